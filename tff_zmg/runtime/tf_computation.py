"""One TFF TensorFlow computation, run by the TensorFlow of this Python process.

A `tff.tensorflow.computation` is a serialized GraphDef with named parameter and result
tensors and an initialize op (see `computation.proto`, message `TensorFlow`). TFF's C++
worker runs it as: initialize op, then the result tensors, in one session with the same
feeds. `ImportedComputation` does the same with TensorFlow's own functions: the GraphDef
is imported into a `tf.compat.v1.wrap_function` and pruned twice, once to the initialize
op and once to the results; both read the graph's resources by their shared names, which
each import makes unique, so two imports of one computation (two devices, or two clients
on one device) never share a variable. The GraphDef's library functions are renamed per
import too: TensorFlow registers them process-wide by name and refuses a second,
different definition under a name it has (the same loop body placed on another device).

Placement is written into the GraphDef's nodes, not taken from a `tf.device` scope: a
dataset variant cannot be copied to an accelerator, so everything that touches tf.data
(dataset and iterator ops, optionals, variant placeholders) stays on the host and the
rest, model arithmetic included, goes to the client's device.

Values cross the boundary flat, in the order of their TFF type (`flatten`, `pack`).

Grappler optimizes an imported function, and each function it calls, without its memory
scheduling (`without_memory_scheduling`, `call_options`), as `forms` compiles them: see
`forms.GRAPPLER_CONFIG` for the AlreadyExistsError that pass causes when clients run at once.
"""

import contextlib
import functools
import itertools
from typing import Any, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow.core.protobuf import config_pb2
from tensorflow.python.eager import context
from tensorflow.python.framework import kernels
from tensorflow_federated.proto.v0 import computation_pb2
from tensorflow_federated.python.common_libs import structure
from tensorflow_federated.python.core.impl.types import type_conversions
from tensorflow_federated.python.core.impl.utils import tensorflow_utils
from tensorflow_federated.python.tensorflow_libs import serialization_utils

from tff_zmg.runtime import forms

HOST_DEVICE = '/device:CPU:0'
_import_counter = itertools.count()


def proto_of(comp: tff.framework.ConcreteComputation) -> computation_pb2.Computation:
  return tff.framework.ConcreteComputation.get_proto(comp)


def is_tensorflow(comp: tff.framework.ConcreteComputation) -> bool:
  """Whether `comp` is a TF computation (runs as one graph), not a federated one."""
  return proto_of(comp).WhichOneof('computation') == 'tensorflow'


def _device_type(device: str) -> str:
  return tf.DeviceSpec.from_string(device).device_type or 'CPU'


def is_cpu(device: str) -> bool:
  """Whether `device` is a CPU of this machine (the host or a logical CPU)."""
  return _device_type(device).upper() == 'CPU'


def _stays_on_host(node, device_type: str) -> bool:
  """Whether a node must run on the host: tf.data's and variant ops, or no kernel there."""
  op = node.op
  if 'Dataset' in op or 'Iterator' in op or op.startswith('Optional'):
    return True
  if op == 'Placeholder' and node.attr['dtype'].type == tf.variant.as_datatype_enum:
    return True
  if op == 'Identity' and node.attr['T'].type == tf.variant.as_datatype_enum:
    return True
  # A DEFAULT kernel serves every device type without one of its own (GPU's variable ops,
  # `Enter`, `NoOp`, ... are registered only so).
  return not _kernel_device_types(op) & {device_type, 'DEFAULT'}


@functools.lru_cache(maxsize=None)
def _kernel_device_types(op: str) -> frozenset:
  """The device types with a kernel of `op`: TensorFlow serializes its whole kernel list
  for each ask (0.3 ms here), and a graph of K cells has thousands of nodes."""
  return frozenset(k.device_type for k in kernels.get_registered_kernels_for_op(op).kernel)


_FORWARDING_OPS = frozenset(['Identity', 'Switch', 'Merge', 'Enter', 'Exit', 'NextIteration'])


def _is_variant(node) -> bool:
  return 'T' in node.attr and node.attr['T'].type == tf.variant.as_datatype_enum


def place_nodes(graph_def: tf.compat.v1.GraphDef, device: str) -> tf.compat.v1.GraphDef:
  """Sets every node's device, in the graph and its function library (loop bodies).

  Nodes that `_stays_on_host`, and control flow forwarding their variants, go to
  `HOST_DEVICE`, the rest to `device`. Function-call nodes (`StatefulPartitionedCall`,
  `While`, ...) run their bodies' nodes where those are placed, so the bodies are placed
  too.
  """
  device_type = _device_type(device)
  for nodes in (graph_def.node, *(f.node_def for f in graph_def.library.function)):
    on_host = {n.name for n in nodes if _stays_on_host(n, device_type)}
    # A tf.data variant that control flow forwards (the iterator's optional through the
    # loop body's `Switch`, a dataset through `Enter`) stays on the host with its producer;
    # other variants (TensorLists) stay with the model.
    forwarding = [n for n in nodes if n.op in _FORWARDING_OPS and _is_variant(n)]
    changed = True
    while changed:
      changed = False
      for node in forwarding:
        data = node.input if node.op == 'Merge' else node.input[:1]  # Not Switch's predicate.
        if node.name not in on_host and any(
            i.split(':')[0] in on_host for i in data if not i.startswith('^')
        ):
          on_host.add(node.name)
          changed = True
    for node in nodes:
      node.device = HOST_DEVICE if node.name in on_host else device
  return graph_def


def _rename_in_attr(attr_value, names: dict) -> None:
  """Renames the functions an `AttrValue` names (`func`, `list.func`, nested attrs)."""
  kind = attr_value.WhichOneof('value')
  if kind == 'func':
    funcs = [attr_value.func]
  elif kind == 'list':
    funcs = list(attr_value.list.func)
  else:
    return
  for func in funcs:
    func.name = names.get(func.name, func.name)
    for nested in func.attr.values():
      _rename_in_attr(nested, names)


def rename_functions(graph_def: tf.compat.v1.GraphDef, suffix: str) -> tf.compat.v1.GraphDef:
  """Appends `suffix` to every function of the library, and to every use of one."""
  library = graph_def.library
  names = {f.signature.name: f'{f.signature.name}_{suffix}' for f in library.function}
  if not names:
    return graph_def
  for function in library.function:
    function.signature.name = names[function.signature.name]
  for gradient in library.gradient:
    gradient.function_name = names.get(gradient.function_name, gradient.function_name)
    gradient.gradient_func = names.get(gradient.gradient_func, gradient.gradient_func)
  for nodes in (graph_def.node, *(f.node_def for f in library.function)):
    for node in nodes:
      node.op = names.get(node.op, node.op)  # A function called as an op.
      for attr_value in node.attr.values():
        _rename_in_attr(attr_value, names)
  return graph_def


def without_memory_scheduling(graph_def: tf.compat.v1.GraphDef) -> tf.compat.v1.GraphDef:
  """Memory scheduling off in the Grappler config of every function call of the graph and
  its library (a call's body not inlined is optimized with the call's `config_proto`)."""
  for nodes in (graph_def.node, *(f.node_def for f in graph_def.library.function)):
    for node in nodes:
      if 'config_proto' in node.attr:
        config = config_pb2.ConfigProto.FromString(node.attr['config_proto'].s)
        forms.turn_off_memory_scheduling(config)
        node.attr['config_proto'].s = config.SerializeToString(deterministic=True)
  return graph_def


@functools.lru_cache(maxsize=None)
def _call_options(default_config: bytes) -> context.FunctionCallOptions:
  config = config_pb2.ConfigProto.FromString(default_config)
  forms.turn_off_memory_scheduling(config)
  return context.FunctionCallOptions(config_proto=config)


@contextlib.contextmanager
def call_options():
  """This thread's eager function calls optimized without memory scheduling."""
  ctx = context.context()
  default = ctx.function_call_options
  ctx.function_call_options = _call_options(default.config_proto_serialized)
  try:
    yield
  finally:
    ctx.function_call_options = default


class ImportedComputation:
  """A TF computation imported into this process, callable on flat values.

  `__call__(*flat_args)` runs the initialize op and then the results with the same
  feeds, as TFF's C++ worker does, and returns the flat results as tensors (on the
  devices that computed them).
  """

  def __init__(self, comp: tff.framework.ConcreteComputation, device: Optional[str] = None):
    proto = proto_of(comp)
    if proto.WhichOneof('computation') != 'tensorflow':
      raise TypeError(f'not a TensorFlow computation: {comp.type_signature}')
    self.type_signature = comp.type_signature
    self.device = device
    tf_proto = proto.tensorflow
    graph_def = serialization_utils.unpack_graph_def(tf_proto.graph_def)
    # pylint: disable-next=protected-access
    suffix = f'tff_zmg_{next(_import_counter)}'
    graph_def = tensorflow_utils._uniquify_shared_names_with_suffix(graph_def, suffix)
    graph_def = rename_functions(graph_def, suffix)
    without_memory_scheduling(graph_def)
    if device is not None:
      place_nodes(graph_def, device)
    parameter_names = []
    if tf_proto.HasField('parameter'):
      parameter_names = tensorflow_utils.extract_tensor_names_from_binding(tf_proto.parameter)
    result_names = tensorflow_utils.extract_tensor_names_from_binding(tf_proto.result)
    self._token = None
    if tf_proto.session_token_tensor_name:
      parameter_names.append(tf_proto.session_token_tensor_name)
      self._token = tf.constant('tff_zmg_in_process')

    wrapped = tf.compat.v1.wrap_function(
        lambda: tf.graph_util.import_graph_def(graph_def, name=''), []
    )
    graph = wrapped.graph
    feeds = [graph.as_graph_element(n) for n in parameter_names]
    # A pruned function without an input signature binds each call's arguments to an empty
    # one first, fails, formats every argument into the error (NumPy's repr of each weight:
    # milliseconds per call) and only then runs through its flat signature.
    signature = (tuple(tf.TensorSpec(f.shape, f.dtype) for f in feeds), {})
    self._initialize = None
    if tf_proto.initialize_op:
      self._initialize = wrapped.prune(
          feeds, [graph.as_graph_element(tf_proto.initialize_op)], input_signature=signature
      )
    self._run = wrapped.prune(
        feeds, [graph.as_graph_element(n) for n in result_names], input_signature=signature
    )
    self.num_parameters = len(parameter_names) - (self._token is not None)
    self._dtypes = [f.dtype for f in feeds[: self.num_parameters]]

  def __call__(self, *flat_args) -> list[tf.Tensor]:
    if len(flat_args) != self.num_parameters:
      raise ValueError(
          f'expected {self.num_parameters} flat arguments, got {len(flat_args)}'
      )
    flat_args = [
        a if isinstance(a, tf.Tensor) else tf.convert_to_tensor(a, dtype)
        for a, dtype in zip(flat_args, self._dtypes)
    ]
    if self._token is not None:
      flat_args.append(self._token)
    with call_options():
      if self._initialize is not None:
        self._initialize(*flat_args)
      return list(self._run(*flat_args))


def flatten(value: Any, type_spec: tff.Type) -> list[Any]:
  """The leaves of `value` in the order of `type_spec` (datasets as variant tensors).

  Structures are read by name where the type names its elements, so an `OrderedDict`,
  an attrs class, a named tuple or a `tff.structure.Struct` all flatten alike.
  """
  if isinstance(type_spec, tff.FederatedType):
    if not type_spec.all_equal:
      raise TypeError(f'a CLIENTS-placed value cannot be flattened as one: {type_spec}')
    return flatten(value, type_spec.member)
  if isinstance(type_spec, tff.TensorType):
    return [value]
  if isinstance(type_spec, tff.SequenceType):
    if isinstance(value, (tf.data.Dataset, list, tuple)):
      return [tf.data.experimental.to_variant(as_dataset(value, type_spec))]
    return [value]  # Already a variant tensor.
  if isinstance(type_spec, tff.StructType):
    if not isinstance(value, structure.Struct):
      value = structure.from_container(value)
    elements = structure.to_elements(value)
    if len(elements) != len(type_spec):
      raise TypeError(f'a value of {len(elements)} elements for the type {type_spec}')
    leaves = []
    for index, (name, element_type) in enumerate(structure.iter_elements(type_spec)):
      by_name = name is not None and name in structure.name_list(value)
      element = value[name] if by_name else value[index]
      leaves.extend(flatten(element, element_type))
    return leaves
  raise TypeError(f'cannot flatten a value of type {type_spec}')


def as_dataset(value: Any, type_spec: tff.SequenceType) -> tf.data.Dataset:
  """A sequence given as a dataset or as a Python list of its elements, as a dataset (made
  as TFF's own contexts make one of a list)."""
  if isinstance(value, tf.data.Dataset):
    check_dataset(value, type_spec)
    return value
  if isinstance(value, (list, tuple)):
    return tensorflow_utils.make_data_set_from_elements(None, list(value), type_spec.element)
  raise TypeError(f'a sequence must be a tf.data.Dataset or a list, got {type(value).__name__}')


def check_dataset(dataset: tf.data.Dataset, type_spec: tff.SequenceType) -> None:
  """Raises TFF's `TypeError` for a dataset whose elements the sequence type does not take
  (a batched dataset where the computation takes single examples): TensorFlow would fail
  later, inside the computation, on a shape it cannot name the cause of."""
  given = type_conversions.tensorflow_infer_type(dataset)
  if not type_spec.is_assignable_from(given):
    raise TypeError(
        f'the computation takes a {type_spec}, and a dataset of {given.element} cannot be'
        ' passed as one')


def count_leaves(type_spec: tff.Type) -> int:
  if isinstance(type_spec, tff.FederatedType):
    return count_leaves(type_spec.member)
  if isinstance(type_spec, tff.StructType):
    return sum(count_leaves(t) for _, t in structure.iter_elements(type_spec))
  return 1


def pack(leaves: Sequence[Any], type_spec: tff.Type) -> Any:
  """`leaves` (NumPy values, in `flatten`'s order) as the Python value TFF returns.

  The containers are the ones the type records (`OrderedDict`, attrs classes, ...), as
  TFF's own execution contexts return them.
  """
  iterator = iter(leaves)

  def build(t):
    if isinstance(t, tff.FederatedType):
      return build(t.member)
    if isinstance(t, tff.StructType):
      return structure.Struct([(name, build(e)) for name, e in structure.iter_elements(t)])
    return next(iterator)

  value = build(type_spec)
  if next(iterator, None) is not None:
    raise ValueError(f'more values than the type {type_spec} holds')
  return type_conversions.type_to_py_container(value, type_spec)


def to_numpy(leaves: Sequence[Any]) -> list[Any]:
  """Tensors as NumPy values (a scalar string as `bytes`, as TFF's worker returns it)."""
  return [leaf.numpy() if isinstance(leaf, tf.Tensor) else np.asarray(leaf) for leaf in leaves]
