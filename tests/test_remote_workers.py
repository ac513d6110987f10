"""Rounds on remote TFF workers: real `launch.worker` programs on loopback ports.

Each remote run compiles TFF's mergeable form of its computations (tens of seconds of one
CPU core), so one long test covers the match with a local run, a worker killed mid-run and
the resumption; the other tests fail before anything is compiled.
"""

import csv
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time

from absl import flags
import grpc
import numpy as np
import portpicker
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from launch.run import errors
from launch.run import experiment
from launch.run import run_config
from launch.run import runtime_choice
from launch import train
from launch import worker
import tasks
from tff_zmg.algorithms import registry
from tff_zmg import analysis
from tff_zmg import client_states
from tff_zmg.runtime import cpp_worker
from tff_zmg.runtime import in_process
from tff_zmg.runtime import remote_clients
from test_in_process import assert_all_close
from test_in_process import client_dataset
from test_in_process import HPARAMS
from test_in_process import tiny_keras_model
from test_in_process import tiny_model_fn
import worker_processes

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What the flags below give (launch.train fills in the Dirichlet alpha and the seed).
_SMALL = dict(num_train_clients=8, num_test_clients=3, mean_examples_per_client=20,
              dirichlet_alpha=0.5, seed=0)
_TIME_COLUMNS = ('training_time_in_seconds', 'evaluation/evaluation_time_in_seconds')
# Local and remote runs lower aggregations the same way and the two workers' slices merge
# in the order the local worker folds them; measured difference 0. The bound leaves room
# for float32 summation order only (values here are O(1..10)).
_ATOL = 1e-6


class _Launcher:
  """One `python -m launch.worker` process and the worker_binary it runs."""

  def __init__(self, log_dir):
    self.port = portpicker.pick_unused_port()
    self.address = f'localhost:{self.port}'
    self.log = os.path.join(log_dir, f'worker-{self.port}.log')
    with open(self.log, 'w') as out:
      self.proc = subprocess.Popen(
          [sys.executable, '-m', 'launch.worker', f'--port={self.port}'],
          stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=_REPO,
      )
    self.worker_pids = []

  def wait_serving(self, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      with open(self.log) as f:
        if 'serving on' in f.read():
          break
      assert self.proc.poll() is None, open(self.log).read()
      time.sleep(0.2)
    else:
      raise AssertionError(f'launch.worker did not start: {open(self.log).read()}')
    self.worker_pids = list(worker_processes.worker_pids(self.proc.pid, recursive=False))
    assert len(self.worker_pids) == 1

  def kill(self) -> None:
    """A machine that dies: SIGKILL; the parent-death signal takes its worker along."""
    self.proc.send_signal(signal.SIGKILL)
    self.proc.wait(30)


@pytest.fixture(scope='module')
def workers(tmp_path_factory):
  """Three launch.worker programs (a, b, c), serving; all stopped at the end, checked gone."""
  log_dir = str(tmp_path_factory.mktemp('workers'))
  launchers = []
  try:
    launchers.extend(_Launcher(log_dir) for _ in range(3))  # They boot in parallel.
    for launcher in launchers:
      launcher.wait_serving()
    yield launchers
  finally:
    for launcher in launchers:
      if launcher.proc.poll() is None:
        launcher.proc.terminate()  # SIGTERM, like Ctrl-C, is a server's normal end.
        assert launcher.proc.wait(30) == 0, open(launcher.log).read()
        assert 'worker: stopped' in open(launcher.log).read()
    for launcher in launchers:
      for pid in [launcher.proc.pid, *launcher.worker_pids]:
        assert worker_processes.is_gone(pid), (
            f'process {pid} of the worker on port {launcher.port} outlived the test')


def _flags(cache_dir, root, name, *extra):
  return [
      '--task=emnist', '--algo=fedzmg', '--data_source=synthetic', f'--cache_dir={cache_dir}',
      '--synthetic_train_clients=8', '--synthetic_test_clients=3',
      '--synthetic_examples_per_client=20', '--clients_per_round=4',
      # Evaluate at round 0 only (the trainer evaluates; the workers train).
      '--total_rounds=2', '--rounds_per_eval=100',
      f'--root_output_dir={root}', f'--experiment_name={name}', *extra,
  ]


def _main(argv, capsys):
  """`launch.train.main` in this process; returns (rc, stdout, stderr)."""
  flags.FLAGS.unparse_flags()
  try:
    flags.FLAGS(['train', *argv])
    rc = train.main(['train'])
  finally:
    flags.FLAGS.unparse_flags()
  out, err = capsys.readouterr()
  return rc, out, err


def _rows(path):
  with open(path, newline='') as f:
    return [{k: v for k, v in r.items() if k not in _TIME_COLUMNS} for r in csv.DictReader(f)]


def _main_losing_worker(worker, metrics_csv, argv, capsys):
  """`_main(argv)` while a thread SIGKILLs `worker` (a real process) once round 1 is in
  `metrics_csv`: launch.train's `main` ends with 4 and one line, in this process."""
  ended = threading.Event()

  def kill_after_round_1():
    while not ended.is_set():
      if metrics_csv.exists() and any(r['key'] == '1' for r in _rows(metrics_csv)):
        worker.kill()
        return
      time.sleep(0.05)

  killer = threading.Thread(target=kill_after_round_1, daemon=True)
  try:
    killer.start()
    return _main(argv, capsys)
  finally:
    ended.set()
    killer.join(30)


def _checkpoint(output_dir, version):
  state = tf.saved_model.load(os.path.join(output_dir, 'checkpoints', f'program_state_{version}'))
  return [np.asarray(v) for v in tf.nest.flatten(state())]


def test_worker_addresses_are_checked():
  for good in ('hostA:8000', ' 10.0.0.7:8000 ', '[::1]:8000'):
    assert cpp_worker.parse_worker_address(good) == good.strip()
  for bad in ('hostA', 'hostA:', ':8000', 'hostA:0', 'hostA:65536', 'hostA:http', '::1:8000'):
    with pytest.raises(ValueError, match='host:port'):
      cpp_worker.parse_worker_address(bad)
  with pytest.raises(ValueError, match='twice'):
    cpp_worker.connect_workers(['hostA:8000', 'hostA:8000'])
  config = run_config.ExperimentConfig(
      task='emnist', algo='fedavg', root_output_dir='/nonexistent', experiment_name='x',
      workers='hostA:8000',
  )
  with pytest.raises(errors.ExperimentError, match='sequence'):
    experiment.run(config)
  config = dataclasses.replace(config, workers=('hostA:8000',), max_concurrent_clients=2)
  with pytest.raises(errors.ExperimentError, match='max_concurrent_computation_calls'):
    experiment.run(config)
  config = dataclasses.replace(config, max_concurrent_clients=-1, intra_op_threads=1)
  with pytest.raises(errors.ExperimentError, match='--intra_op_parallelism_threads=N'):
    experiment.run(config)


def test_unreachable_worker_at_start_is_one_clear_line_and_writes_nothing(
    workers, tmp_path, capsys
):
  live = workers[0]
  dead = f'localhost:{portpicker.pick_unused_port()}'  # Nobody listens there.
  # A data folder of its own: the task, built, would have written its synthetic data there.
  data = tmp_path / 'data'
  rc, _, err = _main(
      _flags(data, tmp_path / 'runs', 'x', '--worker_timeout_s=2',
             f'--workers={live.address},{dead}'),
      capsys,
  )
  assert rc == 2
  assert len(err.strip().splitlines()) == 1
  assert dead in err and live.address not in err
  assert 'python -m launch.worker --port=' in err and 'within 2 s' in err
  # Checked before the task and process are built: no data written, no run folder.
  assert not os.listdir(tmp_path)


def test_worker_program_refuses_a_bad_or_busy_port(workers, capsys):
  flags.FLAGS.unparse_flags()
  flags.FLAGS.mark_as_parsed()
  try:
    for port, message in (
        (None, 'required'), (0, 'must be in 1..65535'), (workers[0].port, 'already in use'),
    ):
      flags.FLAGS.port = port
      assert worker.main(['worker']) == 2
      err = capsys.readouterr().err
      assert message in err and len(err.strip().splitlines()) == 1
  finally:
    flags.FLAGS.unparse_flags()


def test_remote_context_sums_over_workers_and_keeps_computation_errors(workers):
  @tff.tensorflow.computation(np.float32)
  def checked(x):
    with tf.control_dependencies([tf.debugging.assert_positive(x)]):
      return tf.identity(x)

  @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
  def total(xs):
    return tff.federated_sum(tff.federated_map(checked, xs))

  with cpp_worker.remote_execution_context([workers[0].address]):  # Whole computations.
    assert total([1.0, 2.0]) == 3.0
  addresses = [w.address for w in workers[:2]]
  with cpp_worker.remote_execution_context(addresses, connect_timeout_s=2) as remote:
    assert [w.address for w in remote] == addresses
    assert total([1.0, 2.0, 3.0, 4.0, 5.0]) == 15.0
    # A failing computation on live workers is its own error, not a lost worker.
    with pytest.raises(grpc.RpcError) as error:
      total([1.0, -2.0, 3.0])
    assert not isinstance(error.value, cpp_worker.WorkerUnavailableError)
    assert 'assert' in str(error.value).lower()
  # launch.train says so in one line, with the usual causes (a missing data file there).
  config = run_config.ExperimentConfig(
      task='emnist', algo='fedavg', root_output_dir='/nonexistent', experiment_name='x',
      workers=tuple(addresses),
  )
  with pytest.raises(errors.ExperimentError) as error:
    with runtime_choice.execution_context(config, progress=None):
      total([1.0, -2.0, 3.0])
  message = str(error.value)
  assert not isinstance(error.value, errors.WorkerLostError)
  assert 'failed on a TFF worker' in message and 'same absolute path' in message
  assert len(message.splitlines()) == 1


# Stateful algorithms across workers: the round is evaluated in this process and only the
# clients' work goes to the workers (tff_zmg.runtime.remote_clients). These tests come
# before test_two_workers_match_a_local_run_and_a_lost_worker_resumes, which kills b.

_STATEFUL_PARTICIPATION = ((0, 1, 2), (1, 3), (0, 2, 3))  # Partial, and a client repeats.


def _stateful_rounds(process, workers_for_run=None):
  """Weights, metrics and every client's state after _STATEFUL_PARTICIPATION's rounds."""

  with in_process.in_process_context(workers=workers_for_run) as context:
    state = process.initialize()
    states = {c: process.initial_client_state() for c in range(4)}
    metrics = []
    for clients in _STATEFUL_PARTICIPATION:
      output = process.next(state, [client_dataset(c) for c in clients],
                            [states[c] for c in clients])
      state = output.state
      states.update(zip(clients, output.client_states))
      metrics.append(output.metrics)
    weights = process.get_model_weights(state)
  return dict(weights=weights, metrics=metrics, states=states), context


@pytest.mark.parametrize('algo', ['fedrkmgc', 'fedgps', 'scaffold'])
def test_stateful_algorithms_on_two_and_three_workers_equal_one_process(algo, workers):

  assert all(w.proc.poll() is None for w in workers), 'a, b and c must all serve'
  # One process for the three runs: each run starts from its `initialize()`.
  process = registry.build(algo, tiny_model_fn, keras_model_fn=tiny_keras_model, num_clients=4,
                           **HPARAMS)
  expected, _ = _stateful_rounds(process)
  for count in (2, 3):
    remote = cpp_worker.connect_workers([w.address for w in workers[:count]], 30)
    try:
      actual, context = _stateful_rounds(process, remote)
    finally:
      for w in remote:
        w.close()
    assert_all_close(actual, expected)
    # The last round's 3 clients: one contiguous slice per worker, in client order.
    ran_on = [d.split(' ')[-1] for d in context.last_client_devices]
    assert ran_on == [workers[w].address for w, part in enumerate(remote_clients.slices(3, count))
                      for _ in part], ran_on



def test_a_worker_lost_during_a_stateful_round_is_named(workers, tmp_path):
  """The round fails with the lost worker's address (exit 4 in launch.train); the
  states given to the round are untouched, so a resume repeats it."""

  process = registry.build('scaffold', tiny_model_fn, num_clients=4, **HPARAMS)
  doomed = _Launcher(str(tmp_path))
  try:
    doomed.wait_serving()
    remote = cpp_worker.connect_workers([workers[0].address, doomed.address], 5)
    with in_process.in_process_context(workers=remote):
      state = process.initialize()
      states = [process.initial_client_state()] * 2
      data = [client_dataset(0), client_dataset(1)]
      process.next(state, data, states)
      doomed.kill()
      with pytest.raises(cpp_worker.WorkerUnavailableError) as error:
        process.next(state, data, states)
    assert error.value.addresses == (doomed.address,)
    assert doomed.address in str(error.value) and len(str(error.value).splitlines()) == 1
  finally:
    if doomed.proc.poll() is None:
      doomed.kill()
  for pid in [doomed.proc.pid, *doomed.worker_pids]:
    assert worker_processes.is_gone(pid)


def test_two_workers_match_a_local_run_and_a_lost_worker_resumes(
    workers, synthetic_cache_dir, tmp_path, capsys
):
  a, b, c = workers
  remote_dir = tmp_path / 'remote'
  metrics_csv = remote_dir / 'metrics.csv'
  # Both runs below read the same synthetic files: write them before they start.
  tasks.get('emnist', data_source='synthetic', cache_dir=synthetic_cache_dir,
            synthetic_settings=_SMALL)

  # Machine b (a real process) dies by SIGKILL once round 1 is reported.
  rc, _, err = _main_losing_worker(
      b, metrics_csv,
      _flags(synthetic_cache_dir, tmp_path, 'remote', '--worker_timeout_s=2',
             f'--workers={a.address},{b.address}'),
      capsys)
  assert rc == 4, err
  rc, _, local_err = _main(_flags(synthetic_cache_dir, tmp_path, 'local'), capsys)
  assert rc == 0, local_err
  err = err.strip().splitlines()
  message = err[-1]
  assert message.startswith('train: error: a TFF worker was lost in round 2'), err
  assert b.address in message and 'checkpoint of round 1 is kept' in message
  assert 're-run the same command' in message and 'python -m launch.worker' in message
  assert [r['key'] for r in _rows(metrics_csv)] == ['0', '1']  # Round 2 wrote nothing.
  checkpoints = os.listdir(remote_dir / 'checkpoints')
  assert 'program_state_1' in checkpoints and 'program_state_2' not in checkpoints
  assert worker_processes.is_gone(b.worker_pids[0])

  # The same command with a replacement for b (another address: the set may change).
  rc, out, err = _main(
      _flags(synthetic_cache_dir, tmp_path, 'remote', '--worker_timeout_s=2',
             f'--workers={a.address},{c.address}'),
      capsys,
  )
  assert rc == 0, err
  assert 'round 2/2' in out and 'round 1/2' not in out  # Resumed, not restarted.

  local_rows, remote_rows = _rows(tmp_path / 'local' / 'metrics.csv'), _rows(metrics_csv)
  assert [r['key'] for r in remote_rows] == ['0', '1', '2']
  assert [sorted(r) for r in remote_rows] == [sorted(r) for r in local_rows]
  mismatches = []
  for lr, rr in zip(local_rows, remote_rows):
    for k in lr:
      if lr[k] == '' or rr[k] == '':
        same = lr[k] == rr[k]
      else:
        same = abs(float(rr[k]) - float(lr[k])) <= _ATOL
      if not same:
        mismatches.append(f'round {lr["key"]} {k}: local {lr[k]} remote {rr[k]}')
  for i, (lw, rw) in enumerate(zip(_checkpoint(tmp_path / 'local', 2), _checkpoint(remote_dir, 2))):
    diff = float(np.max(np.abs(np.asarray(rw) - np.asarray(lw)))) if np.size(lw) else 0.0
    if diff > _ATOL:
      mismatches.append(f'round-2 checkpoint array {i}: max abs difference {diff:.3g}')
  assert not mismatches, '\n'.join(mismatches)


def _client_states(run_dir):
  """client id -> its state's arrays, from a run's disk store."""
  store = client_states.create_store('disk', str(run_dir / 'client_states'))
  return {c: store.read(c) for c in store.client_ids()}


def test_a_stateful_run_on_two_workers_survives_a_lost_worker_and_a_killed_trainer(
    workers, synthetic_cache_dir, tmp_path, capsys
):
  """SCAFFOLD with --workers: a worker SIGKILLed mid-run (exit 4), then the trainer
  SIGKILLed, and each time the same command resumes; the weights, metrics and clients'
  states equal an uninterrupted one-process run's to 1e-6."""
  a, c = workers[0], workers[2]
  doomed = _Launcher(str(tmp_path))
  doomed.wait_serving()
  tasks.get('emnist', data_source='synthetic', cache_dir=synthetic_cache_dir,
            synthetic_settings=_SMALL)
  remote_dir = tmp_path / 'remote'
  metrics_csv = remote_dir / 'metrics.csv'
  extra = ('--algo=scaffold', '--total_rounds=3')

  def reported(round_num):
    return metrics_csv.exists() and any(r['key'] == str(round_num) for r in _rows(metrics_csv))

  # The worker's loss runs in this process; the trainer's own SIGKILL below needs a process
  # of its own.
  try:
    code, _, err = _main_losing_worker(
        doomed, metrics_csv,
        _flags(synthetic_cache_dir, tmp_path, 'remote', '--worker_timeout_s=2',
               f'--workers={a.address},{doomed.address}', *extra), capsys)
  finally:
    if doomed.proc.poll() is None:
      doomed.kill()
  assert code == 4, err
  line = err.strip().splitlines()[-1]
  assert line.startswith('train: error: a TFF worker was lost in round 2'), err
  assert doomed.address in line and 'checkpoint of round 1 is kept' in line
  for pid in [doomed.proc.pid, *doomed.worker_pids]:
    assert worker_processes.is_gone(pid)

  def remote_run(addresses, kill_after_round):
    """launch.train in a subprocess, SIGKILLed once round `kill_after_round` is reported."""
    with open(tmp_path / 'remote.err', 'w') as err:
      proc = subprocess.Popen(
          [sys.executable, '-m', 'launch.train',
           *_flags(synthetic_cache_dir, tmp_path, 'remote', '--worker_timeout_s=2',
                   f'--workers={",".join(addresses)}', *extra)],
          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, cwd=_REPO)
    try:
      deadline = time.monotonic() + 600
      while time.monotonic() < deadline and proc.poll() is None:
        if reported(kill_after_round):
          proc.kill()
          break
        time.sleep(0.05)
      return proc.wait(600), (tmp_path / 'remote.err').read_text()
    finally:
      if proc.poll() is None:
        proc.kill()

  code, err = remote_run([a.address, c.address], 2)
  assert code == -signal.SIGKILL, err
  rc, out, err = _main(
      _flags(synthetic_cache_dir, tmp_path, 'remote', '--worker_timeout_s=2',
             f'--workers={a.address},{c.address}', *extra), capsys)
  assert rc == 0, err
  assert 'round 3/3' in out and 'round 1/3' not in out  # Resumed, not restarted.
  assert "the clients' work on the TFF workers at" in out

  rc, _, err = _main(_flags(synthetic_cache_dir, tmp_path, 'local', *extra), capsys)
  assert rc == 0, err
  local_rows, remote_rows = _rows(tmp_path / 'local' / 'metrics.csv'), _rows(metrics_csv)
  assert [r['key'] for r in remote_rows] == ['0', '1', '2', '3']
  for lr, rr in zip(local_rows, remote_rows):
    for k in lr:
      assert (lr[k] == rr[k] if '' in (lr[k], rr[k])
              else abs(float(rr[k]) - float(lr[k])) <= _ATOL), (lr['key'], k, lr[k], rr[k])
  for lw, rw in zip(_checkpoint(tmp_path / 'local', 3), _checkpoint(remote_dir, 3)):
    np.testing.assert_allclose(rw, lw, rtol=0, atol=_ATOL)
  local_states, remote_states = _client_states(tmp_path / 'local'), _client_states(remote_dir)
  assert sorted(local_states) == sorted(remote_states) and local_states
  for client, state in local_states.items():
    for l, r in zip(state, remote_states[client]):
      np.testing.assert_allclose(r, l, rtol=0, atol=_ATOL)
  sessions = analysis.runs.read_runtime(str(remote_dir))
  assert any(d.startswith('worker ') for d in sessions[-1]['client_devices'])
