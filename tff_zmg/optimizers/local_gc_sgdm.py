"""LocalGC SGDM: projected momentum SGD with coupled L2, GC-Fed's client rule.

The GC-Fed authors' order (ALGORITHMS.md section 2):

    d = M(P(g)) + weight_decay * w     (L2 added after the projection)
    v <- mu * v + d                    (v = 0 on `initialize`)
    w <- w - lr * v

`M` applies the zero-mean projection `P` only to masked tensors (GC-Fed's
feature layers, see `tff_zmg.projection.layer_borderline_mask`); the other
tensors keep their raw gradient. Unlike ZMG-SGDM the decay is part of `d` and
so of the momentum. Defaults (GC-Fed paper): `lr = 0.01`, `momentum = 0.9`,
`weight_decay = 1e-5`, every rank >= 2 tensor projected.
"""

import collections
from collections.abc import Sequence
from typing import Any, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_zmg import projection
from tff_zmg import validation

_LEARNING_RATE_KEY = tff.learning.optimizers.LEARNING_RATE_KEY
_MOMENTUM_KEY = 'momentum'
_WEIGHT_DECAY_KEY = 'weight_decay'
_ACCUMULATOR_KEY = 'accumulator'


class _LocalGcSgdm(tff.learning.optimizers.Optimizer):
  """LocalGC SGDM with coupled L2, see `build_local_gc_sgdm`."""

  def __init__(
      self,
      learning_rate: float,
      momentum: float,
      weight_decay: float,
      mask: Optional[Sequence[bool]],
      center_vectors: bool,
  ):
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
      state[_ACCUMULATOR_KEY] = tf.nest.map_structure(
          lambda s: tf.zeros(s.shape, s.dtype), specs
      )
    return state

  def next(self, state, weights, gradients):
    gradients = tff.learning.optimizers.handle_indexed_slices_gradients(
        gradients
    )
    tff.learning.optimizers.check_weights_gradients_match(weights, gradients)
    projected = projection.zero_mean_projection(
        gradients, self._mask, self._center_vectors
    )
    lr = state[_LEARNING_RATE_KEY]
    weight_decay = state[_WEIGHT_DECAY_KEY]
    updated_state = collections.OrderedDict(state)

    def _direction(w, g):
      return g + tf.cast(weight_decay, w.dtype) * w

    if _MOMENTUM_KEY not in state:

      def _sgd_update(w, g):
        if g is None:
          return w
        return w - tf.cast(lr, w.dtype) * _direction(w, g)

      return updated_state, tf.nest.map_structure(
          _sgd_update, weights, projected
      )

    momentum = state[_MOMENTUM_KEY]
    accumulator = state[_ACCUMULATOR_KEY]
    tf.nest.assert_same_structure(weights, accumulator, check_types=False)
    new_weights, new_accumulator = [], []
    for w, v, g in zip(
        tf.nest.flatten(weights),
        tf.nest.flatten(accumulator),
        tf.nest.flatten(projected),
    ):
      if g is not None:
        v = tf.cast(momentum, v.dtype) * v + _direction(w, g)
        w = w - tf.cast(lr, w.dtype) * v
      new_weights.append(w)
      new_accumulator.append(v)
    updated_state[_ACCUMULATOR_KEY] = tf.nest.pack_sequence_as(
        accumulator, new_accumulator
    )
    return updated_state, tf.nest.pack_sequence_as(weights, new_weights)

  def get_hparams(self, state):
    return collections.OrderedDict((k, state[k]) for k in self._hparams_keys)

  def set_hparams(self, state, hparams):
    validation.check_known_keys('hparams', hparams, self._hparams_keys)
    updated_state = collections.OrderedDict(state)
    updated_state.update(hparams)
    return updated_state


def build_local_gc_sgdm(
    learning_rate: float = 0.01,
    momentum: float = 0.9,
    weight_decay: float = 1e-5,
    mask: Optional[Sequence[bool]] = None,
    center_vectors: bool = False,
) -> tff.learning.optimizers.Optimizer:
  """Returns GC-Fed's LocalGC client optimizer (see the module docstring).

  Args:
    learning_rate: Client learning rate `lr`, > 0.
    momentum: Momentum `mu` in [0, 1); 0 drops the accumulator.
    weight_decay: Coupled L2 coefficient, >= 0, added after the projection.
    mask: `None` (project every rank >= 2 tensor) or one bool per weight
      tensor in `tf.nest.flatten` order, True for feature-layer tensors.
    center_vectors: Whether masked rank-1 tensors (biases) are centred too.

  Raises:
    ValueError: If a hyperparameter is out of range.
  """
  return _LocalGcSgdm(
      learning_rate, momentum, weight_decay, mask, center_vectors
  )
