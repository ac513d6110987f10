"""The TFF execution contexts, and the life cycle of the C++ workers behind them.

Why one file of ~630 lines: it is the one owner of TFF contexts and worker processes, and
their life cycle is one piece of module state (the registry of live workers, the exit
hook, the SIGTERM handler, the "program is ending" flag) that every context maker below
reads; split, that state would be shared across modules or passed around.

TFF's own `tff.backends.native.set_sync_local_cpp_execution_context()` (the default context
`import tensorflow_federated` installs) starts a `worker_binary` subprocess that inherits the
parent's stdout and is stopped only from a `__del__`, which often never runs: the worker
outlives Python and keeps the parent's output pipe open, so a test run or a CI job that
reads that pipe hangs. This module is the one place in the package that creates execution
contexts, and it owns their workers:

* each worker writes to its own log file, never to the parent's stdout/stderr; the log is
  removed when the worker stops, and a killed program's by the next worker started in the
  same temporary folder (`leftovers`);
* each worker is started with a parent-death signal (Linux, `children.dying_with_parent`),
  so even a parent killed with SIGKILL takes its workers along;
* every worker is registered and stopped (SIGTERM, then SIGKILL after a grace period) by
  `stop_all_workers()`, which runs at interpreter exit, after uncaught exceptions and Ctrl-C,
  and on SIGTERM.

Nothing happens at import: TFF's default context stays TFF's own, and no worker, signal
handler or exit hook is installed (`tasks`, imported first, drops TFF's own context at exit
so that its clean-up runs quietly: `tasks/quiet.py`). Where computations run is chosen
explicitly, in one line::

  tff_zmg.set_default_execution_context()  # For the rest of the program (notebooks, scripts).

  with tff_zmg.execution_context():         # For a block; its worker stops at the end.
    state = process.initialize()

The programs of `launch` install the managed default at start (`launch.cli.failures.run_program`),
the tests for their session (`tests/conftest.py`). A notebook or script that installs nothing
runs on TFF's own default context, as with TFF alone: its computations work, but its worker
may write into the program's output and outlive it if the program is killed (at a normal
exit `tasks/quiet.py` stops it). The library does not make that choice at import:
replacing TFF's global context from an import would also silently discard a context the
user had set before `import tff_zmg`, depending on import order.

Making a `LocalWorker` arms the exit hooks, once: `stop_all_workers()` at interpreter exit,
and on SIGTERM when made in the main thread while SIGTERM has no handler (the programs of
`launch` have their own, which ends them through the same exit path).

Several machines: each runs TFF's executor service (`python -m launch.worker --port=8000`),
and `remote_execution_context(['hostA:8000', 'hostB:8000'])` spreads every round's clients
over them with TFF's own mergeable-computation context. Those workers belong to whoever
started them; this module connects to them and never starts or stops them.
"""

import atexit
import contextlib
import functools
import os
import signal
import subprocess
import tempfile
import threading
import time
from typing import Optional, Sequence, Union

from absl import logging
import grpc
import portpicker
import tensorflow_federated as tff
from tensorflow_federated.proto.v0 import computation_pb2

from tff_zmg.runtime import children
from tff_zmg.runtime import leftovers

_WORKER_START_TIMEOUT_S = 60.0
_WORKER_STOP_GRACE_S = 2.0
_GRPC_OPTIONS = [
    ('grpc.max_message_length', 2**31 - 1),
    ('grpc.max_receive_message_length', 2**31 - 1),
]
_LOG_PREFIX = 'tff_zmg-worker-'
# Default time a remote worker may not answer, at start or before a call, before the run
# fails: long enough for a network blip, short enough that a dead machine fails the round.
REMOTE_CONNECT_TIMEOUT_S = 10.0
WORKER_HELP = (
    'start one on each machine with `python -m launch.worker --port=PORT` (the same TFF'
    ' version as here) and check the host names, ports and firewalls'
)

_lock = threading.Lock()
_live_workers: set['LocalWorker'] = set()
_started_pids: list[int] = []
# Set once the program is ending (`stop_all_workers(final=True)`, at exit): no worker starts
# after that, e.g. for a computation that a finalizer or a `finally` runs during shutdown.
_final = False
_exit_hook_registered = False
# The worker of the context `set_default_execution_context` installed last.
_default_worker: Optional['LocalWorker'] = None


def worker_binary_path() -> str:
  """The `worker_binary` shipped inside the installed TFF package."""
  return os.path.join(os.path.dirname(tff.__file__), 'data', 'worker_binary')


class WorkerStartError(RuntimeError):
  """A TFF worker process did not come up."""


class WorkerUnavailableError(RuntimeError):
  """A remote TFF worker cannot be reached: not started, or gone in the middle of a run.

  Deliberately not a `tff.framework.RetryableError`: TFF's contexts retry those forever.
  """

  def __init__(self, addresses: Sequence[str], message: str):
    super().__init__(message)
    self.addresses = tuple(addresses)


class LocalWorker:
  """One TFF C++ `worker_binary` serving on a port of this machine, owned by this process.

  Without `port` it picks a free one; `launch.worker` passes the port other machines use.
  `intra_op_threads` sets the threads each TF op of the worker may use (TF's
  `TF_NUM_INTRAOP_THREADS`; None: TF's default, every core); see `intra_op_threads_for`.
  """

  def __init__(
      self,
      max_concurrent_computation_calls: int = -1,
      port: Optional[int] = None,
      intra_op_threads: Optional[int] = None,
  ):
    if intra_op_threads is not None and intra_op_threads < 1:
      raise ValueError(f'intra_op_threads must be at least 1, got {intra_op_threads}')
    self._max_concurrent_computation_calls = max_concurrent_computation_calls
    self._port = port
    self._intra_op_threads = intra_op_threads
    self._process: Optional[subprocess.Popen] = None
    self._stub: Optional[tff.framework.RemoteExecutorGrpcStub] = None
    self._log_path: Optional[str] = None
    self._start_lock = threading.Lock()
    self._closed = False
    _stop_workers_at_exit()

  @property
  def pid(self) -> Optional[int]:
    return None if self._process is None else self._process.pid

  @property
  def log_path(self) -> Optional[str]:
    return self._log_path

  @property
  def port(self) -> Optional[int]:
    return self._port

  @property
  def address(self) -> Optional[str]:
    """`localhost:<port>` once the port is known (as `RemoteWorker.address`)."""
    return None if self._port is None else f'localhost:{self._port}'

  def poll(self) -> Optional[int]:
    """The worker's exit status once it has ended; None while it runs (or before start)."""
    return None if self._process is None else self._process.poll()

  def _environment(self) -> dict[str, str]:
    environment = dict(os.environ)
    if self._intra_op_threads is not None:
      environment['TF_NUM_INTRAOP_THREADS'] = str(self._intra_op_threads)
    return environment

  def _start(self) -> None:
    binary = worker_binary_path()
    if not os.path.isfile(binary):
      raise WorkerStartError(
          f'TFF worker binary not found at {binary}; reinstall with scripts/bootstrap.sh.'
      )
    port = self._port or portpicker.pick_unused_port()
    # Named after this process, so that the next worker's start removes a killed one's log.
    leftovers.remove_if_owner_gone(tempfile.gettempdir(), _LOG_PREFIX, os.remove)
    owner = leftovers.owner_tag()
    prefix = f'{_LOG_PREFIX}{owner}-{port}-' if owner else f'{_LOG_PREFIX}{port}-'
    fd, self._log_path = tempfile.mkstemp(prefix=prefix, suffix='.log')
    with os.fdopen(fd, 'wb') as log:
      self._process = subprocess.Popen(
          children.dying_with_parent([
              binary,
              f'--port={port}',
              '--max_concurrent_computation_calls='
              f'{self._max_concurrent_computation_calls}',
          ], 'KILL'),
          stdin=subprocess.DEVNULL,
          stdout=log,
          stderr=subprocess.STDOUT,
          env=self._environment(),
      )
    with _lock:
      _live_workers.add(self)
      _started_pids.append(self._process.pid)
    channel = grpc.insecure_channel(f'localhost:{port}', _GRPC_OPTIONS)
    stub = tff.framework.RemoteExecutorGrpcStub(channel)
    deadline = time.monotonic() + _WORKER_START_TIMEOUT_S
    while not stub.is_ready:
      if self._process.poll() is not None or time.monotonic() > deadline:
        self.stop(keep_log=True)
        raise WorkerStartError(
            f'TFF worker on port {port} did not start (is the port in use?); its log is'
            f' {self._log_path}'
        )
      time.sleep(0.05)
    self._stub = stub
    logging.info('Started TFF worker pid %d on port %d', self._process.pid, port)

  def stub(self) -> tff.framework.RemoteExecutorGrpcStub:
    """The worker's stub, (re)starting the worker if it is not serving.

    Raises:
      WorkerStartError: it did not start, or it was closed (`close()`) or the program is
        ending (`stop_all_workers(final=True)`): a computation run then, say by cleanup
        code after Ctrl-C, fails instead of starting a worker that nothing would stop.
    """
    with self._start_lock:
      if self._stub is None or not self._stub.is_ready:
        self.stop()
        if self._closed or _final:
          raise WorkerStartError(
              'the TFF worker was stopped for good ('
              + ('closed' if self._closed else 'the program is ending') + ')'
          )
        self._start()
      return self._stub

  def close(self) -> None:
    """Stops the worker for good: `stub()` then fails instead of starting a new one."""
    self._closed = True
    self.stop()

  def stop(self, keep_log: bool = False) -> None:
    """Ends the worker: SIGTERM (it ignores SIGINT), then SIGKILL after a grace period.

    Its log goes, unless `keep_log`: then it is renamed so that no later worker's start
    removes it once this process is gone (`log_path` says where it is).
    """
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
    if self._log_path and keep_log:
      self._log_path = leftovers.disown(self._log_path, _LOG_PREFIX)
    elif self._log_path:
      with contextlib.suppress(OSError):
        os.remove(self._log_path)
      self._log_path = None


def intra_op_threads_for(
    clients: int, cpus: Optional[int] = None, *, max_concurrent_clients: int = -1
) -> int:
  """Threads per TF op for a worker that runs a round of `clients` clients.

      concurrent_clients = min(clients, max_concurrent_clients)  (all if the cap <= 0)
      intra_op_threads = max(1, cpus // concurrent_clients)

  The worker runs a round's clients side by side, so with at least as many clients as
  cores the cores are already busy and ops split across threads only contend: on the
  2-core machine, EMNIST with 10 clients, one thread per op made FedAvg's round 10%
  faster (paired A/B, docs/performance.md). With fewer clients than cores, each client's ops
  get the idle cores. A thread count may reorder a kernel's float sums;
  `tests/test_speed_settings.py` checks that the weights agree to 1e-6 either way.
  """
  concurrent_clients = clients
  if max_concurrent_clients > 0:
    concurrent_clients = min(clients, max_concurrent_clients)
  if concurrent_clients < 1:
    raise ValueError(f'concurrent_clients must be at least 1, got {concurrent_clients}')
  cpus = cpus or os.cpu_count() or 1
  return max(1, cpus // concurrent_clients)


def live_worker_pids() -> list[int]:
  """The pids of workers this process started and has not stopped yet."""
  with _lock:
    return sorted(w.pid for w in _live_workers if w.pid is not None)


def started_worker_pids() -> list[int]:
  """The pids of every worker this process has started, stopped or not, in order."""
  with _lock:
    return list(_started_pids)


def stop_all_workers(final: bool = False) -> None:
  """Stops every worker this process started. Safe to call any number of times.

  `final`: the program is ending; no worker may start any more (at exit).
  """
  global _final
  with _lock:
    _final = _final or final
    workers = list(_live_workers)
  for worker in workers:
    worker.stop()


def parse_worker_address(address: str) -> str:
  """Checks a worker address `host:port` (`[v6-address]:port` for IPv6); returns it trimmed.

  Raises:
    ValueError: not of that form, or the port is not in 1..65535.
  """
  text = str(address).strip()
  host, sep, port = text.rpartition(':')
  if host.startswith('[') and host.endswith(']'):
    bare_host = host[1:-1]
  else:
    bare_host = host
  if (
      not sep or not bare_host or not port.isdigit() or not 1 <= int(port) <= 65535
      or (':' in bare_host and bare_host == host)
  ):
    raise ValueError(
        f"worker address {address!r} is not 'host:port' (e.g. 'hostA:8000', '10.0.0.7:8000',"
        " '[::1]:8000') with a port in 1..65535"
    )
  return text


class RemoteWorker:
  """A TFF executor service at `host:port` that someone else runs (`python -m launch.worker`).

  Offers `LocalWorker`'s `stub()`, but is never started or stopped from here. TFF's contexts
  retry an unavailable worker forever (they expect it to be restarted, as a local one is);
  instead `stub()` waits up to `connect_timeout_s` for the worker to serve again and then
  raises `WorkerUnavailableError`, which TFF does not retry, so the call fails.
  """

  def __init__(self, address: str, connect_timeout_s: float = REMOTE_CONNECT_TIMEOUT_S):
    self.address = parse_worker_address(address)
    self.connect_timeout_s = connect_timeout_s
    self._channel = grpc.insecure_channel(self.address, _GRPC_OPTIONS)
    self._stub = tff.framework.RemoteExecutorGrpcStub(self._channel)

  def wait_ready(self, timeout_s: float) -> bool:
    """Whether the worker serves (now, or within `timeout_s` seconds)."""
    deadline = time.monotonic() + timeout_s
    while not self._stub.is_ready:
      if time.monotonic() >= deadline:
        return False
      time.sleep(0.05)
    return True

  def stub(self) -> tff.framework.RemoteExecutorGrpcStub:
    """The worker's stub once it serves.

    Raises:
      WorkerUnavailableError: it did not serve within the connection timeout.
    """
    if not self.wait_ready(self.connect_timeout_s):
      raise WorkerUnavailableError(
          [self.address],
          f'the TFF worker at {self.address} did not answer for {self.connect_timeout_s:g} s',
      )
    return self._stub

  def close(self) -> None:
    self._channel.close()


def connect_workers(
    addresses: Sequence[str], timeout_s: float = REMOTE_CONNECT_TIMEOUT_S
) -> list[RemoteWorker]:
  """Connects to every remote worker at once, waiting up to `timeout_s` for all of them.

  The workers keep `timeout_s` as the time they may not answer during a computation.

  Raises:
    ValueError: an address is malformed or given twice.
    WorkerUnavailableError: some workers did not answer; it names them all.
  """
  addresses = [parse_worker_address(a) for a in addresses]
  if not addresses:
    raise ValueError('no worker addresses given')
  duplicates = sorted({a for a in addresses if addresses.count(a) > 1})
  if duplicates:
    raise ValueError(f'worker addresses given twice: {", ".join(duplicates)}')
  workers = [RemoteWorker(a, timeout_s) for a in addresses]
  deadline = time.monotonic() + timeout_s
  # The channels connect in parallel, so all workers share one deadline.
  unreachable = [
      w.address for w in workers if not w.wait_ready(max(0.0, deadline - time.monotonic()))
  ]
  if unreachable:
    for w in workers:
      w.close()
    raise WorkerUnavailableError(
        unreachable,
        f'TFF worker{"s" if len(unreachable) > 1 else ""} not reachable within'
        f' {timeout_s:g} s: {", ".join(unreachable)}; {WORKER_HELP}',
    )
  return workers


class ComputationCachingRemoteExecutor(tff.framework.RemoteExecutor):
  """A `RemoteExecutor` that sends each compiled computation to its worker once.

  TFF's execution context calls `create_value(computation)` on every invocation, which
  copies the whole computation proto into a `Value` and serializes it, in pure-Python
  protobuf here: about 0.15-0.2 s of a FedAvg round on the EMNIST CNN, on the critical
  path. The context's compiler cache hands back the same compiled object each time, so
  the worker-side value made for it the first time serves every later call (a value is
  not consumed by `create_call`). Keyed by identity, holding the computation so its id is
  not reused; cleared when the worker-side executor is replaced, as its values go with it.

  A cached value lives as long as its executor, so it may be disposed of (TFF does that
  from a finalizer, at the latest at interpreter exit) after the context has closed the
  worker's channel; that disposal is skipped instead of failing, as the worker drops
  the values with the executor anyway.
  """

  def __init__(self, stub, **kwargs):
    super().__init__(stub, **kwargs)
    self._computations = {}

  def _dispose(self, value_ref, value_executor_id):
    try:
      super()._dispose(value_ref, value_executor_id)
    except grpc.RpcError:
      pass  # The worker is gone, and its values with it.
    except ValueError as e:
      if 'closed channel' not in str(e):
        raise

  def set_cardinalities(self, cardinalities):
    self._computations.clear()
    super().set_cardinalities(cardinalities)

  def close(self):
    self._computations.clear()
    super().close()

  async def create_value(self, value, type_spec=None):
    if not isinstance(value, (tff.framework.ConcreteComputation, computation_pb2.Computation)):
      return await super().create_value(value, type_spec)
    cached = self._computations.get(id(value))
    if cached is None or cached[0] is not value or cached[1] != type_spec:
      remote = await super().create_value(value, type_spec)
      cached = (value, type_spec, remote)
      self._computations[id(value)] = cached
    return cached[2]


def _executor_factory(
    worker: Union[LocalWorker, RemoteWorker],
    default_num_clients: int,
    cache_computations: bool,
) -> tff.framework.ResourceManagingExecutorFactory:
  """TFF's per-cardinality executor cache, each executor a `RemoteExecutor` on `worker`."""
  executor_class = (
      ComputationCachingRemoteExecutor if cache_computations else tff.framework.RemoteExecutor
  )

  def executor_stack_fn(cardinalities):
    if cardinalities.get(tff.CLIENTS) is None:
      cardinalities[tff.CLIENTS] = default_num_clients
    executor = executor_class(worker.stub())
    executor.set_cardinalities(cardinalities)
    return executor

  return tff.framework.ResourceManagingExecutorFactory(executor_stack_fn=executor_stack_fn)


def create_sync_context(
    workers: Sequence[Union[LocalWorker, RemoteWorker]],
    default_num_clients: int = 0,
    cache_computations: bool = True,
) -> tff.framework.SyncContext:
  """A synchronous TFF context that runs computations on the given workers.

  One worker runs whole computations. Several run TFF's mergeable-computation context: TFF
  compiles each computation into `up_to_merge` / `merge` / `after_merge` on its one level
  of aggregation, gives each worker a contiguous slice of the CLIENTS-placed arguments,
  and merges the partial aggregates. The workers' lives are the caller's.

  Args:
    workers: The workers (at least one).
    default_num_clients: Cardinality of CLIENTS when it cannot be inferred.
    cache_computations: True: each compiled computation is sent to a worker once
      (`ComputationCachingRemoteExecutor`); False: TFF's own `RemoteExecutor`, which
      sends it on every call (the benchmark's stock-TFF contender).
  """
  if len(workers) == 1:
    return tff.framework.SyncExecutionContext(
        executor_fn=_executor_factory(workers[0], default_num_clients, cache_computations),
        compiler_fn=tff.backends.native.desugar_and_transform_to_native,
        transform_args=tff.tensorflow.transform_args,
        transform_result=tff.tensorflow.transform_result,
    )
  # Every worker runs the same compiled parts; compile each once, not once per worker (with
  # the pure-Python protobuf TFF 0.87 runs on here, compiling dominates a first round).
  compile_once = functools.lru_cache(maxsize=None)(
      tff.backends.native.desugar_and_transform_to_native
  )
  return tff.backends.native.create_mergeable_comp_execution_context([
      tff.framework.AsyncExecutionContext(
          executor_fn=_executor_factory(worker, default_num_clients, cache_computations),
          compiler_fn=compile_once,
          transform_args=tff.tensorflow.transform_args,
          transform_result=tff.tensorflow.transform_result,
      )
      for worker in workers
  ])


@contextlib.contextmanager
def remote_execution_context(
    addresses: Sequence[str],
    default_num_clients: int = 0,
    connect_timeout_s: float = REMOTE_CONNECT_TIMEOUT_S,
):
  """Runs the enclosed TFF computations on remote TFF workers (one or several).

  Args:
    addresses: `host:port` of each worker (`python -m launch.worker --port=...`).
    default_num_clients: Cardinality of CLIENTS when it cannot be inferred.
    connect_timeout_s: How long a worker may not answer, at start or before a call,
      before `WorkerUnavailableError`.

  Yields:
    The `RemoteWorker`s, in the order of `addresses`.

  Raises:
    ValueError: a malformed or repeated address.
    WorkerUnavailableError: a worker did not answer at start, or stopped answering during
      a computation (that computation fails; nothing is retried on another worker).
  """
  workers = connect_workers(addresses, connect_timeout_s)
  context = create_sync_context(workers, default_num_clients)
  try:
    with tff.framework.get_context_stack().install(context):
      yield workers
  except grpc.RpcError as e:
    # A worker dying in the middle of a call can surface as a non-retryable gRPC error
    # (e.g. a stream reset). It is a lost worker only if one no longer answers; an error
    # from a computation on live workers (say, a missing data file) stays what it is.
    lost = [w.address for w in workers if not w.wait_ready(w.connect_timeout_s)]
    if not lost:
      raise
    raise WorkerUnavailableError(
        lost,
        f'the TFF worker{"s" if len(lost) > 1 else ""} at {", ".join(lost)} stopped'
        f' answering ({e.code().name if isinstance(e, grpc.Call) else e})',
    ) from e
  finally:
    for worker in workers:
      worker.close()


@contextlib.contextmanager
def execution_context(
    max_concurrent_computation_calls: int = -1,
    default_num_clients: int = 0,
    intra_op_threads: Optional[int] = None,
):
  """Runs the enclosed TFF computations on a fresh local C++ worker, stopped on exit.

  Args:
    max_concurrent_computation_calls: How many client computations the worker runs at
      once; non-positive means no limit (TFF's default).
    default_num_clients: Cardinality of CLIENTS when it cannot be inferred.
    intra_op_threads: Threads per TF op in the worker (None: TF's default); for a
      round of N clients, `intra_op_threads_for(N)` is the fast choice.

  Yields:
    The `LocalWorker` serving the context (its `pid` and `log_path` are useful in tests).
  """
  worker = LocalWorker(max_concurrent_computation_calls, intra_op_threads=intra_op_threads)
  worker.stub()  # Start now, from this thread (the parent-death signal follows it).
  context = create_sync_context([worker], default_num_clients)
  try:
    with tff.framework.get_context_stack().install(context):
      yield worker
  finally:
    worker.close()


def set_default_execution_context(
    max_concurrent_computation_calls: int = -1,
    default_num_clients: int = 0,
    intra_op_threads: Optional[int] = None,
    start: bool = True,
) -> LocalWorker:
  """Makes a managed local C++ context TFF's default for the rest of the program.

  For notebooks and scripts that do not want a `with` block. The worker is stopped at
  interpreter exit (or by `stop_all_workers()`). Calling it again (a notebook cell run
  twice) stops the worker of the context it installed before.

  Args:
    max_concurrent_computation_calls: As `execution_context`.
    default_num_clients: As `execution_context`.
    intra_op_threads: As `execution_context`.
    start: True: start the worker now (a missing binary or a busy machine fails here);
      False: at the first computation, so that a program that runs none starts nothing.

  Returns:
    The `LocalWorker` serving the context.
  """
  global _default_worker
  worker = LocalWorker(max_concurrent_computation_calls, intra_op_threads=intra_op_threads)
  if start:
    worker.stub()  # From this thread (the parent-death signal follows it).
  tff.framework.set_default_context(create_sync_context([worker], default_num_clients))
  previous, _default_worker = _default_worker, worker
  if previous is not None:
    previous.close()
  return worker


def _stop_on_sigterm(signum, frame):
  del frame
  stop_all_workers(final=True)
  # Leave through the normal exit path, so `finally` blocks and atexit handlers run.
  raise SystemExit(128 + signum)


def _stop_workers_at_exit() -> None:
  """Arms the exit hooks, once: stop every worker at interpreter exit and on SIGTERM.

  Called by each `LocalWorker`, so that whatever starts a worker gets them, and nothing
  is installed before a worker exists.
  """
  global _exit_hook_registered
  with _lock:
    if not _exit_hook_registered:
      atexit.register(stop_all_workers, final=True)
      _exit_hook_registered = True
  if (
      threading.current_thread() is threading.main_thread()
      and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
  ):
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
