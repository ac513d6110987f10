"""The package owns TFF's C++ workers: none outlives the program, however it ends."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import psutil
import pytest
import tensorflow_federated as tff

from tff_zmg.runtime import cpp_worker
import worker_processes

# A program that runs one federated computation on a managed context, prints its worker's
# pid once it has checked that the worker still runs, waits for the test's go-ahead on
# stdin (so that the worker is alive while the test looks at it, however loaded the
# machine), then ends as argv[1] says.
_PROGRAM = textwrap.dedent("""
    import signal, sys, time
    import numpy as np
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C, even in background.
    import tensorflow_federated as tff
    import tff_zmg

    @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
    def mean(x):
      return tff.federated_mean(x)

    worker = tff_zmg.runtime.cpp_worker.set_default_execution_context()
    assert mean([1.0, 3.0]) == 2.0
    assert worker.poll() is None
    print('WORKER', worker.pid, flush=True)
    how = sys.argv[1]
    if how != 'wait':
      sys.stdin.readline()
    if how == 'raise':
      raise RuntimeError('the program failed')
    if how == 'wait':
      time.sleep(600)
""")


@pytest.mark.parametrize(
    'how, signum',
    [
        ('exit', None),
        ('raise', None),
        ('wait', signal.SIGINT),
        ('wait', signal.SIGTERM),
        ('wait', signal.SIGKILL),
    ],
    ids=['normal_exit', 'uncaught_exception', 'ctrl_c', 'sigterm', 'sigkill'],
)
def test_no_worker_outlives_the_program(how, signum, tmp_path, monkeypatch):
  temp = tmp_path / 'tmp'
  temp.mkdir()
  program = subprocess.Popen(
      [sys.executable, '-c', _PROGRAM, how],
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      stderr=subprocess.DEVNULL,
      text=True,
      env={**os.environ, 'TMPDIR': str(temp)},
  )
  try:
    line = program.stdout.readline()
    assert line.startswith('WORKER '), f'program did not report its worker: {line!r}'
    worker_pid = int(line.split()[1])
    # The program waits (on stdin, or in its sleep) until told to end: its worker runs.
    worker = psutil.Process(worker_pid)
    assert worker.status() != psutil.STATUS_ZOMBIE
    assert worker.ppid() == program.pid and 'worker_binary' in ' '.join(worker.cmdline())
    if signum is not None:
      program.send_signal(signum)
    # communicate() closes stdin: the go-ahead (EOF) for the programs that wait on it. The
    # stdout pipe closes only when every process holding it is gone: a leaked worker that
    # inherited stdout would make this time out, which is exactly the CI hang.
    rest, _ = program.communicate(timeout=60)
    assert rest == ''
  finally:
    if program.poll() is None:
      program.kill()
  assert worker_processes.is_gone(worker_pid), f'worker {worker_pid} outlived its program ({how})'
  logs = sorted(n for n in os.listdir(temp) if n.startswith('tff_zmg-worker-'))
  if signum != signal.SIGKILL:
    assert logs == []  # Each stopped worker's log went with it.
    return
  # SIGKILL runs no clean-up: the log stays, named after its dead owner, until the next
  # worker started in that folder removes it; a live owner's log (the new worker's), a log
  # kept for an error message to name, and other files stay.
  assert len(logs) == 1 and logs[0].startswith(f'tff_zmg-worker-{program.pid}-'), logs
  (temp / 'notes.log').write_text("a user's")
  monkeypatch.setattr('tempfile.tempdir', str(temp))
  named = cpp_worker.LocalWorker()
  named.stub()
  named.stop(keep_log=True)
  kept = os.path.basename(named.log_path)
  assert kept.startswith('tff_zmg-worker-') and f'-{os.getpid()}-' not in kept, kept
  worker = cpp_worker.LocalWorker()
  worker.stub()
  try:
    started = os.path.basename(worker.log_path)
    assert sorted(os.listdir(temp)) == sorted(['notes.log', kept, started]), os.listdir(temp)
  finally:
    worker.stop()
  assert sorted(os.listdir(temp)) == sorted(['notes.log', kept])


# Sets the managed default twice, as a notebook cell run twice does, the second time with
# the worker left to start at the first computation; prints the pids it saw.
_DEFAULT_SET_TWICE = textwrap.dedent("""
    import json
    import numpy as np
    import tensorflow_federated as tff
    import tff_zmg
    from tff_zmg.runtime import cpp_worker

    @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
    def mean(x):
      return tff.federated_mean(x)

    first = tff_zmg.set_default_execution_context()
    first_pid = first.pid
    second = tff_zmg.set_default_execution_context(start=False)
    live_before_a_computation = cpp_worker.live_worker_pids()
    assert mean([1.0, 3.0]) == 2.0
    print(json.dumps(dict(
        first=first_pid, live_before_a_computation=live_before_a_computation,
        second=second.pid, live=cpp_worker.live_worker_pids())), flush=True)
""")


@pytest.fixture(scope='module')
def one_program():
  """One run of _DEFAULT_SET_TWICE, then _DISPOSE_AFTER_CLOSE, in one program: both
  tests below read its exit status, stdout and stderr (one start-up of TFF, not two)."""
  return subprocess.run(
      [sys.executable, '-c', _DEFAULT_SET_TWICE + _DISPOSE_AFTER_CLOSE], capture_output=True,
      text=True, timeout=120,
  )


def test_setting_the_default_again_stops_the_worker_set_before(one_program):
  result = one_program
  assert result.returncode == 0, result.stderr
  pids = json.loads([l for l in result.stdout.splitlines() if l.startswith('{')][-1])
  assert worker_processes.is_gone(pids['first'])
  assert pids['live_before_a_computation'] == []  # start=False: the computation starts it.
  assert pids['second'] not in (None, pids['first'])
  assert pids['live'] == [pids['second']]
  assert worker_processes.is_gone(pids['second'])  # And the program's end stopped it.


def test_execution_context_stops_its_worker_on_exit():
  @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
  def total(x):
    return tff.federated_sum(x)

  with cpp_worker.execution_context() as worker:
    assert total([1.0, 2.0, 4.0]) == 7.0
    pid = worker.pid
    assert pid in cpp_worker.live_worker_pids()
  assert pid not in cpp_worker.live_worker_pids()
  assert worker_processes.is_gone(pid)


def test_execution_context_stops_its_worker_on_exception():
  with pytest.raises(ZeroDivisionError):
    with cpp_worker.execution_context() as worker:
      pid = worker.pid
      _ = 1 / 0
  assert worker_processes.is_gone(pid)


def test_worker_does_not_write_to_the_parents_output(capfd):
  with cpp_worker.execution_context() as worker:
    log_path = worker.log_path
    assert log_path
  out, err = capfd.readouterr()
  assert 'worker_binary' not in out + err


def _run_in_own_loop(coroutine):
  """Runs `coroutine` on a loop of its own; asyncio.run would unset the thread's loop,
  which the in-process training tests that share this pytest process need."""
  loop = asyncio.new_event_loop()
  try:
    return loop.run_until_complete(coroutine)
  finally:
    loop.close()


def test_a_computation_is_sent_to_its_worker_once_and_serves_every_call():
  @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
  def mean(x):
    return tff.federated_mean(x)

  compiled = tff.backends.native.desugar_and_transform_to_native(mean)
  argument_type = compiled.type_signature.parameter
  worker = cpp_worker.LocalWorker()
  try:
    executor = cpp_worker.ComputationCachingRemoteExecutor(worker.stub())

    async def two_calls():
      function = await executor.create_value(compiled, compiled.type_signature)
      assert await executor.create_value(compiled, compiled.type_signature) is function
      means = []
      for values in ([1.0, 3.0], [2.0, 6.0]):
        argument = await executor.create_value(values, argument_type)
        means.append(await (await executor.create_call(function, argument)).compute())
      return function, means

    executor.set_cardinalities({tff.CLIENTS: 2})
    first, means = _run_in_own_loop(two_calls())
    assert means == [2.0, 4.0]
    # A new executor on the worker holds none of the old values: the computation is sent
    # again, and the new value works.
    executor.set_cardinalities({tff.CLIENTS: 2})
    second, means = _run_in_own_loop(two_calls())
    assert second is not first
    assert means == [2.0, 4.0]
  finally:
    worker.stop()


def test_the_worker_gets_the_intra_op_threads_it_is_given():
  with cpp_worker.execution_context(intra_op_threads=1) as worker:
    assert psutil.Process(worker.pid).environ().get('TF_NUM_INTRAOP_THREADS') == '1'
  with cpp_worker.execution_context() as worker:
    inherited = os.environ.get('TF_NUM_INTRAOP_THREADS')
    assert psutil.Process(worker.pid).environ().get('TF_NUM_INTRAOP_THREADS') == inherited
  with pytest.raises(ValueError, match='intra_op_threads must be at least 1'):
    cpp_worker.LocalWorker(intra_op_threads=0)


@pytest.mark.parametrize(
    'clients, cpus, threads', [(10, 2, 1), (2, 2, 1), (1, 2, 2), (3, 16, 5), (1, 1, 1)]
)
def test_intra_op_threads_share_the_cores_among_the_clients_run_at_once(
    clients, cpus, threads
):
  assert cpp_worker.intra_op_threads_for(clients, cpus) == threads


@pytest.mark.parametrize(
    'clients, cap, cpus, threads', [(10, 1, 2, 2), (10, 4, 16, 4), (3, 0, 16, 5), (2, 8, 4, 2)]
)
def test_intra_op_threads_count_only_the_clients_the_cap_lets_run_at_once(
    clients, cap, cpus, threads
):
  assert cpp_worker.intra_op_threads_for(clients, cpus, max_concurrent_clients=cap) == threads


def test_intra_op_threads_need_at_least_one_client():
  with pytest.raises(ValueError, match='concurrent_clients must be at least 1'):
    cpp_worker.intra_op_threads_for(0, 2)


# Caches a computation on a remote worker, closes the channel as `remote_execution_context`
# does on exit, and ends: the cached value is disposed of at exit, on the closed channel.
# Runs after _DEFAULT_SET_TWICE in the same program (`one_program`).
_DISPOSE_AFTER_CLOSE = textwrap.dedent("""
    import asyncio
    import numpy as np
    import portpicker
    import tensorflow_federated as tff
    from tff_zmg.runtime import cpp_worker

    @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
    def mean(x):
      return tff.federated_mean(x)

    compiled = tff.backends.native.desugar_and_transform_to_native(mean)
    worker = cpp_worker.LocalWorker(port=portpicker.pick_unused_port())
    worker.stub()
    remote = cpp_worker.RemoteWorker(f'localhost:{worker.port}')
    executor = cpp_worker.ComputationCachingRemoteExecutor(remote.stub(), dispose_batch_size=1)
    executor.set_cardinalities({tff.CLIENTS: 2})
    asyncio.run(executor.create_value(compiled, compiled.type_signature))
    remote.close()
    print('DONE', flush=True)
""")


def test_cached_computations_outliving_their_channel_end_quietly(one_program):
  result = one_program
  assert result.returncode == 0, result.stderr
  assert 'DONE' in result.stdout
  assert 'Exception ignored' not in result.stderr, result.stderr
  assert 'closed channel' not in result.stderr, result.stderr


# As a script that sets no context runs (the README's example without
# `tff_zmg.execution_context()`): its computation starts TFF's own worker.
_ON_TFFS_OWN_CONTEXT = textwrap.dedent("""
    import numpy as np
    import psutil
    import tensorflow_federated as tff
    import tasks, tff_zmg

    @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
    def mean(x):
      return tff.federated_mean(x)

    assert mean([1.0, 3.0]) == 2.0
    print(*[p.pid for p in psutil.Process().children()
            if 'worker_binary' in ' '.join(p.cmdline())], flush=True)
""")


def test_a_script_on_tffs_own_context_exits_when_it_ignores_sigint(tmp_path):
  """Issue 47: started as a background job of a non-interactive shell (SIGINT ignored,
  which its worker inherits), the script hung at exit: TFF's clean-up sends the worker
  SIGINT and waits for ever. `tasks/quiet.py` ends the worker within a grace period."""
  script = tmp_path / 'example.py'
  script.write_text(_ON_TFFS_OWN_CONTEXT)
  program = subprocess.Popen(
      [sys.executable, str(script)], cwd=os.path.dirname(os.path.dirname(__file__)),
      env=dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(__file__))),
      stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
  )
  try:
    out, err = program.communicate(timeout=120)
  finally:
    if program.poll() is None:
      for pid in worker_processes.worker_pids(program.pid):
        os.kill(pid, signal.SIGKILL)
      program.kill()
      program.communicate()
  assert program.returncode == 0, err
  (worker,) = map(int, out.split())
  assert worker_processes.is_gone(worker, timeout=1)
