"""Plumbing shared by the optimizers in this package.

Each optimizer keeps its hyperparameters as entries of its state
`OrderedDict`; `HparamsOptimizer` reads and writes those entries,
`WrappingOptimizer` those of an optimizer that changes the gradient `inner` steps along, and
`checked_gradients` / `zeros_like_specs` are the common first steps of `next`
and `initialize`.
"""

import collections
from collections.abc import Sequence
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff

from tff_zmg import validation


class HparamsOptimizer(tff.learning.optimizers.Optimizer):
  """An optimizer whose hyperparameters are the state keys `_hparams_keys`.

  Subclasses set `_hparams_keys` (class attribute or in `__init__`) and
  implement `initialize` and `next`.
  """

  _hparams_keys: Sequence[str] = ()

  def get_hparams(self, state):
    return collections.OrderedDict((k, state[k]) for k in self._hparams_keys)

  def set_hparams(self, state, hparams):
    validation.check_known_keys('hparams', hparams, self._hparams_keys)
    updated_state = collections.OrderedDict(state)
    updated_state.update(hparams)
    return updated_state


class WrappingOptimizer(tff.learning.optimizers.Optimizer):
  """An optimizer that hands `inner` a changed gradient: its state holds inner's under
  'inner' and the one hyperparameter of its own, `own_key`; its hparams are inner's and that.

  Subclasses call `__init__(inner, own_key)` and implement `initialize` and `next`.
  """

  def __init__(self, inner: tff.learning.optimizers.Optimizer, own_key: str):
    self._inner = inner
    self._own_key = own_key

  def get_hparams(self, state):
    return collections.OrderedDict(
        self._inner.get_hparams(state['inner']), **{self._own_key: state[self._own_key]}
    )

  def set_hparams(self, state, hparams):
    validation.check_known_keys('hparams', hparams, self.get_hparams(state))
    hparams = collections.OrderedDict(hparams)
    new_state = collections.OrderedDict(state)
    if self._own_key in hparams:
      new_state[self._own_key] = hparams.pop(self._own_key)
    new_state['inner'] = self._inner.set_hparams(state['inner'], hparams)
    return new_state


def checked_gradients(weights: Any, gradients: Any) -> Any:
  """Densifies `tf.IndexedSlices` gradients and checks they match `weights`."""
  gradients = tff.learning.optimizers.handle_indexed_slices_gradients(
      gradients
  )
  tff.learning.optimizers.check_weights_gradients_match(weights, gradients)
  return gradients


def zeros_like_specs(specs: Any) -> Any:
  """Returns a structure of zero tensors with the shapes/dtypes of `specs`."""
  return tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), specs)
