"""The training program end to end, through its real `main`, on small synthetic data."""

import asyncio
import collections
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.parse

from absl import flags
import numpy as np
import pytest
import tensorflow as tf

from launch.run import resumption
from launch.run import rounds
from launch.run import run_config
from launch.run import runtime_choice
from launch.run import settings as run_settings
from tff_zmg.algorithms import registry
from tff_zmg import analysis
from tff_zmg.client_states import state_file
from tff_zmg.runtime import cpp_worker
from tff_zmg.runtime import gpu_diagnosis
from tff_zmg.templates import hparams as hparams_lib
import small_runs
import worker_processes

_SMALL = small_runs.FLAGS
_TIME_COLUMNS = ('training_time_in_seconds', 'evaluation/evaluation_time_in_seconds')


CORES = os.cpu_count()


def _cores_shared_by(clients_at_once):
  """The rule: each client run at once gets an equal share of the cores, at least one."""
  return max(1, CORES // clients_at_once)


def _worker_binaries():
  """The pids of TFF worker_binary processes this process started, now or ever."""
  return worker_processes.worker_pids(live=False) | set(cpp_worker.started_worker_pids())


def _rows(path):
  with open(path, newline='') as f:
    return list(csv.DictReader(f))


def _without_times(rows):
  return [{k: v for k, v in r.items() if k not in _TIME_COLUMNS} for r in rows]


def _assert_same_metrics(a, b):
  """Same rounds and columns, values equal to float32 rounding.

  Runs in different processes may sum in another thread order (TF's multi-threaded
  kernels), which moves the last bits of a float32 metric; nothing else may differ.
  """
  a, b = _without_times(a), _without_times(b)
  assert [sorted(r) for r in a] == [sorted(r) for r in b]
  for ra, rb in zip(a, b):
    for k in ra:
      if ra[k] == '' or rb[k] == '':
        assert ra[k] == rb[k], k
      else:
        np.testing.assert_allclose(float(ra[k]), float(rb[k]), rtol=1e-5, err_msg=k)


# TFF's worker against the in-process runtime. After round 1 they differ by float32
# round-off: at most 3.1e-7 on the matrix's runs (FedGPS on CIFAR-100). Round 2 starts
# from weights that differ by that much, and a max-pool window whose two largest inputs
# lie within round-off may pick the other one, which moves a conv layer's gradient by a
# step: after round 2, conv weights and FedGPS's states differ by up to 3.4e-3 of their
# norm (measured), and by 3.1e-7 in the runs where no such tie flips. A wrong mask,
# client or weighting moves them by their own size.
_ROUND_1_ATOL = 1e-6
_ROUND_2_RTOL = 1e-2


def _assert_close_in_norm(a, b, err_msg=''):
  difference, size = np.linalg.norm(b - a), np.linalg.norm(a)
  assert difference <= _ROUND_2_RTOL * size + _ROUND_1_ATOL, (
      f'{err_msg} {np.shape(a)}: |difference| {difference:.3g}, |array| {size:.3g}')


RECORDED_DEFAULTS = {
    'fedzmg': dict(client_learning_rate=0.01, server_learning_rate=1.0, client_momentum=0.9,
                   weight_decay=1e-4, center_vectors=False),
    'fedrkmgc': dict(client_learning_rate=0.01, client_momentum=0.8, beta=0.03, gamma=500.0,
                     rho=1.5, km_clock='global', allow_unsafe_relaxation=False),
}


@pytest.mark.parametrize(
    'task, algo, extra',
    [
        ('emnist', 'fedzmg', ['--runtime=tff_worker']),
        ('emnist', 'fedzmg', []),  # The default on the CPU: in process.
        # FedRKMGC's stateful clients on the other two tasks (EMNIST: the resume test).
        # Evaluating every 5 rounds still evaluates the last (round 2).
        ('cifar100', 'fedrkmgc', ['--rounds_per_eval=5']),
        # Two snippets a client, one of them a round (the cap binds): the GRU's rounds
        # cost seconds each.
        ('shakespeare', 'fedrkmgc',
         ['--synthetic_examples_per_client=2', '--max_elements_per_client=1',
          '--client_state_store=memory']),
    ],
)
def test_training_writes_flags_metrics_tensorboard_and_checkpoints(
    run_main, tmp_path, task, algo, extra
):
  workers_before = _worker_binaries()
  rc, out, err = run_main(f'--task={task}', f'--algo={algo}', '--total_rounds=2', *extra)
  assert rc == 0, err
  if '--runtime=tff_worker' not in extra:  # Not one worker_binary started, even for a moment.
    assert _worker_binaries() == workers_before
  exp = tmp_path / f'{task}_{algo}_seed0'
  rows = _rows(exp / 'metrics.csv')
  assert [int(r['key']) for r in rows] == [0, 1, 2]  # Round 0 evaluates the start.
  for r in rows[1:]:
    assert np.isfinite(float(r['client_work/train/loss']))
  evaluated = [int(r['key']) for r in rows if r['evaluation/sparse_categorical_accuracy']]
  assert evaluated == ([0, 2] if '--rounds_per_eval=5' in extra else [0, 1, 2])
  for r in rows:
    if r['evaluation/sparse_categorical_accuracy']:
      assert 0.0 <= float(r['evaluation/sparse_categorical_accuracy']) <= 1.0
  summary = __import__('json').loads(out.split('summary: ')[1])
  assert summary['final_eval_accuracy'] == float(rows[2]['evaluation/sparse_categorical_accuracy'])
  assert os.listdir(exp / 'tensorboard')
  assert any(n.startswith('program_state_2') for n in os.listdir(exp / 'checkpoints'))
  assert 'round 2/2' in out and 'rounds/s' in out and 'summary:' in out
  recorded = __import__('json').loads((exp / 'flags.json').read_text())
  assert recorded['task'] == task and recorded['algo'] == algo
  # Every hyperparameter it trained with, though none was given (specification.md s. 2).
  assert recorded['hparams'] == RECORDED_DEFAULTS[algo]
  if algo == 'fedrkmgc':  # The sampled clients' states are kept with the run.
    assert os.listdir(exp / 'client_states')
  # Where the clients ran: read from the computed tensors in process, never the flag.
  (runtime,) = analysis.runs.read_runtime(str(exp))  # One session, of rounds 1-2.
  assert runtime['rounds'] == [1, 2]
  if '--runtime=tff_worker' not in extra:
    assert runtime['runtime'] == 'in_process'
    (device, count), = runtime['client_devices'].items()
    # 2 rounds of 3 clients; the evaluation is no client computation.
    assert device.endswith('/device:CPU:0') and count == 2 * 3
  else:
    assert runtime['runtime'] == 'tff_worker'
    assert list(runtime['client_devices']) == [
        "CPU of TFF's local worker_binary (a build without CUDA)"
    ]
  assert runtime['evaluation']['device'].endswith('/device:CPU:0')
  assert runtime['evaluation']['covered'].startswith('global: ')
  assert 'GPU' not in out


# In process: the runtime is not what these tests are about, and it starts faster.
_FEDAVG_ARGS = ('--task=emnist', '--algo=fedavg', '--total_rounds=1', '--seed=5',
                '--runtime=in_process')


def _one_line(err):
  lines = err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('train: error: '), err
  return lines[0]


def _fedavg_run(run_main, tmp_path_factory):
  """The folder of a finished run of `_FEDAVG_ARGS` in this process, trained by the first
  test that asks; tests copy it (`shutil.copytree`) and compare with it, never change it."""

  def train():
    root = tmp_path_factory.mktemp('fedavg')
    rc, _, err = run_main(*_FEDAVG_ARGS, root=root)
    assert rc == 0, err
    return root / 'emnist_fedavg_seed5'

  return small_runs.made_once(('test_train', 'fedavg'), train)


def _latest_client_states(experiment_dir):
  """{client id: the arrays of its latest state file} of a run's disk store."""
  root = experiment_dir / 'client_states' / 'clients'
  states = {}
  for client in sorted(os.listdir(root)):
    latest = max(os.listdir(root / client))
    states[client] = (latest, state_file.load(str(root / client / latest)))
  return states


def _server_state(experiment_dir, version):
  """The leaves of checkpoint `version`'s server state (model, optimizers, shared)."""
  module = tf.saved_model.load(str(experiment_dir / 'checkpoints' / f'program_state_{version}'))
  return [np.asarray(v) for v in tf.nest.flatten(module())]


# SCAFFOLD's kill -9 and resume in process is tests/test_remote_workers.py's (its rounds
# run in process there, the clients' work on two workers), a DP run's is
# tests/test_aggregation_launch.py's: here FedRKMGC, killed once in each runtime.
def test_killed_runs_resume_to_the_uninterrupted_result(
    run_main, tmp_path, tmp_path_factory, synthetic_cache_dir
):
  """One run killed with SIGKILL twice, once in each runtime, each kill resumed by a real
  process of the other runtime: in TFF's worker, killed after round 3, resumed in process
  from checkpoint 2; that process killed after round 5, resumed in the worker from
  checkpoint 4. It ends where an uninterrupted run ends. (A killed and a resumed process
  per runtime, as two tests, took five processes; this chain takes four.)"""
  algo = 'fedrkmgc'
  # Stateful clients (FedRKMGC's corrections, SCAFFOLD's control variates c_i and the
  # server's c), so that the clients' and the server's states must resume exactly too.
  # Checkpoints every 2 rounds: each kill after an odd round leaves states of that round
  # that no checkpoint has, which the resumed run must discard and recompute.
  args = ['--task=emnist', f'--algo={algo}', '--total_rounds=6', '--rounds_per_checkpoint=2']
  def command(root, runtime):
    return [sys.executable, '-m', 'launch.train', f'--cache_dir={synthetic_cache_dir}',
            f'--root_output_dir={root}', *_SMALL, *args, f'--runtime={runtime}']

  # The uninterrupted run, in process (it starts sooner): the runtimes agree to 1e-6, so
  # the resumed run must end where it ends. In a fresh process, as the killed runs:
  # TensorFlow's threads per op are set there (this test process's are whatever its first
  # test left), and the evaluation's batches of 100 sum in another order with other
  # threads (4.6e-5 on this model's loss).
  whole_root = tmp_path_factory.mktemp('uninterrupted')
  whole = subprocess.run(command(whole_root, 'in_process'), capture_output=True, text=True,
                         cwd=small_runs.REPO, timeout=600)
  assert whole.returncode == 0, whole.stderr
  whole_dir = whole_root / f'emnist_{algo}_seed0'
  killed_dir = tmp_path / 'killed' / f'emnist_{algo}_seed0'
  for runtime, kill_after in (('tff_worker', 3), ('in_process', 5)):
    lines = small_runs.kill_when(command(tmp_path / 'killed', runtime),
                                 f'round {kill_after}/6')
    # Cores // clients at once threads per op in either runtime (in process set before
    # TensorFlow started, which only a fresh process allows).
    threads = _cores_shared_by(min(3, CORES) if runtime == 'in_process' else 3)
    runtime_line, = [l for l in lines if l.startswith('runtime:')]
    assert f'{threads} thread{"s" if threads > 1 else ""} per TF op' in runtime_line
    if kill_after == 5:  # Resumed the kill after round 3 from checkpoint 2.
      assert any(l.startswith('round 3/6') for l in lines)
      assert not any(l.startswith('round 2/6') for l in lines)
    assert max(int(r['key']) for r in _rows(killed_dir / 'metrics.csv')) <= kill_after
    # Round `kill_after` wrote its clients' states, but no checkpoint holds them.
    assert any(version == f'0000000{kill_after}.tfstate'
               for version, _ in _latest_client_states(killed_dir).values())
  resumed = subprocess.run(command(tmp_path / 'killed', 'tff_worker'), capture_output=True,
                           text=True, cwd=small_runs.REPO, timeout=600)
  assert resumed.returncode == 0, resumed.stderr
  out = resumed.stdout
  assert 'round 5/6' in out and 'round 4/6' not in out  # Resumed from checkpoint 4.
  _assert_same_metrics(_rows(killed_dir / 'metrics.csv'), _rows(whole_dir / 'metrics.csv'))
  for a, b in zip(_server_state(whole_dir, 6), _server_state(killed_dir, 6), strict=True):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)
  whole_states = _latest_client_states(whole_dir)
  resumed_states = _latest_client_states(killed_dir)
  assert sorted(whole_states) == sorted(resumed_states)
  for client, (version, arrays) in whole_states.items():
    resumed_version, resumed_arrays = resumed_states[client]
    assert resumed_version == version, client
    for a, b in zip(arrays, resumed_arrays):
      np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7, err_msg=client)
  # Each kept checkpoint (the first and the last two) lists the state versions it needs:
  # the last one, every client's latest.
  index_dir = killed_dir / 'client_states' / 'index'
  assert sorted(os.listdir(index_dir)) == ['00000000.json', '00000004.json', '00000006.json']
  needed = __import__('json').loads((index_dir / '00000006.json').read_text())
  assert needed == {urllib.parse.unquote(c): int(v[:8]) for c, (v, _) in resumed_states.items()}
  # A state file that checkpoint 6 needs, deleted: resuming names it, never falls back to
  # that client's older state.
  client, (version, _) = sorted(resumed_states.items())[0]
  os.remove(killed_dir / 'client_states' / 'clients' / client / version)
  rc, out, err = run_main(*args[:2], '--total_rounds=7', *args[3:], '--runtime=tff_worker',
                          root=tmp_path / 'killed')
  assert rc == 2 and 'round 7/7' not in out
  assert f'{client}/{version} is missing: checkpoint 6 needs' in err
  assert len(err.strip().splitlines()) == 1


# The guarantees on every row of `small_runs.MATRIX` (each family of algorithm, each kind of
# model of the tests), each row's uninterrupted `launch.train` run their reference
# (`small_runs.reference_run`, trained once in the session). Here: the same command twice,
# a killed run resumed, one client at a time, TFF's worker (which runs each row's graphs
# its own way: a stateless algorithm's plain round, dropout masks drawn in every step,
# clients' states read and written around the round, a recurrent model with an adaptive
# server). A warm, a batched and a Ray cell of each row: tests/test_warm_slots.py and
# tests/test_ray_slots.py.
_ROWS = list(small_runs.MATRIX)
_RERUNS = {
    'same': (),  # The reference's command.
    'killed': (),  # The same, SIGKILLed once round 1 is reported, resumed here.
    'one_at_a_time': ('--max_concurrent_clients=1',),
    'worker': ('--runtime=tff_worker',),
}


def _reruns(row, tmp_path_factory) -> dict:
  """Runs of `row` (`_RERUNS`), every row's made at once: each row's 'killed' run
  started by `python -m launch.train` and SIGKILLed once round 1 is reported; then one
  fresh Python, a warm slot (`launch.sweeps.warm_slot`), trains every row's runs, row
  by row, in this order: 'same', built from scratch as `launch.train` builds it (no row
  shares a task, process or evaluation with another); 'killed', resumed as a sweep
  resumes a cell; then the others. Those after a row's first train what it built (the
  warm slot keeps it), at its threads per TF op (`launch.train` alone would give one
  client at a time every core); each row's at its own run's (two clients a round
  everywhere). One warm slot, not one a row: each costs its imports. Their folders by
  row and name, made once in this test process."""

  def train():
    root = tmp_path_factory.mktemp('reruns')
    requests = []
    for each in _ROWS:
      killed = small_runs.kill_when(
          small_runs.train_command(small_runs.matrix_args(each, root / each, 'killed')),
          'round 1/2')
      assert killed[-1].startswith('round 1/2'), (each, killed)
      requests += [
          small_runs.cell_request(f'{each}/{name}',
                                  small_runs.matrix_args(each, root / each, name, *flags_),
                                  str(root / each / f'{name}.log'))
          for name, flags_ in _RERUNS.items()]
    proc = subprocess.run([sys.executable, '-m', 'launch.sweeps.warm_slot'],
                          input=''.join(json.dumps(r) + '\n' for r in requests),
                          capture_output=True, text=True, cwd=small_runs.REPO, timeout=3600)
    answers = [json.loads(line) for line in proc.stdout.splitlines()[1:]]
    assert [(a['name'], a['status']) for a in answers] == [(r['name'], 0) for r in requests], (
        proc.stderr + ''.join(open(r['log']).read() for r in requests if os.path.exists(r['log'])))
    return {each: {name: root / each / name for name in _RERUNS} for each in _ROWS}

  return small_runs.made_once(('test_train', 'reruns'), train)[row]


def _threads_per_op(run_dir) -> int:
  with open(os.path.join(run_dir, 'runtime.json')) as f:
    sessions = json.load(f)['sessions']
  return sessions[-1]['intra_op_threads']


@pytest.mark.parametrize('row', _ROWS)
def test_the_same_command_twice_gives_the_same_numbers(row, tmp_path_factory):
  """Bit for bit: every metric but times, the last checkpoint, every client's state."""
  reference = small_runs.reference_run(row)
  small_runs.assert_same_run(_reruns(row, tmp_path_factory)['same'], reference)


@pytest.mark.parametrize('row', _ROWS)
def test_a_run_killed_mid_way_resumes_to_its_uninterrupted_run_bit_for_bit(
    row, tmp_path_factory):
  """SIGKILLed once round 1 is reported (its checkpoint saved or not, its clients' states
  written), then resumed (in a warm slot, as a sweep resumes a cell; tests/test_train.py's
  FedRKMGC and tests/test_aggregation_launch.py's DP run resume by `launch.train`)."""
  reference = small_runs.reference_run(row)
  killed = _reruns(row, tmp_path_factory)['killed']
  log = open(f'{killed}.log').read()
  assert 'round 2/2' in log and 'round 0/2' not in log  # Resumed, not started afresh.
  # From the newest checkpoint the kill left: each is renamed into place whole, after the
  # client states it needs, so none is set aside as unreadable. (The kill lands before
  # round 1's checkpoint here: the unreadable ones of FedGPS, 6adc1ac, were found by
  # test_failures' stop between clients, which resumes from round 1.)
  assert 'cannot be read' not in log, log
  small_runs.assert_same_run(killed, reference)


@pytest.mark.parametrize('row', _ROWS)
def test_one_client_at_a_time_gives_the_numbers_of_clients_at_once(row, tmp_path_factory):
  """In process, two clients at once (the default on two cores or more) and one: bit for
  bit at the same threads per TF op (each client's steps are the same ops; the round adds
  the clients' updates in client order)."""
  reference = small_runs.reference_run(row)
  alone = _reruns(row, tmp_path_factory)['one_at_a_time']
  assert '(1 client at once per device,' in open(f'{alone}.log').read()
  assert _threads_per_op(alone) == _threads_per_op(reference)
  small_runs.assert_same_run(alone, reference)


@pytest.mark.parametrize('row', _ROWS)
def test_tffs_worker_gives_the_numbers_of_the_in_process_runtime(row, tmp_path_factory):
  """At the same threads per TF op, to float32 round-off (`_ROUND_1_ATOL`,
  `_ROUND_2_RTOL`): TFF's worker runs the round's graphs itself (optimized its way, the
  clients' updates summed in its own order)."""
  reference = small_runs.reference_run(row)
  worker = _reruns(row, tmp_path_factory)['worker']
  assert _threads_per_op(worker) == _threads_per_op(reference)
  _assert_same_metrics(small_runs.metric_rows(worker), small_runs.metric_rows(reference))
  for a, b in zip(small_runs.checkpoint_arrays(reference, 1),
                  small_runs.checkpoint_arrays(worker, 1), strict=True):
    np.testing.assert_allclose(b, a, rtol=0, atol=_ROUND_1_ATOL)
  for a, b in zip(small_runs.final_checkpoint(reference), small_runs.final_checkpoint(worker),
                  strict=True):
    _assert_close_in_norm(a, b)
  theirs = small_runs.client_states(reference)
  ours = small_runs.client_states(worker)
  assert ours.keys() == theirs.keys()
  for client, (version, arrays) in theirs.items():
    assert ours[client][0] == version
    for a, b in zip(arrays, ours[client][1], strict=True):
      _assert_close_in_norm(a, b, err_msg=client)


@pytest.mark.parametrize(
    'algo, runtime, extra, reason',
    [
        # FedAvg's weights blow up while its training loss is still finite: its
        # evaluation is what shows it first.
        ('fedavg', 'tff_worker', [], 'evaluation loss nan'),
        ('fedavg', 'in_process', [], 'evaluation loss nan'),
        # FedRKMGC drops each non-finite update and keeps its loss finite: without an
        # evaluation in that round, every client dropped is what shows it.
        ('fedrkmgc', 'in_process', ['--rounds_per_eval=10'],
         "3 of 3 clients' updates were not finite"),
    ],
)
def test_absurd_learning_rate_stops_in_the_round_it_diverges_and_saves_nothing_of_it(
    run_main, synthetic_cache_dir, tmp_path, algo, runtime, extra, reason
):
  args = [
      '--task=emnist', f'--algo={algo}', '--total_rounds=4', '--client_learning_rate=1e6',
      f'--runtime={runtime}', *extra,
      '--divergence_factor=inf',  # The non-finite cases (tests/test_trust.py: the limit).
  ]

  def train():
    if runtime == 'tff_worker':
      # A real process: its exit status, and its one line with TFF's worker stopped at
      # exit (tests/test_trust.py's diverging runs are real processes of the in-process
      # runtime); the other cases in this process.
      proc = subprocess.run(
          [sys.executable, '-m', 'launch.train', f'--cache_dir={synthetic_cache_dir}',
           f'--root_output_dir={tmp_path}', *_SMALL, *args],
          capture_output=True, text=True, cwd=small_runs.REPO, stdin=subprocess.DEVNULL,
          timeout=600)
      rc, out, err = proc.returncode, proc.stdout, proc.stderr
    else:
      rc, out, err = run_main(*args)
    assert rc == 3, err
    assert len(err.strip().splitlines()) == 1 and 'Traceback' not in err, err
    assert err.startswith('train: error: training diverged in round ') and '--overwrite' in err
    return out, err

  out, err = train()
  diverged = int(re.search(r'diverged in round (\d+): ', err).group(1))
  assert f'diverged in round {diverged}: {reason}' in err
  assert f'round {diverged}/4' not in out and 'summary:' not in out
  # Nothing of the diverged round is written, and every round written was finite.
  exp = tmp_path / f'emnist_{algo}_seed0'
  rows = _rows(exp / 'metrics.csv')
  assert [int(r['key']) for r in rows] == list(range(diverged))
  assert all(np.isfinite(float(r['evaluation/loss'])) for r in rows if r['evaluation/loss'])
  saved = sorted(int(n.split('_')[-1]) for n in os.listdir(exp / 'checkpoints')
                 if n.startswith('program_state_'))
  assert saved and saved[-1] == diverged - 1
  if runtime == 'in_process' and algo == 'fedavg':
    # The kept checkpoint resumes: the same command goes on from it (and, deterministic,
    # diverges in the same round again).
    out, err = train()
    assert f'round {diverged - 1}/4' not in out
    assert f'diverged in round {diverged}: {reason}' in err


def test_divergence_is_judged_on_everything_a_round_reports():
  finite = {'client_work/train/loss': 2.3, 'evaluation/loss': 2.4}
  assert rounds.divergence(finite) is None
  assert rounds.divergence({**finite, 'client_work/train/loss': float('inf')}) == (
      'training loss inf'
  )
  assert rounds.divergence({**finite, 'evaluation/loss': float('nan')}) == (
      'evaluation loss nan'
  )
  assert 'aggregated update' in rounds.divergence(
      {**finite, 'finalizer/update_non_finite': 1}
  )
  # Client works that drop non-finite updates: half dropped is a round, more is divergence.
  half = {**finite, 'client_work/clients': 4, 'client_work/non_finite_clients': 2}
  assert rounds.divergence(half) is None
  assert rounds.divergence({**half, 'client_work/non_finite_clients': 3}) == (
      "3 of 4 clients' updates were not finite"
  )
  state = collections.OrderedDict(
      global_model_weights=[np.ones(3, np.float32), np.array([1.0, np.inf])],
      round_num=np.int32(1),
  )
  assert rounds.non_finite_leaf(state) == 'global_model_weights/1'
  state['global_model_weights'][1][1] = 0.0
  assert rounds.non_finite_leaf(state) is None


@pytest.mark.parametrize(
    'args, message',
    [
        (['--task=emnist', '--algo=fedavg', '--client_learning_rate=-1'], 'client_learning_rate'),
        (['--task=emnist', '--algo=fedavg', '--total_rounds=0'], 'total_rounds'),
        (['--task=emnist', '--algo=fedavg', '--gc_lambda=0.5'], 'does not apply'),
        (['--task=emnist', '--algo=fedzmg', '--client_momentum=1.0'], 'momentum'),
        (['--task=emnist', '--algo=fedavg', '--intra_op_threads=-1'], 'intra_op_threads'),
        (['--task=emnist', '--algo=fedavg', '--max_elements_per_client=0'],
         'max_elements_per_client'),
        (['--task=emnist', '--algo=fedavg', '--max_elements_per_client=-3'],
         'max_elements_per_client'),
        (['--task=emnist', '--algo=fedavg', '--runtime=in_process', '--workers=hostA:8000'],
         'drop --workers'),
        (['--task=emnist', '--algo=fedavg', '--executor=gpu', '--workers=hostA:8000'],
         'no CUDA'),
        (['--task=emnist', '--algo=fedavg', '--executor=gpu', '--runtime=tff_worker'],
         'built without CUDA'),
        (['--task=emnist', '--algo=fedrkmgc', '--runtime=in_process', '--client_learning_rate=-1'],
         'client_learning_rate'),
        (['--task=emnist', '--algo=fedprox', '--proximal_strength=-0.1'],
         'proximal_strength must be >= 0, got -0.1'),
        (['--task=emnist', '--algo=fedyogi', '--yogi_epsilon=0'], 'yogi_epsilon must be > 0'),
        (['--task=emnist', '--algo=fedadagrad', '--adagrad_epsilon=-1e-6'],
         'adagrad_epsilon must be > 0'),
        (['--task=emnist', '--algo=scaffold', '--client_learning_rate=0'],
         'client_learning_rate must be > 0'),
        (['--task=emnist', '--algo=fedavg', '--proximal_strength=0.1'], 'does not apply'),
        (['--task=emnist', '--algo=fedavg', '--worker_timeout_s=2'],
         '--worker_timeout_s applies only with --workers'),
        # Issue 47: beyond int64 it failed where it became a tensor, naming no flag.
        (['--task=emnist', '--algo=fedavg', '--seed=18446744073709551616'],
         'seed must be an integer in [0, 9223372036854775807] (an int64), got'
         ' 18446744073709551616'),
        (['--task=emnist', '--algo=fedavg', '--client_learning_rate=1e39'],
         'client_learning_rate must be at most 3.40282e+38 in magnitude (a float32)'),
        (['--task=emnist', '--algo=fedavg', '--synthetic_dirichlet_alpha=1e300',
          '--data_source=synthetic'], 'dirichlet_alpha must be at most 3.40282e+38'),
        # A rule pair stands for --algo: both rules, and no --algo.
        (['--task=emnist', '--client_rule=zmg_sgdm'],
         'give --algo, or --client_rule with --server_rule; got --client_rule'),
        (['--task=emnist', '--algo=fedavg', '--server_rule=adam'],
         'give --algo, or --client_rule with --server_rule; got --algo and --server_rule'),
        (['--task=emnist', '--client_rule=sgd', '--server_rule=adam', '--proximal_strength=0.1'],
         '--proximal_strength does not apply to --algo=sgd+adam'),
        (['--task=emnist', '--client_rule=prox_sgd', '--server_rule=yogi', '--yogi_epsilon=0'],
         'yogi_epsilon must be > 0'),
    ],
)
def test_bad_values_end_with_one_line_and_write_nothing(run_main, tmp_path, args, message):
  rc, _, err = run_main(*args)
  assert rc == 2
  assert err.startswith('train: error:') and message in err
  assert len(err.strip().splitlines()) == 1
  assert not os.listdir(tmp_path)


def test_every_hyperparameter_has_a_flag_whose_help_says_its_range_and_defaults():
  """The flags are the registry's `Hparams` fields: one each, unset by default (the
  algorithm's default then applies), typed as the field, the help its text, its range
  and each algorithm's default (hand values for a few)."""
  fields = {}
  for name, spec in registry.ALGORITHMS.items():
    for field, info in hparams_lib.field_info(spec.hparams_class).items():
      fields.setdefault(field, {})[name] = (info, spec.defaults[field])
  assert set(run_settings._HPARAMS) == set(fields)  # pylint: disable=protected-access
  parsers = {float: 'FloatParser', int: 'IntegerParser', bool: 'BooleanParser',
             str: 'ArgumentParser'}
  for field, per_algo in fields.items():
    flag = flags.FLAGS[field]
    (kind, valid, text), _ = next(iter(per_algo.values()))
    assert flag.default is None and type(flag.parser).__name__ == parsers[kind], field
    assert text.rstrip('.') in flag.help and valid.text in flag.help, field
    for algo, (_, default) in per_algo.items():
      assert f'{algo}={default!r}' in flag.help or (
          f'Default: {default!r} (' in flag.help and algo in flag.help), (field, algo)
  assert 'Defaults: ' in flags.FLAGS['weight_decay'].help
  assert 'fedzmg=0.0001' in flags.FLAGS['weight_decay'].help
  assert 'local_gc=1e-05' in flags.FLAGS['weight_decay'].help
  assert 'fedrkmgc_raw=1.0' in flags.FLAGS['rho'].help
  assert 'in [0, 1)' in flags.FLAGS['client_momentum'].help


def test_missing_real_data_offline_is_one_clear_line(run_main, tmp_path):
  flags_args = ['--task=emnist', '--algo=fedavg', '--data_source=tff',
                f'--cache_dir={tmp_path / "empty"}']
  rc, _, err = run_main(*flags_args)
  assert rc == 2 and 'emnist_all.sqlite' in err and len(err.strip().splitlines()) == 1


def test_a_client_rule_with_a_server_rule_trains_as_the_algorithm_they_name(
    run_main, tmp_path):
  """--client_rule with --server_rule instead of --algo (specification.md section 4): the
  run is algorithm 'zmg_sgdm+adam', recorded with both rules' hyperparameters at their
  families' defaults, resumed by the same command, and its numbers are those of the named
  algorithm of the same rules and weighting (FedZMG-Adam) at the same rates."""
  pair = ('--task=emnist', '--client_rule=zmg_sgdm', '--server_rule=adam')
  rc, out, err = run_main(*pair, '--total_rounds=1')
  assert rc == 0, err
  run_dir = tmp_path / 'emnist_zmg_sgdm+adam_seed0'
  record = json.loads((run_dir / 'flags.json').read_text())
  assert record['algo'] == 'zmg_sgdm+adam'
  assert record['hparams'] == dict(registry.get('zmg_sgdm+adam').defaults)
  rc, out, err = run_main(*pair, '--total_rounds=2')
  assert rc == 0, err
  assert 'round 2/2' in out and 'round 1/2' not in out, out  # Resumed.
  named = dict(registry.get('zmg_sgdm+adam').defaults)
  rc, _, err = run_main('--task=emnist', '--algo=fedzmg_adam', '--total_rounds=2',
                        *[f'--{n}={named[n]}' for n in ('client_learning_rate',
                                                        'server_learning_rate')])
  assert rc == 0, err
  ours = _without_times(_rows(run_dir / 'metrics.csv'))
  assert ours == _without_times(_rows(tmp_path / 'emnist_fedzmg_adam_seed0' / 'metrics.csv'))
  assert len(ours) == 3


def test_an_older_record_reads_with_the_hyperparameters_it_trained_with():
  """A record that lists fewer hyperparameters than today's trained with the defaults of
  its day: FedAvg's, no momentum and no decay (today's too); GlobalGC's, no decay (today's
  default is the GC-Fed paper's 1e-5, so such a run resumes only with --weight_decay=0)."""
  fedavg = resumption.lasting_settings({'algo': 'fedavg', 'task': 'emnist', 'hparams': {}})
  assert fedavg['hparams'] == {'client_learning_rate': 0.1, 'server_learning_rate': 1.0,
                               'client_momentum': 0.0, 'weight_decay': 0.0}
  global_gc = resumption.lasting_settings(
      {'algo': 'global_gc', 'task': 'emnist', 'hparams': {'client_momentum': 0.9}})
  assert global_gc['hparams']['weight_decay'] == 0.0
  assert registry.get('global_gc').defaults['weight_decay'] == 1e-5


def test_resuming_with_other_settings_or_a_broken_checkpoint_is_refused(
    run_main, tmp_path, tmp_path_factory):
  """Ends with the same flags (and --overwrite) training the run again: the same flags give
  the same metrics (this run serves both checks; a run of its own cost one more)."""
  base = _FEDAVG_ARGS
  exp = tmp_path / 'emnist_fedavg_seed5'
  first = _fedavg_run(run_main, tmp_path_factory)
  a = _rows(first / 'metrics.csv')
  shutil.copytree(first, exp)  # A copied run resumes.
  # A run recorded before records listed every hyperparameter (`{}`: the defaults) is
  # the same run as the same command today; its record now lists them.
  flags_json = exp / 'flags.json'
  identity_json = exp / 'checkpoints' / 'run_identity.json'
  recorded, identity = (__import__('json').loads(p.read_text())
                        for p in (flags_json, identity_json))
  assert recorded['hparams'] == identity['settings']['hparams'] == {
      'client_learning_rate': 0.1, 'server_learning_rate': 1.0, 'client_momentum': 0.0,
      'weight_decay': 0.0}
  recorded['hparams'] = identity['settings']['hparams'] = {}
  flags_json.write_text(__import__('json').dumps(recorded))
  identity_json.write_text(__import__('json').dumps(identity))
  rc, _, err = run_main(*base)
  assert rc == 0, err
  assert __import__('json').loads(flags_json.read_text())['hparams'] == {
      'client_learning_rate': 0.1, 'server_learning_rate': 1.0, 'client_momentum': 0.0,
      'weight_decay': 0.0}
  rc, _, err = run_main(*base, '--client_learning_rate=0.5')
  assert rc == 2 and 'other settings' in err and '--overwrite' in err
  ckpt_dir = exp / 'checkpoints'
  for name in os.listdir(ckpt_dir):
    for root, _, files in os.walk(ckpt_dir / name):
      for f in files:
        with open(os.path.join(root, f), 'wb') as out:
          out.write(b'garbage')
  rc, _, err = run_main(*base)
  assert rc == 2 and 'checkpoint' in err and '--overwrite' in err
  # asyncio.run (a notebook cell, another test) leaves the thread without an event loop,
  # and TFF's training loop asks for one: training must still run.
  asyncio.run(asyncio.sleep(0))
  assert run_main(*base, '--overwrite')[0] == 0
  # The same flags give the same metrics.
  assert _without_times(a) == _without_times(_rows(exp / 'metrics.csv'))


def test_a_damaged_record_a_foreign_folder_and_a_read_only_root_are_called_what_they_are(
    run_main, tmp_path, tmp_path_factory):
  """Issue 47: the first said only `Expecting value: line 2 column 1 (char 4)`, the second
  'a run with other settings (~20 changes)', the third that /sys had 0.0 MiB free."""
  exp = tmp_path / 'runs' / 'emnist_fedavg_seed5'
  shutil.copytree(_fedavg_run(run_main, tmp_path_factory), exp)
  (exp / 'runtime.json').write_text('{\n')
  rc, out, err = run_main(*_FEDAVG_ARGS, '--total_rounds=2', root=tmp_path / 'runs')
  line = _one_line(err)
  assert rc == 2 and f'{exp / "runtime.json"} is damaged (not JSON' in line, err
  assert 'delete it' in line and 'round' not in out
  foreign = tmp_path / 'runs' / 'emnist_fedavg_seed6'
  foreign.mkdir()
  (foreign / 'metrics.csv').write_text('step,lr\n1,0.1\n')
  (foreign / 'flags.json').write_text('{"lr": 0.1, "batch": 32}')
  rc, _, err = run_main(*_FEDAVG_ARGS, '--seed=6', root=tmp_path / 'runs')
  assert rc == 2 and 'is not the record of a launch.train run' in _one_line(err), err
  assert 'other settings' not in err
  rc, _, err = run_main(*_FEDAVG_ARGS, root='/sys/tff_zmg_runs')
  assert rc == 5 and 'is read-only' in _one_line(err) and 'MiB free' not in err, err


# An unknown task on the command line (a real process, exit status 2, the tasks it knows
# listed): tests/test_failures.py's first bad input, the same command.


def test_gpu_executor_without_a_gpu_is_a_clear_error(run_main, tmp_path):
  import tensorflow as tf

  if tf.config.list_physical_devices('GPU'):
    pytest.skip('this machine has a GPU')
  for runtime in ('auto', 'in_process'):
    rc, out, err = run_main('--task=emnist', '--algo=fedavg', '--executor=gpu',
                            f'--runtime={runtime}')
    assert rc == 2 and 'no GPU' in err and len(err.strip().splitlines()) == 1
    assert gpu_diagnosis.no_gpu_cause() in err  # The cause and its fix, as check_devices says.
    assert not out  # Nothing claims a GPU that ran nothing.
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize(
    'settings, threads',
    [
        (dict(clients_per_round=10), _cores_shared_by(10)),
        (dict(clients_per_round=10, max_concurrent_clients=1), CORES),
        (dict(clients_per_round=1, max_concurrent_clients=4), CORES),
        (dict(clients_per_round=10, intra_op_threads=3), 3),
        # In process: by default one client per core at once.
        (dict(clients_per_round=10, runtime='in_process'), _cores_shared_by(min(10, CORES))),
        (dict(clients_per_round=1, runtime='in_process'), CORES),
    ],
)
def test_the_local_worker_shares_the_cores_among_the_clients_it_runs_at_once(settings, threads):
  config = run_config.ExperimentConfig(
      task='emnist', algo='fedavg', root_output_dir='/nonexistent', experiment_name='x',
      **settings,
  )
  assert runtime_choice.local_intra_op_threads(config) == threads
