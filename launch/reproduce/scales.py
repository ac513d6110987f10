"""The scales `launch.reproduce` can run a paper's protocol at.

A scale shrinks a protocol keeping its shape (grid, then every algorithm on every setting
over seeds, then the paper's metrics): `full` is the paper's, `small` a machine like ours,
`ci` a test's; a number in (0, 1] scales only the rounds.

Tuning is where shrinking can lie: a grid scored after a few rounds picks by noise (issue
27: after 5 rounds every EMNIST cell scored below 0.12, and FedAvg's pick diverged in the
comparison). So `small` keeps the paper's grid and its rounds and searches it by
successive halving (`launch.sweeps.halving`) instead; the scales that cut the grid or its
rounds (`ci`, a fraction) say in their report that their rates were not tuned honestly.
"""

import dataclasses
import math
from typing import Mapping, Optional


@dataclasses.dataclass(frozen=True)
class Scale:
  """How much of a protocol to run.

  Attributes:
    name: The --scale value.
    description: What it shrinks, for --help and the report.
    rounds_factor: Comparison and (exhaustive) grid rounds are multiplied by this
      (rounded up) ...
    min_rounds: ... but kept at least this (comparison, grid).
    halving: Search the paper's grid by successive halving up to the paper's grid rounds
      (`launch.sweeps.halving.default_rung_rounds`) instead of training every cell to the
      scaled grid rounds.
    grid_rates: (client, server) learning rates that replace the grid's axes (a test's
      few safe values); None: the paper's.
    max_seeds: The first this many seeds; None: all.
    max_clients_per_round: A cap on the cohort; None: the paper's.
    max_num_clients: A cap on the clients of a Dirichlet split; None: the paper's.
    flags: `launch.train` flags this scale sets unless the command line gives them.
  """

  name: str
  description: str
  rounds_factor: float = 1.0
  min_rounds: tuple[int, int] = (1, 1)
  halving: bool = False
  grid_rates: Optional[tuple[tuple[float, ...], tuple[float, ...]]] = None
  max_seeds: Optional[int] = None
  max_clients_per_round: Optional[int] = None
  max_num_clients: Optional[int] = None
  flags: Mapping[str, object] = dataclasses.field(default_factory=dict)

  def rounds(self, paper_rounds: int, grid: bool = False) -> int:
    """max(min_rounds, ceil(rounds_factor * paper_rounds)), never above the paper's."""
    scaled = math.ceil(self.rounds_factor * paper_rounds - 1e-9)
    return min(paper_rounds, max(self.min_rounds[1 if grid else 0], scaled))

  def seeds(self, seeds):
    return tuple(seeds)[: self.max_seeds] if self.max_seeds else tuple(seeds)

  def cap(self, value: int, limit: Optional[int]) -> int:
    return value if limit is None else min(value, limit)


SCALES = {
    'full': Scale(name='full', description="the paper's protocol: every round, grid cell,"
                  ' seed and client'),
    'small': Scale(
        name='small',
        description='a tenth of the comparison rounds (at least 10), the paper\'s whole grid'
        ' searched by successive halving up to its rounds (every cell a fifth of them, the'
        ' best third two fifths, the best ninth all), 3 seeds, evaluation on a fixed'
        ' subsample of 5,000 test examples',
        rounds_factor=0.1, min_rounds=(10, 1), halving=True, max_seeds=3,
        flags=dict(eval_examples=5000),
    ),
    'ci': Scale(
        name='ci',
        description='a test\'s: 4 comparison and 2 grid rounds, a 2 x 1 grid (client'
        ' learning rates 0.01 and 0.1, server 0.1; not an honest tuning), 2 seeds, 2 clients'
        ' per round of 4 tiny synthetic clients (10 examples, batch 5), 2 test clients',
        rounds_factor=0.0, min_rounds=(4, 2), grid_rates=((0.01, 0.1), (0.1,)), max_seeds=2,
        max_clients_per_round=2, max_num_clients=4,
        flags=dict(
            client_batch_size=5, synthetic_train_clients=4,
            synthetic_test_clients=2, synthetic_examples_per_client=10,
            rounds_per_checkpoint=1000,
        ),
    ),
}
SCALE_NAMES = tuple(SCALES)


def get_scale(value: str) -> Scale:
  """A named scale, or a number in (0, 1] that scales the rounds only."""
  if value in SCALES:
    return SCALES[value]
  try:
    factor = float(value)
  except (TypeError, ValueError):
    factor = math.nan
  if not 0 < factor <= 1:
    raise ValueError(
        f'--scale={value!r}: choose one of {list(SCALE_NAMES)} or a number in (0, 1]'
        ' (the fraction of the rounds to run)'
    )
  return Scale(name=f'{factor:g}', description=f'{factor:g} of the rounds, all else full',
               rounds_factor=factor)

