"""Projected momentum SGD, the one rule behind ZMG-SGDM and LocalGC SGDM.

With `M(P(g))` the masked zero-mean projection of the gradient
(`tff_zmg.transforms.projection.zero_mean_projection`) and `v = 0` on `initialize`:

    decoupled (ZMG-SGDM):  d = M(P(g))
                           v <- mu * v + d
                           w <- w - lr * v - lr * weight_decay * w
    coupled (LocalGC):     d = M(P(g)) + weight_decay * w
                           v <- mu * v + d
                           w <- w - lr * v

With `momentum = 0` the state holds no accumulator and `v` is just `d`. The
public builders are `build_zmg_sgdm` and `build_local_gc_sgdm`.
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
_MOMENTUM_KEY = 'momentum'
_WEIGHT_DECAY_KEY = 'weight_decay'
_ACCUMULATOR_KEY = 'accumulator'


class ProjectedSgdm(_base.HparamsOptimizer):
  """Projected momentum SGD with decoupled or coupled weight decay."""

  def __init__(
      self,
      learning_rate: float,
      momentum: float,
      weight_decay: float,
      mask: Optional[Sequence[bool]],
      center_vectors: bool,
      *,
      decoupled_weight_decay: bool,
  ):
    """Checks and stores the hyperparameters (see the module docstring).

    Args:
      learning_rate: Learning rate `lr`, > 0.
      momentum: Momentum `mu` in [0, 1); 0 drops the accumulator.
      weight_decay: Weight decay coefficient, >= 0.
      mask: `None` (project every rank >= 2 tensor) or one bool per weight
        tensor in `tf.nest.flatten` order; unmasked tensors keep their raw
        gradient.
      center_vectors: Whether masked rank-1 tensors (biases) are centred too.
      decoupled_weight_decay: True for ZMG-SGDM's decay, applied to `w` and
        never entering `v`; False for LocalGC's L2, added to the direction `d`.

    Raises:
      ValueError: If a hyperparameter is out of range.
    """
    self._lr = validation.check_positive('learning_rate', learning_rate)
    self._momentum = validation.check_in_range(
        'momentum', momentum, 0.0, 1.0, high_inclusive=False
    )
    self._weight_decay = validation.check_non_negative(
        'weight_decay', weight_decay
    )
    self._mask = validation.check_mask('mask', mask)
    self._center_vectors = validation.check_bool(
        'center_vectors', center_vectors
    )
    self._decoupled = validation.check_bool(
        'decoupled_weight_decay', decoupled_weight_decay
    )
    self._hparams_keys = [_LEARNING_RATE_KEY, _WEIGHT_DECAY_KEY]
    if self._momentum > 0:
      self._hparams_keys.append(_MOMENTUM_KEY)

  def initialize(self, specs: Any) -> collections.OrderedDict[str, Any]:
    state = collections.OrderedDict([
        (_LEARNING_RATE_KEY, self._lr),
        (_WEIGHT_DECAY_KEY, self._weight_decay),
    ])
    if self._momentum > 0:
      state[_MOMENTUM_KEY] = self._momentum
      state[_ACCUMULATOR_KEY] = _base.zeros_like_specs(specs)
    return state

  def next(self, state, weights, gradients):
    gradients = _base.checked_gradients(weights, gradients)
    projected = projection.zero_mean_projection(
        gradients, self._mask, self._center_vectors
    )
    lr = state[_LEARNING_RATE_KEY]
    weight_decay = state[_WEIGHT_DECAY_KEY]
    updated_state = collections.OrderedDict(state)

    def _update(w, v, g):
      """Returns the new `(w, v)` of one tensor; `v` is None without momentum."""
      if g is None:
        return w, v

      def _direction():
        # Built after `mu * v`, as before the merge: under `tf.function`,
        # grappler's rewrites (hence the float rounding) follow op order.
        if self._decoupled:
          return g
        return g + tf.cast(weight_decay, w.dtype) * w

      lr_w = tf.cast(lr, w.dtype)
      if v is None:
        step = _direction()
      else:
        v = step = tf.cast(state[_MOMENTUM_KEY], v.dtype) * v + _direction()
      new_w = w - lr_w * step
      if self._decoupled:
        new_w = new_w - lr_w * tf.cast(weight_decay, w.dtype) * w
      return new_w, v

    if _MOMENTUM_KEY not in state:
      return updated_state, tf.nest.map_structure(
          lambda w, g: _update(w, None, g)[0], weights, projected
      )

    accumulator = state[_ACCUMULATOR_KEY]
    tf.nest.assert_same_structure(weights, accumulator, check_types=False)
    new_weights, new_accumulator = [], []
    for w, v, g in zip(
        tf.nest.flatten(weights),
        tf.nest.flatten(accumulator),
        tf.nest.flatten(projected),
    ):
      w, v = _update(w, v, g)
      new_weights.append(w)
      new_accumulator.append(v)
    updated_state[_ACCUMULATOR_KEY] = tf.nest.pack_sequence_as(
        accumulator, new_accumulator
    )
    return updated_state, tf.nest.pack_sequence_as(weights, new_weights)
