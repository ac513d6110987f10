"""The TFF execution context, and the life cycle of the C++ workers behind it.

TFF's own `tff.backends.native.set_sync_local_cpp_execution_context()` starts a
`worker_binary` subprocess that inherits the parent's stdout and is stopped only from a
`__del__`, which often never runs: the worker outlives Python and keeps the parent's output
pipe open, so a test run or a CI job that reads that pipe hangs. This module is the one place
in the package that creates execution contexts, and it owns their workers:

* each worker writes to its own log file, never to the parent's stdout/stderr;
* each worker is started with a parent-death signal (Linux), so even a parent killed with
  SIGKILL takes its workers along;
* every worker is registered and stopped (SIGINT, then SIGKILL after a grace period) by
  `stop_all_workers()`, which runs at interpreter exit, after uncaught exceptions and Ctrl-C,
  and on SIGTERM.

Typical use::

  with tff_zmg.context.execution_context():
    state = process.initialize()
"""

import atexit
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional

from absl import logging
import grpc
import portpicker
import tensorflow_federated as tff

_WORKER_START_TIMEOUT_S = 60.0
_WORKER_STOP_GRACE_S = 2.0
_GRPC_OPTIONS = [
    ('grpc.max_message_length', 2**31 - 1),
    ('grpc.max_receive_message_length', 2**31 - 1),
]
_PR_SET_PDEATHSIG = 1

_lock = threading.Lock()
_live_workers: set['LocalWorker'] = set()


def worker_binary_path() -> str:
  """The `worker_binary` shipped inside the installed TFF package."""
  return os.path.join(os.path.dirname(tff.__file__), 'data', 'worker_binary')


def _die_with_parent() -> None:
  """Runs in the forked child: ask Linux to SIGKILL it when its parent dies."""
  try:
    ctypes.CDLL('libc.so.6', use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
  except OSError:  # Not Linux: atexit and the signal handlers still stop the worker.
    pass


class WorkerStartError(RuntimeError):
  """A TFF worker process did not come up."""


class LocalWorker:
  """One TFF C++ `worker_binary` serving on a loopback port, owned by this process."""

  def __init__(self, max_concurrent_computation_calls: int = -1):
    self._max_concurrent_computation_calls = max_concurrent_computation_calls
    self._process: Optional[subprocess.Popen] = None
    self._stub: Optional[tff.framework.RemoteExecutorGrpcStub] = None
    self._log_path: Optional[str] = None
    self._start_lock = threading.Lock()

  @property
  def pid(self) -> Optional[int]:
    return None if self._process is None else self._process.pid

  @property
  def log_path(self) -> Optional[str]:
    return self._log_path

  def _start(self) -> None:
    binary = worker_binary_path()
    if not os.path.isfile(binary):
      raise WorkerStartError(
          f'TFF worker binary not found at {binary}; reinstall with scripts/bootstrap.sh.'
      )
    port = portpicker.pick_unused_port()
    fd, self._log_path = tempfile.mkstemp(prefix=f'tff_zmg-worker-{port}-', suffix='.log')
    with os.fdopen(fd, 'wb') as log:
      self._process = subprocess.Popen(
          [
              binary,
              f'--port={port}',
              '--max_concurrent_computation_calls='
              f'{self._max_concurrent_computation_calls}',
          ],
          stdin=subprocess.DEVNULL,
          stdout=log,
          stderr=subprocess.STDOUT,
          preexec_fn=_die_with_parent if sys.platform.startswith('linux') else None,
      )
    with _lock:
      _live_workers.add(self)
    channel = grpc.insecure_channel(f'localhost:{port}', _GRPC_OPTIONS)
    stub = tff.framework.RemoteExecutorGrpcStub(channel)
    deadline = time.monotonic() + _WORKER_START_TIMEOUT_S
    while not stub.is_ready:
      if self._process.poll() is not None or time.monotonic() > deadline:
        self.stop(keep_log=True)
        raise WorkerStartError(
            f'TFF worker on port {port} did not start; its log is {self._log_path}'
        )
      time.sleep(0.05)
    self._stub = stub
    logging.info('Started TFF worker pid %d on port %d', self._process.pid, port)

  def stub(self) -> tff.framework.RemoteExecutorGrpcStub:
    """The worker's stub, (re)starting the worker if it is not serving."""
    with self._start_lock:
      if self._stub is None or not self._stub.is_ready:
        self.stop()
        self._start()
      return self._stub

  def stop(self, keep_log: bool = False) -> None:
    """Ends the worker: SIGTERM (it ignores SIGINT), then SIGKILL after a grace period."""
    process, self._process, self._stub = self._process, None, None
    with _lock:
      _live_workers.discard(self)
    if process is not None and process.poll() is None:
      process.terminate()
      try:
        process.wait(_WORKER_STOP_GRACE_S)
      except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    if self._log_path and not keep_log:
      with contextlib.suppress(OSError):
        os.remove(self._log_path)
      self._log_path = None


def live_worker_pids() -> list[int]:
  """The pids of workers this process started and has not stopped yet."""
  with _lock:
    return sorted(w.pid for w in _live_workers if w.pid is not None)


def stop_all_workers() -> None:
  """Stops every worker this process started. Safe to call any number of times."""
  with _lock:
    workers = list(_live_workers)
  for worker in workers:
    worker.stop()


def _create_sync_context(workers: list[LocalWorker], default_num_clients: int):
  """A synchronous TFF context that runs computations on the given worker."""
  (worker,) = workers  # One local worker; remote multi-worker contexts compose several.

  def executor_stack_fn(cardinalities):
    if cardinalities.get(tff.CLIENTS) is None:
      cardinalities[tff.CLIENTS] = default_num_clients
    executor = tff.framework.RemoteExecutor(worker.stub())
    executor.set_cardinalities(cardinalities)
    return executor

  return tff.framework.SyncExecutionContext(
      executor_fn=tff.framework.ResourceManagingExecutorFactory(
          executor_stack_fn=executor_stack_fn
      ),
      compiler_fn=tff.backends.native.desugar_and_transform_to_native,
      transform_args=tff.tensorflow.transform_args,
      transform_result=tff.tensorflow.transform_result,
  )


@contextlib.contextmanager
def execution_context(
    max_concurrent_computation_calls: int = -1, default_num_clients: int = 0
):
  """Runs the enclosed TFF computations on a fresh local C++ worker, stopped on exit.

  Args:
    max_concurrent_computation_calls: How many client computations the worker runs at
      once; non-positive means no limit (TFF's default).
    default_num_clients: Cardinality of CLIENTS when it cannot be inferred.

  Yields:
    The `LocalWorker` serving the context (its `pid` and `log_path` are useful in tests).
  """
  worker = LocalWorker(max_concurrent_computation_calls)
  worker.stub()  # Start now, from this thread (the parent-death signal follows it).
  context = _create_sync_context([worker], default_num_clients)
  try:
    with tff.framework.get_context_stack().install(context):
      yield worker
  finally:
    worker.stop()


def set_default_execution_context(
    max_concurrent_computation_calls: int = -1, default_num_clients: int = 0
) -> LocalWorker:
  """Makes a managed local C++ context TFF's default for the rest of the program.

  For notebooks and scripts that do not want a `with` block. The worker is stopped at
  interpreter exit (or by `stop_all_workers()`).
  """
  worker = LocalWorker(max_concurrent_computation_calls)
  worker.stub()
  tff.framework.set_default_context(_create_sync_context([worker], default_num_clients))
  return worker


def _stop_on_sigterm(signum, frame):
  del frame
  stop_all_workers()
  # Leave through the normal exit path, so `finally` blocks and atexit handlers run.
  raise SystemExit(128 + signum)


def _install_exit_handlers() -> None:
  atexit.register(stop_all_workers)
  if (
      threading.current_thread() is threading.main_thread()
      and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
  ):
    signal.signal(signal.SIGTERM, _stop_on_sigterm)


def _replace_tff_default_context() -> None:
  """Swaps the unmanaged context TFF installs at import for a managed, lazily started one.

  Any computation run without an explicit context then also runs on a worker this module
  stops at exit.
  """
  tff.framework.set_default_context(_create_sync_context([LocalWorker()], 0))


_install_exit_handlers()
_replace_tff_default_context()
