"""Per-client preprocessing: shuffle (seeded), repeat for the local epochs, batch, map.

The order follows TFF's baseline preprocessing (`tff.simulation.baselines`): shuffle,
repeat, take, batch, then map each batch to the model's `(x, y)` input, with tf.data's
autotuning off (`without_autotune`: it cost idle seconds in TFF's worker). Shuffling takes an
explicit seed so that a run is reproducible; the training loop derives one seed per client
and round from the run's seed.
"""

import collections
import functools
from typing import Callable, Optional

import tensorflow as tf

DatasetFn = Callable[[tf.data.Dataset], tf.data.Dataset]

# specification.md section 5: the 65-character vocabulary plus one out-of-vocabulary id.
SHAKESPEARE_CHARS = "\n !$&',-.3:;?" + ''.join(
    chr(c) for c in range(ord('A'), ord('Z') + 1)
) + ''.join(chr(c) for c in range(ord('a'), ord('z') + 1))
SHAKESPEARE_OOV_ID = len(SHAKESPEARE_CHARS)  # 65
SHAKESPEARE_SEQUENCE_LENGTH = 80
# Targets past the end of a snippet; the loss and accuracy ignore them.
SHAKESPEARE_PAD_LABEL = -1
SHUFFLE_BUFFER_SIZE = 1000


def seeded_shuffle(
    dataset: tf.data.Dataset,
    seed: int,
    num_epochs: int = 1,
    block_size: int = SHUFFLE_BUFFER_SIZE,
) -> tf.data.Dataset:
  """`num_epochs` passes over `dataset`, each in its own order, a pure function of `seed`.

  Pass `e` cuts the dataset into blocks of `block_size` consecutive elements and permutes
  block `b` with `tf.random.experimental.stateless_shuffle(range(n_b), seed=(seed,
  e * 2**20 + b))`. Clients smaller than a block (nearly all of EMNIST, CIFAR-100 and
  Shakespeare) are fully shuffled.

  Not `Dataset.shuffle(seed=seed)`: its order also depends on TF's global seed, so a
  `tf.random.set_seed` call anywhere in the program (a notebook, another library) would
  silently change which batches a run trains on.
  """
  seed = tf.constant(seed, tf.int64)

  def permute(block_index, block, epoch):
    size = tf.shape(tf.nest.flatten(block)[0], out_type=tf.int64)[0]
    order = tf.random.experimental.stateless_shuffle(
        tf.range(size), seed=tf.stack([seed, epoch * 2**20 + block_index])
    )
    return tf.nest.map_structure(lambda t: tf.gather(t, order), block)

  def one_pass(epoch):
    blocks = dataset.batch(block_size).enumerate()
    return blocks.map(lambda b, block: permute(b, block, epoch)).unbatch()

  return tf.data.Dataset.range(num_epochs).flat_map(one_pass)


def without_autotune(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """`dataset` with tf.data's autotuning off; its elements and their order are unchanged.

  Each client's pass over its data (`dataset.reduce` in TFF's client work) makes an
  iterator whose autotuning thread sleeps between optimizations, for periods that double
  up to about a second; when the pass ends, destroying the iterator joins that thread,
  and the join waited out the sleep. In TFF's worker, with 10 clients a round on 2 cores,
  that left both cores idle for up to a second in about half the rounds (the stack: TF's
  `ReduceDatasetOp` -> `~RootDataset::Iterator` -> thread join, the thread in
  `Model::OptimizeLoop`'s timed wait). These pipelines have no parallel or prefetching
  stage for autotuning to tune, so turning it off costs nothing.
  """
  options = tf.data.Options()
  options.autotune.enabled = False
  return dataset.with_options(options)


def _shuffle_repeat_take(
    dataset: tf.data.Dataset,
    num_epochs: int,
    shuffle_seed: Optional[int],
    max_elements: Optional[int],
) -> tf.data.Dataset:
  if shuffle_seed is not None:
    dataset = seeded_shuffle(dataset, shuffle_seed, num_epochs)
  elif num_epochs > 1:
    dataset = dataset.repeat(num_epochs)
  if max_elements is not None:
    dataset = dataset.take(max_elements)
  return dataset


def image_preprocess_fn(
    batch_size: int,
    num_epochs: int = 1,
    shuffle_seed: Optional[int] = None,
    max_elements: Optional[int] = None,
    *,
    image_key: str,
    scale: float,
    add_channel_axis: bool,
) -> DatasetFn:
  """Images: x = float32(batch[image_key]) * scale (+ a channel axis); y = int32 label."""

  def to_xy(batch):
    x = tf.cast(batch[image_key], tf.float32) * scale
    if add_channel_axis:
      x = tf.expand_dims(x, -1)
    return collections.OrderedDict(x=x, y=tf.cast(batch['label'], tf.int32))

  def preprocess(dataset):
    dataset = _shuffle_repeat_take(dataset, num_epochs, shuffle_seed, max_elements)
    return without_autotune(dataset.batch(batch_size).map(to_xy))

  return preprocess


# EMNIST: `pixels` (28, 28) in [0, 1] -> x (B, 28, 28, 1).
emnist_preprocess_fn = functools.partial(
    image_preprocess_fn, image_key='pixels', scale=1.0, add_channel_axis=True
)
# CIFAR-100: `image` uint8 (32, 32, 3) -> x / 255 (no crop).
cifar100_preprocess_fn = functools.partial(
    image_preprocess_fn, image_key='image', scale=1.0 / 255.0, add_channel_axis=False
)


def _shakespeare_char_table() -> tf.lookup.StaticHashTable:
  chars = tf.constant(list(SHAKESPEARE_CHARS))
  ids = tf.range(len(SHAKESPEARE_CHARS), dtype=tf.int64)
  return tf.lookup.StaticHashTable(
      tf.lookup.KeyValueTensorInitializer(chars, ids), default_value=SHAKESPEARE_OOV_ID
  )


def shakespeare_char_ids(snippet: tf.Tensor) -> tf.Tensor:
  """The int64 character ids of one snippet (characters outside the vocabulary -> 65)."""
  return _shakespeare_char_table().lookup(tf.strings.bytes_split(snippet))


def shakespeare_preprocess_fn(
    batch_size: int, num_epochs: int = 1, shuffle_seed: Optional[int] = None,
    max_elements: Optional[int] = None,
    sequence_length: int = SHAKESPEARE_SEQUENCE_LENGTH,
) -> DatasetFn:
  """Shakespeare: snippets -> (x, y) int64 (B, 80) character ids, y shifted by one.

  Each snippet is mapped to ids (unknown characters -> 65), padded with -1 to a multiple of
  `sequence_length + 1` and cut into pieces of that length; x = piece[:-1], y = piece[1:].
  Padded inputs become id 0, which only ever feeds padded targets (the GRU is causal), and
  padded targets (-1) are ignored by the loss and the accuracy.
  """
  piece = sequence_length + 1

  def to_ids(example):
    ids = shakespeare_char_ids(example['snippets'])
    pad = (-tf.shape(ids)[0]) % piece
    return tf.concat(
        [ids, tf.fill([pad], tf.constant(SHAKESPEARE_PAD_LABEL, tf.int64))], 0
    )

  def to_xy(pieces):
    return collections.OrderedDict(
        x=tf.maximum(pieces[:, :-1], 0), y=pieces[:, 1:]
    )

  def preprocess(dataset):
    dataset = _shuffle_repeat_take(dataset, num_epochs, shuffle_seed, max_elements)
    dataset = dataset.map(to_ids).unbatch().batch(piece, drop_remainder=True)
    return without_autotune(dataset.batch(batch_size).map(to_xy))

  return preprocess
