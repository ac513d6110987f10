"""The shapes of what we know about a paper: its protocol, its tables and their numbers.

Each paper's module (`launch/papers/<paper>.py`) fills these with that paper's values,
every one with its source.
"""

import dataclasses
from typing import Mapping, Optional

# Table layouts (how `launch.reproduce` fills a table):
# 'summary': FedZMG Tables 3-5, a row per algorithm: rounds to each threshold and the
#   late-stage accuracy after the second.
# 'ttest': FedZMG Tables 6-8, a row per pair (fedzmg vs each baseline): t and p.
# 'accuracy': a row per algorithm, a column per setting: the paper's accuracy of a run.
LAYOUTS = ('summary', 'ttest', 'accuracy')


@dataclasses.dataclass(frozen=True)
class ClientOptimizer:
  """The client optimizer a paper trains every method with: SGD, momentum, weight decay.

  Attributes:
    learning_rate: The clients' learning rate eta_l.
    momentum: Momentum mu (0: none).
    weight_decay: Weight decay (0: none).
    decoupled: Whether the decay is decoupled (applied to the weights beside the step)
      rather than coupled L2 (added to the gradient, inside the momentum: the
      `torch.optim.SGD` the papers train with).
  """

  learning_rate: float
  momentum: float
  weight_decay: float
  decoupled: bool

  def describe(self) -> str:
    """'SGD at 0.01, momentum 0.9, coupled weight decay 1e-05' (as the reports say it)."""
    text = f'SGD at {self.learning_rate:g}'
    if self.momentum:
      text += f', momentum {self.momentum:g}'
    if self.weight_decay:
      kind = 'decoupled' if self.decoupled else 'coupled'
      text += f', {kind} weight decay {self.weight_decay:g}'
    return text


@dataclasses.dataclass(frozen=True)
class Protocol:
  """One paper's training settings: what `launch.train --protocol=<name>` fills in.

  Attributes:
    name: The --protocol value.
    num_clients: Clients in the Dirichlet split (N).
    dirichlet_alpha: The default concentration; `dirichlet_alphas` lists the paper's.
    dirichlet_alphas: The concentrations of the paper's main tables.
    clients_per_round: Clients sampled per round.
    client_epochs_per_round: Local epochs E.
    client_batch_size: Local batch size.
    client_optimizer: The SGD the paper trains every method's clients with.
    method_hparams: The paper's own method's hyperparameters (FedRKMGC's beta, gamma,
      rho; launch.train's flags): set for the algorithms that take them, its method and
      its ablations, except where an ablation's name fixes a value (fedrkmgc_raw's
      rho = 1).
    sources: Where each value comes from (field or hparam name -> citation).
  """

  name: str
  num_clients: int
  dirichlet_alpha: float
  dirichlet_alphas: tuple[float, ...]
  clients_per_round: int
  client_epochs_per_round: int
  client_batch_size: int
  client_optimizer: ClientOptimizer
  method_hparams: Mapping[str, float]
  sources: Mapping[str, str]

  def flag_values(self) -> dict:
    """launch.train flag name -> value of the data and participation settings."""
    return dict(
        partition='dirichlet',
        num_clients=self.num_clients,
        dirichlet_alpha=self.dirichlet_alpha,
        clients_per_round=self.clients_per_round,
        client_epochs_per_round=self.client_epochs_per_round,
        client_batch_size=self.client_batch_size,
    )

  def hparams_for(self, algo, given=()) -> dict:
    """The hyperparameters the protocol trains algorithm `algo` with (flag -> value),
    leaving out the flags in `given` (a run's own: they win).

    Every method takes the client optimizer under its own names: `client_learning_rate`,
    `client_momentum` and the weight decay its `Hparams` name (`WEIGHT_DECAY_NAME`);
    a setting of 0 is met by an algorithm without it.

    Args:
      algo: The algorithm's `registry.AlgorithmSpec`.
      given: Flags the run sets itself.

    Raises:
      ValueError: (one line) `algo` cannot train with the client optimizer: it has no
        momentum or weight decay, or a decay of the other kind.
    """
    sgd, cls = self.client_optimizer, algo.hparams_class
    names = cls.names()

    def refuse(what: str, why: str):
      raise ValueError(
          f'--protocol={self.name} trains every method\'s clients with {what}'
          f' ({self.sources["client_optimizer"]}); --algo={algo.name} {why}'
      )

    values = {'client_learning_rate': sgd.learning_rate}
    if 'client_momentum' in names:
      values['client_momentum'] = sgd.momentum
    elif sgd.momentum:
      refuse(f'momentum {sgd.momentum:g}', 'has no client momentum')
    decay = cls.WEIGHT_DECAY_NAME
    kind = 'decoupled' if sgd.decoupled else 'coupled'
    if decay in given:
      pass
    elif decay not in names:
      if sgd.weight_decay:
        refuse(f'{kind} weight decay {sgd.weight_decay:g}', 'has no weight decay')
    elif sgd.weight_decay and cls.DECOUPLED_WEIGHT_DECAY != sgd.decoupled:
      ours = 'decoupled' if cls.DECOUPLED_WEIGHT_DECAY else 'coupled'
      refuse(f'{kind} weight decay {sgd.weight_decay:g}',
             f'decays its weights {ours}: give --{decay} to train it with its own decay')
    else:
      values[decay] = sgd.weight_decay
    values.update({
        name: value for name, value in self.method_hparams.items()
        if name in names and name not in algo.default_overrides
    })
    return {name: value for name, value in values.items() if name not in given}


@dataclasses.dataclass(frozen=True)
class PublishedTable:
  """One published table, reduced to the rows and columns we reproduce.

  Every value is copied from the paper texts in /work/shared/papers (our copies have no
  page numbers, so a table is cited by its number and section); `None` is a number our
  copy does not show (the extraction dropped most inline math, e.g. the FedZMG paper's
  p-values). Accuracies are in percent, as printed; rounds are rounds.

  Attributes:
    paper: Our key of the paper ('fedzmg', 'gcfed', 'fedrkmgc', 'fedgps').
    number: The table's number in the paper.
    source: Paper, table and section, for the report.
    caption: What the table shows, in our words.
    columns: Column key -> header as the paper prints it.
    rows: Row key (an algorithm, or 'a vs b') -> column key -> value (None: not in our
      copy of the paper).
    notes: Where our reading of the table needed a choice.
  """

  paper: str
  number: int
  source: str
  caption: str
  columns: Mapping[str, str]
  rows: Mapping[str, Mapping[str, Optional[float]]]
  notes: tuple[str, ...] = ()

  def value(self, row: str, column: str) -> Optional[float]:
    return self.rows.get(row, {}).get(column)


def rows(columns, values_by_row) -> dict:
  """{row: {column: value}} from the values of each row in column order."""
  return {row: dict(zip(columns, values)) for row, values in values_by_row.items()}


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

  def describe(self, data_source: str) -> str:
    """What the setting is, for a figure's title: 'cifar10_n100_a0.05 (cifar10, Dirichlet
    α=0.05 over 100 clients; synthetic cifar100 data in its place)'."""
    flags = dict(self.flags)
    parts = []
    if flags.pop('partition', None) == 'dirichlet':
      parts.append(f'Dirichlet α={flags.pop("dirichlet_alpha"):g} over'
                   f' {flags.pop("num_clients")} clients')
    parts += [f'{name.replace("_", " ")} {value}' for name, value in flags.items()]
    what = ', '.join([self.task, *parts])
    stand_in = self.task_for(data_source)
    if stand_in != self.task:
      what += f'; synthetic {stand_in} data in its place'
    elif data_source == 'synthetic':
      what += '; synthetic data'
    return what if self.key == self.task else f'{self.key} ({what})'


def dirichlet_setting(*, key, task, num_clients, alpha, **flags) -> Setting:
  """A column trained on a Dirichlet split of a tfds task (synthetic: TFF's CIFAR-100).

  `num_clients` and `alpha` are the split's; `flags` are further `launch.train` flags.
  """
  return Setting(
      key=key, task=task, synthetic_task='cifar100',
      flags=dict(partition='dirichlet', num_clients=num_clients, dirichlet_alpha=alpha, **flags),
  )


@dataclasses.dataclass(frozen=True)
class TableSpec:
  """How one published table is reproduced.

  Attributes:
    number: The table's number in the paper (a key of its `Paper.published`).
    layout: One of `LAYOUTS`.
    settings: The settings whose runs fill it, in column order.
  """

  number: int
  layout: str
  settings: tuple[Setting, ...]


def by_number(*entries) -> dict:
  """{entry.number: entry} in the given order: a paper's `tables` or `published`.

  Each entry carries its table's number once; a number given twice is an error.
  """
  numbered = {}
  for entry in entries:
    if entry.number in numbered:
      raise ValueError(f'table {entry.number} is given twice')
    numbered[entry.number] = entry
  return numbered


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
  """One paper: what `launch.reproduce` runs for its tables, and their published numbers.

  Attributes:
    name: The --paper value.
    title: For the report.
    algos: The algorithms compared (registry names), in the table's row order.
    seeds: Training seeds of each algorithm and setting.
    total_rounds: Rounds of a comparison run.
    flags: `launch.train` flags of every run (clients per round, protocol, model, ...).
    tables: Table number -> its spec (`by_number(TableSpec(...), ...)`).
    published: Table number -> the numbers the paper printed in it (`by_number`).
    grid: The learning-rate search before the comparison; None where the paper fixed the
      learning rates.
    accuracy: How the 'accuracy' layout scores a run: ('last', n) the mean of the last n
      rounds, or ('best', 0) the best accuracy.
    notes: Choices we made where the paper leaves room, for the report.
  """

  name: str
  title: str
  algos: tuple[str, ...]
  seeds: tuple[int, ...]
  total_rounds: int
  flags: Mapping[str, object]
  tables: Mapping[int, TableSpec]
  published: Mapping[int, PublishedTable]
  grid: Optional[Grid] = None
  accuracy: tuple[str, int] = ('last', 10)
  notes: tuple[str, ...] = ()

  def __post_init__(self):
    if set(self.tables) - set(self.published):
      raise ValueError(f'{self.name}: tables {sorted(self.tables)} without published numbers')
