"""The model-update aggregators, one function per kind, from TFF's own factories.

Each returns a `tff.aggregators` factory that a builder takes as `model_aggregator`, the way
`tff.learning.algorithms.build_weighted_fed_avg` does; `model_aggregator(settings, weighting)`
picks by `AggregatorSettings.kind`. With `u_k` client `k`'s update, `m` the clients sampled
each round and `S_t` the round's clients:

    mean         sum_k w_k u_k / sum_k w_k       (the algorithm's own; `model_aggregator`
                                                 returns None and the builder keeps it)
    dp_fixed     (sum_{k in S_t} clip_C(u_k) + N(0, (z C)^2 I)) / m,
                 clip_C(u) = u min(1, C / ||u||_2)                  (McMahan et al. 2018)
    dp_adaptive  the same with C_t following the target quantile of the norms ||u_k||,
                 estimated from a noised count (Andrew et al. 2021); TFF splits z between
                 the two so that the pair has noise multiplier z
    compressed   sum_k w_k Q(u_k) / sum_k w_k, Q: each tensor of more than `threshold`
                 elements uniformly quantized to `b` bits between its min and max, with
                 stochastic rounding (Suresh et al. 2017), packed 28 bits to an int32 word:
                 28 / b times fewer bytes per float32 coordinate (`communication`)
    robust       TFF's `robust_aggregator`: updates above an adaptive norm zeroed, the rest
                 clipped to an adaptive norm, then the mean

DP averages uniformly: each client's clipped update must count once for the noise to hide
it, which example weights would undo; an algorithm that weights by examples is averaged
uniformly under DP and `model_aggregator` says so in a warning. The DP factories add no
zeroing (`tff.learning.dp_aggregator` does): its norm adapts on un-noised counts of the
clients' updates, a release no accountant covers. Their noise comes from a seed kept in the
aggregator's state (`seeded_noise`), so a resumed run redraws the same noise.
"""

from typing import Optional
import warnings

import tensorflow_federated as tff
import tensorflow_privacy as tfp
# TFF's split of dp_adaptive's noise between the value and the clipped count (not exported).
from tensorflow_federated.python.aggregators import differential_privacy

from tff_zmg.aggregation import seeded_noise
from tff_zmg.aggregation import settings as settings_lib

EXAMPLES = tff.learning.ClientWeighting.NUM_EXAMPLES
UNIFORM = tff.learning.ClientWeighting.UNIFORM


def dp_fixed(
    noise_multiplier: float, clip: float, clients_per_round: int, noise_seed: Optional[int]
) -> tff.aggregators.UnweightedAggregationFactory:
  """`(sum_k clip_C(u_k) + N(0, (z C)^2 I)) / m`: TFF's `gaussian_fixed`, seeded noise."""
  return tff.aggregators.DifferentiallyPrivateFactory(
      tfp.NormalizedQuery(
          seeded_noise.SeededGaussianSumQuery(
              clip, noise_multiplier * clip, noise_seed=noise_seed,
              stream=seeded_noise.VALUE_STREAM,
          ),
          denominator=float(clients_per_round),
      )
  )


def dp_adaptive(
    noise_multiplier: float,
    clients_per_round: int,
    *,
    initial_clip: float,
    target_unclipped_quantile: float,
    clip_learning_rate: float,
    noise_seed: Optional[int],
) -> tff.aggregators.UnweightedAggregationFactory:
  """`dp_fixed` with the clip adapted each round: TFF's `gaussian_adaptive`, seeded noise.

  TFF gives the count `stddev_c = 0.05 m` and the value the multiplier
  `z_v = (z^-2 - (2 stddev_c)^-2)^-1/2`, so that the pair is worth one Gaussian
  mechanism with multiplier `z` (Andrew et al., arXiv:1905.03871).
  """
  value_noise_multiplier, clipped_count_stddev = (
      differential_privacy.adaptive_clip_noise_params(noise_multiplier, float(clients_per_round))
  )
  return tff.aggregators.DifferentiallyPrivateFactory(
      tfp.NormalizedQuery(
          seeded_noise.SeededQuantileAdaptiveClipSumQuery(
              initial_l2_norm_clip=initial_clip,
              noise_multiplier=value_noise_multiplier,
              target_unclipped_quantile=target_unclipped_quantile,
              learning_rate=clip_learning_rate,
              clipped_count_stddev=clipped_count_stddev,
              expected_num_records=float(clients_per_round),
              noise_seed=noise_seed,
          ),
          denominator=float(clients_per_round),
      )
  )


def compressed(
    bits: int, threshold: int, *, weighted: bool
) -> tff.aggregators.AggregationFactory:
  """The mean of uniformly quantized updates: TFF's `compression_aggregator` without its
  default zeroing and clipping (`robust` is those), so that only the encoding changes."""
  quantized_sum = tff.aggregators.EncodedSumFactory.quantize_above_threshold(
      quantization_bits=bits, threshold=threshold
  )
  if weighted:
    return tff.aggregators.MeanFactory(quantized_sum)
  return tff.aggregators.UnweightedMeanFactory(quantized_sum)


def robust(*, weighted: bool) -> tff.aggregators.AggregationFactory:
  """TFF's `robust_aggregator`: adaptive zeroing, adaptive L2 clipping, then the mean."""
  return tff.learning.robust_aggregator(weighted=weighted)


def client_weighting(
    settings: settings_lib.AggregatorSettings,
    algorithm_weighting: tff.learning.ClientWeighting,
) -> tff.learning.ClientWeighting:
  """How updates are averaged under `settings`: uniformly under DP, else the algorithm's."""
  return UNIFORM if settings.is_private else algorithm_weighting


def model_aggregator(
    settings: settings_lib.AggregatorSettings,
    algorithm_weighting: tff.learning.ClientWeighting,
) -> Optional[tff.aggregators.AggregationFactory]:
  """The factory of `settings.kind` for an algorithm weighting as `algorithm_weighting`.

  Returns:
    None for 'mean' (the builder keeps the algorithm's own mean); otherwise a factory to
    pass as a builder's `model_aggregator` (weighted by examples when the algorithm is,
    except under DP, which is uniform: a warning says so when that changes the weighting).
  """
  weighted = client_weighting(settings, algorithm_weighting) == EXAMPLES
  if settings.is_private and algorithm_weighting == EXAMPLES:
    warnings.warn(
        f'aggregator {settings.kind} averages client updates uniformly (each clipped update'
        ' must count once for the noise to hide it); the algorithm\'s example weighting is'
        ' not used',
        stacklevel=2,
    )
  if settings.kind == 'mean':
    return None
  if settings.kind == 'dp_fixed':
    return dp_fixed(
        settings.noise_multiplier, settings.clip, settings.clients_per_round,
        settings.noise_seed,
    )
  if settings.kind == 'dp_adaptive':
    return dp_adaptive(
        settings.noise_multiplier, settings.clients_per_round,
        initial_clip=settings.clip,
        target_unclipped_quantile=settings.target_unclipped_quantile,
        clip_learning_rate=settings.clip_learning_rate,
        noise_seed=settings.noise_seed,
    )
  if settings.kind == 'compressed':
    return compressed(
        settings.compression_bits, settings.compression_threshold, weighted=weighted
    )
  return robust(weighted=weighted)
