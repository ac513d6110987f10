"""Runs any federated computation by evaluating its call-dominant form in this process.

TFF compiles a federated computation to a tree of building blocks; `to_call_dominant`
flattens it to one `let` of calls: intrinsics (`federated_map`, `federated_sum`, ...) and
compiled TensorFlow computations, tied together by references, selections, structs and
small lambdas. `FederatedInterpreter` evaluates that tree as TFF's C++ executors do, on the
values of `federated_values` (tensors, datasets, structs; `Placed` for federated ones) and
the intrinsics of `intrinsics`; a function (a lambda, an intrinsic, a compiled computation)
is a Python callable of one argument (none for a no-argument one).

A compiled computation runs as `tf_computation.ImportedComputation`, imported once per
device and slot. The clients of a `federated_map` (or `federated_eval_at_clients`) run as
the MapReduceForm rounds of `in_process` run theirs: client i on `devices[i % n]`,
`clients_per_device` of them at once per device, results in client order; everything the
server computes (aggregations, `federated_apply`, unplaced calls) runs on the first
device. Sums and means add client values in client order, so results do not depend on
timing.

What it cannot run, refused with `InProcessUnsupportedError` before anything runs:
external data (`Data` blocks, which name files or URIs TFF's workers resolve) and
intrinsics this module does not define (none of TFF 0.87's, as of writing: the secure
ones are first lowered to a bound check and a sum, as TFF's test backend does).
"""

import threading
from typing import Any, Callable, Optional, Sequence

import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.common_libs import structure
from tensorflow_federated.python.core.impl.compiler import building_blocks
from tensorflow_federated.python.core.impl.types import placements

from tff_zmg.runtime import client_slots
from tff_zmg.runtime import federated_values
from tff_zmg.runtime import intrinsics
from tff_zmg.runtime import tf_computation

# Raised for what the interpreter cannot run (its own class, not a TypeError).
InProcessUnsupportedError = federated_values.InProcessUnsupportedError


class FederatedInterpreter:
  """One federated computation, compiled once, evaluated on every call.

  Args:
    comp: A `tff.framework.ConcreteComputation` (federated).
    devices: Where clients run (client i on `devices[i % n]`); the server on the first.
    clients_per_device: Clients each device runs at once.
    remote: Optional `remote_clients.RemoteClientWork`: compiled client computations
      mapped over the clients run on its TFF workers instead (everything else here).
  """

  def __init__(self, comp, devices: Sequence[str], clients_per_device: int, remote=None):
    self.type_signature = comp.type_signature
    if _uses_secure_intrinsics(comp.to_building_block()):
      comp = tff.backends.test.replace_secure_intrinsics_with_bodies(comp)
    self._root = tff.framework.to_call_dominant(comp.to_building_block())
    self._check(self._root)
    self._slots = client_slots.ClientSlots(devices, clients_per_device)
    self._remote = remote
    self._imports: dict[tuple[int, int, str], tf_computation.ImportedComputation] = {}
    self._imports_lock = threading.Lock()
    self.last_client_devices: list[str] = []

  def _check(self, root) -> None:
    """Refuses, before anything runs, what `_evaluate` cannot evaluate."""
    for block in _walk(root):
      if isinstance(block, building_blocks.Data):
        raise InProcessUnsupportedError(
            f'a computation of type {self.type_signature} reads external data'
            f' ({block.compact_representation()[:80]}), which only TFF\'s workers resolve'
        )
      if isinstance(block, building_blocks.Intrinsic) and block.uri not in intrinsics.INTRINSICS:
        raise InProcessUnsupportedError(
            f'a computation of type {self.type_signature} calls {block.uri}, an intrinsic'
            ' the in-process runtime does not define'
        )

  def __call__(self, arg: Any = None) -> Any:
    self.last_client_devices = []
    function = self._evaluate(self._root, {})
    parameter = self.type_signature.parameter
    if parameter is None:
      self.num_clients = None
      result = function()
    else:
      value = federated_values.ingest(arg, parameter)
      self.num_clients = _num_clients(value)
      result = function(value)
    return federated_values.export(result, self.type_signature.result)

  def members(self, value: federated_values.Placed) -> list:
    """One member per client of a CLIENTS value (an all-equal one repeated).

    Raises:
      InProcessUnsupportedError: an all-equal value, and a call without CLIENTS values
        to tell how many clients there are (TFF's workers refuse it too).
    """
    if not value.all_equal:
      return value.members
    if self.num_clients is None:
      raise InProcessUnsupportedError(
          f'a computation of type {self.type_signature} needs the number of clients (to'
          ' aggregate or combine a value equal at every client), and its call gives no'
          ' CLIENTS values to count'
      )
    return value.members * self.num_clients

  # Evaluation of the building blocks.

  def _evaluate(self, block, env: dict) -> Any:
    if isinstance(block, building_blocks.Reference):
      return env[block.name]
    if isinstance(block, building_blocks.Block):
      env = dict(env)
      for name, local in block.locals:
        env[name] = self._evaluate(local, env)
      return self._evaluate(block.result, env)
    if isinstance(block, building_blocks.Call):
      function = self._evaluate(block.function, env)
      if block.argument is None:
        return function()
      return function(self._evaluate(block.argument, env))
    if isinstance(block, building_blocks.Struct):
      return structure.Struct([(name, self._evaluate(element, env))
                               for name, element in structure.iter_elements(block)])
    if isinstance(block, building_blocks.Selection):
      source = self._evaluate(block.source, env)
      return source[block.as_index()]
    if isinstance(block, building_blocks.Lambda):
      return self._lambda(block, env)
    if isinstance(block, building_blocks.CompiledComputation):
      return self._compiled(block)
    if isinstance(block, building_blocks.Intrinsic):
      return intrinsics.INTRINSICS[block.uri](self, block.type_signature)
    if isinstance(block, building_blocks.Literal):
      return tf.constant(block.value, block.type_signature.dtype)
    if isinstance(block, building_blocks.Placement):
      return block.uri
    raise InProcessUnsupportedError(f'cannot evaluate {type(block).__name__} blocks')

  def _lambda(self, block, env: dict) -> Callable[..., Any]:
    if block.parameter_name is None:
      return lambda: self._evaluate(block.result, env)
    return lambda arg: self._evaluate(block.result, {**env, block.parameter_name: arg})

  def _compiled(self, block) -> Callable[..., Any]:
    type_signature = block.type_signature

    def run(arg=None):
      slot, device = self._slots.current
      key = (id(block), slot, device)
      with self._imports_lock:
        imported = self._imports.get(key)
        if imported is None:
          imported = tf_computation.ImportedComputation(
              tff.framework.ConcreteComputation.from_building_block(block), device
          )
          self._imports[key] = imported
      flat = [] if arg is None else tf_computation.flatten(arg, type_signature.parameter)
      return federated_values.unflatten(imported(*flat), type_signature.result)

    run.block = block  # Holds the block, so its id stays its own while cached.
    return run

  # Placement helpers for the intrinsics.

  def server(self, value) -> federated_values.Placed:
    return federated_values.Placed(placements.SERVER.uri, [value], True)

  def at_clients(self, members: list, all_equal: bool = False) -> federated_values.Placed:
    return federated_values.Placed(placements.CLIENTS.uri, members, all_equal)

  def map_clients(self, fn: Callable[[Any], Any], members: list) -> list:
    """[fn(m) for m in members] on the client slots (or the remote workers), in order."""
    block = getattr(fn, 'block', None)
    if self._remote is not None and block is not None:
      results = self._remote.map(block, members)
      devices = [f'worker {self._remote.workers[w].address}'
                 for w in self._remote.last_client_workers]
    else:
      results = self._slots.map(fn, members)
      devices = [_device_of(r) for r in results]
    # Where the clients' work ran: the call's first compiled computation over them (the
    # lambdas that follow only select from its results).
    if block is not None and not self.last_client_devices:
      self.last_client_devices = devices
    return results

  def on_server(self, fn: Callable[[], Any]) -> Any:
    with tf.device(self._slots.devices[0]):
      return fn()


def _device_of(value) -> str:
  """The device of a client's largest tensor output (as `in_process._device_of`)."""
  tensors = [l for l in federated_values.leaves(value) if isinstance(l, tf.Tensor)]
  if not tensors:
    return ''
  return max(tensors, key=lambda t: t.shape.num_elements() or 0).device


def _walk(block):
  yield block
  for child in block.children():
    yield from _walk(child)


def _uses_secure_intrinsics(block) -> bool:
  return any(isinstance(b, building_blocks.Intrinsic) and 'secure' in b.uri
             for b in _walk(block))


def _num_clients(value: Any) -> Optional[int]:
  """How many clients the CLIENTS values of a call's argument hold (None: it has none).

  Raises:
    ValueError: two CLIENTS values of different lengths.
  """
  if isinstance(value, federated_values.Placed):
    counts = {len(value.members)} if value.placement == placements.CLIENTS.uri and (
        not value.all_equal) else set()
  elif isinstance(value, structure.Struct):
    counts = {_num_clients(v) for _, v in structure.iter_elements(value)} - {None}
  else:
    counts = set()
  if len(counts) > 1:
    raise ValueError(f'CLIENTS values of different numbers of clients: {sorted(counts)}')
  return counts.pop() if counts else None
