"""The values `interpreter.FederatedInterpreter` holds, and their arithmetic.

* an unplaced value is a tensor, a `tf.data.Dataset` or a `structure.Struct` of them;
* a placed value is a `Placed`: SERVER holds one member, CLIENTS one per client (one for an
  all-equal value, which is the same at every client);
* `ingest` and `export` convert from and to the Python values TFF's contexts take and return;
* sums and means add client values in client order, so results do not depend on timing.
"""

from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.common_libs import structure
from tensorflow_federated.python.core.impl.types import placements
from tensorflow_federated.python.core.impl.types import type_conversions

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


def placement_uri(type_spec: tff.FederatedType) -> str:
  return type_spec.placement.uri


# Values in: the Python values TFF's contexts accept, as the interpreter's values.


def ingest(value: Any, type_spec: tff.Type) -> Any:
  """`value` as given to a computation of parameter `type_spec` -> an interpreter value.

  Sequences given as Python lists of elements become datasets (`tf_computation.as_dataset`).
  """
  if isinstance(type_spec, tff.FederatedType):
    if placement_uri(type_spec) == placements.CLIENTS.uri and not type_spec.all_equal:
      if not isinstance(value, (list, tuple)):
        raise TypeError(f'a value of {type_spec} must be a list (one per client), got '
                        f'{type(value).__name__}')
      return Placed(placements.CLIENTS.uri, [ingest(v, type_spec.member) for v in value],
                    False)
    return Placed(placement_uri(type_spec), [ingest(value, type_spec.member)], True)
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


def check_argument(value: Any, type_spec: Optional[tff.Type]) -> None:
  """Raises `TypeError`, as TFF's contexts do at the call, for an argument that a
  computation of parameter `type_spec` does not take: a structure of another length, a
  dataset of other elements, a tensor of another shape. Values are only looked at."""
  if type_spec is None:
    if value is not None:
      raise TypeError(f'the computation takes no argument, got {type(value).__name__}')
    return
  if isinstance(type_spec, tff.FederatedType):
    clients = placement_uri(type_spec) == placements.CLIENTS.uri and not type_spec.all_equal
    if clients and not isinstance(value, (list, tuple)):
      raise TypeError(f'a value of {type_spec} must be a list (one per client), got '
                      f'{type(value).__name__}')
    for member in (value if clients else [value]):
      check_argument(member, type_spec.member)
  elif isinstance(type_spec, tff.StructType):
    if not isinstance(value, structure.Struct):
      value = structure.from_container(value)
    if len(value) != len(type_spec):
      raise TypeError(f'a value of {len(value)} elements where the computation takes'
                      f' {type_spec}')
    names = structure.name_list(value)
    for i, (name, t) in enumerate(structure.iter_elements(type_spec)):
      check_argument(value[name] if name is not None and name in names else value[i], t)
  elif isinstance(type_spec, tff.SequenceType):
    if isinstance(value, tf.data.Dataset):
      tf_computation.check_dataset(value, type_spec)
  elif isinstance(type_spec, tff.TensorType) and isinstance(value, (np.ndarray, tf.Tensor)):
    if not tf.TensorShape(value.shape).is_compatible_with(type_spec.shape):
      raise TypeError(f'a tensor of shape {value.shape} where the computation takes'
                      f' {type_spec}')


# Values out: the Python values TFF's contexts return.


def leaves(value: Any) -> list:
  if isinstance(value, structure.Struct):
    return [leaf for element in structure.iter_elements(value) for leaf in leaves(element[1])]
  return [value]


def _to_python_leaf(leaf):
  if isinstance(leaf, tf.Tensor):
    return leaf.numpy()
  if isinstance(leaf, tf.data.Dataset):
    return leaf
  return np.asarray(leaf)


def _to_python(value: Any, type_spec: tff.Type) -> Any:
  if isinstance(type_spec, tff.FederatedType):
    if placement_uri(type_spec) == placements.CLIENTS.uri and not type_spec.all_equal:
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


def unflatten(leaves: Sequence[Any], type_spec: tff.Type) -> Any:
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


def map_leaves(fn: Callable[..., Any], *values: Any) -> Any:
  first = values[0]
  if isinstance(first, structure.Struct):
    names = [name for name, _ in structure.iter_elements(first)]
    return structure.Struct([
        (name, map_leaves(fn, *(v[i] for v in values))) for i, name in enumerate(names)
    ])
  return fn(*values)


def sum_in_order(values: Sequence[Any]) -> Any:
  """sum_i v_i, added in client order (v_1 + v_2 + ...)."""
  total = values[0]
  for value in values[1:]:
    total = map_leaves(tf.add, total, value)
  return total


def mean_in_order(values: Sequence[Any], weights: Optional[Sequence[Any]] = None) -> Any:
  """sum_i w_i v_i / sum_i w_i (w_i = 1 without weights), added in client order."""
  if weights is None:
    return map_leaves(lambda s: s / tf.cast(len(values), s.dtype), sum_in_order(values))
  weighted = [
      map_leaves(lambda v, w=w: v * tf.cast(w, tf.as_dtype(v.dtype)), value)
      for value, w in zip(values, weights)
  ]
  total_weight = sum_in_order(list(weights))
  return map_leaves(
      lambda s: s / tf.cast(total_weight, s.dtype), sum_in_order(weighted)
  )


def generic_zero(type_spec: tff.Type) -> Any:
  if isinstance(type_spec, tff.StructType):
    return structure.Struct([(n, generic_zero(t)) for n, t in structure.iter_elements(type_spec)])
  if isinstance(type_spec, tff.TensorType):
    return tf.zeros(type_spec.shape, type_spec.dtype)
  raise InProcessUnsupportedError(f'no zero of the type {type_spec}')


def iterate(dataset: tf.data.Dataset, element_type: tff.Type):
  for element in dataset:
    yield ingest(element, element_type)
