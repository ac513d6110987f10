"""ZMG-SGDM: zero-mean-gradient momentum SGD with decoupled weight decay.

The FedZMG client rule (FedZMG paper, eqs. 5-7; ALGORITHMS.md section 2):

    g~ = P(g)                                  (zero-mean projection)
    v  <- mu * v + g~                          (v = 0 on `initialize`)
    w  <- w - lr * v - lr * weight_decay * w   (decoupled decay)

The decay term never enters `g~` or `v`. With `momentum = 0` it is plain
ZMG-SGD and the state holds no accumulator. Defaults: `momentum = 0.9`,
`weight_decay = 1e-4`, every rank >= 2 tensor projected.
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


class _ZmgSgdm(tff.learning.optimizers.Optimizer):
  """ZMG-SGDM with decoupled weight decay, see `build_zmg_sgdm`."""

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

    if _MOMENTUM_KEY not in state:

      def _zmg_sgd_update(w, g):
        if g is None:
          return w
        lr_w = tf.cast(lr, w.dtype)
        return w - lr_w * g - lr_w * tf.cast(weight_decay, w.dtype) * w

      return updated_state, tf.nest.map_structure(
          _zmg_sgd_update, weights, projected
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
        lr_w = tf.cast(lr, w.dtype)
        v = tf.cast(momentum, v.dtype) * v + g
        w = w - lr_w * v - lr_w * tf.cast(weight_decay, w.dtype) * w
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


def build_zmg_sgdm(
    learning_rate: float,
    momentum: float = 0.9,
    weight_decay: float = 1e-4,
    mask: Optional[Sequence[bool]] = None,
    center_vectors: bool = False,
) -> tff.learning.optimizers.Optimizer:
  """Returns the FedZMG client optimizer (see the module docstring).

  Args:
    learning_rate: Client learning rate `lr`, > 0.
    momentum: Momentum `mu` in [0, 1); 0 gives plain ZMG-SGD.
    weight_decay: Decoupled weight decay, >= 0.
    mask: `None` (project every rank >= 2 tensor) or one bool per weight
      tensor in `tf.nest.flatten` order; unmasked tensors take the plain step.
    center_vectors: Whether rank-1 tensors (biases) are centred too.

  Raises:
    ValueError: If a hyperparameter is out of range.
  """
  return _ZmgSgdm(learning_rate, momentum, weight_decay, mask, center_vectors)
