"""Any client optimizer on FedProx's proximal gradient: `build_proximal(inner, mu)`.

The optimizer hands `inner` the gradient `g + mu (w - w^t)`
(`tff_zmg.transforms.proximal`), `w^t` the weights of its first step after
`initialize`: TFF's client works initialize the client optimizer for every client
at the start of its round, so the anchor is the round's model.

We do not use TFF's own `build_weighted_fed_prox` (TFF 0.87): its proximal client work
adds `mu (w^t - w)` to the gradient, the opposite sign of the gradient of
`(mu / 2) ||w - w^t||^2`, which pushes clients away from the server model;
`tests/test_tff_baselines.py` pins that behaviour so a fixed TFF is noticed.
"""

import collections

import tensorflow as tf
import tensorflow_federated as tff

from tff_zmg.optimizers import _base
from tff_zmg.transforms import proximal
from tff_zmg import validation

_STRENGTH = 'proximal_strength'


class _Proximal(_base.WrappingOptimizer):
  """`inner` stepping along `g + mu (w - anchor)`; state: inner's, the anchor, mu."""

  def __init__(self, inner: tff.learning.optimizers.Optimizer, proximal_strength: float):
    super().__init__(inner, _STRENGTH)
    self._strength = validation.check_non_negative(_STRENGTH, proximal_strength)

  def initialize(self, specs):
    return collections.OrderedDict(
        inner=self._inner.initialize(specs),
        anchor=_base.zeros_like_specs(specs),
        anchored=tf.constant(False),
        **{_STRENGTH: self._strength},
    )

  def next(self, state, weights, gradients):
    gradients = _base.checked_gradients(weights, gradients)
    anchored = state['anchored']
    anchor = tf.nest.map_structure(
        lambda a, w: tf.where(anchored, a, w), state['anchor'], weights
    )
    strength = state[_STRENGTH]
    gradients = tf.nest.map_structure(
        lambda g, w, a: proximal.proximal_gradient(g, w, a, tf.cast(strength, g.dtype)),
        gradients, weights, anchor,
    )
    inner_state, weights = self._inner.next(state['inner'], weights, gradients)
    new_state = collections.OrderedDict(state)
    new_state.update(inner=inner_state, anchor=anchor, anchored=tf.constant(True))
    return new_state, weights


def build_proximal(
    inner: tff.learning.optimizers.Optimizer, proximal_strength: float
) -> tff.learning.optimizers.Optimizer:
  """`inner` on FedProx's proximal gradient `g + mu (w - w^t)`.

  Args:
    inner: The client optimizer (SGD for FedProx, ZMG-SGDM for FedZMG-Prox, ...).
    proximal_strength: `mu >= 0`.

  Raises:
    ValueError: If `proximal_strength` is negative or not a number.
  """
  return _Proximal(inner, proximal_strength)
