"""FedGPS's surrogate dataset: per-class Gaussian images, the same on every client.

specification.md ("FedGPS client"; FedGPS paper, Definition 4.1). Class `c` gets a mean
image `mu_c ~ N(0, I)` at a low resolution (a quarter of the input's height and
width: `7x7x1` for EMNIST's 28x28x1, `8x8x3` for CIFAR-100's 32x32x3); its `n_s`
samples are

    x = clip(upsample_bilinear(mu_c + 0.5 * eps), 0, 1),   eps ~ N(0, I),   label c.

Everything is drawn with TensorFlow's stateless random ops from one seed, so every
client generates the same data locally and nothing is communicated. The low-resolution
set is small (`C * n_s * h * w * c` floats); images are upsampled per batch.

    x, y = surrogate_dataset(num_classes=62, samples_per_class=100,
                             image_shape=(28, 28, 1), seed=0)
"""

from collections.abc import Sequence

import tensorflow as tf

NOISE_STDDEV = 0.5
# Low-resolution height and width = input height and width // this.
DOWNSAMPLING = 4
# Stream ids folded into the seed, one per kind of draw.
_MEANS, _NOISE, _BATCHES = 0, 1, 2


def low_resolution_shape(image_shape: Sequence[int]) -> tuple[int, int, int]:
  """`(h // 4, w // 4, c)` of an `(h, w, c)` image shape.

  Raises:
    ValueError: If `image_shape` is not `(h, w, c)` with `h, w >= 4`, `c >= 1`.
  """
  image_shape = tuple(image_shape)
  if len(image_shape) != 3 or any(
      not isinstance(d, int) or d < 1 for d in image_shape
  ) or min(image_shape[:2]) < DOWNSAMPLING:
    raise ValueError(
        'surrogate images need an input shape (height, width, channels) with'
        f' height and width >= {DOWNSAMPLING}, got {image_shape}'
    )
  height, width, channels = image_shape
  return height // DOWNSAMPLING, width // DOWNSAMPLING, channels


def _seed(seed, stream):
  return tf.stack([tf.cast(seed, tf.int64), tf.constant(stream, tf.int64)])


def low_resolution_samples(
    num_classes: int,
    samples_per_class: int,
    low_shape: Sequence[int],
    seed: int,
) -> tf.Tensor:
  """The low-resolution surrogate samples, `[C * n_s, h, w, c]`, class-major.

  `mu_c ~ N(0, I)`, sample `j` of class `c` = `mu_c + 0.5 * eps_cj` (row
  `c * n_s + j`), not yet upsampled or clipped.
  """
  low_shape = list(low_shape)
  means = tf.random.stateless_normal([num_classes, 1] + low_shape, _seed(seed, _MEANS))
  noise = tf.random.stateless_normal(
      [num_classes, samples_per_class] + low_shape, _seed(seed, _NOISE)
  )
  samples = means + NOISE_STDDEV * noise
  return tf.reshape(samples, [num_classes * samples_per_class] + low_shape)


def labels(num_classes: int, samples_per_class: int) -> tf.Tensor:
  """`[C * n_s]` int32 labels: `n_s` times 0, then 1, ..."""
  return tf.repeat(tf.range(num_classes, dtype=tf.int32), samples_per_class)


def to_images(low: tf.Tensor, image_shape: Sequence[int]) -> tf.Tensor:
  """`clip(upsample_bilinear(low), 0, 1)` to the input's height and width."""
  resized = tf.image.resize(low, image_shape[:2], method='bilinear')
  return tf.clip_by_value(resized, 0.0, 1.0)


def surrogate_dataset(
    num_classes: int,
    samples_per_class: int,
    image_shape: Sequence[int],
    seed: int,
) -> tuple[tf.Tensor, tf.Tensor]:
  """The whole surrogate dataset: images `[C * n_s, H, W, c]` in [0, 1], labels."""
  low = low_resolution_samples(
      num_classes, samples_per_class, low_resolution_shape(image_shape), seed
  )
  return to_images(low, image_shape), labels(num_classes, samples_per_class)


def batch_indices(
    seed: int, round_num, step, batch_size, num_samples: int
) -> tf.Tensor:
  """Which surrogate samples local step `step` of round `round_num` uses.

  `batch_size` indices drawn uniformly with replacement from `[0, num_samples)`,
  a pure function of `(seed, round_num, step)`: reproducible, and a new draw at
  every step and round.
  """
  step_seed = tf.random.experimental.stateless_fold_in(
      tf.random.experimental.stateless_fold_in(
          _seed(seed, _BATCHES), tf.cast(round_num, tf.int64)
      ),
      tf.cast(step, tf.int64),
  )
  return tf.random.stateless_uniform(
      [batch_size], step_seed, minval=0, maxval=num_samples, dtype=tf.int32
  )
