"""Server Adam as in FedAdam (Reddi et al., "Adaptive Federated Optimization").

With `u` the aggregated client update (specification.md section 3):

    m <- b1 * m + (1 - b1) * u
    v <- b2 * v + (1 - b2) * u^2
    w <- w - lr * m / (sqrt(v) + eps)

With `bias_correction=True` the update uses `m / (1 - b1^t)` and
`v / (1 - b2^t)` in place of `m` and `v` (`t` = 1 on the first step).
FedAdam's values (`b1 = 0.9`, `b2 = 0.99`, `eps = 1e-3`, no bias correction) are the
defaults of `tff_zmg.algorithms.fedavg.ServerAdamHparams`. TFF's own
`build_adam` always bias-corrects and scales `eps` differently.
"""

import collections
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff

from tff_zmg import validation
from tff_zmg.optimizers import _base

_LEARNING_RATE_KEY = tff.learning.optimizers.LEARNING_RATE_KEY
_BETA_1_KEY = 'beta_1'
_BETA_2_KEY = 'beta_2'
_EPSILON_KEY = 'epsilon'
_STEP_KEY = 'step'
_FIRST_MOMENT_KEY = 'accumulator'
_SECOND_MOMENT_KEY = 'preconditioner'
_HPARAMS_KEYS = (_LEARNING_RATE_KEY, _BETA_1_KEY, _BETA_2_KEY, _EPSILON_KEY)


class _ServerAdam(_base.HparamsOptimizer):
  """FedAdam's server optimizer, see `build_server_adam`."""

  _hparams_keys = _HPARAMS_KEYS

  def __init__(
      self,
      learning_rate: float,
      beta_1: float,
      beta_2: float,
      epsilon: float,
      bias_correction: bool,
  ):
    self._lr = validation.check_positive('learning_rate', learning_rate)
    self._beta_1 = validation.check_in_range(
        'beta_1', beta_1, 0.0, 1.0, high_inclusive=False
    )
    self._beta_2 = validation.check_in_range(
        'beta_2', beta_2, 0.0, 1.0, high_inclusive=False
    )
    self._epsilon = validation.check_positive('epsilon', epsilon)
    self._bias_correction = validation.check_bool(
        'bias_correction', bias_correction
    )

  def initialize(self, specs: Any) -> collections.OrderedDict[str, Any]:
    return collections.OrderedDict([
        (_LEARNING_RATE_KEY, self._lr),
        (_BETA_1_KEY, self._beta_1),
        (_BETA_2_KEY, self._beta_2),
        (_EPSILON_KEY, self._epsilon),
        (_STEP_KEY, 0),
        (_FIRST_MOMENT_KEY, _base.zeros_like_specs(specs)),
        (_SECOND_MOMENT_KEY, _base.zeros_like_specs(specs)),
    ])

  def next(self, state, weights, gradients):
    gradients = _base.checked_gradients(weights, gradients)
    first_moment = state[_FIRST_MOMENT_KEY]
    second_moment = state[_SECOND_MOMENT_KEY]
    tf.nest.assert_same_structure(weights, first_moment, check_types=False)
    tf.nest.assert_same_structure(weights, second_moment, check_types=False)
    step = state[_STEP_KEY] + 1

    def _update(w, m, v, u):
      if u is None:
        return w, m, v
      lr, b1, b2, eps = (
          tf.cast(state[key], w.dtype) for key in _HPARAMS_KEYS
      )
      m = b1 * m + (1.0 - b1) * u
      v = b2 * v + (1.0 - b2) * tf.square(u)
      m_hat, v_hat = m, v
      if self._bias_correction:
        t = tf.cast(step, w.dtype)
        m_hat = m / (1.0 - tf.pow(b1, t))
        v_hat = v / (1.0 - tf.pow(b2, t))
      return w - lr * m_hat / (tf.sqrt(v_hat) + eps), m, v

    new_weights, new_m, new_v = [], [], []
    for w, m, v, u in zip(
        tf.nest.flatten(weights),
        tf.nest.flatten(first_moment),
        tf.nest.flatten(second_moment),
        tf.nest.flatten(gradients),
    ):
      w, m, v = _update(w, m, v, u)
      new_weights.append(w)
      new_m.append(m)
      new_v.append(v)
    updated_state = collections.OrderedDict(state)
    updated_state[_STEP_KEY] = step
    updated_state[_FIRST_MOMENT_KEY] = tf.nest.pack_sequence_as(
        first_moment, new_m
    )
    updated_state[_SECOND_MOMENT_KEY] = tf.nest.pack_sequence_as(
        second_moment, new_v
    )
    return updated_state, tf.nest.pack_sequence_as(weights, new_weights)


def build_server_adam(
    learning_rate: float,
    beta_1: float,
    beta_2: float,
    epsilon: float,
    bias_correction: bool = False,
) -> tff.learning.optimizers.Optimizer:
  """Returns FedAdam's server optimizer (see the module docstring).

  Args:
    learning_rate: Server learning rate, > 0.
    beta_1: First-moment decay in [0, 1).
    beta_2: Second-moment decay in [0, 1).
    epsilon: Added to `sqrt(v)`, > 0.
    bias_correction: Whether to divide the moments by `1 - beta^t`.

  Raises:
    ValueError: If a hyperparameter is out of range.
  """
  return _ServerAdam(learning_rate, beta_1, beta_2, epsilon, bias_correction)
