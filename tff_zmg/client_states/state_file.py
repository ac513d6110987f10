"""The file format of one client state, read and written by Python and by TFF's worker.

A state is a flat list of tensors. Its file holds one string `TensorProto` whose
elements are the serialized `TensorProto`s of those tensors: TF graphs running inside
TFF's worker read and write it with `tf.io.read_file`/`parse_tensor` and
`serialize_tensor`/`write_file`, so a round's states never travel between Python and
the worker, and Python reads it back without knowing the state's structure.
"""

from collections.abc import Sequence

from google.protobuf import message
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow.core.framework import tensor_pb2

from tff_zmg.client_states import store

SUFFIX = '.tfstate'


def tensor_types(state_type: tff.Type) -> list[tff.TensorType]:
  """The tensor types of a client-state type, in the order the file holds them."""
  if isinstance(state_type, tff.TensorType):
    return [state_type]
  return [leaf for member in state_type for leaf in tensor_types(member)]  # pytype: disable=attribute-error


def flatten(state, state_type: tff.Type) -> list:
  """The tensors of `state` (containers or a `tff.structure.Struct`) in file order."""
  if isinstance(state_type, tff.TensorType):
    return [state]
  leaves = []
  for i, (name, member_type) in enumerate(tff.structure.iter_elements(state_type)):
    member = state[name] if isinstance(state, dict) else state[i]
    leaves.extend(flatten(member, member_type))
  return leaves


def pack(tensors: Sequence, state_type: tff.Type):
  """`tensors` (in file order) as a value of `state_type`, with its Python containers."""
  leaves = iter(tensors)
  struct = tff.types.structure_from_tensor_type_tree(lambda _: next(leaves), state_type)
  return tff.types.type_to_py_container(struct, state_type)


def serialize(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
  """The file's bytes as a scalar string tensor (in graphs, e.g. in TFF's worker)."""
  return tf.io.serialize_tensor(tf.stack([tf.io.serialize_tensor(t) for t in tensors]))


def parse(serialized: tf.Tensor, types: Sequence[tff.TensorType]) -> list[tf.Tensor]:
  """The inverse of `serialize`, checking every tensor's dtype and shape."""
  parts = tf.io.parse_tensor(serialized, tf.string)
  parts = tf.ensure_shape(parts, [len(types)])
  return [
      tf.ensure_shape(tf.io.parse_tensor(parts[i], t.dtype), t.shape)
      for i, t in enumerate(types)
  ]


def encode(arrays: Sequence[np.ndarray]) -> bytes:
  """`serialize` for NumPy values, in Python: the same bytes a worker writes."""
  parts = [tf.make_tensor_proto(np.asarray(a)).SerializeToString() for a in arrays]
  return tf.make_tensor_proto(np.array(parts, dtype=object)).SerializeToString()


def decode(data: bytes, path: str) -> list[np.ndarray]:
  """The arrays of a state file's bytes; `CorruptClientStateError` naming `path` if torn."""
  try:
    outer = tensor_pb2.TensorProto.FromString(data)
    if outer.dtype != tf.string.as_datatype_enum:
      raise ValueError(f'expected a string TensorProto, got dtype {outer.dtype}')
    return [
        tf.make_ndarray(tensor_pb2.TensorProto.FromString(part))
        for part in tf.make_ndarray(outer).ravel()
    ]
  except (message.DecodeError, ValueError, TypeError) as e:
    raise store.corrupt_state_error(path, e) from e


def load(path: str) -> list[np.ndarray]:
  """The arrays of the state file `path`."""
  with open(path, 'rb') as f:
    return decode(f.read(), path)
