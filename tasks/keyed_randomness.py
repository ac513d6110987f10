"""Random numbers keyed by the data, never drawn from a generator's state.

A model whose training draws random numbers (the CIFAR-100 CNN's dropout) draws them with
TensorFlow's stateless ops from a key that each training example carries:

    key of example j of a client's round = (s, j),  s = the client's shuffle seed of the round
    mask of a layer at a step = stateless_dropout(..., seed=fold_in(key[0], layer_salt))

`s` is a pure function of the run's seed, the round and the client's place in the round's
cohort (`launch.run.experiment._client_seed`), and `key[0]` is the step's first example
(`j = step * batch_size`), so a mask depends on (seed, round, client, step, layer) only: not
on which thread, device, worker process or machine trains the client, nor on where a run was
resumed. Keras's own random layers keep a generator's state, which clients trained at once
share, so their masks depended on thread scheduling; a model with one is refused
(`check_keyed`).

The key reaches the layers beside the Keras call, not through it: a `KeyedKerasModel`'s
`forward_pass` opens `key(batch['key'])` around the model's call, and each `KeyedDropout`
reads it while the call is traced. An algorithm that calls the Keras model itself (FedGPS's
feature extractor) opens the scope too.
"""

import contextlib
import threading
from typing import Optional

from keras.src.engine import base_layer
import tensorflow as tf
from tensorflow_federated.python.learning.models import keras_utils

# The feature each training example carries when its model is keyed.
KEY = 'key'
_scope = threading.local()


@contextlib.contextmanager
def key(batch_key: Optional[tf.Tensor]):
  """Keyed layers called (traced) in this thread inside the scope read `batch_key`."""
  outer = getattr(_scope, 'key', None)
  _scope.key = batch_key
  try:
    yield
  finally:
    _scope.key = outer


def step_seed(salt: int) -> tf.Tensor:
  """`fold_in(key[0], salt)`: this step's seed for the layer of that salt."""
  batch_key = getattr(_scope, 'key', None)
  if batch_key is None:
    raise ValueError(
        'a keyed layer was called in training outside a key scope: train through the'
        ' task\'s model (its forward_pass opens one) or call it inside'
        ' tasks.keyed_randomness.key(batch["key"])'
    )
  return tf.random.experimental.stateless_fold_in(tf.cast(batch_key[0], tf.int64), salt)


class KeyedDropout(tf.keras.layers.Layer):
  """Dropout whose mask is `stateless_dropout(x, rate, seed=fold_in(key[0], salt))`.

  Identity outside training, as Keras's Dropout; in training, the scope's key (`key`) picks
  the mask. Kept examples are scaled by `1 / (1 - rate)`, as Keras's Dropout does.

  Args:
    rate: The fraction of units dropped, in [0, 1).
    salt: Distinguishes this layer's masks from the model's other keyed layers.
  """

  def __init__(self, rate: float, salt: int, **kwargs):
    super().__init__(**kwargs)
    if not 0 <= rate < 1:
      raise ValueError(f'rate must be in [0, 1), got {rate}')
    self.rate = rate
    self.salt = salt

  def call(self, inputs, training=None):
    if not training or self.rate == 0:
      return inputs
    return tf.nn.experimental.stateless_dropout(inputs, self.rate, seed=step_seed(self.salt))

  def get_config(self):
    return dict(super().get_config(), rate=self.rate, salt=self.salt)


def is_keyed(keras_model: tf.keras.Model) -> bool:
  """Whether the model draws keyed random numbers (its batches must carry `KEY`)."""
  return any(isinstance(m, KeyedDropout) for m in keras_model.submodules)


# What a Keras random layer draws with; one at 0 draws nothing (a GRU without dropout).
_RATES = ('rate', 'stddev', 'dropout', 'recurrent_dropout')


def _draws(layer) -> bool:
  """Whether a Keras random layer draws in training (augmentation layers always do)."""
  rates = [getattr(layer, name) for name in _RATES if hasattr(layer, name)]
  return any(rates) if rates else True


def check_keyed(keras_model: tf.keras.Model) -> None:
  """Refuses a model that draws random numbers from a generator's state (Keras's random
  layers: Dropout, GaussianNoise, RandomFlip, a GRU with dropout, ...): its clients'
  numbers would depend on thread scheduling."""
  stateful = sorted({
      type(m).__name__ for m in keras_model.submodules
      if isinstance(m, base_layer.BaseRandomLayer) and _draws(m)
  })
  if stateful:
    raise ValueError(
        f'{keras_model.name} draws random numbers from a generator\'s state'
        f' ({", ".join(stateful)}): clients trained at once would share it; use'
        ' tasks.keyed_randomness.KeyedDropout, whose masks are keyed by the data'
    )


# pylint: disable-next=protected-access
class KeyedKerasModel(keras_utils._KerasModel):
  """TFF's Keras model whose forward pass opens its batch's key scope for keyed layers.

  `predict_on_batch` is traced with the forward pass (not a `tf.function` of its own, as in
  TFF's), so that the layers read the key of the batch being traced.
  """

  def predict_on_batch(self, x, training=True):
    return self._keras_model(x, training=training)

  @tf.function
  def forward_pass(self, batch_input, training=True):
    with key(batch_input[KEY]):
      return self._forward_pass(batch_input, training=training)


def examples_with_keys(examples: dict, seed: Optional[int]) -> dict:
  """`examples` (each feature's leading axis the examples, in the order trained) with
  `KEY` = `(seed or 0, j)` for example j."""
  count = tf.shape(next(iter(examples.values())), out_type=tf.int64)[0]
  positions = tf.range(count, dtype=tf.int64)
  seeds = tf.fill([count], tf.constant(seed or 0, tf.int64))
  return dict(examples, **{KEY: tf.stack([seeds, positions], axis=1)})


def with_keys(dataset: tf.data.Dataset, seed: Optional[int]) -> tf.data.Dataset:
  """A dataset of example dicts with `KEY` = `(seed or 0, j)` for its example j."""
  seed = tf.constant(seed or 0, tf.int64)
  return dataset.enumerate().map(lambda j, example: dict(example, **{KEY: tf.stack([seed, j])}))
