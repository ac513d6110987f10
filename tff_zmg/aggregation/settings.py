"""How the server aggregates client updates: the aggregator's kind and settings, checked.

`AggregatorSettings` is an `Hparams` dataclass, the one place of each setting's default,
range and help (the training program can make a flag of each field, as it does of an
algorithm's), and its only validation door:

    settings = AggregatorSettings(kind='dp_fixed', noise_multiplier=1.0, clip=0.5,
                                  clients_per_round=10)
    AggregatorSettings(kind='dp_fixed', noise_multiplier=-1.0)
    # ValueError: noise_multiplier must be >= 0, got -1.0

Which fields each kind reads (the others are ignored; `READS`, `settings.used()`):

    mean         none: the algorithm's own mean (example-weighted or uniform)
    dp_fixed     noise_multiplier, clip, clients_per_round, noise_seed (target_delta: epsilon)
    dp_adaptive  noise_multiplier, clip (initial), target_unclipped_quantile,
                 clip_learning_rate, clients_per_round, noise_seed (target_delta: epsilon)
    compressed   compression_bits, compression_threshold
    robust       none: TFF's `robust_aggregator` settings
"""

import dataclasses
from typing import Optional

from tff_zmg.templates import hparams as hp

KINDS = ('mean', 'dp_fixed', 'dp_adaptive', 'compressed', 'robust')
DP_KINDS = ('dp_fixed', 'dp_adaptive')
_DP_READS = ('noise_multiplier', 'clip', 'target_delta', 'clients_per_round', 'noise_seed')
# The fields each kind reads besides `kind` (the module docstring's table).
READS = {
    'mean': (),
    'dp_fixed': _DP_READS,
    'dp_adaptive': _DP_READS + ('target_unclipped_quantile', 'clip_learning_rate'),
    'compressed': ('compression_bits', 'compression_threshold'),
    'robust': (),
}
# The largest noise multiplier: dp_accounting's RDP accountant (0.4.3) divides by zero from
# about 1e9 on, and beyond about 1e6 its epsilon is 0 to float64 precision; noise of 1e6
# clipping norms buries any update long before that.
MAX_NOISE_MULTIPLIER = 1e6
# TFF noises dp_adaptive's clipped count with stddev 0.05 m and needs z < 2 * 0.05 m
# (`tff.aggregators.DifferentiallyPrivateFactory.gaussian_adaptive`).
_ADAPTIVE_COUNT_STDDEV_PER_CLIENT = 0.05


@dataclasses.dataclass(frozen=True)
class AggregatorSettings(hp.Hparams):
  """The aggregator of client updates and its settings (see the module docstring).

  The DP defaults: `noise_multiplier = 1.0`, where TFF's documentation places meaningful
  privacy; `clip = 0.1` and the adaptive clip's target quantile 0.5 and rate 0.2 are TFF's
  `gaussian_adaptive` defaults (after Andrew et al., arXiv:1905.03871), the fixed clip
  starting where the adaptive one does; `target_delta = 1e-5`, below `1 / N` for every
  task's population. The compression defaults are TFF's `compression_aggregator`'s.
  """

  kind: str = hp.hparam(
      'mean', hp.one_of(*KINDS),
      'How the server aggregates client updates: mean (the algorithm\'s own),'
      ' dp_fixed / dp_adaptive (clipped, Gaussian-noised uniform mean, fixed or adaptive'
      ' clip), compressed (uniformly quantized uploads), robust (TFF\'s adaptive zeroing and'
      ' clipping).',
  )
  noise_multiplier: float = hp.hparam(
      1.0, hp.in_range(0.0, MAX_NOISE_MULTIPLIER),
      'DP noise multiplier z: the noise on the sum of clipped updates has stddev z * clip.',
  )
  clip: float = hp.hparam(
      0.1, hp.POSITIVE,
      'DP clipping norm C: every client update is scaled to L2 norm <= C (dp_adaptive:'
      ' its initial value).',
  )
  target_unclipped_quantile: float = hp.hparam(
      0.5, hp.in_range(0.0, 1.0),
      'dp_adaptive: the quantile of update norms the clip follows.',
  )
  clip_learning_rate: float = hp.hparam(
      0.2, hp.NON_NEGATIVE,
      'dp_adaptive: the clip\'s geometric learning rate (at most a factor exp(rate) a round).',
  )
  target_delta: float = hp.hparam(
      1e-5, hp.UNIT_INTERVAL_OPEN, 'DP delta of the (epsilon, delta) guarantee reported.'
  )
  clients_per_round: Optional[int] = hp.hparam(
      None, hp.optional(hp.integer(1)),
      'DP: the clients m sampled each round (the noised mean divides by m; the accountant'
      ' samples m).',
  )
  noise_seed: Optional[int] = hp.hparam(
      None, hp.optional(hp.integer(0)),
      'DP: seed of the noise (unset: drawn when the process is initialized); kept in the'
      ' server state, so a resumed run redraws the same noise.',
  )
  compression_bits: int = hp.hparam(
      8, hp.integer(1, 16), 'compressed: bits per coordinate of the quantized update.'
  )
  compression_threshold: int = hp.hparam(
      20000, hp.integer(0),
      'compressed: tensors of at most this many elements are sent unquantized.',
  )

  def check_together(self):
    if self.kind not in DP_KINDS:
      return
    if self.clients_per_round is None:
      raise ValueError(
          f'aggregator {self.kind} needs clients_per_round, the clients sampled each round'
          ' (the noised mean\'s denominator)'
      )
    # TFF's count noise has stddev 0.05 m and must exceed z / 2: m > z / (2 * 0.05).
    fewest_clients = self.noise_multiplier / (2 * _ADAPTIVE_COUNT_STDDEV_PER_CLIENT)
    if self.kind == 'dp_adaptive' and self.clients_per_round <= fewest_clients:
      raise ValueError(
          f'dp_adaptive with noise_multiplier={self.noise_multiplier:g} needs'
          f' clients_per_round > {fewest_clients:g} (TFF noises the clipped count with'
          f' stddev 0.05 * clients_per_round, which must exceed noise_multiplier / 2), got'
          f' {self.clients_per_round}'
      )

  def used(self) -> dict:
    """`kind` and the fields it reads (`READS`): what a run's record needs to say, since
    the others change nothing."""
    return {'kind': self.kind, **{name: getattr(self, name) for name in READS[self.kind]}}

  @property
  def is_private(self) -> bool:
    """Whether the aggregator is differentially private (clips and noises each update)."""
    return self.kind in DP_KINDS
