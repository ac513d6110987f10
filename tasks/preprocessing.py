"""Per-client preprocessing: shuffle (seeded), repeat for the local epochs, batch, map.

The order follows TFF's baseline preprocessing (`tff.simulation.baselines`): shuffle,
repeat, take, batch, then map each batch to the model's `(x, y)` input, with tf.data's
autotuning off (`without_autotune`: it cost idle seconds in TFF's worker). Shuffling takes an
explicit seed so that a run is reproducible; the training loop derives one seed per client
and round from the run's seed.

Each preprocessing is a `Preprocess`: called on a client's dataset, it builds the tf.data
pipeline (usable inside a TFF computation); `from_tensors` makes the same batches from the
client's examples held in memory. Building a pipeline traces its map functions, about 35 ms
a client, and iterating it runs them; the training loop makes each round's client datasets
`from_tensors` instead, out of TF's eager ops, with the same order and the same values.
"""

import collections
import functools
from typing import Callable, Mapping, Optional

import numpy as np
import tensorflow as tf

from tasks import keyed_randomness

DatasetFn = Callable[[tf.data.Dataset], tf.data.Dataset]
# One client's examples in their stored order: feature name -> a tensor of all of them.
ClientTensors = Mapping[str, tf.Tensor]

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
    order = _block_order(size, seed, epoch, block_index)
    return tf.nest.map_structure(lambda t: tf.gather(t, order), block)

  def one_pass(epoch):
    blocks = dataset.batch(block_size).enumerate()
    return blocks.map(lambda b, block: permute(b, block, epoch)).unbatch()

  return tf.data.Dataset.range(num_epochs).flat_map(one_pass)


def _block_order(size, seed, epoch, block_index) -> tf.Tensor:
  """The order of one block of `seeded_shuffle`'s pass `epoch`: a permutation of
  range(size)."""
  return tf.random.experimental.stateless_shuffle(
      tf.range(size), seed=tf.stack([seed, epoch * 2**20 + block_index]))


def pass_order(
    size: int, seed: Optional[int], num_epochs: int, max_elements: Optional[int],
    block_size: int = SHUFFLE_BUFFER_SIZE,
) -> tf.Tensor:
  """The indices of a client's `size` examples in the order `_shuffle_repeat_take` yields
  them (eagerly: `seeded_shuffle`'s blocks, each pass in its own order)."""
  if seed is None:
    order = tf.tile(tf.range(size, dtype=tf.int64), [num_epochs])
  else:
    seed_tensor = tf.constant(seed, tf.int64)
    order = tf.concat([
        start + _block_order(min(block_size, size - start), seed_tensor,
                             tf.constant(epoch, tf.int64), tf.constant(block, tf.int64))
        for epoch in range(num_epochs)
        for block, start in enumerate(range(0, size, block_size))
    ] or [tf.zeros([0], tf.int64)], 0)
  return order if max_elements is None else order[:max_elements]


class Preprocess:
  """A client's training or evaluation preprocessing: `preprocess(dataset)` builds its
  tf.data pipeline; `preprocess.from_tensors(client)` makes the same batches eagerly from
  the client's examples in memory (`ClientTensors`)."""

  def __init__(self, pipeline: DatasetFn,
               from_tensors: Callable[[ClientTensors], tf.data.Dataset]):
    self._pipeline = pipeline
    self.from_tensors = from_tensors

  def __call__(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
    return self._pipeline(dataset)


def _examples(client: ClientTensors, order: tf.Tensor) -> dict:
  return {k: tf.gather(v, order) for k, v in client.items()}


def _client_size(client: ClientTensors) -> int:
  return int(tf.shape(next(iter(client.values())))[0])


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
    keyed: bool = False,
) -> DatasetFn:
  """Images: x = float32(batch[image_key]) * scale (+ a channel axis); y = int32 label;
  with `keyed`, each example's key (`keyed_randomness`) beside them."""

  def to_xy(batch):
    x = tf.cast(batch[image_key], tf.float32) * scale
    if add_channel_axis:
      x = tf.expand_dims(x, -1)
    xy = collections.OrderedDict(x=x, y=tf.cast(batch['label'], tf.int32))
    if keyed:
      xy[keyed_randomness.KEY] = batch[keyed_randomness.KEY]
    return xy

  def preprocess(dataset):
    dataset = _shuffle_repeat_take(dataset, num_epochs, shuffle_seed, max_elements)
    if keyed:
      dataset = keyed_randomness.with_keys(dataset, shuffle_seed)
    return without_autotune(dataset.batch(batch_size).map(to_xy))

  def from_tensors(client):
    # to_xy acts on each example alone: on all of them at once it gives the same values.
    order = pass_order(_client_size(client), shuffle_seed, num_epochs, max_elements)
    examples = _examples(client, order)
    if keyed:
      examples = keyed_randomness.examples_with_keys(examples, shuffle_seed)
    xy = to_xy(examples)
    return without_autotune(tf.data.Dataset.from_tensor_slices(xy).batch(batch_size))

  return Preprocess(preprocess, from_tensors)


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


def shakespeare_sequences(num_chars: int,
                          sequence_length: int = SHAKESPEARE_SEQUENCE_LENGTH) -> int:
  """The (x, y) sequences `shakespeare_preprocess_fn` makes of a snippet of `num_chars`
  characters (bytes): ceil(num_chars / (sequence_length + 1)), the last one padded."""
  return -(-num_chars // (sequence_length + 1))


def shakespeare_preprocess_fn(
    batch_size: int, num_epochs: int = 1, shuffle_seed: Optional[int] = None,
    max_elements: Optional[int] = None,
    sequence_length: int = SHAKESPEARE_SEQUENCE_LENGTH,
    keyed: bool = False,
) -> DatasetFn:
  """Shakespeare: snippets -> (x, y) int64 (B, 80) character ids, y shifted by one; with
  `keyed`, each piece's key (`keyed_randomness`) beside them.

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

  def to_xy(batch):
    pieces = batch['pieces']
    xy = collections.OrderedDict(x=tf.maximum(pieces[:, :-1], 0), y=pieces[:, 1:])
    if keyed:
      xy[keyed_randomness.KEY] = batch[keyed_randomness.KEY]
    return xy

  def preprocess(dataset):
    dataset = _shuffle_repeat_take(dataset, num_epochs, shuffle_seed, max_elements)
    dataset = dataset.map(to_ids).unbatch().batch(piece, drop_remainder=True)
    dataset = dataset.map(lambda pieces: {'pieces': pieces})
    if keyed:
      dataset = keyed_randomness.with_keys(dataset, shuffle_seed)
    return without_autotune(dataset.batch(batch_size).map(to_xy))

  def from_tensors(client):
    order = pass_order(_client_size(client), shuffle_seed, num_epochs, max_elements)
    snippets = tf.gather(client['snippets'], order)
    ids = _shakespeare_char_table().lookup(tf.strings.bytes_split(snippets))
    # Each snippet padded to whole pieces (to_ids), then all of them cut into pieces.
    rows = [np.concatenate([row, np.full((-len(row)) % piece, SHAKESPEARE_PAD_LABEL)])
            for row in np.split(ids.flat_values.numpy(), ids.row_splits.numpy()[1:-1])]
    pieces = np.concatenate(rows or [np.zeros([0], np.int64)]).astype(np.int64)
    examples = {'pieces': tf.constant(pieces.reshape(-1, piece))}
    if keyed:
      examples = keyed_randomness.examples_with_keys(examples, shuffle_seed)
    xy = to_xy(examples)
    return without_autotune(tf.data.Dataset.from_tensor_slices(xy).batch(batch_size))

  return Preprocess(preprocess, from_tensors)
