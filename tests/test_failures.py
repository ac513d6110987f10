"""Every failure a user causes ends in one line and a documented exit status (issue 21).

Real subprocesses of the programs (launch/cli/failures.py maps the failures); cheap cases that
fail before the first round run side by side.
"""

import asyncio
import contextlib
import glob
import io
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import weakref

import numpy as np
import psutil
import pytest
import tensorflow as tf

from launch.cli import exit_status
from launch.cli import failures
from launch.cli import stops
from launch.run import errors
from launch import train
from tasks import synthetic
from tff_zmg import analysis
from tff_zmg.runtime import children
from tff_zmg.runtime import cpp_worker
import small_runs

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SMALL = small_runs.FLAGS


def _environment(tmpdir):
  """The programs' environment: TMPDIR a folder of the test's, TF's log level unset (the
  programs' own default must keep stderr clean)."""
  env = {k: v for k, v in os.environ.items() if k != 'TF_CPP_MIN_LOG_LEVEL'}
  os.makedirs(tmpdir, exist_ok=True)
  env['TMPDIR'] = str(tmpdir)
  return env


def _start(program, *args, tmpdir, **kwargs):
  return subprocess.Popen(
      [sys.executable, '-m', f'launch.{program}', *args], cwd=_REPO, text=True,
      stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      env=_environment(tmpdir), **kwargs,
  )


def _workers_of(pid):
  """TFF workers whose parent is `pid` (none may be left)."""
  return [
      p.pid for p in psutil.process_iter(['ppid', 'cmdline'])
      if p.info['ppid'] == pid and 'worker_binary' in ' '.join(p.info['cmdline'] or [])
  ]


def _workers_in(tmpdir):
  """TFF workers started by programs that ran with `TMPDIR=tmpdir` (alive now, reparented
  or not): each program's own temp folder, which its workers inherit, is inside it."""
  found = []
  for p in psutil.process_iter(['cmdline']):
    if 'worker_binary' not in ' '.join(p.info['cmdline'] or []):
      continue
    with contextlib.suppress(psutil.Error):
      if p.environ().get('TMPDIR', '').startswith(str(tmpdir)):
        found.append(p.pid)
  return found


def _one_error_line(err, program):
  lines = err.strip().splitlines()
  assert len(lines) == 1, err
  assert lines[0].startswith(f'{program}: error: ') and 'Traceback' not in err, err
  return lines[0]


def _garble_examples(path):
  """Random bytes over every page of the examples table; the metadata stays intact."""
  with sqlite3.connect(path) as con:
    pages = [r[0] for r in con.execute("SELECT pageno FROM dbstat WHERE name = 'examples'")]
    page_size = con.execute('PRAGMA page_size').fetchone()[0]
  rng = random.Random(0)
  with open(path, 'r+b') as f:
    for page in pages:
      f.seek((page - 1) * page_size)
      f.write(bytes(rng.getrandbits(8) for _ in range(page_size)))


@pytest.fixture(scope='module')
def small_data(tmp_path_factory):
  """The small synthetic EMNIST data of `_SMALL` (cache dir) and a copy with garbage pages."""
  cache_dir = str(tmp_path_factory.mktemp('failures_cache'))
  directory = synthetic.ensure_synthetic_cache_dir(
      'emnist', cache_dir, num_train_clients=6, num_test_clients=2,
      mean_examples_per_client=12,
  )
  corrupt_dir = str(tmp_path_factory.mktemp('corrupt'))
  corrupt = os.path.join(corrupt_dir, 'emnist_all.sqlite')
  shutil.copy(os.path.join(directory, 'emnist_all.sqlite'), corrupt)
  _garble_examples(corrupt)
  return cache_dir, corrupt_dir


def test_bad_input_ends_in_one_line_before_anything_runs(small_data, tmp_path):
  """Flag errors (absl's exit 1 before), data and output paths, in every kind of program."""
  cache_dir, corrupt_dir = small_data
  a_file = tmp_path / 'a_file'
  a_file.write_text('not a directory')
  stale = tmp_path / 'tmp' / 'tff_zmg-tmp-999999999-1'  # A program killed with SIGKILL.
  stale.mkdir(parents=True)
  (stale / '__autograph_generated_filex.py').write_text('')
  cases = [
      ('train', ['--task=mnist', '--algo=fedavg'], 2, 'value should be one of'),
      ('train', ['--task=emnist', '--algo=fedavg', '--data_source=tff',
                 f'--cache_dir={corrupt_dir}', f'--root_output_dir={tmp_path / "runs"}'],
       2, 'database disk image is malformed'),
      ('grid_search', ['--task=emnist', '--algo=fedavg', '--no_such_flag'], 2,
       "Unknown command line flag 'no_such_flag'"),
      ('data_stats', ['--task=emnist', '--data_source=tff', f'--cache_dir={corrupt_dir}',
                      f'--output_dir={tmp_path / "stats"}'], 2,
       'database disk image is malformed'),
      ('data_stats', ['--task=emnist', *_SMALL[:4], f'--cache_dir={cache_dir}',
                      f'--output_dir={a_file}'], 5, 'is a file, not a directory'),
      ('worker', ['--port=0'], 2, 'must be in 1..65535'),
  ]
  procs = [_start(p, *args, tmpdir=tmp_path / 'tmp') for p, args, _, _ in cases]
  for proc, (program, args, code, message) in zip(procs, cases):
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == code, (program, err)
    assert message in _one_error_line(err, program), err
    assert 'round' not in out and 'counting' not in out  # Nothing was computed.
    if args[0] == '--task=mnist':  # (Was test_train.py's test_unknown_task_...): the
      assert 'mnist' in err and 'emnist' in err, err  # tasks it knows are listed.
  assert not (tmp_path / 'runs').exists()
  # Each program's temporary directory is gone, and so is the killed program's.
  assert os.listdir(tmp_path / 'tmp') == []


def test_another_program_succeeds_with_nothing_on_stderr(small_data, tmp_path):
  """TensorFlow's C++ start-up lines stay off stderr in every program (not only train)."""
  cache_dir, _ = small_data
  proc = _start('data_stats', '--task=emnist', *_SMALL[:4], f'--cache_dir={cache_dir}',
                f'--output_dir={tmp_path / "stats"}', tmpdir=tmp_path / 'tmp')
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 0 and err == '', err
  assert 'emnist_summary' in out or 'tables:' in out
  assert os.listdir(tmp_path / 'tmp') == []


def _checkpoints(run_dir):
  return sorted(int(n.rsplit('_', 1)[1]) for n in os.listdir(run_dir / 'checkpoints')
                if n.rsplit('_', 1)[1].isdigit())


@pytest.fixture
def run_train(small_data, tmp_path, capsys):
  """`launch.train.main` in this process (a resume without another TensorFlow start-up)."""
  cache_dir, _ = small_data

  def run(*args):
    flags = train.flags.FLAGS
    flags.unparse_flags()
    flags(['train', f'--cache_dir={cache_dir}', f'--root_output_dir={tmp_path / "runs"}',
           *_SMALL, *args])
    rc = train.main(['train'])
    return (rc, *capsys.readouterr())

  yield run
  train.flags.FLAGS.unparse_flags()


@pytest.mark.parametrize(
    'algo, signum, after, resume',
    [
        ('fedavg', signal.SIGINT, 'round 1/', True),
        # FedRKMGC, where a second worker once started during the shutdown; the same
        # handler for the others: stopped early and not resumed, to keep the suite short
        # (tests/test_train.py resumes a killed FedRKMGC run).
        ('fedrkmgc', signal.SIGINT, 'round 0/', False),
        ('fedavg', signal.SIGTERM, 'round 0/', False),
        ('fedavg', signal.SIGHUP, 'round 0/', False),
    ],
    ids=['ctrl_c', 'ctrl_c_fedrkmgc', 'sigterm', 'sighup'],
)
def test_a_stop_signal_mid_run_says_which_round_resumes_and_it_does(
    small_data, tmp_path, run_train, algo, signum, after, resume
):
  """The stop waits for a safe point (`stops.between_rounds`: a round's next client, the
  next round's start or the last round's end), so that the line names the newest
  checkpoint on disk, that of the last round in metrics.csv, whichever round the signal
  landed in."""
  cache_dir, _ = small_data
  args = ['--task=emnist', f'--algo={algo}', '--total_rounds=2']
  # --verbosity=0 logs each worker start: exactly one, none during the shutdown (in TFF's
  # worker, which the CPU default no longer is).
  in_worker = ['--verbosity=0', '--runtime=tff_worker'] if algo == 'fedrkmgc' else []
  proc = _start('train', f'--cache_dir={cache_dir}', f'--root_output_dir={tmp_path / "runs"}',
                *_SMALL, *args, *in_worker, tmpdir=tmp_path / 'tmp')
  try:
    for line in proc.stdout:  # Synchronised on the program's output, not on time.
      if line.startswith(after):
        proc.send_signal(signum)
        break
    _, err = proc.communicate(timeout=300)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == exit_status.INTERRUPTED, err
  assert not _workers_of(proc.pid)
  run_dir = tmp_path / 'runs' / f'emnist_{algo}_seed0'
  kept = _checkpoints(run_dir) or [None]
  # The round named is the newest checkpoint on disk: what the re-run resumes from.
  expected = (f'train: error: interrupted after round {kept[-1]}; re-run the same command'
              ' to resume')
  if kept[-1] is None:
    expected = ('train: error: interrupted before the first checkpoint; re-run the same'
                ' command to start')
  if kept[-1] is not None:
    assert analysis.runs.completed_rounds(str(run_dir)) == kept[-1]
  if in_worker:
    assert 'Traceback' not in err and err.count('Started TFF worker') == 1, err
    # (TFF logs at INFO that the closed worker no longer answers its value disposals.)
    assert [l for l in err.splitlines() if l.startswith('train: ')] == [expected], err
  else:
    assert _one_error_line(err, 'train') == expected
  assert os.listdir(tmp_path / 'tmp') == []  # Autograph files and worker log: gone.
  if not resume:
    return
  rc, out, err = run_train(*args)
  assert rc == 0, err
  if kept[-1] == 2:  # Stopped after the last round: the re-run has none to train.
    assert not re.search(r'^round ', out, re.M), out
  else:
    if kept[-1] is not None:
      assert f'round {kept[-1] + 1}/2' in out and f'round {kept[-1]}/2' not in out
    assert 'round 2/2' in out
  assert _checkpoints(run_dir)[-1] == 2


def test_a_stop_between_a_rounds_clients_drops_that_round_and_the_rerun_is_uninterrupted(
    tmp_path, run_program, monkeypatch):
  """A Ctrl-C between round 2's two clients (CIFAR-100's CNN with FedGPS: dropout and
  client states) ends the run before the second client: the line names round 1, the
  newest checkpoint and the last round in metrics.csv. The same command then trains
  round 2 again, to the numbers and client states of the run never stopped (here too: this
  process runs TF's ops at its own threads).

  The run sends itself the signal at that point: from the check `stops.between_rounds`
  yields, on its second call from the in-process runtime's clients
  (`client_slots.between_clients`) after round 2's start (the check's second call from
  training's selection of clients)."""
  row = 'cifar100_cnn-fedgps'
  rc, _, err = run_program(train, *small_runs.matrix_args(row, tmp_path, 'uninterrupted'))
  assert rc == 0, err
  args = small_runs.matrix_args(row, tmp_path)
  between_rounds = stops.between_rounds
  sent = []

  @contextlib.contextmanager
  def ctrl_c_between_round_2s_clients():
    calls = {'client_slots.py': 0, 'experiment.py': 0}
    with between_rounds() as stop_if_received:

      def check():
        caller = os.path.basename(sys._getframe(1).f_code.co_filename)  # pylint: disable=protected-access
        calls[caller] += 1
        if (caller, calls['experiment.py'], calls[caller]) == ('client_slots.py', 2, 2):
          sent.append(signal.SIGINT)
          signal.raise_signal(signal.SIGINT)
        elif caller == 'experiment.py':
          calls['client_slots.py'] = 0
        stop_if_received()

      yield check

  monkeypatch.setattr(stops, 'between_rounds', ctrl_c_between_round_2s_clients)
  rc, _, err = run_program(train, *args)
  assert (rc, sent) == (exit_status.INTERRUPTED, [signal.SIGINT]), err
  assert err.strip().splitlines()[-1] == (  # (After the synthetic data's writing bars.)
      'train: error: interrupted after round 1; re-run the same command to resume')
  run_dir = tmp_path / 'run'
  assert _checkpoints(run_dir)[-1] == 1
  assert analysis.runs.completed_rounds(str(run_dir)) == 1
  monkeypatch.setattr(stops, 'between_rounds', between_rounds)
  rc, out, err = run_program(train, *args)
  assert rc == 0, err
  assert 'round 2/2' in out and 'round 1/2' not in out
  small_runs.assert_same_run(run_dir, tmp_path / 'uninterrupted')


@pytest.mark.skipif(shutil.which('unshare') is None, reason='needs unshare (util-linux)')
@pytest.mark.parametrize('algo, resume', [('fedavg', True), ('fedrkmgc', False)])
def test_a_full_disk_while_saving_is_one_line_and_the_kept_checkpoint_resumes(
    small_data, tmp_path, run_train, algo, resume
):
  """The run's root is a 10 MiB tmpfs (a user namespace mounts it without root): round 0's
  checkpoint fits; round 1's does not (TF's SaveV2 in this process for fedavg; the TFF
  worker writing FedRKMGC's client states, a gRPC error). The tmpfs is then copied back
  where it was mounted, so that the same command resumes from what it kept."""
  cache_dir, _ = small_data
  root = tmp_path / 'runs'
  stash = tmp_path / 'stash'
  root.mkdir()
  probe = subprocess.run(['unshare', '-rm', 'true'], capture_output=True)
  if probe.returncode != 0:
    pytest.skip(f'user namespaces are not available: {probe.stderr!r}')
  train_cmd = ' '.join([
      sys.executable, '-m', 'launch.train', f'--cache_dir={cache_dir}',
      f'--root_output_dir={root}', *_SMALL, '--task=emnist', f'--algo={algo}',
      '--total_rounds=2',
  ])
  script = (
      f'mount -t tmpfs -o size=10m tmpfs {root} && {{ {train_cmd}; rc=$?; '
      f'cp -a {root} {stash}; umount {root}; cp -a {stash}/. {root}; exit $rc; }}'
  )
  proc = subprocess.run(
      ['unshare', '-rm', 'sh', '-c', script], cwd=_REPO, text=True, capture_output=True,
      env=_environment(tmp_path / 'tmp'), timeout=300,
  )
  assert proc.returncode == exit_status.ENVIRONMENT, proc.stderr
  line = _one_error_line(proc.stderr, 'train')
  assert 'No space left on device' in line and 'the checkpoint of round 0 is kept' in line
  assert 'round 0/2' in proc.stdout
  # FedAvg saves round 1 while round 2 trains, but round 2 is written only once that save
  # is: its failure is said first. (FedRKMGC's worker fills the disk with round 1's client
  # states.)
  assert ('round 1/2' in proc.stdout) == (algo == 'fedavg') and 'round 2/2' not in proc.stdout
  run_dir = root / f'emnist_{algo}_seed0'
  assert _checkpoints(run_dir) == [0]
  for path in glob.glob(str(run_dir / 'checkpoints' / 'program_state_0' / '**'),
                        recursive=True):
    if 'variables.data' in path:
      values = tf.train.load_checkpoint(path.rsplit('.data', 1)[0])
      for name in values.get_variable_to_shape_map():
        value = values.get_tensor(name)
        if np.issubdtype(np.asarray(value).dtype, np.floating):
          assert np.isfinite(value).all(), name
  # The program's, not this process's (whose default context may keep a worker of an
  # earlier test): it ended inside a namespace, so any worker left is reparented.
  assert not _workers_in(tmp_path / 'tmp')
  if not resume:
    return
  rc, out, err = run_train('--task=emnist', f'--algo={algo}', '--total_rounds=2')
  assert rc == 0, err
  assert 'round 1/2' in out and 'round 0/2' not in out and 'round 2/2' in out


def test_a_stop_while_a_program_imports_ends_it_in_one_line(tmp_path):
  """Issue 47: a stop in the seconds of imports, before `run_program` installs the
  program's handlers, ended it by Python's default (status 143 for SIGTERM, no line)."""
  proc = _start('train', '--task=emnist', '--algo=fedavg', tmpdir=tmp_path / 'tmp')
  time.sleep(1.0)  # Python is up; TensorFlow's import takes seconds more.
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == exit_status.INTERRUPTED, err
  assert 'interrupted by SIGTERM while starting' in _one_error_line(err, 'train')
  assert out == ''


def test_a_stop_while_synthetic_data_is_written_ends_the_run_and_leaves_no_database(tmp_path):
  """Issue 47: a SIGTERM while the synthetic clients were written was lost (the run wrote
  them all, trained and exited 0). Each stop ends the run (130, one line) leaving no
  database, whole or half; the next run writes it and trains."""
  data_args = ['--task=emnist', '--algo=fedavg', '--data_source=synthetic',
               '--synthetic_train_clients=1500', '--synthetic_test_clients=2',
               '--synthetic_examples_per_client=10', '--clients_per_round=2',
               '--total_rounds=1', f'--cache_dir={tmp_path / "cache"}',
               f'--root_output_dir={tmp_path / "runs"}']
  synthetic_dir = tmp_path / 'cache' / 'synthetic'

  def being_written():
    folders = os.listdir(synthetic_dir) if synthetic_dir.is_dir() else []
    return any('.tmp' in n for f in folders for n in os.listdir(synthetic_dir / f))

  for delay_s in (0.0, 0.5):  # At the first clients written, and further on.
    proc = _start('train', *data_args, tmpdir=tmp_path / 'tmp')
    deadline = time.monotonic() + 300
    while not being_written() and proc.poll() is None and time.monotonic() < deadline:
      time.sleep(0.02)
    time.sleep(delay_s)
    assert being_written(), 'the data was not being written when the stop was sent'
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == exit_status.INTERRUPTED, err
    assert 'interrupted by SIGTERM' in _one_error_line(err, 'train')
    (folder,) = os.listdir(synthetic_dir)
    assert os.listdir(synthetic_dir / folder) == ['settings.json']
  proc = _start('train', *data_args, tmpdir=tmp_path / 'tmp')
  out, err = proc.communicate(timeout=600)
  assert proc.returncode == 0, err
  assert 'round 1/1' in out
  assert sorted(os.listdir(synthetic_dir / folder)) == ['emnist_all.sqlite', 'settings.json']
  assert not _workers_in(tmp_path / 'tmp')


def test_large_synthetic_data_reports_progress(tmp_path):
  stream = io.StringIO()
  synthetic.write_synthetic_sqlite(
      'emnist', str(tmp_path / 'emnist_all.sqlite'), num_train_clients=3, num_test_clients=1,
      mean_examples_per_client=2, progress_interval_s=0, progress_stream=stream,
  )
  lines = stream.getvalue().splitlines()
  assert 'synthetic emnist data: 4/4 clients generated' in lines[3]
  assert any('clients written' in l for l in lines)


def test_environment_causes_are_recognised_in_oserrors_tf_and_grpc_messages():
  import errno

  code, message = failures.classify(OSError(errno.ENOSPC, 'No space left on device', '/x'))
  assert code == exit_status.ENVIRONMENT and '/x' in message
  error = tf.errors.ResourceExhaustedError(
      None, None, '{{function_node __wrapped__SaveV2}} /r/c/variables.data; No space left on'
      ' device [Op:SaveV2]')
  code, message = failures.classify(error)
  assert code == exit_status.ENVIRONMENT
  assert '/r/c/variables.data; No space left on device' in message and 'Op:' not in message
  assert failures.classify(KeyboardInterrupt())[0] == exit_status.INTERRUPTED
  assert failures.classify(ValueError('bad\nvalue'))[1] == 'bad; value'
  code, message = failures.classify(ZeroDivisionError('x'))
  assert code == exit_status.UNEXPECTED and 'ZeroDivisionError' in message


def test_a_coroutine_a_stop_signal_left_unawaited_prints_nothing():
  """CI once saw Python's never-awaited warning under the one line: SIGHUP landed
  between TFF's loop making `state_manager.save(...)` and running it."""
  import gc
  import warnings

  async def save():
    pass

  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    made_not_run = save()
    with pytest.raises(errors.Interrupted, match='SIGHUP'):
      stops._raise_interrupted(signal.SIGHUP, None)  # What the handler does.
    del made_not_run
    gc.collect()
  assert not caught, [str(w.message) for w in caught]


@contextlib.contextmanager
def _stop_signals_installed():
  """The programs' stop handling (`stops.install`) in this process, and
  pytest's handlers and unraisable hook back afterwards."""
  handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
  python_hook = sys.unraisablehook
  try:
    stops.install()
    yield
  finally:
    for signum, handler in handlers.items():
      signal.signal(signum, handler)
    sys.unraisablehook = python_hook


def test_a_stop_signal_landing_in_a_weakref_callback_still_stops_the_program():
  """CI once saw a SIGTERM run to exit 0: its handler raised inside a weakref callback,
  where Python prints an exception ("Exception ignored in ...") and goes on."""
  landed_in_callback = []

  def callback(_):
    try:
      os.kill(os.getpid(), signal.SIGTERM)  # Handled as this call returns: in the callback.
    finally:
      landed_in_callback.append(True)

  class Referent:
    pass

  with _stop_signals_installed():
    referent = Referent()
    reference = weakref.ref(referent, callback)
    with pytest.raises(errors.Interrupted, match='SIGTERM'):
      del referent
      deadline = time.monotonic() + 10
      while time.monotonic() < deadline:  # Signalled again: raised here, in ordinary code.
        pass
    assert landed_in_callback and reference() is None


def test_a_stop_while_starting_ends_the_program_even_where_exceptions_are_swallowed(tmp_path):
  """Issue 47: a SIGTERM during a program's imports landed in JAX's garbage-collector
  callback, was printed and ignored, and the run trained and exited 0; CI saw another
  turned into `ImportError: initialization failed` by an extension module's import (exit
  1, a traceback). The start-up handler now ends the process itself: here the stop lands
  in a handler that swallows every exception, and the program still ends, 130, one line."""
  script = (
      'import os, signal, time\n'
      'from launch.cli import stops\n'
      'stops.end_at_once_while_starting("train", lambda: print("cleaned up"))\n'
      'try:\n'
      '  os.kill(os.getpid(), signal.SIGTERM)\n'
      '  time.sleep(5)\n'
      'except BaseException:\n'
      '  pass\n'
      'print("went on")\n'
  )
  proc = subprocess.run([sys.executable, '-c', script], cwd=_REPO, capture_output=True,
                        text=True, env=_environment(tmp_path / 'tmp'), timeout=120)
  assert proc.returncode == exit_status.INTERRUPTED, proc.stderr
  assert proc.stdout == 'cleaned up\n'
  assert proc.stderr == 'train: error: interrupted by SIGTERM while starting; nothing was done\n'


def test_a_stop_signal_landing_in_asyncio_bookkeeping_is_raised_once_it_is_done():
  """CI once saw "Task was destroyed but it is pending!" beside a SIGTERM's one line: the
  signal landed while asyncio registered a checkpoint's `save` task, which was then left
  scheduled but unknown to `asyncio.all_tasks`, so no cancel reached it."""
  landed = []

  def signal_lands_in_registration(frame, event, arg):
    # A signal handled in the trace function would land in this file; the handler is given
    # the frame the signal lands in, as Python gives it.
    if (event == 'call' and frame.f_code is weakref.WeakSet.add.__code__
        and isinstance(frame.f_locals.get('item'), asyncio.Task)):
      sys.settrace(None)
      landed.append(frame.f_code.co_filename)
      signal.getsignal(signal.SIGTERM)(signal.SIGTERM, frame)
    return None

  async def checkpoint_save():
    await asyncio.sleep(10)  # The loop waits: where the stop, signalled again, is raised.

  loop = asyncio.new_event_loop()
  try:
    with _stop_signals_installed():
      sys.settrace(signal_lands_in_registration)
      with pytest.raises(errors.Interrupted, match='SIGTERM'):
        loop.run_until_complete(checkpoint_save())
      sys.settrace(None)
    assert landed
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    assert [t.get_coro().__name__ for t in pending] == ['checkpoint_save']
    for task in pending:
      task.cancel()
    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
  finally:
    sys.settrace(None)
    loop.close()


def test_inside_a_loops_deferral_the_first_stop_waits_for_its_turn_and_a_second_is_raised():
  with _stop_signals_installed():
    with stops.deferred('nothing was stopped') as stop_if_received:
      stop_if_received()  # No stop, no raise.
    with stops.deferred('the runs still going were stopped') as stop_if_received:
      os.kill(os.getpid(), signal.SIGTERM)  # Handled as this call returns: only recorded.
      with pytest.raises(errors.Interrupted) as raised:
        stop_if_received()
      assert str(raised.value) == 'interrupted by SIGTERM; the runs still going were stopped'
      with pytest.raises(errors.Interrupted) as raised:
        os.kill(os.getpid(), signal.SIGINT)  # The second: raised at once, with the same line.
      assert str(raised.value) == 'interrupted by SIGINT; the runs still going were stopped'
    with pytest.raises(errors.Interrupted) as raised:  # Past the loop: at once.
      os.kill(os.getpid(), signal.SIGHUP)
    assert str(raised.value) == 'interrupted by SIGHUP'


def test_a_child_dies_with_the_program_that_started_it_even_one_killed():
  """The programs' children (TFF's workers, a sweep's worker processes, the Ray driver) are
  started through `children.dying_with_parent`: a program killed with SIGKILL, which runs
  no clean-up, takes them along; and nothing of Python runs in the forked child (a
  `preexec_fn` did, and once segfaulted there beside TensorFlow's threads)."""
  program = (
      'import importlib.util, subprocess, sys\n'
      'spec = importlib.util.spec_from_file_location("children", sys.argv[1])\n'
      'children = importlib.util.module_from_spec(spec)\n'
      'spec.loader.exec_module(children)\n'
      'command = children.dying_with_parent(["sleep", "600"], "KILL")\n'
      'print(command[:2], subprocess.Popen(command).pid, flush=True)\n'
      'sys.stdin.read()\n')
  path = os.path.join(small_runs.REPO, 'tff_zmg', 'runtime', 'children.py')
  with subprocess.Popen([sys.executable, '-c', program, path], stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE, text=True) as parent:
    line = parent.stdout.readline()
    child = psutil.Process(int(line.split()[-1]))
    assert line.startswith(f"['{shutil.which('setpriv')}', '--pdeathsig=KILL']"), line
    assert child.ppid() == parent.pid
    parent.kill()
    parent.wait()
    child.wait(timeout=60)  # Gone (psutil raises TimeoutExpired if it still runs).


def test_a_child_whose_parent_died_before_it_asked_to_die_with_it_never_runs():
  """A parent killed before `setpriv` asks for the signal would leave an orphan that outlives
  it: the command runs only under the process that built it (here, another one starts it)."""
  command = children.dying_with_parent(['echo', 'ran'], 'KILL')
  started_elsewhere = subprocess.run(
      [sys.executable, '-c', 'import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))',
       *command], capture_output=True, text=True, check=False)
  assert (started_elsewhere.returncode, started_elsewhere.stdout) == (1, '')
  assert subprocess.run(command, capture_output=True, text=True, check=True).stdout == 'ran\n'


def test_a_closed_worker_is_never_started_again():
  with cpp_worker.execution_context() as worker:
    pass
  with pytest.raises(cpp_worker.WorkerStartError, match='stopped for good'):
    worker.stub()
  assert worker.pid is None
