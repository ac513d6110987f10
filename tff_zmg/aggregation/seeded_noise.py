"""TF Privacy's Gaussian DP queries with their noise drawn from a seed kept in their state.

TF Privacy's `GaussianSumQuery` draws its noise with an unseeded `tf.random_normal_initializer`:
every run, and every resumption of a run from its checkpoint, adds noise nobody can draw again.
Here round `t`'s noise is a function of a seed that is part of the query's state, so a state
saved after round `t` holds everything round `t + 1` draws (a killed and resumed DP run adds
the noise the uninterrupted one adds):

    s_0 = split(base, 2)[stream]           base = (noise_seed, 0), or drawn once at initialize
    k_0, ..., k_{n-1}, s_{t+1} = split(s_t, n + 1)        (n: the tensors of the value)
    noise of tensor j in round t ~ N(0, stddev^2 I) = stateless_normal(shape_j, k_j)

(`split`: `tf.random.experimental.stateless_split`; `stream` keeps the value's noise and the
adaptive clip's count noise apart.) Clipping, the noise's scale and the `DpEvent` are TF
Privacy's own; only the source of the Gaussian draws changes. The seed is server state, as
the un-noised sum is server data: central DP trusts the server with both (publish models, not
checkpoints).
"""

import collections
from typing import Optional

import dp_accounting
import tensorflow as tf
import tensorflow_privacy as tfp

# The streams of one base seed: the value's noise and the adaptive clip's count noise.
VALUE_STREAM = 0
COUNT_STREAM = 1


def initial_seed(noise_seed: Optional[int], stream: int) -> tf.Tensor:
  """`s_0 = split(base, 2)[stream]`, `base = (noise_seed, 0)` or, without one, drawn now."""
  if noise_seed is None:
    base = tf.random.uniform([2], maxval=tf.int64.max, dtype=tf.int64)
  else:
    base = tf.constant([noise_seed, 0], tf.int64)
  return tf.random.experimental.stateless_split(base, 2)[stream]


def noise_keys(seed, num_tensors: int):
  """`(k_0..k_{n-1}, s_{t+1}) = split(s_t, n + 1)`: one key per tensor, and the next seed."""
  keys = tf.random.experimental.stateless_split(seed, num_tensors + 1)
  return keys[:-1], keys[-1]


def add_seeded_noise(values, stddev, seed):
  """`(values + N(0, stddev^2 I), s_{t+1})`, tensor `j`'s noise drawn from key `k_j`."""
  flat = tf.nest.flatten(values)
  keys, next_seed = noise_keys(seed, len(flat))
  noised = [
      v + tf.random.stateless_normal(
          tf.shape(v), keys[j], stddev=tf.cast(stddev, v.dtype), dtype=v.dtype
      )
      for j, v in enumerate(flat)
  ]
  return tf.nest.pack_sequence_as(values, noised), next_seed


class SeededGaussianSumQuery(tfp.GaussianSumQuery):
  """`tfp.GaussianSumQuery` (clip each record to L2 norm `l2_norm_clip`, sum, add
  `N(0, stddev^2 I)`) whose noise comes from `add_seeded_noise` and a seed in its state."""

  _GlobalState = collections.namedtuple('_GlobalState', ['l2_norm_clip', 'stddev', 'seed'])

  def __init__(self, l2_norm_clip, stddev, *, noise_seed: Optional[int], stream: int):
    super().__init__(l2_norm_clip, stddev)
    self._noise_seed = noise_seed
    self._stream = stream

  def make_global_state(self, l2_norm_clip, stddev, seed=None):
    # No seed: a placeholder, for a caller that sets the seed afterwards (the adaptive query).
    seed = tf.zeros([2], tf.int64) if seed is None else seed
    return self._GlobalState(
        tf.cast(l2_norm_clip, tf.float32), tf.cast(stddev, tf.float32), seed
    )

  def initial_global_state(self):
    return self.make_global_state(
        self._l2_norm_clip, self._stddev, initial_seed(self._noise_seed, self._stream)
    )

  def get_noised_result(self, sample_state, global_state):
    result, next_seed = add_seeded_noise(sample_state, global_state.stddev, global_state.seed)
    # TF Privacy's event: the noise's stddev over the records' norm bound.
    event = dp_accounting.GaussianDpEvent(global_state.stddev / global_state.l2_norm_clip)
    return result, global_state._replace(seed=next_seed), event


class SeededQuantileAdaptiveClipSumQuery(tfp.QuantileAdaptiveClipSumQuery):
  """`tfp.QuantileAdaptiveClipSumQuery` (Andrew et al., arXiv:1905.03871: the clip follows a
  target quantile of the update norms, estimated from a noised count) with both of its
  Gaussian draws, the value's and the count's, from seeds in its state."""

  def __init__(
      self,
      initial_l2_norm_clip,
      noise_multiplier,
      target_unclipped_quantile,
      learning_rate,
      clipped_count_stddev,
      expected_num_records,
      *,
      noise_seed: Optional[int],
  ):
    super().__init__(
        initial_l2_norm_clip, noise_multiplier, target_unclipped_quantile, learning_rate,
        clipped_count_stddev, expected_num_records, geometric_update=True,
    )
    # TF Privacy 0.9 builds its two Gaussian queries inside, unseeded; the same queries,
    # seeded (tests/test_aggregation.py checks that resumed rounds redraw the same noise).
    self._sum_query = SeededGaussianSumQuery(
        initial_l2_norm_clip, noise_multiplier * initial_l2_norm_clip,
        noise_seed=noise_seed, stream=VALUE_STREAM,
    )
    # The count's records are the indicators below - 0.5, hence TF Privacy's clip of 0.5.
    estimator = self._quantile_estimator_query
    estimator._below_estimate_query = tfp.NormalizedQuery(  # pylint: disable=protected-access
        SeededGaussianSumQuery(
            0.5, clipped_count_stddev, noise_seed=noise_seed, stream=COUNT_STREAM
        ),
        denominator=expected_num_records,
    )

  def get_noised_result(self, sample_state, global_state):
    result, new_state, event = super().get_noised_result(sample_state, global_state)
    # TF Privacy rebuilds the sum query's state from the adapted clip, without our seed:
    # put back the one this round's draw moved on to.
    _, next_seed = noise_keys(
        global_state.sum_state.seed, len(tf.nest.flatten(sample_state.sum_state))
    )
    sum_state = new_state.sum_state._replace(seed=next_seed)
    return result, new_state._replace(sum_state=sum_state), event
