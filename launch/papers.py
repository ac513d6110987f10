"""What `launch.reproduce` runs for each paper's tables, and the scales it can run them at.

A paper's protocol is data: its algorithms, seeds, rounds, the `launch.train` flags of
its training setup (for GC-Fed, FedRKMGC and FedGPS: `--protocol`, launch/protocols.py),
the learning-rate grid where the paper tuned (FedZMG only), and per table the settings
(data and participation) of its columns. A setting's runs are shared by every table that
uses it (FedZMG's Table 5 and Table 6 both read the EMNIST runs). The published numbers
are in `tff_zmg.analysis.published`.

A scale shrinks a protocol keeping its shape (grid, then every algorithm on every setting
over seeds, then the paper's metrics): `full` is the paper's, `small` a machine like ours,
`ci` a test's; a number in (0, 1] scales only the rounds.
"""

import dataclasses
import math
from typing import Mapping, Optional

from launch import grid_search
from tff_zmg.analysis import published

# Table layouts (how `launch.reproduce` fills a table):
# 'summary': FedZMG Tables 3-5, a row per algorithm: rounds to each threshold and the
#   late-stage accuracy after the second.
# 'ttest': FedZMG Tables 6-8, a row per pair (fedzmg vs each baseline): t and p.
# 'accuracy': a row per algorithm, a column per setting: the paper's accuracy of a run.
LAYOUTS = ('summary', 'ttest', 'accuracy')


@dataclasses.dataclass(frozen=True)
class Setting:
  """The data and participation of one table column (or one FedZMG task).

  Attributes:
    key: The column key in the published table; also the directory of its runs.
    task: The task (`tasks.TASK_NAMES`).
    flags: Further `launch.train` flags of this setting (split, participation).
    synthetic_task: With --data_source=synthetic, the TFF-format task that stands in for
      a tfds task (tfds data has no synthetic version); None: `task` itself.
  """

  key: str
  task: str
  flags: Mapping[str, object] = dataclasses.field(default_factory=dict)
  synthetic_task: Optional[str] = None

  def task_for(self, data_source: str) -> str:
    return self.synthetic_task if data_source == 'synthetic' and self.synthetic_task else self.task


@dataclasses.dataclass(frozen=True)
class TableSpec:
  """How one published table is reproduced.

  Attributes:
    number: The table's number in the paper (`published.TABLES[(paper, number)]`).
    layout: One of `LAYOUTS`.
    settings: The settings whose runs fill it, in column order.
  """

  number: int
  layout: str
  settings: tuple[Setting, ...]


@dataclasses.dataclass(frozen=True)
class Grid:
  """A client x server learning-rate grid search run before the comparison.

  Attributes:
    client_learning_rates, server_learning_rates: The axes.
    total_rounds: Rounds per cell.
    clients_per_round: The cohort while tuning.
    score_rounds: A cell scores the mean accuracy of its last this many rounds.
  """

  client_learning_rates: tuple[float, ...]
  server_learning_rates: tuple[float, ...]
  total_rounds: int
  clients_per_round: int
  score_rounds: int


@dataclasses.dataclass(frozen=True)
class Paper:
  """One paper's protocol.

  Attributes:
    name: The --paper value.
    title: For the report.
    algos: The algorithms compared (registry names), in the table's row order.
    seeds: Training seeds of each algorithm and setting.
    total_rounds: Rounds of a comparison run.
    flags: `launch.train` flags of every run (clients per round, protocol, model, ...).
    grid: The learning-rate search before the comparison; None where the paper fixed the
      learning rates.
    accuracy: How the 'accuracy' layout scores a run: ('last', n) the mean of the last n
      rounds, or ('best', 0) the best accuracy.
    tables: Table number -> its spec.
    notes: Choices we made where the paper leaves room, for the report.
  """

  name: str
  title: str
  algos: tuple[str, ...]
  seeds: tuple[int, ...]
  total_rounds: int
  flags: Mapping[str, object]
  tables: Mapping[int, TableSpec]
  grid: Optional[Grid] = None
  accuracy: tuple[str, int] = ('last', 10)
  notes: tuple[str, ...] = ()


_ZMG_TASKS = {t: Setting(key=t, task=t) for t in ('emnist', 'cifar100', 'shakespeare')}


def _dirichlet(key, task, num_clients, alpha, **flags):
  return Setting(
      key=key, task=task, synthetic_task='cifar100',
      flags=dict(partition='dirichlet', num_clients=num_clients, dirichlet_alpha=alpha, **flags),
  )


PAPERS = {
    'fedzmg': Paper(
        name='fedzmg',
        title='FedZMG (ALGORITHMS.md section 6; paper sections 5.2-6.2)',
        algos=('fedzmg', 'fedavg', 'fedadam'),
        seeds=(0, 1, 2, 3, 4),
        total_rounds=1000,
        flags=dict(clients_per_round=10),
        grid=Grid(
            client_learning_rates=grid_search.HALF_DECADES,
            server_learning_rates=grid_search.HALF_DECADES,
            total_rounds=grid_search.DEFAULT_TOTAL_ROUNDS, clients_per_round=10,
            score_rounds=10,
        ),
        tables={
            3: TableSpec(3, 'summary', (_ZMG_TASKS['cifar100'],)),
            4: TableSpec(4, 'summary', (_ZMG_TASKS['shakespeare'],)),
            5: TableSpec(5, 'summary', (_ZMG_TASKS['emnist'],)),
            6: TableSpec(6, 'ttest', (_ZMG_TASKS['emnist'],)),
            7: TableSpec(7, 'ttest', (_ZMG_TASKS['shakespeare'],)),
            8: TableSpec(8, 'ttest', (_ZMG_TASKS['cifar100'],)),
        },
        notes=(
            'Comparison: 1000 rounds (section 5.2.2), 5 seeds (section 5.3). The comparison'
            ' cohort is not legible in our copy of section 5.2.2; we keep the tuning'
            ' cohort, 10.',
            'Tuning: "the epoch size at 4" (section 5.2.1) is ambiguous and ALGORITHMS.md'
            ' leaves it; every run trains 1 local epoch (launch.train\'s default).',
            'Each algorithm is tuned on each task (section 5.2.1), so the grid runs 81'
            ' cells per algorithm and task.',
        ),
    ),
    'gcfed': Paper(
        name='gcfed',
        title='GC-Fed (arXiv 2503.13180), section 4',
        algos=('fedavg', 'local_gc', 'global_gc', 'gcfed'),
        seeds=(0, 1, 2),
        total_rounds=800,
        flags=dict(protocol='gcfed', clients_per_round=5, model='cnn'),
        tables={
            5: TableSpec(5, 'accuracy', (
                _dirichlet('cifar10_n100_a0.05', 'cifar10', 100, 0.05),
                _dirichlet('cifar10_n100_a0.1', 'cifar10', 100, 0.1),
                _dirichlet('cifar10_n200_a0.05', 'cifar10', 200, 0.05),
                _dirichlet('cifar10_n200_a0.1', 'cifar10', 200, 0.1),
                _dirichlet('cifar100_n100_a0.05', 'cifar100_tfds', 100, 0.05),
                _dirichlet('cifar100_n100_a0.1', 'cifar100_tfds', 100, 0.1),
                _dirichlet('cifar100_n200_a0.05', 'cifar100_tfds', 200, 0.05),
                _dirichlet('cifar100_n200_a0.1', 'cifar100_tfds', 200, 0.1),
            )),
            4: TableSpec(4, 'accuracy', (
                _dirichlet('cifar10_k5_a1', 'cifar10', 100, 1.0),
                _dirichlet('cifar10_k10_a1', 'cifar10', 100, 1.0, clients_per_round=10),
                _dirichlet('cifar10_k5_a1000', 'cifar10', 100, 1000.0),
                _dirichlet('cifar10_k10_a1000', 'cifar10', 100, 1000.0, clients_per_round=10),
            )),
        },
        accuracy=('last', 10),
        notes=(
            'Learning rates are the paper\'s (SGD 0.01, momentum 0.9, weight decay 1e-5; no'
            ' tuning). FedAvg takes no momentum in our registry, so it trains with plain'
            ' SGD at 0.01.',
            'Accuracy: the mean of the last 10 rounds (the paper smooths its Table 6 over'
            ' the last 10 rounds; Tables 4-5 do not say). 3 seeds (Table 6\'s caption).',
        ),
    ),
    'fedrkmgc': Paper(
        name='fedrkmgc',
        title='FedRKMGC, section 4',
        algos=('fedavg', 'fedrkmgc'),
        seeds=(0,),
        total_rounds=1000,
        flags=dict(protocol='fedrkmgc', model='resnet18_gn'),
        tables={
            1: TableSpec(1, 'accuracy', (
                _dirichlet('cifar10_a0.5', 'cifar10', 100, 0.5),
                _dirichlet('cifar10_a0.3', 'cifar10', 100, 0.3),
                _dirichlet('cifar100_a0.5', 'cifar100_tfds', 100, 0.5),
                _dirichlet('cifar100_a0.3', 'cifar100_tfds', 100, 0.3),
            )),
        },
        accuracy=('last', 20),
        notes=(
            'Table 1 reports one run per cell; we run seed 0. Accuracy: the mean of the'
            ' last 20 rounds (Evaluation Metrics, section 4).',
        ),
    ),
    'fedgps': Paper(
        name='fedgps',
        title='FedGPS, section 5',
        algos=('fedavg', 'fedgps'),
        seeds=(0,),
        total_rounds=500,
        flags=dict(protocol='fedgps', model='resnet18_gn'),
        tables={
            1: TableSpec(1, 'accuracy', tuple(
                _dirichlet(f'scenario{i}', 'cifar10', 10, 0.1, partition_seed=i - 1)
                for i in range(1, 6)
            )),
        },
        accuracy=('best', 0),
        notes=(
            'ACC is the best accuracy during training (section 5, Datasets, Models and'
            ' Metrics). The paper\'s ResNet-18 has BatchNorm; ours GroupNorm.',
        ),
    ),
}
PAPER_NAMES = tuple(PAPERS)


def get(name: str) -> Paper:
  if name not in PAPERS:
    raise ValueError(f'unknown --paper {name!r}; choose one of {list(PAPER_NAMES)}')
  return PAPERS[name]


def tables(paper: Paper, numbers) -> list[TableSpec]:
  """The chosen tables (all of the paper's when `numbers` is empty), in the given order."""
  if not numbers:
    return list(paper.tables.values())
  out = []
  for n in numbers:
    try:
      number = int(n)
    except (TypeError, ValueError):
      number = None
    if number not in paper.tables:
      raise ValueError(
          f'--table={n} is not a table we reproduce of {paper.name}; choose from'
          f' {sorted(paper.tables)}'
      )
    out.append(paper.tables[number])
  return out


def published_table(paper: Paper, spec: TableSpec) -> published.PublishedTable:
  return published.get(paper.name, spec.number)


# --- scales -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Scale:
  """How much of a protocol to run.

  Attributes:
    name: The --scale value.
    description: What it shrinks, for --help and the report.
    rounds_factor: Comparison and grid rounds are multiplied by this (rounded up) ...
    min_rounds: ... but kept at least this (comparison, grid).
    grid_shape: (client, server) learning rates kept of each grid axis, spread over it
      (`thin`); None keeps the paper's grid.
    grid_rates: (client, server) learning rates that replace the grid's axes (a test's
      few safe values); None: `grid_shape`.
    max_seeds: The first this many seeds; None: all.
    max_clients_per_round: A cap on the cohort; None: the paper's.
    max_num_clients: A cap on the clients of a Dirichlet split; None: the paper's.
    flags: `launch.train` flags this scale sets unless the command line gives them.
  """

  name: str
  description: str
  rounds_factor: float = 1.0
  min_rounds: tuple[int, int] = (1, 1)
  grid_shape: Optional[tuple[int, int]] = None
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
        description='a tenth of the rounds (at least 10, grid at least 5), a 3 x 3 grid'
        ' (the ends and middle of each axis), 3 seeds, evaluation on 20 test clients',
        rounds_factor=0.1, min_rounds=(10, 5), grid_shape=(3, 3), max_seeds=3,
        flags=dict(num_eval_clients=20),
    ),
    'ci': Scale(
        name='ci',
        description='a test\'s: 4 comparison and 2 grid rounds, a 2 x 1 grid (client'
        ' learning rates 0.01 and 0.1, server 0.1), 2 seeds, 2 clients per round of 4 tiny'
        ' synthetic clients (10 examples, batch 5), 2 test clients',
        rounds_factor=0.0, min_rounds=(4, 2), grid_rates=((0.01, 0.1), (0.1,)), max_seeds=2,
        max_clients_per_round=2, max_num_clients=4,
        flags=dict(
            num_eval_clients=2, client_batch_size=5, synthetic_train_clients=4,
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


def thin(values, count: Optional[int]) -> tuple:
  """`count` values spread over `values`: both ends and evenly between (one: the middle)."""
  values = tuple(values)
  if count is None or count >= len(values):
    return values
  if count == 1:
    return (values[len(values) // 2],)
  step = (len(values) - 1) / (count - 1)
  return tuple(values[round(i * step)] for i in range(count))
