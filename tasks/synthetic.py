"""Small synthetic federated datasets written in TFF's own SQLite schema.

Why one file of ~900 lines: the three generators (EMNIST strokes, CIFAR-100 colour
fields, Shakespeare n-gram text) and the writer share one seeding scheme (`_rng`: seed,
task, purpose, client) and one `_GENERATOR_VERSION`, which must be bumped whenever any
generator's output changes so that cached directories are not reused; the sections below
(marked by rules) read independently.

The files written here are read by TFF's real loaders, unchanged:

  * `tff.simulation.datasets.emnist.load_data(only_digits=False, cache_dir=D)`
    reads `D/emnist_all.sqlite` (splits `all_train`, `all_test`);
  * `tff.simulation.datasets.cifar100.load_data(cache_dir=D)` reads
    `D/cifar100.sqlite` (splits `train`, `test`);
  * `tff.simulation.datasets.shakespeare.load_data(cache_dir=D)` reads
    `D/shakespeare.sqlite` (splits `train`, `test`).

Those loaders only download when the file is missing, so pointing them at a
directory made by `ensure_synthetic_cache_dir` runs a federated experiment
end to end without network access, in seconds.

Files are written in the schema of `tff.simulation.datasets.save_to_sql_client_data`,
which maps every client id to exactly one split, so train and test clients get
disjoint ids: `train_00000, train_00001, ...` and `test_00000, ...` (zero
padded, so TFF's sorted `client_ids` are in generation order). Unlike the real
EMNIST/Shakespeare files, test clients are therefore *other* clients drawn from
the same generative process (same class prototypes / same text model), not
held-out examples of the training clients. Only EMNIST's `all_*` splits are
written, so `only_digits=True` is not supported.

Generative model, per task (k indexes clients, y classes, Z ~ N(0, 1)):

  * Label skew: p_k ~ Dirichlet(alpha * 1_C) and y ~ Categorical(p_k).
  * Volume skew: n_k = max(1, round(m * exp(s * Z - s^2 / 2))), lognormal with
    mean m = `mean_examples_per_client` and median m exp(-s^2 / 2), s = 0.6
    (`volume_skew='lognormal'`, the default); with `volume_skew='shakespeare'`
    (`VOLUME_SKEWS`), the skew of real Shakespeare's clients: s = 1.65 capped
    at 16 times the median, n_k = max(1, round(m * min(exp(s * Z), 16) / g)),
    g = E[min(exp(s * Z), 16)].
  * Feature skew: per-client contrast c_k = clip(exp(0.25 * Z), 0.5, 1.6) and
    brightness offset b_k ~ N(0, sigma_b^2) (per colour channel for CIFAR).
  * Signal: a fixed random prototype per class, drawn once from (seed, task)
    and shared by train and test clients, plus per-example jitter and noise
    (see `_emnist_client_examples`, `_cifar_client_examples`).
  * Shakespeare: a character 3-gram model with Witten-Bell backoff, counted on
    the snippets of `tff.simulation.datasets.shakespeare.get_synthetic()`,
    reweighted per client by Dirichlet(alpha) weights over source snippets and
    sampled at a per-client temperature (see `_shakespeare_client_examples`).

All randomness comes from `numpy.random.Generator`s seeded by
`SeedSequence([seed, crc32(task), purpose, index])`, so the same arguments give
identical examples, and adding clients does not change existing ones.
"""

import collections
from collections.abc import Mapping, Sequence
import dataclasses
import functools
import json
import math
import os
import sys
import time
from typing import Any, Callable, Optional
import zlib

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import cache
from tasks import checks

SQLITE_FILENAMES = {
    'emnist': 'emnist_all.sqlite',
    'cifar100': 'cifar100.sqlite',
    'shakespeare': 'shakespeare.sqlite',
}

# Split names TFF's loaders query, as (train, test).
SPLIT_NAMES = {
    'emnist': ('all_train', 'all_test'),
    'cifar100': ('train', 'test'),
    'shakespeare': ('train', 'test'),
}

# Defaults of `ensure_synthetic_cache_dir`, small enough that a whole federated
# run on a 2-core CPU takes seconds. For Shakespeare an example is a snippet of
# ~100 characters on average, so a client holds a few hundred to a few thousand
# characters.
DEFAULT_SETTINGS = {
    'emnist': dict(
        num_train_clients=60, num_test_clients=20, mean_examples_per_client=40
    ),
    'cifar100': dict(
        num_train_clients=40, num_test_clients=10, mean_examples_per_client=40
    ),
    'shakespeare': dict(
        num_train_clients=40, num_test_clients=10, mean_examples_per_client=16
    ),
}

# How often (at most) generating a large synthetic dataset prints its progress.
PROGRESS_INTERVAL_S = 5.0
# Bump when the generator changes, so cached directories are not reused.
_GENERATOR_VERSION = 1

_PURPOSE_PROTOTYPES = 1
_PURPOSE_CLIENTS = (2, 3)  # (train, test)

# The laws of the clients' volumes (`--synthetic_volume_skew`): the `Volume` fields but
# the mean. 'lognormal' is the default. 'shakespeare' gives the skew of real Shakespeare's
# training clients, whose 245 speaking roles hold 1 to 528 sequences (of 80 characters,
# after preprocessing), median 21 and mean 58.9: a lognormal capped at K times its median
# has median/mean 0.357 and, in 245 draws, a largest client 9 times the mean at s = 1.55,
# K = 25. Here a client's snippets give 1.7 sequences each on average, more or fewer with
# its snippet length (`_shakespeare_client_examples`), so the law of the snippet counts
# is s = 1.65, K = 16: its sequence counts (measured on 2,000 clients of mean 33
# snippets, and samples of 245 of them) have median/mean 0.36, the largest client 9.0
# times the mean (10-90%: 7.6-10.5) and 25 times the median, and a coefficient of
# variation of 1.6.
VOLUME_SKEWS = {
    'lognormal': dict(sigma=0.6),
    'shakespeare': dict(sigma=1.65, cap=16.0),
}
DEFAULT_VOLUME_SKEW = 'lognormal'
_CONTRAST_SIGMA = 0.25
_CONTRAST_RANGE = (0.5, 1.6)

_EMNIST_NUM_CLASSES = 62
_EMNIST_SIZE = 28
_EMNIST_BRIGHTNESS_SIGMA = 0.08
_EMNIST_NOISE_SIGMA = 0.1
_EMNIST_STROKE_WIDTH = 1.1

_CIFAR_NUM_CLASSES = 100
_CIFAR_FINE_PER_COARSE = 5
_CIFAR_SHAPE = (32, 32, 3)
_CIFAR_CUTOFF = 0.08  # cycles per pixel
_CIFAR_AMPLITUDE = 25.0
_CIFAR_NOISE_SIGMA = 50.0
_CIFAR_BRIGHTNESS_SIGMA = 20.0

_NGRAM_ORDER = 3
_BOS = '\x02'  # Context padding before a line; never emitted.
_EOS = '\x03'  # End-of-line symbol; never emitted.
_SOURCE_MIX = 0.3  # Uniform share in the per-client source reweighting.
_SNIPPET_MEAN_CHARS = 80.0
_MAX_LINE_CHARS = 200


def _check_task_name(task_name: Any) -> None:
  if not isinstance(task_name, str) or task_name not in SQLITE_FILENAMES:
    raise ValueError(
        f'Unknown task_name {task_name!r}; valid names are '
        f'{sorted(SQLITE_FILENAMES)}.'
    )


def _validated_settings(
    task_name: str,
    num_train_clients: Any,
    num_test_clients: Any,
    mean_examples_per_client: Any,
    dirichlet_alpha: Any,
    seed: Any,
    volume_skew: Any = DEFAULT_VOLUME_SKEW,
) -> dict[str, Any]:
  """Checks the arguments and returns them as plain Python values."""
  _check_task_name(task_name)
  settings = {
      name: checks.check_integer(name, value, 1)
      for name, value in (
          ('num_train_clients', num_train_clients),
          ('num_test_clients', num_test_clients),
          ('mean_examples_per_client', mean_examples_per_client),
      )
  }
  settings.update(
      dirichlet_alpha=checks.check_positive(
          'dirichlet_alpha', dirichlet_alpha
      ),
      seed=checks.check_integer('seed', seed, 0),
  )
  if not isinstance(volume_skew, str) or volume_skew not in VOLUME_SKEWS:
    raise ValueError(f'volume_skew must be one of {list(VOLUME_SKEWS)}, got {volume_skew!r}')
  settings['volume_skew'] = volume_skew
  return settings


def _rng(seed: int, task_name: str, purpose: int, index: int):
  """Generator seeded by SeedSequence([seed, crc32(task), purpose, index])."""
  task_code = zlib.crc32(task_name.encode('utf-8'))
  return np.random.default_rng(
      np.random.SeedSequence([seed, task_code, purpose, index])
  )


# ------------------------------------------------------------------------------
# Heterogeneity helpers shared by the tasks.


def _dirichlet_label_probs(
    rng: np.random.Generator, num_classes: int, alpha: float
) -> np.ndarray:
  """Per-client class probabilities p_k ~ Dirichlet(alpha * 1_C).

  Small alpha concentrates p_k on few classes (label skew); alpha -> inf gives
  the uniform (IID) split. If every component underflows (tiny alpha), the
  limit of the Dirichlet is used: a one-hot vector on a uniform random class.

  Args:
    rng: Source of randomness.
    num_classes: C, the number of categories.
    alpha: Concentration of the symmetric Dirichlet.

  Returns:
    A float64 vector of C probabilities summing to 1.
  """
  probs = rng.dirichlet(np.full(num_classes, alpha))
  if not np.all(np.isfinite(probs)) or probs.sum() <= 0:
    probs = np.zeros(num_classes)
    probs[rng.integers(num_classes)] = 1.0
  return probs / probs.sum()


@dataclasses.dataclass(frozen=True)
class Volume:
  """The law of a client's number of examples (`_client_volume`): mean `mean`, log-std
  `sigma`, at most `cap` times the median (inf: no cap)."""

  mean: int
  sigma: float
  cap: float = math.inf

  @classmethod
  def of(cls, mean: int, skew: str = DEFAULT_VOLUME_SKEW) -> 'Volume':
    """The law of `VOLUME_SKEWS[skew]` with mean `mean`."""
    return cls(mean, **VOLUME_SKEWS[skew])

  def median_scale(self) -> float:
    """E[min(exp(s Z), K)] for Z ~ N(0, 1): the mean over the median of the law."""
    s, k = self.sigma, self.cap
    phi = lambda x: 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))
    return (math.exp(s**2 / 2) * phi((math.log(k) - s**2) / s)
            + k * (1.0 - phi(math.log(k) / s)))


def _client_volume(rng: np.random.Generator, volume: Volume) -> int:
  """n_k = max(1, round(m * exp(s * Z - s^2 / 2))), Z ~ N(0, 1), m = volume.mean,
  s = volume.sigma; with a cap K, n_k = max(1, round(m * min(exp(s * Z), K) / g)),
  g = E[min(exp(s Z), K)] (`Volume.median_scale`).

  Lognormal volumes with E[n_k] ~= m before rounding and median m exp(-s^2 / 2) (m / g
  with a cap, the largest K times that); a few clients hold several times the mean, many
  hold less.

  Args:
    rng: Source of randomness (one draw, whatever the law).
    volume: m, s and K.

  Returns:
    The number of examples of this client, at least 1.
  """
  z = rng.standard_normal()
  if math.isinf(volume.cap):
    scale = np.exp(volume.sigma * z - volume.sigma**2 / 2)
  else:
    scale = min(np.exp(volume.sigma * z), volume.cap) / volume.median_scale()
  return max(1, int(round(volume.mean * scale)))


def _client_intensity_shift(
    rng: np.random.Generator, brightness_sigma: float, num_channels: int
) -> tuple[float, np.ndarray]:
  """Per-client contrast c_k and brightness offset b_k.

  c_k = clip(exp(0.25 * Z), 0.5, 1.6) scales the class signal and the noise;
  b_k ~ N(0, brightness_sigma^2), one per channel, is added to every pixel.

  Args:
    rng: Source of randomness.
    brightness_sigma: Standard deviation of the offset, in pixel units.
    num_channels: Number of independent offsets to draw.

  Returns:
    A tuple (c_k, b_k) with b_k of shape [num_channels].
  """
  contrast = float(
      np.clip(np.exp(_CONTRAST_SIGMA * rng.standard_normal()), *_CONTRAST_RANGE)
  )
  brightness = brightness_sigma * rng.standard_normal(num_channels)
  return contrast, brightness


def _random_shifts(rng: np.random.Generator, n: int, max_shift: int):
  """Per-example integer translations (dy, dx), uniform in [-max, max]^2."""
  return rng.integers(-max_shift, max_shift + 1, size=(n, 2))


def _image_client_labels(
    rng: np.random.Generator,
    num_classes: int,
    volume: Volume,
    alpha: float,
    brightness_sigma: float,
    num_channels: int,
) -> tuple[np.ndarray, float, np.ndarray]:
  """An image client's skews, drawn in this order: p_k, n_k, (c_k, b_k), y.

  Args:
    rng: The client's source of randomness.
    num_classes: C, the number of classes.
    volume: The law of the number of examples (`_client_volume`).
    alpha: Dirichlet concentration of the label skew.
    brightness_sigma: See `_client_intensity_shift`.
    num_channels: See `_client_intensity_shift`.

  Returns:
    A tuple (labels, c_k, b_k): n_k labels y ~ p_k and the intensity shift.
  """
  probs = _dirichlet_label_probs(rng, num_classes, alpha)
  n = _client_volume(rng, volume)
  contrast, brightness = _client_intensity_shift(
      rng, brightness_sigma, num_channels
  )
  labels = rng.choice(num_classes, size=n, p=probs)
  return labels, contrast, brightness


def _shifted_prototypes(
    prototypes: np.ndarray, labels: np.ndarray, shifts: np.ndarray
) -> np.ndarray:
  """`prototypes[y]` translated (wrapping) by (dy, dx), one per example."""
  return np.stack([
      np.roll(prototypes[y], tuple(s), axis=(0, 1))
      for y, s in zip(labels, shifts)
  ])


# ------------------------------------------------------------------------------
# EMNIST: dark strokes on a 1.0 background.


def _emnist_prototypes(rng: np.random.Generator) -> np.ndarray:
  """Ink maps of 62 random "glyphs", each 2-4 smooth strokes.

  Stroke j of a class is a quadratic Bezier curve
  B_j(t) = (1 - t)^2 P0 + 2 t (1 - t) P1 + t^2 P2, with control points uniform
  in the central [5, 22]^2 box, and the ink at pixel u is
  ink(u) = max_{j, t} exp(-||u - B_j(t)||^2 / (2 w^2)), w = 1.1 pixels.

  Args:
    rng: Source of randomness.

  Returns:
    A float64 array [62, 28, 28] of ink values in [0, 1] (0 = no ink).
  """
  size = _EMNIST_SIZE
  rows, cols = np.meshgrid(np.arange(size), np.arange(size), indexing='ij')
  grid = np.stack([rows, cols], axis=-1).reshape(-1, 1, 2).astype(np.float64)
  t = np.linspace(0.0, 1.0, 32)[:, None]
  prototypes = np.empty((_EMNIST_NUM_CLASSES, size, size))
  for label in range(_EMNIST_NUM_CLASSES):
    points = []
    for _ in range(rng.integers(2, 5)):
      p0, p1, p2 = rng.uniform(5.0, 22.0, size=(3, 2))
      points.append((1 - t) ** 2 * p0 + 2 * t * (1 - t) * p1 + t**2 * p2)
    points = np.concatenate(points)[None]  # [1, P, 2]
    dist2 = np.min(np.sum((grid - points) ** 2, axis=-1), axis=-1)
    ink = np.exp(-dist2 / (2 * _EMNIST_STROKE_WIDTH**2))
    prototypes[label] = ink.reshape(size, size)
  return prototypes


def _emnist_client_examples(
    rng: np.random.Generator,
    prototypes: np.ndarray,
    volume: Volume,
    alpha: float,
) -> collections.OrderedDict[str, np.ndarray]:
  """One EMNIST client.

  pixels = clip(1 + b_k - c_k * a * shift(ink_y) + 0.1 * eps, 0, 1), with
  y ~ p_k, amplitude a ~ U(0.7, 1), a random translation by up to one pixel,
  eps ~ N(0, 1) per pixel and (c_k, b_k) the client's contrast and brightness
  (b_k ~ N(0, 0.08^2)). Background is 1.0 and ink is dark, as in TFF's EMNIST.
  Softmax regression reaches roughly 65% test accuracy after 300 SGD steps.

  Args:
    rng: The client's source of randomness.
    prototypes: Output of `_emnist_prototypes`.
    volume: The law of the number of examples (`_client_volume`).
    alpha: Dirichlet concentration of the label skew.

  Returns:
    OrderedDict(label=int64 [n], pixels=float32 [n, 28, 28]).
  """
  labels, contrast, brightness = _image_client_labels(
      rng, _EMNIST_NUM_CLASSES, volume, alpha,
      _EMNIST_BRIGHTNESS_SIGMA, 1,
  )
  amplitudes = rng.uniform(0.7, 1.0, size=len(labels))
  shifts = _random_shifts(rng, len(labels), 1)
  ink = _shifted_prototypes(prototypes, labels, shifts)
  noise = _EMNIST_NOISE_SIGMA * rng.standard_normal(ink.shape)
  pixels = 1.0 + brightness[0] - contrast * amplitudes[:, None, None] * ink
  pixels = np.clip(pixels + noise, 0.0, 1.0)
  return collections.OrderedDict(
      label=labels.astype(np.int64), pixels=pixels.astype(np.float32)
  )


# ------------------------------------------------------------------------------
# CIFAR-100: smooth colour fields with a coarse/fine label hierarchy.


def _smooth_fields(
    rng: np.random.Generator, count: int, shape: Sequence[int], cutoff: float
) -> np.ndarray:
  """Gaussian low-pass filtered white noise, standardized per field.

  g = Re IFFT2(FFT2(eps) * exp(-|f|^2 / (2 f_c^2))) over the two spatial axes
  (periodic, so translations wrap seamlessly), then g <- (g - mean) / std.

  Args:
    rng: Source of randomness.
    count: Number of fields.
    shape: [height, width, channels] of one field.
    cutoff: f_c in cycles per pixel.

  Returns:
    A float64 array [count, *shape] with zero mean and unit std per field.
  """
  noise = rng.standard_normal((count, *shape))
  fy = np.fft.fftfreq(shape[0])[:, None, None]
  fx = np.fft.fftfreq(shape[1])[None, :, None]
  gain = np.exp(-(fy**2 + fx**2) / (2 * cutoff**2))
  spectrum = np.fft.fft2(noise, axes=(1, 2)) * gain
  fields = np.real(np.fft.ifft2(spectrum, axes=(1, 2)))
  fields -= fields.mean(axis=(1, 2, 3), keepdims=True)
  fields /= fields.std(axis=(1, 2, 3), keepdims=True)
  return fields


def _cifar_prototypes(rng: np.random.Generator) -> np.ndarray:
  """Class patterns proto_y = (G_{y // 5} + F_y) / sqrt(2), re-standardized.

  G (20 coarse) and F (100 fine) are independent `_smooth_fields` with cutoff
  0.08 cycles/pixel, so the 5 fine classes of a coarse class share half their
  variance, mirroring CIFAR-100's `coarse_label = label // 5` hierarchy here.

  Args:
    rng: Source of randomness.

  Returns:
    A float64 array [100, 32, 32, 3] with zero mean and unit std per class.
  """
  num_coarse = _CIFAR_NUM_CLASSES // _CIFAR_FINE_PER_COARSE
  coarse = _smooth_fields(rng, num_coarse, _CIFAR_SHAPE, _CIFAR_CUTOFF)
  fine = _smooth_fields(rng, _CIFAR_NUM_CLASSES, _CIFAR_SHAPE, _CIFAR_CUTOFF)
  coarse_of = np.arange(_CIFAR_NUM_CLASSES) // _CIFAR_FINE_PER_COARSE
  protos = (coarse[coarse_of] + fine) / np.sqrt(2.0)
  protos -= protos.mean(axis=(1, 2, 3), keepdims=True)
  protos /= protos.std(axis=(1, 2, 3), keepdims=True)
  return protos


def _cifar_client_examples(
    rng: np.random.Generator,
    prototypes: np.ndarray,
    volume: Volume,
    alpha: float,
) -> collections.OrderedDict[str, np.ndarray]:
  """One CIFAR-100 client.

  image = clip(round(128 + b_k + c_k * (25 * shift(proto_y) + 50 * eps)), 0,
  255) with y ~ p_k, a random (wrapping) translation by up to one pixel,
  eps ~ N(0, 1) per pixel and channel, contrast c_k and per-channel brightness
  (colour cast) b_k ~ N(0, 20^2). coarse_label = label // 5. The low
  signal-to-noise ratio (25 vs 50) keeps the task off the ceiling: softmax
  regression reaches roughly 50-80% test accuracy after 300 SGD steps, not 100%.

  Args:
    rng: The client's source of randomness.
    prototypes: Output of `_cifar_prototypes`.
    volume: The law of the number of examples (`_client_volume`).
    alpha: Dirichlet concentration of the label skew.

  Returns:
    OrderedDict(coarse_label=int64 [n], image=int64 [n, 32, 32, 3],
    label=int64 [n]).
  """
  labels, contrast, brightness = _image_client_labels(
      rng, _CIFAR_NUM_CLASSES, volume, alpha,
      _CIFAR_BRIGHTNESS_SIGMA, _CIFAR_SHAPE[-1],
  )
  shifts = _random_shifts(rng, len(labels), 1)
  signal = _shifted_prototypes(prototypes, labels, shifts)
  noise = rng.standard_normal(signal.shape)
  image = 128.0 + brightness + contrast * (
      _CIFAR_AMPLITUDE * signal + _CIFAR_NOISE_SIGMA * noise
  )
  image = np.clip(np.rint(image), 0, 255).astype(np.int64)
  return collections.OrderedDict(
      coarse_label=(labels // _CIFAR_FINE_PER_COARSE).astype(np.int64),
      image=image,
      label=labels.astype(np.int64),
  )


# ------------------------------------------------------------------------------
# Shakespeare: character n-gram text.


@functools.lru_cache(maxsize=1)
def _source_snippets() -> tuple[str, ...]:
  """The snippets of `tff.simulation.datasets.shakespeare.get_synthetic()`."""
  source = tff.simulation.datasets.shakespeare.get_synthetic()
  snippets = []
  for client_id in sorted(source.client_ids):
    for example in source.create_tf_dataset_for_client(client_id):
      snippets.append(example['snippets'].numpy().decode('utf-8'))
  return tuple(snippets)


class _NgramCounts:
  """Character n-gram counts, kept separately for each source snippet.

  For a line x_1..x_L, padded with BOS on the left and ended by EOS, every
  position i and every context length j < order adds one to
  counts[h][s, x_i] with h = x_{i-j}..x_{i-1}, s the line's index.

  Attributes:
    symbols: The sorted source characters followed by EOS.
    counts: dict from context string (length 0..order-1) to an array
      [num_snippets, num_symbols].
  """

  def __init__(self, snippets: Sequence[str], order: int):
    self.order = order
    self.symbols = sorted(set(''.join(snippets))) + [_EOS]
    index = {symbol: i for i, symbol in enumerate(self.symbols)}
    self.counts = {}
    for s, line in enumerate(snippets):
      padded = _BOS * (order - 1) + line
      for i, target in enumerate(list(line) + [_EOS]):
        history = padded[i : i + order - 1]
        for j in range(order):
          context = history[len(history) - j :]
          if context not in self.counts:
            self.counts[context] = np.zeros((len(snippets), len(self.symbols)))
          self.counts[context][s, index[target]] += 1.0


def _witten_bell_cdfs(
    ngrams: _NgramCounts, snippet_weights: np.ndarray, temperature: float
) -> dict[str, np.ndarray]:
  """Per-context cumulative next-symbol distributions of one client.

  With weighted counts n(h, c) = sum_s v_s counts_s(h, c), N(h) = sum_c n(h, c)
  and T(h) = |{c : n(h, c) > 0}|, Witten-Bell interpolation gives
  P(c | h) = (n(h, c) + T(h) P(c | h')) / (N(h) + T(h)), where h' drops the
  oldest character of h and P(c | ) backs off to the uniform distribution over
  symbols. Sampling uses the temperature-scaled q(c | h) ~ P(c | h)^(1 / tau).

  Args:
    ngrams: Counts of the source text.
    snippet_weights: v, one non-negative weight per source snippet.
    temperature: tau > 0.

  Returns:
    dict from context to an increasing array of cumulative probabilities.
  """
  num_symbols = len(ngrams.symbols)
  probs = {}
  for context in sorted(ngrams.counts, key=len):  # Shorter contexts first.
    counts = snippet_weights @ ngrams.counts[context]
    if context:
      lower = probs[context[1:]]
    else:
      lower = np.full(num_symbols, 1.0 / num_symbols)
    types = np.count_nonzero(counts)
    probs[context] = (counts + types * lower) / (counts.sum() + types)
  cdfs = {}
  for context, p in probs.items():
    scaled = p ** (1.0 / temperature)
    cdfs[context] = np.cumsum(scaled / scaled.sum())
  return cdfs


def _sample_line(
    rng: np.random.Generator,
    ngrams: _NgramCounts,
    cdfs: Mapping[str, np.ndarray],
) -> str:
  """Samples one line (until EOS, at most 200 characters) from the n-gram model.

  The context is the last order-1 characters (BOS-padded); a context unseen in
  the source backs off to its longest seen suffix.

  Args:
    rng: Source of randomness.
    ngrams: Counts of the source text (for its symbol table and order).
    cdfs: Output of `_witten_bell_cdfs`.

  Returns:
    The sampled characters, possibly empty.
  """
  history = _BOS * (ngrams.order - 1)
  chars = []
  while len(chars) < _MAX_LINE_CHARS:
    context = history
    while context not in cdfs:
      context = context[1:]
    cdf = cdfs[context]
    index = int(np.searchsorted(cdf, rng.random() * cdf[-1], side='right'))
    index = min(index, len(cdf) - 1)  # Guards against rounding in cdf[-1].
    symbol = ngrams.symbols[index]
    if symbol == _EOS:
      break
    chars.append(symbol)
    history = (history + symbol)[1:]  # Keeps the last order-1 symbols.
  return ''.join(chars)


def _shakespeare_client_examples(
    rng: np.random.Generator,
    ngrams: _NgramCounts,
    volume: Volume,
    alpha: float,
) -> collections.OrderedDict[str, list[bytes]]:
  """One Shakespeare client: n_k snippets of sampled lines.

  Per client: source-snippet weights w_k ~ Dirichlet(alpha * 1_S), used as
  v_k = S * ((1 - 0.3) w_k + 0.3 / S) in `_witten_bell_cdfs` (a client
  "speaks" like a few source lines); temperature
  tau_k = clip(exp(0.25 Z), 0.6, 1.6); mean snippet length
  mu_k = clip(80 exp(0.5 Z), 20, 400) characters. Each snippet has target
  length L = max(1, round(mu_k exp(0.5 Z - 0.125))) and joins sampled lines
  with ' ' until it reaches L characters.

  Args:
    rng: The client's source of randomness.
    ngrams: Counts of the source text.
    volume: The law of the number of snippets (`_client_volume`).
    alpha: Dirichlet concentration of the source-snippet weights.

  Returns:
    OrderedDict(snippets=list of n_k UTF-8 byte strings).
  """
  num_sources = next(iter(ngrams.counts.values())).shape[0]
  weights = _dirichlet_label_probs(rng, num_sources, alpha)
  weights = num_sources * (1 - _SOURCE_MIX) * weights + _SOURCE_MIX
  temperature = float(np.clip(np.exp(0.25 * rng.standard_normal()), 0.6, 1.6))
  mean_chars = float(
      np.clip(
          _SNIPPET_MEAN_CHARS * np.exp(0.5 * rng.standard_normal()), 20, 400
      )
  )
  n = _client_volume(rng, volume)
  cdfs = _witten_bell_cdfs(ngrams, weights, temperature)
  snippets = []
  for _ in range(n):
    scale = np.exp(0.5 * rng.standard_normal() - 0.125)
    target = max(1, int(round(mean_chars * scale)))
    lines, length = [], -1
    while length < target:
      line = _sample_line(rng, ngrams, cdfs)
      if line:
        lines.append(line)
        length += len(line) + 1
    snippets.append(' '.join(lines).encode('utf-8'))
  return collections.OrderedDict(snippets=snippets)


# ------------------------------------------------------------------------------
# Writing.


def _client_generator(
    task_name: str, seed: int
) -> Callable[[np.random.Generator, Volume, float], Mapping[str, Any]]:
  """Returns f(rng, volume, alpha) -> one client's examples."""
  if task_name == 'shakespeare':
    shared = _NgramCounts(_source_snippets(), _NGRAM_ORDER)
    make = _shakespeare_client_examples
  else:
    prototype_rng = _rng(seed, task_name, _PURPOSE_PROTOTYPES, 0)
    if task_name == 'emnist':
      shared, make = _emnist_prototypes(prototype_rng), _emnist_client_examples
    else:
      shared, make = _cifar_prototypes(prototype_rng), _cifar_client_examples
  return lambda rng, volume, alpha: make(rng, shared, volume, alpha)


def write_synthetic_sqlite(
    task_name: str,
    database_path: str,
    *,
    num_train_clients: int,
    num_test_clients: int,
    mean_examples_per_client: int,
    dirichlet_alpha: float = 0.5,
    seed: int = 0,
    volume_skew: str = DEFAULT_VOLUME_SKEW,
    progress_interval_s: float = PROGRESS_INTERVAL_S,
    progress_stream=None,
) -> None:
  """Writes a synthetic federated dataset for `task_name` at `database_path`.

  The file has TFF's schema (tables `examples` and `client_metadata`) and the
  split names TFF's `load_data` for the task queries (`SPLIT_NAMES`). Client
  ids are `train_%05d` and `test_%05d`. The file is written to a temporary
  file in the same directory and moved into place with `os.replace`, so
  readers never see a partial file.

  Args:
    task_name: One of `SQLITE_FILENAMES`.
    database_path: Destination path (the parent directory is created).
    num_train_clients: Number of clients in the train split, >= 1.
    num_test_clients: Number of clients in the test split, >= 1.
    mean_examples_per_client: Mean examples (snippets for Shakespeare) per
      client, >= 1.
    dirichlet_alpha: Concentration of the per-client Dirichlet label skew
      (source-snippet skew for Shakespeare), > 0; smaller is more skewed.
    seed: Non-negative integer; equal arguments give identical examples.
    volume_skew: The law of the clients' volumes, a name in `VOLUME_SKEWS`; the
      default's data is the generator's from before the setting.
    progress_interval_s: Large datasets take minutes: a progress line (clients done,
      seconds) goes to `progress_stream` (default stdout) at most this often, the first
      after this long, so small ones print nothing.
    progress_stream: Where the progress lines go.

  Raises:
    ValueError: If an argument is invalid.
  """
  start = last_progress = time.monotonic()
  total_clients = None

  def report_progress(done: int, what: str = 'clients generated') -> None:
    nonlocal last_progress
    now = time.monotonic()
    if now - last_progress >= progress_interval_s:
      last_progress = now
      print(f'synthetic {task_name} data: {done}/{total_clients} {what} ({now - start:.0f} s)',
            file=progress_stream or sys.stdout, flush=True)

  settings = _validated_settings(
      task_name,
      num_train_clients,
      num_test_clients,
      mean_examples_per_client,
      dirichlet_alpha,
      seed,
      volume_skew,
  )
  volume = Volume.of(settings['mean_examples_per_client'], settings['volume_skew'])
  make_client = _client_generator(task_name, settings['seed'])
  examples_by_id = {}
  split_by_id = {}
  counts = (settings['num_train_clients'], settings['num_test_clients'])
  total_clients = sum(counts)
  for split, (prefix, split_name, count) in enumerate(
      zip(('train', 'test'), SPLIT_NAMES[task_name], counts)
  ):
    for index in range(count):
      client_id = f'{prefix}_{index:05d}'
      rng = _rng(settings['seed'], task_name, _PURPOSE_CLIENTS[split], index)
      examples_by_id[client_id] = make_client(rng, volume, settings['dirichlet_alpha'])
      split_by_id[client_id] = split_name
      report_progress(len(examples_by_id))

  # Written here rather than by TFF's `save_to_sql_client_data`, which iterates a
  # tf.data dataset per client: a SIGTERM landing in that iteration was once lost, and the
  # run wrote every client, trained and exited 0. This loop is plain Python, NumPy and
  # SQLite, where a stop raises; the file appears only when whole (`cache.new_tff_sqlite`).
  database_path = os.fspath(database_path)
  with cache.new_tff_sqlite(
      database_path, prefix=f'.{os.path.basename(database_path)}.'
  ) as con:
    for written, (client_id, examples) in enumerate(examples_by_id.items()):
      report_progress(written, 'clients written')
      split_name = split_by_id[client_id]
      protos = _serialized_examples(examples)
      con.executemany(
          'INSERT INTO examples VALUES (?, ?, ?)',
          ((split_name, client_id, proto) for proto in protos),
      )
      con.execute(
          'INSERT INTO client_metadata VALUES (?, ?, ?)',
          (client_id, split_name, len(protos)),
      )


def _serialized_examples(examples: Mapping[str, Any]) -> list[bytes]:
  """One `tf.train.Example` per example (the i-th entry of every field), as TFF's SQLite
  loaders parse them: floats as a float list, integers as an int64 list, byte strings as
  bytes, each example's array flattened."""
  columns = {}
  for key, values in examples.items():
    if isinstance(values, np.ndarray) and values.dtype.kind == 'f':
      columns[key] = [tf.train.Feature(float_list=tf.train.FloatList(value=v.ravel()))
                      for v in values]
    elif isinstance(values, np.ndarray) and values.dtype.kind in 'iub':
      columns[key] = [tf.train.Feature(int64_list=tf.train.Int64List(value=v.ravel()))
                      for v in values]
    else:  # Byte strings, kept as they are (a NumPy 'S' array would drop trailing NULs).
      columns[key] = [tf.train.Feature(bytes_list=tf.train.BytesList(value=[bytes(v)]))
                      for v in values]
  return [
      tf.train.Example(features=tf.train.Features(feature=dict(zip(columns, row))))
      .SerializeToString()
      for row in zip(*columns.values())
  ]


def ensure_synthetic_cache_dir(
    task_name: str,
    cache_dir: str,
    *,
    num_train_clients: Optional[int] = None,
    num_test_clients: Optional[int] = None,
    mean_examples_per_client: Optional[int] = None,
    dirichlet_alpha: float = 0.5,
    seed: int = 0,
    volume_skew: str = DEFAULT_VOLUME_SKEW,
) -> str:
  """Returns a directory with `SQLITE_FILENAMES[task_name]` for these settings.

  The directory is `<cache_dir>/synthetic/<task_name>-<hash>/`, where <hash> is
  the first 12 hex digits of the SHA-256 of the settings (and the generator
  version), so different settings never collide. The database is generated on
  first use; later calls with the same settings find it and do no work. The
  directory also gets a `settings.json` describing the data. Pass the returned
  directory as `cache_dir=` to TFF's `load_data`.

  Args:
    task_name: One of `SQLITE_FILENAMES`.
    cache_dir: Root cache directory.
    num_train_clients: Train clients; `None` uses `DEFAULT_SETTINGS`.
    num_test_clients: Test clients; `None` uses `DEFAULT_SETTINGS`.
    mean_examples_per_client: Mean examples per client; `None` uses
      `DEFAULT_SETTINGS`.
    dirichlet_alpha: See `write_synthetic_sqlite`.
    seed: See `write_synthetic_sqlite`.
    volume_skew: See `write_synthetic_sqlite`.

  Returns:
    The directory path.

  Raises:
    ValueError: If an argument is invalid.
  """
  _check_task_name(task_name)
  requested = dict(
      num_train_clients=num_train_clients,
      num_test_clients=num_test_clients,
      mean_examples_per_client=mean_examples_per_client,
  )
  counts = {
      name: DEFAULT_SETTINGS[task_name][name] if value is None else value
      for name, value in requested.items()
  }
  settings = _validated_settings(
      task_name, dirichlet_alpha=dirichlet_alpha, seed=seed, volume_skew=volume_skew,
      **counts
  )
  description = dict(
      task_name=task_name, generator_version=_GENERATOR_VERSION, **settings
  )
  if description['volume_skew'] == DEFAULT_VOLUME_SKEW:
    # The data of the setting's default is the data from before the setting: so is its
    # folder, which data made then keeps.
    del description['volume_skew']
  directory = os.path.join(
      os.fspath(cache_dir), 'synthetic', f'{task_name}-{cache.settings_digest(description)}'
  )
  database_path = os.path.join(directory, SQLITE_FILENAMES[task_name])
  if not os.path.exists(database_path):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, 'settings.json'), 'w') as f:
      json.dump(description, f, indent=2, sort_keys=True)
    write_synthetic_sqlite(task_name, database_path, **settings)
  return directory
