"""Issue 28, each numbered case as a user meets it: a real subprocess of the program, its
exit status, one line on stderr without a traceback, nothing touched outside the run, and
what the run's records say afterwards. A test per case, named after the behaviour, its
item in the docstring.

The runs are tiny (six synthetic EMNIST clients, one or two rounds); runs a test only
reads or copies are made once (`finished_run`; `resumed_run`, a resume of a copy of it in
a real process, which two tests read), and independent programs of one test run side by
side. A program that only prepares a case, or whose case is its `main`'s answer
(not the process's start, exit or leftovers), runs in this process (`run_program`, no
TensorFlow start-up); a test keeps at least one real process where it checks leftovers.
"""

import csv
import fcntl
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

from launch.cli import exit_status
from launch import grid_search
from launch.reproduce import run as reproduce
from launch import train
from tasks import synthetic
from tff_zmg import analysis
from tff_zmg.runtime import cpp_worker
import small_runs

_REPO = small_runs.REPO
_SMALL = small_runs.FLAGS
_TRAIN_CLIENTS = 6  # small_runs' --synthetic_train_clients.


@pytest.fixture(scope='module')
def cache_dir(tmp_path_factory):
  directory = str(tmp_path_factory.mktemp('trust_cache'))
  synthetic.ensure_synthetic_cache_dir(
      'emnist', directory, num_train_clients=_TRAIN_CLIENTS, num_test_clients=2,
      mean_examples_per_client=12)
  return directory


def _environment(tmp_path):
  """TMPDIR and HOME of the test's own, TF's log level unset (the programs' own default)."""
  env = {k: v for k, v in os.environ.items() if k != 'TF_CPP_MIN_LOG_LEVEL'}
  for name in ('tmp', 'home'):
    os.makedirs(tmp_path / name, exist_ok=True)
  env.update(TMPDIR=str(tmp_path / 'tmp'), HOME=str(tmp_path / 'home'))
  return env


def _start(program, *args, tmp_path, **kwargs):
  """A program of `launch` (None: python itself) in a subprocess."""
  command = [sys.executable, *(['-m', f'launch.{program}'] if program else []), *args]
  return subprocess.Popen(
      command, cwd=_REPO, text=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, env=_environment(tmp_path), **kwargs)


# Generous: a run takes seconds alone, but minutes on two cores shared with other work.
_TIMEOUT_S = 900


def _finish(proc, timeout=_TIMEOUT_S):
  out, err = proc.communicate(timeout=timeout)
  return proc.returncode, out, err


def _run(program, *args, tmp_path, timeout=_TIMEOUT_S):
  return _finish(_start(program, *args, tmp_path=tmp_path), timeout)


def _run_side_by_side(commands, tmp_path):
  """[(exit status, stdout, stderr)] of `commands` ((program, *args)) run at once."""
  procs = [_start(*command, tmp_path=tmp_path) for command in commands]
  return [_finish(proc) for proc in procs]


@pytest.fixture
def children_tmp(tmp_path, monkeypatch):
  """For a program run in this process (`run_program`) that starts others (a grid's cells,
  a dry run's timing runs): they get the test's TMPDIR, as `_start`'s programs do, so that
  `_assert_left_clean` still sees what they leave; this process keeps its own."""
  os.makedirs(tmp_path / 'tmp', exist_ok=True)
  monkeypatch.setattr(tempfile, 'tempdir', tempfile.gettempdir())
  monkeypatch.setenv('TMPDIR', str(tmp_path / 'tmp'))


def _one_error_line(err, program):
  lines = err.strip().splitlines()
  assert len(lines) == 1 and 'Traceback' not in err, err
  assert lines[0].startswith(f'{program}: error: '), err
  return lines[0]


def _train_args(cache_dir, root, *args):
  return (f'--cache_dir={cache_dir}', f'--root_output_dir={root}', *_SMALL, '--task=emnist',
          *args)


def _tree(path):
  """Every entry below `path` with its size and modification time (files) or None."""
  found = {}
  for directory, dirs, files in os.walk(path):
    for name in dirs + files:
      full = os.path.join(directory, name)
      stat = os.lstat(full)
      found[os.path.relpath(full, path)] = (
          None if name in dirs else (stat.st_size, stat.st_mtime_ns))
  return found


def _contents(run_dir):
  """Every file of a run folder and its bytes, but the lock's (the pid of its last holder,
  for the message a second process prints)."""
  return {os.path.relpath(os.path.join(d, n), run_dir): open(os.path.join(d, n), 'rb').read()
          for d, _, files in os.walk(run_dir) for n in files if n != '.lock'}


def _assert_left_clean(tmp_path, refused=False, killed=False):
  """The programs' private temporary folders are gone, and no program left the
  ~/.keras/keras.json its import of TensorFlow wrote (issue 47: a run that trained left
  it), but one `killed` with SIGKILL, which runs no clean-up; programs that only `refused`
  what they were given (status 2) left nothing there."""
  assert os.listdir(tmp_path / 'tmp') == []
  assert killed or not os.path.lexists(tmp_path / 'home' / '.keras')
  if refused:
    assert os.listdir(tmp_path / 'home') == []


@pytest.fixture
def finished_run(cache_dir, tmp_path_factory, run_program):
  """(folder, stdout) of a finished 1-round FedAvg run that asked for 8 clients a round of
  the data's 6, trained once, in this process, for the first test that asks. Tests read
  it or copy it (`_copy`)."""

  def train_finished():
    tmp_path = tmp_path_factory.mktemp('finished')
    code, out, err = run_program(train, *_train_args(
        cache_dir, tmp_path / 'runs', '--algo=fedavg', '--clients_per_round=8',
        '--total_rounds=1'))
    assert code == 0 and err == '', err
    return tmp_path / 'runs' / 'emnist_fedavg_seed0', out

  return small_runs.made_once(('test_trust', 'finished'), train_finished)


_FINISHED_ARGS = ('--algo=fedavg', '--clients_per_round=8')


def _copy(run_dir, tmp_path):
  """A copy of a run folder in `tmp_path/runs` (a copied run resumes)."""
  copy = tmp_path / 'runs' / run_dir.name
  shutil.copytree(run_dir, copy)
  return copy


def _cache_of(run_dir):
  return json.loads((run_dir / 'flags.json').read_text())['cache_dir']


@pytest.fixture
def resumed_run(finished_run, tmp_path_factory):
  """A copy of `finished_run` holding a user's .notes.tmp and the temporaries of two
  interrupted writes of ours, resumed to round 2 in TFF's worker in a real process, once,
  for the first test that asks: (its folder, the flags that resume it but --total_rounds
  and --runtime, (exit status, stdout, stderr), the folder with the process's TMPDIR and
  HOME and the run's root, runs/)."""

  def resume():
    tmp_path = tmp_path_factory.mktemp('resumed')
    run_dir = _copy(finished_run[0], tmp_path)
    (run_dir / '.notes.tmp').write_text('mine')
    (run_dir / '.flags.json.tmp').write_text('{"cut sh')  # A killed write of ours.
    (run_dir / 'metrics.csv_temp1234').write_text('key\n')  # TFF's CSV manager's.
    args = (*_train_args(_cache_of(run_dir), tmp_path / 'runs'), *_FINISHED_ARGS)
    result = _run('train', *args, '--total_rounds=2', '--runtime=tff_worker',
                  tmp_path=tmp_path)
    return run_dir, args, result, tmp_path

  return small_runs.made_once(('test_trust', 'resumed'), resume)


# 1. The grid search writes only inside its root and replaces only its own files.


def test_grid_search_refuses_names_and_folders_outside_its_root_or_not_its_own(
    tmp_path, run_program):
  """1: '..', an absolute path, a link out of the root, a 300-character name, a folder of
  someone else's (its best.json would be replaced): refused as launch.train refuses, 2."""
  root = tmp_path / 'root'
  outside = tmp_path / 'outside'
  mine = root / 'mine'
  for folder in (outside, mine):
    folder.mkdir(parents=True)
    (folder / 'best.json').write_text('{"mine": 1}')
    (folder / 'grid.csv').write_text('mine\n')
  os.symlink(outside, root / 'link')
  grid = ('grid_search', '--task=emnist', '--algo=fedavg', f'--root_output_dir={root}',
          '--client_learning_rates=0.1', '--server_learning_rates=1', '--total_rounds=1')
  cases = {
      '../outside': "has a '..' component",
      str(outside): 'is an absolute path',
      'g' * 300: 'a file name holds at most 255',
      'link': 'is not inside --root_output_dir',
      'mine': "holds files no grid search wrote ('best.json' and 1 more)",
  }
  before = _tree(root), _tree(outside)
  # One refusal in a real process, whose leftovers are checked below; the others (the same
  # check before any work, other names) in this process.
  names = list(cases)
  results = [_run(*grid, f'--experiment_name={names[0]}', tmp_path=tmp_path)] + [
      run_program(grid_search, *grid[1:], f'--experiment_name={name}') for name in names[1:]]
  for (name, message), (code, out, err) in zip(cases.items(), results):
    assert code == exit_status.BAD_INPUT, (name, err)
    assert message in _one_error_line(err, 'grid_search'), (name, err)
    assert out == '', out
  assert (_tree(root), _tree(outside)) == before
  assert (outside / 'best.json').read_text() == '{"mine": 1}'
  _assert_left_clean(tmp_path, refused=True)


# 2. Run records stay true.


def test_each_process_that_trains_adds_its_session_to_runtime_json(
    finished_run, resumed_run, tmp_path, run_program):
  """2: a no-op re-run of a finished run changes nothing; a resume in TFF's worker adds its
  own session beside the first one's, in process."""
  run_dir = _copy(finished_run[0], tmp_path)
  args = (*_train_args(_cache_of(run_dir), tmp_path / 'runs'), *_FINISHED_ARGS)
  record = (run_dir / 'runtime.json').read_bytes()
  # The no-op re-run in this process: what it must not do is write, not start or exit.
  # Issue 47: each added a TensorBoard events file and said `"client_devices": {}`. (The
  # first one records the copy's new folders in flags.json.)
  folder = []
  for _ in range(2):
    code, out, err = run_program(train, *args, '--total_rounds=1')
    assert code == 0 and err == '', err
    folder.append(_contents(run_dir))
  assert (run_dir / 'runtime.json').read_bytes() == record
  assert folder[0] == folder[1]
  assert len(os.listdir(run_dir / 'tensorboard')) == 1
  (summary,) = [json.loads(l.split(' ', 1)[1]) for l in out.splitlines()
                if l.startswith('summary: ')]
  assert summary['client_devices'] == json.loads(record)['sessions'][0]['client_devices']
  # The resume: `resumed_run`'s real process (`--total_rounds=2 --runtime=tff_worker`), on
  # another copy of the run.
  run_dir, _, (code, out, err), tmp_path = resumed_run
  assert code == 0 and err == '' and 'round 2/2' in out, err
  first, second = analysis.runs.read_runtime(str(run_dir))
  assert first['rounds'] == [1, 1] and first['runtime'] == 'in_process'
  (device, count), = first['client_devices'].items()
  assert device.endswith('/device:CPU:0') and count == _TRAIN_CLIENTS
  assert second['rounds'] == [2, 2] and second['runtime'] == 'tff_worker'
  (device, count), = second['client_devices'].items()
  assert 'worker_binary' in device and count is None
  assert os.listdir(tmp_path / 'runs') == [run_dir.name]
  _assert_left_clean(tmp_path)


def test_a_runtime_json_from_before_sessions_reads_as_one_session(tmp_path):
  """2: runs recorded before sessions keep what they said."""
  (tmp_path / 'runtime.json').write_text(json.dumps(
      {'runtime': 'tff_worker', 'client_devices': {'CPU': None}, 'intra_op_threads': 1}))
  assert analysis.runs.read_runtime(str(tmp_path)) == [
      {'runtime': 'tff_worker', 'client_devices': {'CPU': None}, 'intra_op_threads': 1,
       'rounds': None}]


# 3. Only the program's own temporary files are deleted.


def test_resume_and_overwrite_keep_a_users_tmp_file(resumed_run, run_program):
  """3: a resume removes only the temporaries of the run's own interrupted writes;
  --overwrite refuses a folder that holds a user's .notes.tmp, deleting nothing."""
  # The resume: `resumed_run`'s real process, of a copy that held those three files.
  run_dir, args, (code, out, err), tmp_path = resumed_run
  assert code == 0 and err == '' and 'round 2/2' in out, err
  assert (run_dir / '.notes.tmp').read_text() == 'mine'
  assert not (run_dir / '.flags.json.tmp').exists()
  assert not (run_dir / 'metrics.csv_temp1234').exists()

  before = _tree(tmp_path / 'runs')
  # The refusal in this process: it deletes nothing before it answers (the resume above is
  # the real process whose leftovers are checked).
  code, out, err = run_program(train, *args, '--total_rounds=2', '--overwrite')
  line = _one_error_line(err, 'train')
  assert code == exit_status.BAD_INPUT and "('.notes.tmp')" in line, err
  assert _tree(tmp_path / 'runs') == before
  assert analysis.runs.completed_rounds(str(run_dir)) == 2
  _assert_left_clean(tmp_path)


# 4. Divergence is judged against the run's own round 0.


def _losses(run_dir):
  """{round: (training loss, evaluation loss)} of metrics.csv (NaN where not recorded)."""
  with open(run_dir / 'metrics.csv', newline='') as f:
    return {int(row['key']): tuple(float(row.get(k) or math.nan) for k in (
        analysis.runs.TRAIN_LOSS, 'evaluation/loss')) for row in csv.DictReader(f)}


def _checkpoints(run_dir):
  return sorted(n for n in os.listdir(run_dir / 'checkpoints') if n.startswith('program_'))


def test_a_loss_far_above_round_0s_stops_the_run_before_it_is_kept_and_the_advice_works(
    cache_dir, tmp_path, run_program):
  """4: FedAdam (a huge server rate, one round), FedProx (a huge mu), SCAFFOLD and FedZMG
  (huge client rates) used to keep rounds with losses up to 1e31; each now exits 3 in
  that round, keeping round 0's checkpoint, whose losses are finite and under the limit,
  and the reason in diverged.txt. The advice (other settings and --overwrite), followed,
  trains, as does a run resumed with a limit it does not pass."""
  root = tmp_path / 'runs'
  diverging = {
      'fedadam': ['--server_learning_rate=1e6'],
      # Two local steps: the pull mu (w - w^t) is 0 at the first.
      'fedprox': ['--proximal_strength=1e6', '--client_epochs_per_round=2'],
      'scaffold': ['--client_learning_rate=1e4'],
      'fedzmg': ['--client_learning_rate=1e4'],
  }
  # The first in a real process, whose exit status and leftovers are checked; the others
  # (the same check, made in `main`, for other algorithms) in this process.
  args = {algo: _train_args(cache_dir, root, f'--algo={algo}', '--total_rounds=1', *extra)
          for algo, extra in diverging.items()}
  first, *others = diverging
  results = [_run('train', *args[first], tmp_path=tmp_path)] + [
      run_program(train, *args[algo]) for algo in others]
  for algo, (code, out, err) in zip(diverging, results):
    assert code == exit_status.DIVERGED, (algo, code, out[-300:], err)
    line = _one_error_line(err, 'train')
    assert line.startswith('train: error: training diverged in round 1: '), line
    assert "x round 0's evaluation loss" in line and '(--divergence_factor)' in line, line
    assert 'the checkpoint of round 0 is kept' in line, line
    assert 're-run with them and --overwrite, or with another --experiment_name' in line
    run_dir = root / f'emnist_{algo}_seed0'
    assert _checkpoints(run_dir) == ['program_state_0'], algo
    # The run alone says why in its folder, as a sweep's cell does (not retried then).
    assert (run_dir / 'diverged.txt').read_text() == line[len('train: error: '):] + '\n'
    (reference,) = [e for _, e in _losses(run_dir).values()]
    # Round 0's, an untrained model's: about log(62), and under the limit it set.
    assert math.isfinite(reference) and reference < 2 * math.log(62), (algo, reference)
    assert 'round 1/1' not in out
  assert sorted(os.listdir(root)) == sorted(f'emnist_{a}_seed0' for a in diverging)
  # Resumed with a setting a run may change (`resumption`), a limit it does not pass: the
  # run trains on and is no longer recorded as diverged.
  code, out, err = run_program(train, *args['fedprox'], '--divergence_factor=inf')
  assert code == 0 and 'round 1/1' in out, err
  assert not (root / 'emnist_fedprox_seed0' / 'diverged.txt').exists()

  # The advice followed in this process: the first diverging run above is the real process
  # whose exit and leftovers are checked.
  followed = {'fedadam': ['--server_learning_rate=0.01'],
              'scaffold': ['--client_learning_rate=0.01']}
  for algo, extra in followed.items():
    code, out, err = run_program(train, *_train_args(
        cache_dir, root, f'--algo={algo}', '--total_rounds=1', *extra, '--overwrite'))
    assert code == 0 and err == '' and 'round 1/1' in out, (algo, err)
    run_dir = root / f'emnist_{algo}_seed0'
    assert _checkpoints(run_dir) == ['program_state_0', 'program_state_1']
    assert not (run_dir / 'diverged.txt').exists()
    losses = _losses(run_dir)
    limit = 10 * losses[0][1]  # The documented default --divergence_factor.
    assert all(math.isfinite(l) and l < limit for l in losses[1]), losses
  _assert_left_clean(tmp_path)


# 5. Exit statuses as docs/operations.md defines them, with the cause.


def test_a_folder_with_someone_elses_metrics_csv_is_refused_untouched(cache_dir, tmp_path):
  """5: training into it used to write files there and then exit 1."""
  theirs = tmp_path / 'runs' / 'theirs'
  theirs.mkdir(parents=True)
  (theirs / 'metrics.csv').write_text('round,accuracy\n1,0.5\n')
  before = _tree(tmp_path / 'runs')
  code, out, err = _run('train', *_train_args(
      cache_dir, tmp_path / 'runs', '--algo=fedavg', '--experiment_name=theirs'),
      tmp_path=tmp_path)
  line = _one_error_line(err, 'train')
  assert code == exit_status.BAD_INPUT and 'holds a metrics.csv but no flags.json' in line
  assert _tree(tmp_path / 'runs') == before
  _assert_left_clean(tmp_path, refused=True)


def test_an_immutable_metrics_csv_is_the_machines_refusal(finished_run, tmp_path):
  """5: `chattr +i metrics.csv` used to exit 1 ("a bug")."""
  run_dir = _copy(finished_run[0], tmp_path)
  args = (*_train_args(_cache_of(run_dir), tmp_path / 'runs'), *_FINISHED_ARGS)
  metrics = run_dir / 'metrics.csv'
  before = metrics.read_bytes()
  if subprocess.run(['chattr', '+i', str(metrics)], capture_output=True).returncode != 0:
    pytest.skip('chattr +i needs root and a file system with attributes')
  try:
    code, out, err = _run('train', *args, '--total_rounds=2', tmp_path=tmp_path)
  finally:
    subprocess.run(['chattr', '-i', str(metrics)], check=True)
  line = _one_error_line(err, 'train')
  assert code == exit_status.ENVIRONMENT and 'Operation not permitted' in line, err
  assert 'the checkpoint of round 1 is kept' in line, line
  assert metrics.read_bytes() == before
  assert _checkpoints(run_dir) == ['program_state_0', 'program_state_1']
  assert len(analysis.runs.read_runtime(str(run_dir))) == 1  # Round 2 was not trained.
  _assert_left_clean(tmp_path)


def test_a_cell_that_fails_ends_the_search_with_the_line_it_ended_with(
    cache_dir, tmp_path, run_program, children_tmp):
  """5: a grid cell's run that fails (its folder held by another process, which only the
  run's own lock tells) ends the search with the run's own line and status, as its warm
  worker answered them (the runner used to read them back from the end of the cell's log)."""
  grid = tmp_path / 'runs' / 'grid_emnist_fedavg'
  cell = grid / 'clr0.1_slr1'
  (grid / 'logs').mkdir(parents=True)  # A grid's folder.
  cell.mkdir()
  with open(cell / '.lock', 'w') as lock:
    lock.write('12345\n')
    lock.flush()
    fcntl.flock(lock, fcntl.LOCK_EX)
    code, out, err = run_program(
        grid_search, *_train_args(cache_dir, tmp_path / 'runs', '--algo=fedavg'),
        '--client_learning_rates=0.1', '--server_learning_rates=1', '--total_rounds=1',
        '--nostability_check')
  line = _one_error_line(err, 'grid_search')
  assert code == exit_status.BAD_INPUT, err
  assert re.fullmatch(
      r'grid_search: error: clr0\.1_slr1 failed \(exit 2\) after \d+ s: train: error: '
      + re.escape(f'{cell} is being trained by another process (pid 12345); wait for it to'
                  ' end, or choose another --experiment_name (its log:'
                  f' {grid / "logs" / "clr0.1_slr1.log"})'), line), line
  log = (grid / 'logs' / 'clr0.1_slr1.log').read_text()
  assert log.startswith('=== start ') and ' -m launch.train --task=emnist' in log, log
  assert log.splitlines()[-1] == line[line.index('train: error: '):line.index(' (its log:')]
  _assert_left_clean(tmp_path)


def test_a_full_disk_while_client_states_are_written_says_so_in_one_line(cache_dir, tmp_path):
  """5: SCAFFOLD's client states on a 30 MiB tmpfs (round 0's checkpoint fits, round 1's
  states do not), in process and in TFF's worker (there a ~1,200-character line before)."""
  if shutil.which('unshare') is None or subprocess.run(
      ['unshare', '-rm', 'true'], capture_output=True).returncode != 0:
    pytest.skip('user namespaces are not available')
  runtimes = ('in_process', 'tff_worker')
  commands = []
  for runtime in runtimes:
    root = tmp_path / runtime
    root.mkdir()
    train = ' '.join([sys.executable, '-m', 'launch.train', *_train_args(
        cache_dir, root, '--algo=scaffold', '--total_rounds=2', f'--runtime={runtime}')])
    commands.append((None, '-c', (
        'import subprocess, sys; sys.exit(subprocess.run(["unshare", "-rm", "sh", "-c",'
        f' "mount -t tmpfs -o size=30m tmpfs {root} && exec {train}"]).returncode)')))
  for runtime, (code, out, err) in zip(runtimes, _run_side_by_side(commands, tmp_path)):
    line = _one_error_line(err, 'train')
    assert code == exit_status.ENVIRONMENT, (runtime, err)
    assert 'No space left on device' in line and 'File "' not in line, line
    assert len(line) < 400 and 'the checkpoint of round 0 is kept' in line, line
    assert 'round 0/2' in out and 'round 1/2' not in out, out
  # The tmpfs went with its namespace; nothing was written beside it.
  assert sorted(os.listdir(tmp_path)) == sorted(['home', 'tmp', *runtimes])
  assert all(os.listdir(tmp_path / runtime) == [] for runtime in runtimes)
  _assert_left_clean(tmp_path)


# 6. Text and boolean hyperparameters as the grid's third axis.


def test_the_grids_third_axis_takes_text_and_booleans(
    cache_dir, tmp_path, run_program, children_tmp):
  """6: `local_gc_layers:all,feature` (text) and `center_vectors:True` (a bool) used to
  end in "Unknown format code 'g'" and "must be a bool, got 'True'"; an algorithm without
  a server rate (FedRKMGC's km_clock) is refused in the grid's terms."""
  assert grid_search.parse_hparam_grid('center_vectors:True,false', 'fedzmg') == (
      'center_vectors', (True, False))
  root = tmp_path / 'runs'
  grid = ('--client_learning_rates=0.1', '--server_learning_rates=1', '--total_rounds=1',
          '--nostability_check')
  # The grid searches in this process (the flags are parsed as the program parses them);
  # their cells train in a warm slot process, with the test's TMPDIR.
  text, text_out, text_err = run_program(
      grid_search, *_train_args(cache_dir, root, '--algo=local_gc'), *grid,
      '--hparam_grid=local_gc_layers:all,feature')
  boolean, bool_out, bool_err = run_program(
      grid_search, *_train_args(cache_dir, root, '--algo=fedzmg'), *grid,
      '--hparam_grid=center_vectors:True')
  refused = run_program(
      grid_search, *_train_args(cache_dir, root, '--algo=fedrkmgc'),
      '--client_learning_rates=0.1', '--hparam_grid=km_clock:global,participation')
  assert text == 0 and text_err == '', text_err
  assert boolean == 0 and bool_err == '', bool_err
  for name, value, out in (('local_gc_layers', 'all', text_out),
                           ('local_gc_layers', 'feature', text_out),
                           ('center_vectors', True, bool_out)):
    algo = 'local_gc' if name == 'local_gc_layers' else 'fedzmg'
    axis = root / f'grid_emnist_{algo}' / f'{name}={value}'
    assert (axis / 'grid.csv').exists() and (axis / 'grid_heatmap.png').exists()
    (cell,) = [d for d in os.listdir(axis) if d.startswith('clr')]
    assert json.loads((axis / cell / 'flags.json').read_text())['hparams'][name] == value
  best = json.loads((root / 'grid_emnist_local_gc' / 'best.json').read_text())
  assert best['local_gc_layers'] in ('all', 'feature')
  assert f' --local_gc_layers={best["local_gc_layers"]} ' in text_out.splitlines()[-1]
  assert ' --center_vectors ' in bool_out.splitlines()[-1]
  code, out, err = refused
  assert code == exit_status.BAD_INPUT and out == '', err
  assert '--algo=fedrkmgc has no server learning rate' in _one_error_line(err, 'grid_search')
  assert sorted(os.listdir(root)) == ['grid_emnist_fedzmg', 'grid_emnist_local_gc']
  _assert_left_clean(tmp_path)


# 7. Every flag checked before any work; --help exits 0.


# One path parses every program's flags (launch.cli.failures.run_program); these cover a
# module's own program, a package's (reproduce), and each way run_program is called.
_HELP_PROGRAMS = ('train', 'reproduce', 'memory_benchmark', 'worker')


def test_bad_flags_are_refused_before_any_work_and_help_exits_0(tmp_path):
  """7: each used to fail after the work (49 s; the whole run, its JSON lost), or exit 1
  with an empty stderr; absl's --help exits 1, which docs/operations.md calls a bug."""
  cases = [
      (('benchmark', '--repeats=0'), '--repeats=0: 0 is not a positive integer'),
      (('benchmark', f'--output={tmp_path}'), 'is a folder; give the path of a file'),
      (('benchmark', '--scaling_algo=nope'), "Unknown algorithm 'nope'"),
      (('benchmark', '--in_process_devices=/device:GPU:9'),
       '--in_process_devices: /device:GPU:9 is not a device of this process'),
      (('check_devices', '--devices=/device:GPU:7'),
       '--devices: /device:GPU:7 is not a device of this process'),
      (('check_devices', '--tolerance=-1'), '--tolerance=-1: -1.0 is not a non-negative'),
      (('memory_benchmark', '--stores=floppy'), "--stores must name stores of ['disk',"),
      (('memory_benchmark', '--task=nope'), "--task must be one of ['emnist',"),
      # Planned 81 cells before it refused; reproduce's dry run took 0 as 1.
      (('grid_search', '--algo=fedavg', '--parallel=0'), '--parallel=0: 0 is not a positive'),
      (('train', '--task=emnist'), 'give --algo, or --client_rule with --server_rule'),
  ]
  results = _run_side_by_side([command for command, _ in cases], tmp_path)
  for (command, message), (code, out, err) in zip(cases, results):
    assert code == exit_status.BAD_INPUT, (command, err)
    assert message in _one_error_line(err, command[0]), (command, err)
    assert out == '', (command, out)
  helps = _run_side_by_side([(program, '--help') for program in _HELP_PROGRAMS], tmp_path)
  for program, (code, out, err) in zip(_HELP_PROGRAMS, helps):
    assert code == 0 and err == '' and 'Try --helpfull' in out, (program, code, err)
  assert sorted(os.listdir(tmp_path)) == ['home', 'tmp']
  _assert_left_clean(tmp_path, refused=True)


# 8. The smaller cases.


def test_a_cohort_above_the_population_is_said_and_recorded(finished_run):
  """8: --clients_per_round=8 of 6 clients used to be capped without a word."""
  run_dir, out = finished_run
  assert 'clients_per_round: 8 asked, but the data has 6 training clients' in out
  (session,) = analysis.runs.read_runtime(str(run_dir))
  assert list(session['client_devices'].values()) == [_TRAIN_CLIENTS]


def test_collect_only_names_runs_trained_with_other_hyperparameters(finished_run, tmp_path):
  """8: `compare --collect_only` used to mix them in without a word."""
  run_dir = finished_run[0]
  before = _tree(run_dir)
  report = tmp_path / 'report'
  code, out, err = _run('compare', f'--root_output_dir={run_dir.parent}', '--task=emnist',
                        '--algos=fedavg', '--seeds=0', '--collect_only',
                        '--client_learning_rate=0.5', f'--report_dir={report}',
                        tmp_path=tmp_path)
  # The run trained at fedavg's default rates, which issue 32's warning names on stderr.
  assert code == 0 and err.startswith('compare: warning: the learning rates of fedavg'), err
  assert len(err.splitlines()) == 1, err
  assert 'was trained with other hyperparameters than asked (client_learning_rate:' in out
  assert 'other hyperparameters than asked' in (report / 'report.md').read_text()
  assert _tree(run_dir) == before
  _assert_left_clean(tmp_path)


def test_a_lost_memory_snapshot_resumes_from_the_checkpoint_before(
    cache_dir, tmp_path, run_program):
  """8: the newest checkpoint without its client-state snapshot used to offer only
  --overwrite; it is set aside and the previous one resumes."""
  root = tmp_path / 'runs'
  args = _train_args(cache_dir, root, '--algo=scaffold', '--client_state_store=memory')
  # The run to damage, in this process; the resume is the case, in a real process whose
  # leftovers are checked.
  code, out, err = run_program(train, *args, '--total_rounds=2')
  assert code == 0 and err == '', err
  run_dir = root / 'emnist_scaffold_seed0'
  os.remove(run_dir / 'client_states' / 'snapshot-00000002.npz')
  code, out, err = _run('train', *args, '--total_rounds=3', tmp_path=tmp_path)
  assert code == 0 and err == '', err
  assert 'checkpoint of round 2 cannot be read' in out and 'resuming from round 1' in out
  assert 'round 2/3' in out and 'round 3/3' in out
  assert 'unreadable_program_state_2' in os.listdir(run_dir / 'checkpoints')
  assert [s['rounds'] for s in analysis.runs.read_runtime(str(run_dir))] == [[1, 2], [2, 3]]
  _assert_left_clean(tmp_path)


def test_reproduces_dry_run_trains_only_the_timing_runs_its_help_names(
    tmp_path, run_program, children_tmp):
  """8: `reproduce --dry_run` trained where its help said it trains nothing: its help now
  names the timing runs, and they are all it trains (once; a second dry run reuses them)."""
  helpfull = _start('reproduce', '--helpfull', tmp_path=tmp_path)  # Beside the dry runs.
  root = tmp_path / 'root'
  args = ('--paper=fedzmg', '--table=5', '--scale=ci', '--data_source=synthetic',
          '--dry_run', f'--root_output_dir={root}', f'--cache_dir={tmp_path / "data"}')
  # The dry runs in this process; the timing runs train in a warm slot process, with
  # the test's TMPDIR.
  code, out, err = run_program(reproduce, *args)
  assert code == 0 and err == '', err
  timed = [l for l in out.splitlines() if l.startswith('dry run: timing 3 rounds of')]
  plan = root / 'reproduce_fedzmg_ci'
  assert os.listdir(plan) == ['dry_run']  # No grid/ nor runs/: none of the plan's runs.
  runs = [d for d in os.listdir(plan / 'dry_run') if d.startswith('emnist-')]
  # FedZMG's client rule, and plain SGD's: each timed by three runs in turn in a warm slot.
  assert len(timed) == 2 and len(runs) == 3 * len(timed)
  before = _tree(root)
  code, out, err = run_program(reproduce, *args)
  assert code == 0 and err == '' and 'dry run: timing' not in out, err
  assert _tree(root) == before
  code, out, err = _finish(helpfull)
  assert code == 0 and 'only three 3-round timing runs of each kind of run' in ' '.join(
      out.split()), err
  _assert_left_clean(tmp_path)


# 9. Quiet imports; no leftovers of killed programs.


def test_importing_the_packages_prints_nothing_even_at_exit(tmp_path):
  """9: TensorFlow's C++ start-up lines, and TFF's "Exception ignored in
  ServiceManager.__del__" at exit, for each package alone (the README's example:
  tests/test_readme.py)."""
  results = _run_side_by_side(
      [(None, '-c', f'import {package}') for package in ('tasks', 'tff_zmg')], tmp_path)
  for code, out, err in results:
    assert code == 0 and out == '' and err == '', err


def test_bootstrap_filters_only_the_expected_pip_conflicts():
  """9: a successful bootstrap printed pip's "ERROR: ... dependency conflicts"."""
  pip_output = '\n'.join([
      "ERROR: pip's dependency resolver does not currently take into account all the"
      ' packages that are installed.',
      'tensorflow-federated 0.87.0 requires jax==0.4.14, but you have jax 0.4.13 which is'
      ' incompatible.',
      'google-vizier 0.1.11 requires grpcio-tools, which is not installed.',
      'Successfully installed x'])
  awk = subprocess.run(['awk', '-f', 'scripts/expected_pip_conflicts.awk'], cwd=_REPO,
                       input=pip_output, capture_output=True, text=True, check=True)
  lines = awk.stdout.splitlines()
  assert lines[0] == 'Successfully installed x' and len(lines) == 2
  assert lines[1].startswith('bootstrap: pip reports 2 dependency conflict(s) of the pins')
  other = "ERROR: pip's dependency resolver ...\nfoo 1.0 requires bar<2, but you have bar 3."
  awk = subprocess.run(['awk', '-f', 'scripts/expected_pip_conflicts.awk'], cwd=_REPO,
                       input=other, capture_output=True, text=True, check=True)
  assert awk.stdout.splitlines() == other.splitlines()  # Any other conflict stays.
  with open(os.path.join(_REPO, 'scripts', 'bootstrap.sh')) as f:
    assert f.read().count('quiet_conflicts "${pip[@]}" install') >= 3


def _free_port():
  with socket.socket() as s:
    s.bind(('', 0))
    return s.getsockname()[1]


def test_a_killed_workers_log_is_removed_by_the_next_program(tmp_path):
  """9: a SIGKILLed `launch.worker` left its log in $TMPDIR for ever."""
  worker = _start('worker', f'--port={_free_port()}', tmp_path=tmp_path)
  try:
    assert 'serving on' in worker.stdout.readline()
    (private,) = os.listdir(tmp_path / 'tmp')  # Its temporary folder, with the log.
    assert os.listdir(tmp_path / 'tmp' / private)
  finally:
    worker.send_signal(signal.SIGKILL)
    worker.communicate()
  code, _, err = _run('worker', '--port=0', tmp_path=tmp_path)
  assert code == exit_status.BAD_INPUT and '--port must be in' in err, err
  _assert_left_clean(tmp_path, killed=True)


def test_the_log_a_workers_error_names_outlives_the_next_program_and_worker(
    tmp_path, monkeypatch):
  """The log `launch.worker` names when its worker_binary ends by itself is moved out of
  the program's temporary folder and no longer carries its owner's pid, so that neither
  the next program nor the next worker started in that folder removes it."""
  worker = _start('worker', f'--port={_free_port()}', tmp_path=tmp_path)
  try:
    assert 'serving on' in worker.stdout.readline()
    (binary,) = [p for p in psutil.Process(worker.pid).children()
                 if 'worker_binary' in ' '.join(p.cmdline())]
    binary.kill()
    code, _, err = _finish(worker)
  finally:
    if worker.poll() is None:
      worker.kill()
  assert code == exit_status.WORKER_LOST, err
  line = _one_error_line(err, 'worker')
  log = re.search(r'its log (\S+) ends with', line).group(1)
  assert os.path.dirname(log) == str(tmp_path / 'tmp') and os.path.isfile(log), line
  code, _, err = _run('worker', '--port=0', tmp_path=tmp_path)  # The next program.
  assert code == exit_status.BAD_INPUT, err
  monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path / 'tmp'))
  nextone = cpp_worker.LocalWorker()  # The next worker there, of a notebook say.
  nextone.stub()
  nextone.stop()
  assert os.listdir(tmp_path / 'tmp') == [os.path.basename(log)]


def test_an_abandoned_synthetic_data_file_is_removed_by_the_next_writer(tmp_path):
  """9: a SIGKILL during synthetic-data generation left a 0-byte
  .emnist_all.sqlite.*.tmp for ever; a user's other .tmp file stays."""
  data = tmp_path / 'data'

  def generate(clients):
    return _start(None, '-c', (
        'from tasks import synthetic; synthetic.write_synthetic_sqlite("emnist",'
        f' "{data}/emnist_all.sqlite", num_train_clients={clients}, num_test_clients=1,'
        ' mean_examples_per_client=5)'), tmp_path=tmp_path)

  generator = generate(3000)
  try:
    deadline = time.monotonic() + _TIMEOUT_S
    while time.monotonic() < deadline:
      if data.exists() and any(n.endswith('.tmp') for n in os.listdir(data)):
        break
      time.sleep(0.1)
  finally:
    generator.send_signal(signal.SIGKILL)
    generator.communicate()
  abandoned = os.listdir(data)
  assert abandoned and all('.tmp' in n for n in abandoned), abandoned
  (data / 'notes.sqlite.tmp').write_text("a user's")  # Another prefix: not ours.
  code, out, err = _finish(generate(3))
  assert code == 0 and err == '', err
  assert sorted(os.listdir(data)) == ['emnist_all.sqlite', 'notes.sqlite.tmp'], abandoned
