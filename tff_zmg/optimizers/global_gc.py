"""Global GC: server SGD on the projected aggregated update (GC-Fed).

With `u` the aggregated client update (specification.md section 3):

    w <- w - lr * M'(P(u))

`M'` applies the zero-mean projection `P` only to masked tensors (GC-Fed's
classifier layers, `tff_zmg.transforms.projection.classifier_layer_mask`); the other
tensors take a plain SGD step. Default: every rank >= 2 tensor projected (the
GlobalGC algorithm alone, and the GC-Fed authors' code).
"""

import collections
from collections.abc import Sequence
from typing import Any, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_zmg.transforms import projection
from tff_zmg import validation
from tff_zmg.optimizers import _base

_LEARNING_RATE_KEY = tff.learning.optimizers.LEARNING_RATE_KEY


class _GlobalGcSgd(_base.HparamsOptimizer):
  """Projected server SGD, see `build_global_gc_sgd`."""

  _hparams_keys = (_LEARNING_RATE_KEY,)

  def __init__(
      self,
      learning_rate: float,
      mask: Optional[Sequence[bool]],
      center_vectors: bool,
  ):
    self._lr = validation.check_positive('learning_rate', learning_rate)
    self._mask = validation.check_mask('mask', mask)
    self._center_vectors = validation.check_bool(
        'center_vectors', center_vectors
    )

  def initialize(self, specs: Any) -> collections.OrderedDict[str, Any]:
    del specs  # Stateless apart from the learning rate.
    return collections.OrderedDict([(_LEARNING_RATE_KEY, self._lr)])

  def next(self, state, weights, gradients):
    gradients = _base.checked_gradients(weights, gradients)
    projected = projection.zero_mean_projection(
        gradients, self._mask, self._center_vectors
    )
    lr = state[_LEARNING_RATE_KEY]

    def _sgd_update(w, u):
      if u is None:
        return w
      return w - tf.cast(lr, w.dtype) * u

    updated_weights = tf.nest.map_structure(_sgd_update, weights, projected)
    return collections.OrderedDict(state), updated_weights


def build_global_gc_sgd(
    learning_rate: float,
    mask: Optional[Sequence[bool]] = None,
    center_vectors: bool = False,
) -> tff.learning.optimizers.Optimizer:
  """Returns GC-Fed's Global GC server optimizer (see the module docstring).

  Args:
    learning_rate: Server learning rate, > 0.
    mask: `None` (project every rank >= 2 tensor) or one bool per weight
      tensor in `tf.nest.flatten` order, True for classifier-layer tensors.
    center_vectors: Whether masked rank-1 tensors (biases) are centred too.

  Raises:
    ValueError: If a hyperparameter is out of range.
  """
  return _GlobalGcSgd(learning_rate, mask, center_vectors)
