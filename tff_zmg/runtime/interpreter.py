"""Runs any federated computation by evaluating its call-dominant form in this process.

TFF compiles a federated computation to a tree of building blocks; `to_call_dominant`
flattens it to one `let` of calls: intrinsics (`federated_map`, `federated_sum`, ...) and
compiled TensorFlow computations, tied together by references, selections, structs and
small lambdas. `FederatedInterpreter` evaluates that tree as TFF's C++ executors do, with
values held here:

* an unplaced value is a tensor, a `tf.data.Dataset` or a `structure.Struct` of them;
* a placed value is a `Placed`: SERVER holds one member, CLIENTS one per client (one for an
  all-equal value, which is the same at every client);
* a function (a lambda, an intrinsic, a compiled computation) is a Python callable of one
  argument (none for a no-argument one).

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

import collections
import concurrent.futures
import threading
from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.common_libs import structure
from tensorflow_federated.python.core.impl.compiler import building_blocks
from tensorflow_federated.python.core.impl.types import placements
from tensorflow_federated.python.core.impl.types import type_conversions
from tensorflow_federated.python.core.impl.utils import tensorflow_utils

from tff_zmg.runtime import tf_computation


class InProcessUnsupportedError(Exception):
  """A computation the in-process runtime cannot run; the message says which and why.

  Not a `TypeError`: code that catches TFF's type errors must not take a refusal for a
  mismatch of types.
  """


class Placed:
  """A federated value: its placement, members and whether it is equal at every client."""

  def __init__(self, placement: str, members: list, all_equal: bool):
    self.placement = placement
    self.members = members
    self.all_equal = all_equal

  def __repr__(self):
    return f'Placed({self.placement}, {len(self.members)} members, all_equal={self.all_equal})'


def _placement_uri(type_spec: tff.FederatedType) -> str:
  return type_spec.placement.uri


# Values in: the Python values TFF's contexts accept, as the interpreter's values.


def ingest(value: Any, type_spec: tff.Type) -> Any:
  """`value` as given to a computation of parameter `type_spec` -> an interpreter value.

  Sequences given as Python lists of elements become datasets (`tf_computation.as_dataset`).
  """
  if isinstance(type_spec, tff.FederatedType):
    if _placement_uri(type_spec) == placements.CLIENTS.uri and not type_spec.all_equal:
      if not isinstance(value, (list, tuple)):
        raise TypeError(f'a value of {type_spec} must be a list (one per client), got '
                        f'{type(value).__name__}')
      return Placed(placements.CLIENTS.uri, [ingest(v, type_spec.member) for v in value],
                    False)
    return Placed(_placement_uri(type_spec), [ingest(value, type_spec.member)], True)
  if isinstance(type_spec, tff.StructType):
    if not isinstance(value, structure.Struct):
      value = structure.from_container(value)
    names = structure.name_list(value)
    return structure.Struct([
        (name, ingest(value[name] if name is not None and name in names else value[i], t))
        for i, (name, t) in enumerate(structure.iter_elements(type_spec))
    ])
  if isinstance(type_spec, tff.SequenceType):
    return tf_computation.as_dataset(value, type_spec)
  if isinstance(type_spec, tff.TensorType):
    return value
  raise TypeError(f'cannot pass a value of type {type_spec} to the in-process runtime')


# Values out: the Python values TFF's contexts return.


def _leaves(value: Any) -> list:
  if isinstance(value, structure.Struct):
    return [leaf for element in structure.iter_elements(value) for leaf in _leaves(element[1])]
  return [value]


def _to_python_leaf(leaf):
  if isinstance(leaf, tf.Tensor):
    return leaf.numpy()
  if isinstance(leaf, tf.data.Dataset):
    return leaf
  return np.asarray(leaf)


def _to_python(value: Any, type_spec: tff.Type) -> Any:
  if isinstance(type_spec, tff.FederatedType):
    if _placement_uri(type_spec) == placements.CLIENTS.uri and not type_spec.all_equal:
      return [_to_python(m, type_spec.member) for m in value.members]
    return _to_python(value.members[0], type_spec.member)
  if isinstance(type_spec, tff.StructType):
    return structure.Struct([(name, _to_python(value[i], t))
                             for i, (name, t) in enumerate(structure.iter_elements(type_spec))])
  if isinstance(type_spec, (tff.TensorType, tff.SequenceType)):
    return _to_python_leaf(value)
  raise TypeError(f'cannot return a value of type {type_spec} from the in-process runtime')


def export(value: Any, type_spec: tff.Type) -> Any:
  """An interpreter value of type `type_spec` -> the Python value TFF's contexts return
  (the containers its type records; a list per CLIENTS value that is not all-equal)."""
  return type_conversions.type_to_py_container(_to_python(value, type_spec), type_spec)


def _unflatten(leaves: Sequence[Any], type_spec: tff.Type) -> Any:
  """Flat results of a compiled computation as an interpreter value of `type_spec`."""
  iterator = iter(leaves)

  def build(t):
    if isinstance(t, tff.StructType):
      return structure.Struct([(name, build(e)) for name, e in structure.iter_elements(t)])
    leaf = next(iterator)
    if isinstance(t, tff.SequenceType):
      return tf.data.experimental.from_variant(
          leaf, type_conversions.type_to_tf_structure(t.element)
      )
    return leaf

  return build(type_spec)


# Arithmetic of the aggregating intrinsics, leaf by leaf.


def _map_leaves(fn: Callable[..., Any], *values: Any) -> Any:
  first = values[0]
  if isinstance(first, structure.Struct):
    names = [name for name, _ in structure.iter_elements(first)]
    return structure.Struct([
        (name, _map_leaves(fn, *(v[i] for v in values))) for i, name in enumerate(names)
    ])
  return fn(*values)


def sum_in_order(values: Sequence[Any]) -> Any:
  """sum_i v_i, added in client order (v_1 + v_2 + ...)."""
  total = values[0]
  for value in values[1:]:
    total = _map_leaves(tf.add, total, value)
  return total


def mean_in_order(values: Sequence[Any], weights: Optional[Sequence[Any]] = None) -> Any:
  """sum_i w_i v_i / sum_i w_i (w_i = 1 without weights), added in client order."""
  if weights is None:
    return _map_leaves(lambda s: s / tf.cast(len(values), s.dtype), sum_in_order(values))
  weighted = [
      _map_leaves(lambda v, w=w: v * tf.cast(w, tf.as_dtype(v.dtype)), value)
      for value, w in zip(values, weights)
  ]
  total_weight = sum_in_order(list(weights))
  return _map_leaves(
      lambda s: s / tf.cast(total_weight, s.dtype), sum_in_order(weighted)
  )


def _generic_zero(type_spec: tff.Type) -> Any:
  if isinstance(type_spec, tff.StructType):
    return structure.Struct([(n, _generic_zero(t)) for n, t in structure.iter_elements(type_spec)])
  if isinstance(type_spec, tff.TensorType):
    return tf.zeros(type_spec.shape, type_spec.dtype)
  raise InProcessUnsupportedError(f'no zero of the type {type_spec}')


def _iterate(dataset: tf.data.Dataset, element_type: tff.Type):
  for element in dataset:
    yield ingest(element, element_type)


class _ClientSlots:
  """Runs one function per client over the devices' slots; results in client order."""

  def __init__(self, devices: Sequence[str], clients_per_device: int):
    self.devices = list(devices)
    self.slots = clients_per_device * len(self.devices)
    self.local = threading.local()  # The slot and device a thread runs clients on.

  @property
  def current(self) -> tuple[int, str]:
    """(slot, device) of the calling thread; the server's (-1, first device) elsewhere."""
    return getattr(self.local, 'slot', -1), getattr(self.local, 'device', self.devices[0])

  def map(self, fn: Callable[[Any], Any], members: Sequence[Any]) -> list:
    """[fn(m) for m in members], client i on devices[i % n] (as `in_process._Round`)."""
    num_devices = len(self.devices)
    futures = [concurrent.futures.Future() for _ in members]
    waiting = [collections.deque(range(d, len(members), num_devices))
               for d in range(num_devices)]

    def run_slot(slot):
      self.local.slot, self.local.device = slot, self.devices[slot % num_devices]
      queue = waiting[slot % num_devices]
      while True:
        try:
          i = queue.popleft()  # Atomic: each client is taken by one slot.
        except IndexError:
          return
        try:
          futures[i].set_result(fn(members[i]))
        except BaseException as e:  # pylint: disable=broad-except
          futures[i].set_exception(e)

    slots = min(self.slots, len(members))
    if slots <= 1:
      run_slot(0)
      return [f.result() for f in futures]
    threads = [threading.Thread(target=run_slot, args=(s,), daemon=True,
                                name=f'tff_zmg-interpreter-slot-{s}') for s in range(slots)]
    for thread in threads:
      thread.start()
    for thread in threads:
      thread.join()
    return [f.result() for f in futures]


class FederatedInterpreter:
  """One federated computation, compiled once, evaluated on every call.

  Args:
    comp: A `tff.framework.ConcreteComputation` (federated).
    devices: Where clients run (client i on `devices[i % n]`); the server on the first.
    clients_per_device: Clients each device runs at once.
  """

  def __init__(self, comp, devices: Sequence[str], clients_per_device: int):
    self.type_signature = comp.type_signature
    if _uses_secure_intrinsics(comp.to_building_block()):
      comp = tff.backends.test.replace_secure_intrinsics_with_bodies(comp)
    self._root = tff.framework.to_call_dominant(comp.to_building_block())
    self._check(self._root)
    self._slots = _ClientSlots(devices, clients_per_device)
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
      if isinstance(block, building_blocks.Intrinsic) and block.uri not in _INTRINSICS:
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
      value = ingest(arg, parameter)
      self.num_clients = _num_clients(value)
      result = function(value)
    return export(result, self.type_signature.result)

  def members(self, value: Placed) -> list:
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
      return _INTRINSICS[block.uri](self, block.type_signature)
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
      return _unflatten(imported(*flat), type_signature.result)

    run.block = block  # Holds the block, so its id stays its own while cached.
    return run

  # Placement helpers for the intrinsics.

  def server(self, value) -> Placed:
    return Placed(placements.SERVER.uri, [value], True)

  def at_clients(self, members: list, all_equal: bool = False) -> Placed:
    return Placed(placements.CLIENTS.uri, members, all_equal)

  def map_clients(self, fn: Callable[[Any], Any], members: list) -> list:
    results = self._slots.map(fn, members)
    self.last_client_devices = [_device_of(r) for r in results]
    return results

  def on_server(self, fn: Callable[[], Any]) -> Any:
    with tf.device(self._slots.devices[0]):
      return fn()


def _device_of(value) -> str:
  """The device of a client's largest tensor output (as `in_process._device_of`)."""
  tensors = [l for l in _leaves(value) if isinstance(l, tf.Tensor)]
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
  if isinstance(value, Placed):
    counts = {len(value.members)} if value.placement == placements.CLIENTS.uri and (
        not value.all_equal) else set()
  elif isinstance(value, structure.Struct):
    counts = {_num_clients(v) for _, v in structure.iter_elements(value)} - {None}
  else:
    counts = set()
  if len(counts) > 1:
    raise ValueError(f'CLIENTS values of different numbers of clients: {sorted(counts)}')
  return counts.pop() if counts else None


# The intrinsics: each takes (interpreter, its type) and returns the function it is.


def _federated_map(interp, type_signature):
  del type_signature

  def apply(arg):
    fn, value = arg[0], arg[1]
    if value.placement == placements.SERVER.uri:
      return interp.server(interp.on_server(lambda: fn(value.members[0])))
    if value.all_equal:
      return interp.at_clients(interp.map_clients(fn, value.members), all_equal=True)
    return interp.at_clients(interp.map_clients(fn, value.members))

  return apply


def _federated_apply(interp, type_signature):
  del type_signature
  return lambda arg: interp.server(interp.on_server(lambda: arg[0](arg[1].members[0])))


def _federated_broadcast(interp, type_signature):
  del type_signature
  return lambda value: interp.at_clients([value.members[0]], all_equal=True)


def _federated_value_at(placement):
  def intrinsic(interp, type_signature):
    del type_signature
    return lambda value: Placed(placement, [value], True)
  return intrinsic


def _federated_eval_at_server(interp, type_signature):
  del type_signature
  return lambda fn: interp.server(interp.on_server(fn))


def _federated_eval_at_clients(interp, type_signature):
  # Without a CLIENTS argument the number of clients is not known: evaluated once, the
  # value every client computes (TFF's workers, too, need a cardinality to do more).
  return lambda fn: interp.at_clients(
      interp.map_clients(lambda _: fn(), [None]), all_equal=type_signature.result.all_equal
  )


def _federated_zip(placement):
  def intrinsic(interp, type_signature):
    del type_signature

    def zip_values(struct):
      names = [name for name, _ in structure.iter_elements(struct)]
      values = [value for _, value in structure.iter_elements(struct)]
      if placement == placements.SERVER.uri:
        return interp.server(structure.Struct(
            [(n, v.members[0]) for n, v in zip(names, values)]))
      if all(v.all_equal for v in values):
        return interp.at_clients(
            [structure.Struct([(n, v.members[0]) for n, v in zip(names, values)])],
            all_equal=True)
      members = zip(*(interp.members(v) for v in values))
      return interp.at_clients(
          [structure.Struct(list(zip(names, client))) for client in members])
    return zip_values
  return intrinsic


def _federated_sum(interp, type_signature):
  del type_signature
  return lambda value: interp.server(
      interp.on_server(lambda: sum_in_order(interp.members(value))))


def _federated_mean(interp, type_signature):
  del type_signature
  return lambda value: interp.server(
      interp.on_server(lambda: mean_in_order(interp.members(value))))


def _federated_weighted_mean(interp, type_signature):
  del type_signature

  def weighted_mean(arg):
    values, weights = interp.members(arg[0]), interp.members(arg[1])
    return interp.server(interp.on_server(lambda: mean_in_order(values, weights)))
  return weighted_mean


def _federated_extremum(reduce):
  def intrinsic(interp, type_signature):
    del type_signature

    def extremum(value):
      members = interp.members(value)

      def compute():
        result = members[0]
        for member in members[1:]:
          result = _map_leaves(reduce, result, member)
        return result
      return interp.server(interp.on_server(compute))
    return extremum
  return intrinsic


def _federated_aggregate(interp, type_signature):
  del type_signature

  def aggregate(arg):
    value, zero, accumulate, _, report = (arg[i] for i in range(5))

    def compute():
      accumulator = zero
      for member in interp.members(value):
        accumulator = accumulate(structure.Struct([(None, accumulator), (None, member)]))
      return report(accumulator)
    return interp.server(interp.on_server(compute))
  return aggregate


def _federated_select(interp, type_signature):
  element_type = type_signature.result.member.element

  def select(arg):
    keys, _, server_value, select_fn = (arg[i] for i in range(4))
    value = server_value.members[0]

    def for_client(client_keys):
      elements = [select_fn(structure.Struct([(None, value), (None, key)]))
                  for key in tf.unstack(tf.convert_to_tensor(client_keys))]
      return tensorflow_utils.make_data_set_from_elements(
          None, [export(e, element_type) for e in elements], element_type)
    return interp.at_clients([for_client(k) for k in keys.members], keys.all_equal)
  return select


def _sequence_map(interp, type_signature):
  parameter = type_signature.parameter
  element_type, result_type = parameter[1].element, type_signature.result.element

  def sequence_map(arg):
    fn, dataset = arg[0], arg[1]
    results = [export(fn(e), result_type) for e in _iterate(dataset, element_type)]
    return tensorflow_utils.make_data_set_from_elements(None, results, result_type)
  return sequence_map


def _sequence_reduce(interp, type_signature):
  element_type = type_signature.parameter[0].element

  def sequence_reduce(arg):
    dataset, zero, op = arg[0], arg[1], arg[2]
    accumulator = zero
    for element in _iterate(dataset, element_type):
      accumulator = op(structure.Struct([(None, accumulator), (None, element)]))
    return accumulator
  return sequence_reduce


def _sequence_sum(interp, type_signature):
  element_type = type_signature.parameter.element

  def sequence_sum(dataset):
    elements = list(_iterate(dataset, element_type))
    return sum_in_order(elements) if elements else _generic_zero(element_type)
  return sequence_sum


def _generic_binary(op):
  def intrinsic(interp, type_signature):
    del interp, type_signature
    return lambda arg: _map_leaves(op, arg[0], arg[1])
  return intrinsic


def _generic_zero_intrinsic(interp, type_signature):
  del interp
  return lambda: _generic_zero(type_signature)


_INTRINSICS = {
    'federated_aggregate': _federated_aggregate,
    'federated_apply': _federated_apply,
    'federated_broadcast': _federated_broadcast,
    'federated_eval_at_clients': _federated_eval_at_clients,
    'federated_eval_at_server': _federated_eval_at_server,
    'federated_map': _federated_map,
    'federated_map_all_equal': _federated_map,
    'federated_max': _federated_extremum(tf.maximum),
    'federated_mean': _federated_mean,
    'federated_min': _federated_extremum(tf.minimum),
    'federated_select': _federated_select,
    'federated_sum': _federated_sum,
    'federated_value_at_clients': _federated_value_at(placements.CLIENTS.uri),
    'federated_value_at_server': _federated_value_at(placements.SERVER.uri),
    'federated_weighted_mean': _federated_weighted_mean,
    'federated_zip_at_clients': _federated_zip(placements.CLIENTS.uri),
    'federated_zip_at_server': _federated_zip(placements.SERVER.uri),
    'generic_divide': _generic_binary(tf.divide),
    'generic_multiply': _generic_binary(tf.multiply),
    'generic_plus': _generic_binary(tf.add),
    'generic_zero': _generic_zero_intrinsic,
    'sequence_map': _sequence_map,
    'sequence_reduce': _sequence_reduce,
    'sequence_sum': _sequence_sum,
}
