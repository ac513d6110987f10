"""The zero-mean projection (gradient centralization) and layer masks.

See specification.md section 1. `zero_mean_projection` is the one mechanism every
projected optimizer in `tff_zmg.optimizers` chains with a plain update rule;
`layer_borderline_mask` chooses which tensors it applies to (GC-Fed).
"""

import math
from collections.abc import Iterable, Sequence
from typing import Any, Optional

import tensorflow as tf

from tff_zmg import validation


def _project(tensor: tf.Tensor, center_vectors: bool) -> tf.Tensor:
  """Projects one dense tensor; see `zero_mean_projection`."""
  rank = tensor.shape.rank
  if rank is None:
    raise ValueError(
        'zero_mean_projection needs tensors of known rank, got a tensor of '
        f'unknown rank: {tensor!r}'
    )
  if rank >= 2:
    axes = list(range(rank - 1))
  elif rank == 1 and center_vectors:
    axes = [0]
  else:
    return tensor
  return tensor - tf.reduce_mean(tensor, axis=axes, keepdims=True)


def zero_mean_projection(
    tensors: Any,
    mask: Optional[Sequence[bool]] = None,
    center_vectors: bool = False,
) -> Any:
  """Centres every output column of each selected tensor over its inputs.

  For a tensor `G` of rank >= 2 in Keras layout (the output axis last: Dense
  and GRU kernels `[in, out]`, Conv2D kernels `[kh, kw, in, out]`, Embedding
  tables `[vocab, dim]`):

      P(G) = G - mean(G, axis=all axes but the last, keepdims=True)

  i.e. `P = I - e e^T` with `e = (1/sqrt(m), ..., 1/sqrt(m))` applied to each of
  the `m`-long output columns of `G` reshaped to `[m, out]`. `P` is linear,
  idempotent (`P(P(G)) = P(G)`) and non-expansive (`||P(G)|| <= ||G||`).
  This is the zero-mean gradient of FedZMG and the gradient centralization
  of Yong et al. (2020), used locally and globally by GC-Fed.

  Rank-0/1 tensors (biases) are returned unchanged unless `center_vectors` is
  True, in which case a rank-1 tensor `b` becomes `b - mean(b)` (the GC-Fed
  authors' code). `tf.IndexedSlices` leaves (embedding gradients) are
  densified first; `None` leaves are passed through.

  Example:

      grads = [tf.constant([[1., 2.], [3., 6.]]), tf.constant([1., 3.])]
      projected = zero_mean_projection(grads)
      # [[-1., -2.], [1., 2.]] (columns centred); [1., 3.] (bias unchanged)

  Args:
    tensors: A (nested) structure of tensors.
    mask: `None` (project every eligible tensor) or one bool per leaf, in
      `tf.nest.flatten(tensors)` order; leaves where it is False are returned
      unchanged.
    center_vectors: Whether rank-1 tensors are centred too.

  Returns:
    A structure like `tensors` with the selected tensors projected.

  Raises:
    ValueError: If `mask` is not a sequence of bools with one entry per leaf.
  """
  flat = tf.nest.flatten(tensors)
  mask = validation.check_mask('mask', mask)
  if mask is None:
    mask = (True,) * len(flat)
  validation.check_length('mask', mask, len(flat))
  projected = []
  for tensor, selected in zip(flat, mask):
    if isinstance(tensor, tf.IndexedSlices):
      tensor = tf.convert_to_tensor(tensor)
    if tensor is not None and selected:
      tensor = _project(tensor, center_vectors)
    projected.append(tensor)
  return tf.nest.pack_sequence_as(tensors, projected)


def _check_variables(variables: Any) -> tuple[Any, ...]:
  """Returns `variables` as a tuple; raises if it is not a sequence of them."""
  if hasattr(variables, 'trainable_variables'):
    raise ValueError(
        'variables must be a sequence of tf.Variables, got a model '
        f'{variables!r}; pass its `trainable_variables`'
    )
  if isinstance(variables, (str, bytes)) or not isinstance(
      variables, Iterable
  ):
    raise ValueError(
        f'variables must be a sequence of tf.Variables, got {variables!r}'
    )
  variables = tuple(variables)
  for i, variable in enumerate(variables):
    if not (hasattr(variable, 'name') and hasattr(variable, 'shape')):
      raise ValueError(
          f'variables[{i}] must be a tf.Variable (with a name and a shape), '
          f'got {variable!r}'
      )
  return variables


def _scope(variable: tf.Variable) -> Optional[str]:
  """The name scope of a variable: its name without the last `/part`.

  'gru/gru_cell/kernel:0' -> 'gru/gru_cell'; a name without a '/' has no scope.
  """
  name = variable.name.split(':')[0]
  if '/' not in name:
    return None
  return name.rsplit('/', 1)[0]


def _layer_index_per_variable(variables: Sequence[tf.Variable]) -> list[int]:
  """Numbers each variable's layer: consecutive variables of a scope share one.

  A variable without a name scope is a layer of its own.
  """
  indices = []
  previous_scope = None
  for variable in variables:
    scope = _scope(variable)
    if not indices:
      indices.append(0)
    elif scope is not None and scope == previous_scope:
      indices.append(indices[-1])
    else:
      indices.append(indices[-1] + 1)
    previous_scope = scope
  return indices


def layer_borderline_mask(
    variables: Sequence[tf.Variable], gc_lambda: Optional[float] = None
) -> tuple[bool, ...]:
  """Marks the variables of the model's "feature" layers (GC-Fed).

  The trainable variables, in model order (`model.trainable_variables` of a
  `tff.learning.models.VariableModel` or a Keras model, the order of TFF's
  model weights), are grouped into layers by name scope: a variable's scope is
  its name without the last `/part` ('gru/gru_cell/kernel:0' ->
  'gru/gru_cell'), and consecutive variables with one scope are one layer (a
  GRU's kernel, recurrent kernel and bias share a value). With `L` layers, the
  first `floor(gc_lambda * L)` are feature layers, the rest classifier layers.

  Example:

      variables = model_fn().trainable_variables  # EMNIST CNN, 4 layers.
      layer_borderline_mask(variables)             # 6 x True, then 2 x False.
      layer_borderline_mask(variables, 0.5)        # 4 x True, then 4 x False.

  Args:
    variables: The model's trainable `tf.Variable`s, in model order.
    gc_lambda: The layer borderline in [0, 1]; `None` means every layer but
      the last is a feature layer.

  Returns:
    One bool per variable, True for feature-layer variables.

  Raises:
    ValueError: If `gc_lambda` is outside [0, 1], or `variables` is not a
      non-empty sequence of variables.
  """
  variables = _check_variables(variables)
  if not variables:
    raise ValueError(
        'variables is empty; pass the trainable variables of a built model '
        'to get a layer mask'
    )
  indices = _layer_index_per_variable(variables)
  num_layers = indices[-1] + 1
  if gc_lambda is None:
    num_feature = num_layers - 1
  else:
    gc_lambda = validation.check_in_range('gc_lambda', gc_lambda, 0.0, 1.0)
    # The small tolerance keeps e.g. 0.29 * 100 from flooring to 28.
    num_feature = math.floor(gc_lambda * num_layers + 1e-9)
  return tuple(index < num_feature for index in indices)


def classifier_layer_mask(
    variables: Sequence[tf.Variable], gc_lambda: Optional[float] = None
) -> tuple[bool, ...]:
  """The complement of `layer_borderline_mask`: True for classifier layers."""
  return tuple(
      not feature for feature in layer_borderline_mask(variables, gc_lambda)
  )


def weight_matrix_mask(variables: Sequence[tf.Variable]) -> tuple[bool, ...]:
  """Marks the variables that are weight matrices/kernels, not biases.

  The projection centres rank >= 2 tensors and leaves biases alone. Keras' GRU keeps its
  input and recurrent biases in one rank-2 variable of shape [2, 3*units]; projecting it
  would centre the two rows against each other, and since the update and reset gates see
  only their sum, their bias gradients would become exactly zero. So a variable is a weight
  matrix when it has rank >= 2 and is not named a bias (our reading of specification.md
  section 1, "biases untouched").
  """
  return tuple(
      v.shape.rank >= 2 and 'bias' not in v.name.split('/')[-1]
      for v in _check_variables(variables)
  )


def projection_mask(
    variables: Sequence[tf.Variable],
    layers: str = 'all',
    gc_lambda: Optional[float] = None,
    center_vectors: bool = False,
) -> tuple[bool, ...]:
  """The mask of tensors a projection acts on: kernels of the chosen layers.

  Example:

      with tf.Graph().as_default():
        variables = model_fn().trainable_variables
      mask = projection_mask(variables, 'classifier')  # Last kernel only.

  Args:
    variables: The model's trainable `tf.Variable`s, in model order.
    layers: 'all', 'feature' (the first floor(gc_lambda * L) layers) or
      'classifier' (the rest), see `layer_borderline_mask`.
    gc_lambda: The layer borderline; None means every layer but the last is a
      feature layer.
    center_vectors: Whether the rank-1 biases of the chosen layers are in the mask
      too (the GC-Fed authors' bias centring; `zero_mean_projection` then centres
      them with its own `center_vectors`).
  """
  variables = _check_variables(variables)
  if layers == 'all':
    selected = (True,) * len(variables)
  elif layers == 'feature':
    selected = layer_borderline_mask(variables, gc_lambda)
  elif layers == 'classifier':
    selected = classifier_layer_mask(variables, gc_lambda)
  else:
    raise ValueError(
        f"layers must be one of 'all', 'feature', 'classifier', got {layers!r}"
    )
  projected = weight_matrix_mask(variables)
  if center_vectors:
    projected = tuple(
        p or v.shape.rank == 1 for p, v in zip(projected, variables)
    )
  return tuple(s and p for s, p in zip(selected, projected))
