"""The epsilon of a DP run after `n` rounds, from `dp_accounting`'s RDP accountant.

A round of `dp_fixed` or `dp_adaptive` is a Gaussian mechanism on the sum of the sampled
clients' clipped updates (noise `N(0, (z C)^2 I)`, each update of norm <= C; dp_adaptive's
`z` is the effective multiplier of its value and count noise together, as TFF calibrates it)
applied to a sample of the N training clients. The rounds compose:

    RDP_n(alpha) = n * RDP_round(alpha) ;  epsilon_n = min_alpha RDP_to_DP(RDP_n, delta)

Which RDP_round is the sampling's:

* 'fixed_size' (default; what the runs do: `m` of the `N` clients drawn uniformly without
  replacement each round, `tff.simulation.build_uniform_sampling_fn(replace=False)`):
  `SampledWithoutReplacementDpEvent(N, m, GaussianDpEvent(z / 2))` under the replace-one
  relation (neighbouring federations differ in one client's data; `N` is public), Wang,
  Balle and Kasiviswanathan (AISTATS 2019), Theorem 27. The bound is per unit of L2
  sensitivity, and replacing a client moves the clipped sum by up to `2C` (`u` to `u'`,
  `||u - u'|| <= 2C`), so the multiplier it takes is `z / 2`; `dp_accounting` 0.4.3 would
  take `GaussianDpEvent(z)` (its `sigma / C`) as is, an RDP four times too small
  (google/differential-privacy issue #378).
* 'poisson': each client takes part independently with probability `q = m / N`:
  `PoissonSampledDpEvent(q, GaussianDpEvent(z))` under add-or-remove-one, the bound TFF's
  DP tutorials quote. It is smaller, but describes runs whose number of clients varies.

Both assume the round's sample is secret: amplification by sampling is only as good as the
sampling's randomness is hidden (the runs' sampling seed is not part of what they publish).
"""

import functools
import math

import dp_accounting
import numpy as np

from tff_zmg import validation

SAMPLINGS = ('fixed_size', 'poisson')
_RELATIONS = {
    'fixed_size': dp_accounting.NeighboringRelation.REPLACE_ONE,
    'poisson': dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
}


def round_event(
    noise_multiplier: float, clients_per_round: int, num_clients: int, sampling: str
) -> dp_accounting.DpEvent:
  """One round's `DpEvent` under `sampling` (see the module docstring)."""
  if sampling == 'fixed_size':
    # Replace-one sensitivity of the clipped sum is 2C: the multiplier per unit is z / 2.
    return dp_accounting.SampledWithoutReplacementDpEvent(
        num_clients, clients_per_round, dp_accounting.GaussianDpEvent(noise_multiplier / 2)
    )
  return dp_accounting.PoissonSampledDpEvent(
      clients_per_round / num_clients, dp_accounting.GaussianDpEvent(noise_multiplier)
  )


def epsilon(
    *,
    noise_multiplier: float,
    clients_per_round: int,
    num_clients: int,
    rounds: int,
    target_delta: float,
    sampling: str = 'fixed_size',
) -> float:
  """The epsilon of `(epsilon, target_delta)`-DP after `rounds` rounds (RDP accountant).

  Args:
    noise_multiplier: `z`, the noise's stddev over the clipping norm (0: no noise, epsilon
      is infinite).
    clients_per_round: `m`, the clients sampled each round.
    num_clients: `N`, the training clients sampled from.
    rounds: `n`, the rounds run (0: epsilon 0).
    target_delta: `delta`, in (0, 1).
    sampling: 'fixed_size' (the runs') or 'poisson'.

  Raises:
    ValueError: (one line) for a value out of its range, or `m > N`.
  """
  noise_multiplier = validation.check_non_negative('noise_multiplier', noise_multiplier)
  clients_per_round = validation.check_integer('clients_per_round', clients_per_round, 1)
  num_clients = validation.check_integer('num_clients', num_clients, 1)
  rounds = validation.check_integer('rounds', rounds, 0)
  target_delta = validation.check_in_range(
      'target_delta', target_delta, 0.0, 1.0, low_inclusive=False, high_inclusive=False
  )
  if sampling not in SAMPLINGS:
    raise ValueError(f'sampling must be one of {list(SAMPLINGS)}, got {sampling!r}')
  if clients_per_round > num_clients:
    raise ValueError(
        f'clients_per_round ({clients_per_round}) must be at most num_clients'
        f' ({num_clients}), the clients sampled from'
    )
  if rounds == 0:
    return 0.0
  if noise_multiplier == 0.0:
    return math.inf
  orders, round_rdp = _round_rdp(noise_multiplier, clients_per_round, num_clients, sampling)
  # RDP adds up over rounds; the conversion to (epsilon, delta) is dp_accounting's.
  return float(dp_accounting.rdp.compute_epsilon(orders, rounds * round_rdp, target_delta)[0])


@functools.lru_cache(maxsize=32)
def _round_rdp(
    noise_multiplier: float, clients_per_round: int, num_clients: int, sampling: str
) -> tuple[np.ndarray, np.ndarray]:
  """`(orders, RDP_round(orders))`: one round's RDP, computed once (~0.4 s for fixed-size
  sampling) for a run that asks for its epsilon every round."""
  accountant = dp_accounting.rdp.RdpAccountant(neighboring_relation=_RELATIONS[sampling])
  accountant.compose(round_event(noise_multiplier, clients_per_round, num_clients, sampling))
  return accountant.orders, accountant.rdp
