"""Runs TFF computations with the TensorFlow of this Python process, on its CPUs or GPUs.

TFF 0.87's pip `worker_binary` is built without CUDA, so nothing it runs reaches a GPU
(TFF issues #3709, #4600). The TensorFlow in this process is a CUDA build. This context
runs every computation here instead, in one of three ways:

* a TF computation (`get_model_weights`, `initial_client_state`, ...) is imported and run
  as one graph (`tf_computation.ImportedComputation`);
* a round, `<S@SERVER, {D}@CLIENTS> -> <S@SERVER, X@SERVER>` (`next` of a learning or
  evaluation process), through TFF's public MapReduceForm compiler, after lowering the
  secure-sum intrinsics as TFF's test backend does
  (`tff.backends.test.replace_secure_intrinsics_with_bodies`: a bound check and a sum):

      C = prepare(S);  A = zero()
      for each client i, in order:  A = accumulate(A, work(D_i, C)[0])
      S', X = update(S, <report(A), <>, <>, <>>)

  This is the rounds' fast path: four imported graphs, one call of `work` per client;
* any other federated computation (`initialize`, a client work's or a finalizer's `next`,
  a distributor, a round whose clients return values, personalization evaluation, ...)
  by evaluating its call-dominant form (`interpreter.FederatedInterpreter`).

Each computation is compiled and imported once per context. Clients are spread over
`devices` round-robin (client i on `devices[i % len(devices)]`), each device runs
`clients_per_device` of them at once (a thread each; by default one per core on the CPU,
one per GPU), the server's parts run on the first device, and client values are added in
client order, so results do not depend on timing.

What neither can run (external data, an intrinsic the interpreter does not define) is
refused with `InProcessUnsupportedError` naming the computation's type and why; nothing
falls back to another runtime.

The state stays the Python structure `process.next` returns on TFF's own contexts, so
checkpoints, resumption and `get_model_weights` work unchanged.
"""

import collections
import contextlib
import os
import threading
from typing import Any, Optional, Sequence

import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.common_libs import structure

from tff_zmg.runtime import client_slots
from tff_zmg.runtime import federated_values
from tff_zmg.runtime import forms
from tff_zmg.runtime import interpreter
from tff_zmg.runtime import remote_clients
from tff_zmg.runtime import tf_computation

InProcessUnsupportedError = interpreter.InProcessUnsupportedError


def visible_gpus() -> list[str]:
  """The logical GPU devices TensorFlow sees in this process (memory growth on)."""
  for gpu in tf.config.list_physical_devices('GPU'):
    with contextlib.suppress(RuntimeError):  # Already initialized: leave it as it is.
      tf.config.experimental.set_memory_growth(gpu, True)
  return [d.name for d in tf.config.list_logical_devices('GPU')]


def device_name(name: str) -> str:
  """'/job:localhost/replica:0/task:0/device:GPU:1', '/GPU:1' or 'GPU:1' -> '/device:GPU:1'.

  Raises:
    ValueError: `name` is not a device name.
  """
  spec = tf.DeviceSpec.from_string(name)
  return f'/device:{spec.device_type or "CPU"}:{spec.device_index or 0}'


def check_devices(devices: Sequence[str]) -> None:
  """Refuses a device this process's TensorFlow does not see, before any work: a round
  placed on it would fail only once it runs.

  Raises:
    ValueError: (one line) naming the first such device, and those TensorFlow sees.
  """
  visible_gpus()  # Memory growth on, before listing devices starts TensorFlow's runtime.
  known = sorted({device_name(d.name) for d in tf.config.list_logical_devices()})
  for device in devices:
    if device_name(device) not in known:
      raise ValueError(f'{device} is not a device of this process; TensorFlow sees {known}')


def set_intra_op_threads(threads: int) -> bool:
  """Sets the threads each TF op of this process may use; True if that holds now.

  TensorFlow fixes its thread pools when its runtime starts (at the first op), so this
  works only before; afterwards it returns whether the running value already is
  `threads`. With as many clients at once as cores, one thread per op is the fast
  choice for the same reason as in TFF's worker (`cpp_worker.intra_op_threads_for`).
  """
  if threads < 1:
    raise ValueError(f'threads must be at least 1, got {threads}')
  if tf.config.threading.get_intra_op_parallelism_threads() == threads:
    return True
  try:
    tf.config.threading.set_intra_op_parallelism_threads(threads)
  except RuntimeError:  # The runtime has started: its pools are fixed.
    return False
  return True


def _describe(comp) -> str:
  return f'a computation of type {comp.type_signature}'


def _device_of(update: Sequence[tf.Tensor]) -> str:
  """The device holding a client's largest output tensor (its model update).

  A GPU keeps float outputs in its own memory, so they carry its name; every CPU-type
  device (a logical CPU:1, XLA_CPU) returns host memory, which reads as the task's CPU:0.
  """
  if not update:
    return ''
  return max(update, key=lambda t: t.shape.num_elements() or 0).device


def _is_round(type_signature: tff.FunctionType) -> bool:
  """Whether a computation has a round's shape: <S@SERVER, {D}@CLIENTS> -> SERVER values.

  Such a computation runs through MapReduceForm (`_Round`) when TFF can compile it to one;
  the interpreter runs the rest.
  """
  parameter, result = type_signature.parameter, type_signature.result

  def placed_at(t, placement, all_equal):
    return (isinstance(t, tff.FederatedType) and t.placement is placement
            and t.all_equal == all_equal)

  if not isinstance(parameter, tff.StructType) or len(parameter) != 2:
    return False
  if not (placed_at(parameter[0], tff.SERVER, True)
          and placed_at(parameter[1], tff.CLIENTS, False)):
    return False
  results = list(result) if isinstance(result, tff.StructType) else [result]
  return all(placed_at(t, tff.SERVER, True) for t in results)


class _Round:
  """One federated round compiled to MapReduceForm and imported for the given devices."""

  def __init__(self, comp, devices: Sequence[str], clients_per_device: int):
    try:
      form = forms.map_reduce_form(comp)
      if form.securely_aggregates_tensors:
        # Compiled again, lowered: a second compile only for the rare secure round,
        # instead of a lowering pass (seconds of pure-Python protobuf) for every round.
        form = forms.compile_form(
            tff.backends.test.replace_secure_intrinsics_with_bodies(comp)
        )
    except Exception as e:  # pylint: disable=broad-except
      raise InProcessUnsupportedError(
          f'the in-process runtime runs rounds of the shape <S@SERVER, {{D}}@CLIENTS> ->'
          f' <S@SERVER, X@SERVER> (TFF\'s MapReduceForm); {_describe(comp)} is not one'
          f' ({type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else e})'
      ) from e
    if form.securely_aggregates_tensors:
      raise InProcessUnsupportedError(
          f'{_describe(comp)} still aggregates securely after lowering the secure sums'
      )
    self._state_type = form.prepare.type_signature.parameter
    self._data_type = form.work.type_signature.parameter[0]
    self._result_type = comp.type_signature.result
    self._update_count = tf_computation.count_leaves(
        form.work.type_signature.result[0]
    )
    # The server's pieces run on the first device: the host CPU for a CPU run (never a GPU
    # that TensorFlow would pick by default), the first GPU for a GPU run.
    server = devices[0]
    self._prepare = tf_computation.ImportedComputation(form.prepare, server)
    self._zero = tf_computation.ImportedComputation(form.zero, server)
    self._accumulate = tf_computation.ImportedComputation(form.accumulate, server)
    self._report = tf_computation.ImportedComputation(form.report, server)
    self._update = tf_computation.ImportedComputation(form.update, server)
    # Slot s runs on devices[s % len(devices)], so client i runs on devices[i % len(devices)].
    self._slots = [
        tf_computation.ImportedComputation(form.work, device)
        for _ in range(clients_per_device)
        for device in devices
    ]
    self.devices = list(devices)
    self._client_slots = client_slots.ClientSlots(devices, clients_per_device)
    self.last_client_devices: list[str] = []

  def _work(self, client_value, broadcast) -> list[tf.Tensor]:
    slot, _ = self._client_slots.current
    data = tf_computation.flatten(client_value, self._data_type)
    return self._slots[slot](*data, *broadcast)[: self._update_count]

  def __call__(self, state, client_values) -> Any:
    client_values = list(client_values)
    if not client_values:
      raise ValueError('a round needs at least one client')
    state_leaves = tf_computation.flatten(state, self._state_type)
    broadcast = self._prepare(*state_leaves)
    accumulator = self._zero()
    devices = []
    updates = self._client_slots.imap(lambda value: self._work(value, broadcast), client_values)
    for update in updates:
      devices.append(_device_of(update))
      accumulator = self._accumulate(*accumulator, *update)
    self.last_client_devices = devices
    report = self._report(*accumulator)
    new_state_and_output = self._update(*state_leaves, *report)
    return tf_computation.pack(
        tf_computation.to_numpy(new_state_and_output), self._result_type
    )


class InProcessContext(tff.framework.SyncContext):
  """A synchronous TFF context that runs computations with this process's TensorFlow.

  Args:
    devices: The devices clients run on, e.g. `['/device:GPU:0', '/device:GPU:1']`;
      None: the host CPU. Everything else (the server's pieces, `initialize`, TF
      computations) runs on the first.
    clients_per_device: How many clients each device runs at once; None: one per core
      on the host CPU (a client's small ops keep one core busy better than two: FedAvg's
      EMNIST round went from 1.50x to 1.15x the plain-TF floor with two at once on two
      cores, docs/performance.md), one per GPU.
    workers: Optional connected TFF workers (`cpp_worker.RemoteWorker`s) of other
      machines: the clients' work goes to them, a contiguous slice each
      (`remote_clients`), and every computation runs through the interpreter, so that a
      stateful algorithm's clients' states come back; the rest runs here.
    compiled: Optional dict of what earlier contexts with the same devices and clients
      per device compiled (a warm slot's, `launch.run.builds`), used and added to, so
      that a computation run again in a new context is not compiled again.
  """

  def __init__(
      self, devices: Optional[Sequence[str]] = None, clients_per_device: Optional[int] = None,
      workers: Optional[Sequence[Any]] = None, compiled: Optional[dict] = None,
  ):
    self.devices = list(devices) if devices else [tf_computation.HOST_DEVICE]
    self._remote = remote_clients.RemoteClientWork(workers) if workers else None
    self.workers = [w.address for w in workers] if workers else []
    if clients_per_device is None:
      on_host = all(tf_computation.is_cpu(d) for d in self.devices)
      clients_per_device = (os.cpu_count() or 1) if on_host else 1
    if clients_per_device < 1:
      raise ValueError(f'clients_per_device must be at least 1, got {clients_per_device}')
    self.clients_per_device = clients_per_device
    self._compiled: dict[int, tuple[Any, Any]] = {} if compiled is None else compiled
    self._lock = threading.Lock()
    self.rounds_run = 0
    # Device of each client's update in the last round, read from the tensors `work`
    # returned (not from the requested placement), and how many client computations
    # ran on each device over every round so far.
    self.last_client_devices: list[str] = []
    self.client_devices: collections.Counter[str] = collections.Counter()

  def _compile(self, comp):
    """The runnable form of `comp`, made once per computation object."""
    with self._lock:
      cached = self._compiled.get(id(comp))
      if cached is not None and cached[0] is comp:
        return cached[1]
      if tf_computation.is_tensorflow(comp):
        runnable = tf_computation.ImportedComputation(comp, self.devices[0])
      else:
        runnable = None
        if self._remote is None and _is_round(comp.type_signature):
          # Not every round compiles to MapReduceForm (two broadcasts, say): those go to
          # the interpreter, like any other shape.
          with contextlib.suppress(InProcessUnsupportedError):
            runnable = _Round(comp, self.devices, self.clients_per_device)
        if runnable is None:
          runnable = interpreter.FederatedInterpreter(
              comp, self.devices, self.clients_per_device, self._remote)
      self._compiled[id(comp)] = (comp, runnable)  # Holds comp, so its id stays its own.
      return runnable

  def invoke(self, comp, arg):
    if not isinstance(comp, tff.framework.ConcreteComputation):
      raise InProcessUnsupportedError(f'not a TFF computation: {comp!r}')
    type_signature = comp.type_signature
    federated_values.check_argument(arg, type_signature.parameter)  # At the call, as TFF.
    runnable = self._compile(comp)
    if isinstance(runnable, (_Round, interpreter.FederatedInterpreter)):
      if isinstance(runnable, _Round):
        state, client_values = (value for _, value in structure.to_elements(arg))
        result = runnable(state, client_values)
      else:
        result = runnable(arg)
      if runnable.last_client_devices:  # Clients ran: a round, or a piece of one.
        self.rounds_run += 1
        self.last_client_devices = runnable.last_client_devices
        self.client_devices.update(runnable.last_client_devices)
      return result
    flat_args = []
    if type_signature.parameter is not None:
      flat_args = tf_computation.flatten(arg, type_signature.parameter)
    leaves = tf_computation.to_numpy(runnable(*flat_args))
    return tf_computation.pack(leaves, type_signature.result)


@contextlib.contextmanager
def in_process_context(
    devices: Optional[Sequence[str]] = None, clients_per_device: Optional[int] = None,
    workers: Optional[Sequence[Any]] = None, compiled: Optional[dict] = None,
):
  """Runs the enclosed TFF computations in this process (see `InProcessContext`).

  Yields:
    The `InProcessContext` (its `last_client_devices` says where the last round's
    clients ran).
  """
  context = InProcessContext(devices, clients_per_device, workers, compiled)
  with tff.framework.get_context_stack().install(context):
    yield context
