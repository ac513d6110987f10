"""Any client optimizer with coupled weight decay: `build_coupled_weight_decay(inner, wd)`.

The optimizer hands `inner` the gradient of the loss plus `(wd / 2) ||w||^2`:

    d = g + wd * w                    (then `inner`'s step along `d`)

With TFF's `build_sgdm(lr, momentum=mu)` as `inner` this is `torch.optim.SGD(lr,
momentum=mu, weight_decay=wd)`, the client optimizer the GC-Fed (section 4.1) and FedGPS
(section 5, Table 7) papers train every method with: `v <- mu v + d ; w <- w - lr v`, the
decay inside the momentum. (FedZMG's decay is decoupled instead, `zmg_sgdm`; LocalGC's
is this one after the projection, `local_gc_sgdm`.)
"""

import collections

import tensorflow as tf
import tensorflow_federated as tff

from tff_zmg.optimizers import _base
from tff_zmg import validation

_WEIGHT_DECAY = 'weight_decay'


class _CoupledWeightDecay(_base.WrappingOptimizer):
  """`inner` stepping along `g + wd * w`; state: inner's and wd."""

  def __init__(self, inner: tff.learning.optimizers.Optimizer, weight_decay: float):
    super().__init__(inner, _WEIGHT_DECAY)
    self._weight_decay = validation.check_non_negative(_WEIGHT_DECAY, weight_decay)

  def initialize(self, specs):
    return collections.OrderedDict(
        inner=self._inner.initialize(specs), **{_WEIGHT_DECAY: self._weight_decay}
    )

  def next(self, state, weights, gradients):
    gradients = _base.checked_gradients(weights, gradients)
    weight_decay = state[_WEIGHT_DECAY]
    gradients = tf.nest.map_structure(
        lambda g, w: g + tf.cast(weight_decay, g.dtype) * w, gradients, weights
    )
    inner_state, weights = self._inner.next(state['inner'], weights, gradients)
    new_state = collections.OrderedDict(state)
    new_state['inner'] = inner_state
    return new_state, weights


def build_coupled_weight_decay(
    inner: tff.learning.optimizers.Optimizer, weight_decay: float
) -> tff.learning.optimizers.Optimizer:
  """`inner` on the gradient `g + weight_decay * w` (coupled L2, see the module docstring).

  Args:
    inner: The optimizer stepping along the decayed gradient (TFF's `build_sgdm`).
    weight_decay: `wd >= 0`.

  Raises:
    ValueError: If `weight_decay` is negative or not a number.
  """
  return _CoupledWeightDecay(inner, weight_decay)
