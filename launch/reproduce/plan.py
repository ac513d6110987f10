"""What one `launch.reproduce` command runs: the plan of its flags and the runs of it.

A plan is a paper, its chosen tables and their settings, at a scale; its runs are the
grid cells (where the paper tuned), the stability re-runs of their picks and the
comparison runs, each an ordinary `launch.train` run described by `runner.train_run`;
`planned_runs` lists them with the rounds each trains.
"""

import dataclasses
import os
from typing import Optional

from absl import flags

from launch import papers
from launch.reproduce import scales
from launch.run import settings as run_settings
from launch.sweeps import calibration
from launch.sweeps import comparison
from launch.sweeps import halving
from launch.sweeps import lr_grid
from launch.sweeps import runner
import tasks
from tasks import sources
from tasks import tfds_source

_PAPER = flags.DEFINE_string(
    'paper', None, f'The paper to reproduce: one of {list(papers.PAPER_NAMES)}.'
)
_TABLE = flags.DEFINE_list(
    'table', [], "The paper's table number(s) to reproduce (comma list); default: all we"
    ' reproduce of it (fedzmg 3-8, gcfed 4-5, fedrkmgc 1, fedgps 1).',
)
_SCALE = flags.DEFINE_string(
    'scale', 'full',
    'How much of the protocol to run: '
    + '; '.join(f'{s.name}: {s.description}' for s in scales.SCALES.values())
    + '; or a number in (0, 1]: that fraction of the rounds, all else full.',
)
_REPRODUCE_DIR = flags.DEFINE_string(
    'reproduce_dir', None,
    'Where the runs, figures and report.md go (default'
    ' <root_output_dir>/reproduce_<paper>_<scale>).',
)
for _name in ('root_output_dir', 'parallel', 'batch_cells', 'data_source', 'thresholds'):
  flags.declare_key_flag(_name)

# Flags the protocol sets per run; a command line giving them would break the protocol.
_SET_BY_PROTOCOL = (
    'task', 'algo', 'seed', 'experiment_name', 'total_rounds', 'client_learning_rate',
    'server_learning_rate', 'protocol', 'clients_per_round', 'partition', 'num_clients',
    'dirichlet_alpha', 'partition_seed', 'model', 'client_epochs_per_round',
)


@dataclasses.dataclass(frozen=True)
class Plan:
  """What one command runs: a paper, its chosen tables and settings, at a scale, with
  `launch.train`'s flags as the command line gave them (`command_line`; the protocol and
  the scale leave alone those it gave) and the accuracy thresholds it gave (None: each
  task's)."""

  paper: papers.base.Paper
  scale: scales.Scale
  tables: tuple[papers.base.TableSpec, ...]
  settings: tuple[papers.base.Setting, ...]
  directory: str
  command_line: run_settings.Settings
  thresholds: Optional[tuple[float, ...]]

  @property
  def given(self) -> frozenset[str]:
    """The names of the flags of `launch.train` the command line gave."""
    return self.command_line.given

  @property
  def data_source(self) -> str:
    return self.command_line.values['data_source']

  @property
  def cache_dir(self) -> Optional[str]:
    return self.command_line.values['cache_dir']

  @property
  def seeds(self) -> tuple[int, ...]:
    return self.scale.seeds(self.paper.seeds)

  @property
  def total_rounds(self) -> int:
    return self.scale.rounds(self.paper.total_rounds)

  def grid_axes(self):
    """(client rates, server rates, cohort) of the grid at this scale; None if none."""
    grid = self.paper.grid
    if grid is None:
      return None
    client, server = self.scale.grid_rates or (
        grid.client_learning_rates, grid.server_learning_rates)
    return client, server, self.scale.cap(grid.clients_per_round,
                                          self.scale.max_clients_per_round)

  def search(self) -> Optional[lr_grid.Search]:
    """How the grid is searched at this scale: halving up to the paper's grid rounds, or
    every cell to the scaled rounds; None where the paper did not tune."""
    grid = self.paper.grid
    if grid is None:
      return None
    rungs = (halving.default_rung_rounds(grid.total_rounds) if self.scale.halving
             else (self.scale.rounds(grid.total_rounds, grid=True),))
    return lr_grid.Search(rung_rounds=rungs, score_rounds=grid.score_rounds)

  def tuning_caveat(self) -> Optional[str]:
    """Why the rates are not tuned honestly at this scale, or None when they are.

    Honest: the paper's whole grid and cohort, and the pick scored at the paper's grid
    rounds (successive halving gets there with fewer rounds in all).
    """
    grid, axes, search = self.paper.grid, self.grid_axes(), self.search()
    if grid is None:
      return None
    client, server, cohort = axes
    why = []
    if (client, server) != (grid.client_learning_rates, grid.server_learning_rates):
      why.append(f'a {len(client)} x {len(server)} grid, not the paper\'s'
                 f' {len(grid.client_learning_rates)} x {len(grid.server_learning_rates)}')
    if search.final_rounds < grid.total_rounds:
      why.append(f'cells scored after {search.final_rounds} of the paper\'s'
                 f' {grid.total_rounds} rounds')
    if cohort < grid.clients_per_round:
      why.append(f'cohort {cohort}, not {grid.clients_per_round}')
    return '; '.join(why) or None

  def task(self, setting: papers.base.Setting) -> str:
    return setting.task_for(self.data_source)

  def overrides(self, setting: papers.base.Setting) -> dict:
    """The `launch.train` flags of every run of a setting (task, split, cohort, scale)."""
    protocol = self.paper.flags.get('protocol')
    # The protocol's data and participation flags, explicit so that the scale can cap
    # them (its hyperparameters are left to launch.train, which gives each algorithm the
    # client optimizer and refuses one that cannot take it).
    base = {} if protocol is None else {
        flag: value for flag, value in papers.get_protocol(protocol).flag_values().items()
        if flag not in self.given}
    values = {**base, **self.paper.flags, **setting.flags, 'task': self.task(setting)}
    if 'clients_per_round' in values:
      values['clients_per_round'] = self.scale.cap(
          values['clients_per_round'], self.scale.max_clients_per_round)
    if 'num_clients' in values:
      values['num_clients'] = self.scale.cap(values['num_clients'], self.scale.max_num_clients)
    for name, value in self.scale.flags.items():
      if name not in self.given:
        values[name] = value
    if values.get('model') not in (None, *tasks.MODELS[values['task']]):
      # A synthetic stand-in task trains its own model (it has no other).
      del values['model']
    return values


def plan_from_flags() -> Plan:
  """The plan this program's flags describe (--paper, --table, --scale, --reproduce_dir,
  --thresholds and launch.train's), built once by launch.reproduce's `main`, which passes
  it down; ValueError for bad or conflicting flags."""
  if _PAPER.value is None:
    raise ValueError(f'--paper is required: one of {list(papers.PAPER_NAMES)}')
  paper = papers.get(_PAPER.value)
  scale = scales.get_scale(_SCALE.value)
  specs = papers.tables(paper, _TABLE.value)
  command_line = run_settings.settings_from_flags()
  given = [n for n in _SET_BY_PROTOCOL if n in command_line.given]
  if given:
    raise ValueError(
        f'--{given[0]} is set by the {paper.name} protocol (launch/papers/); leave it out'
    )
  settings = {}
  for spec in specs:
    for setting in spec.settings:
      settings.setdefault(setting.key, setting)
  values = command_line.values
  directory = _REPRODUCE_DIR.value or os.path.join(
      values['root_output_dir'], f'reproduce_{paper.name}_{scale.name}')
  return Plan(
      paper=paper, scale=scale, tables=tuple(specs), settings=tuple(settings.values()),
      directory=directory, command_line=command_line,
      thresholds=comparison.parse_thresholds(comparison.THRESHOLDS.value),
  )


def _rename(run: runner.Run, name: str) -> runner.Run:
  return dataclasses.replace(run, name=name)


def grid_groups(plan: Plan) -> dict[tuple[str, str], lr_grid.Grid]:
  """(setting key, algo) -> its learning-rate grid; each is a search of its own."""
  axes = plan.grid_axes()
  if axes is None:
    return {}
  client_lrs, server_lrs, cohort = axes
  return {
      (setting.key, algo): lr_grid.Grid(
          directory=os.path.join(plan.directory, 'grid', setting.key, algo),
          base=plan.command_line,
          client_lrs=client_lrs, server_lrs=server_lrs,
          overrides={**plan.overrides(setting), 'algo': algo, 'clients_per_round': cohort},
          group=(setting.key, algo), prefix=f'grid-{setting.key}-{algo}-',
          score_rounds=plan.search().score_rounds)
      for setting in plan.settings for algo in plan.paper.algos
  }


def comparison_runs(plan: Plan, best: Optional[dict] = None) -> list[runner.Run]:
  """Every algorithm on every setting over the seeds; `best[(key, algo)]` its rates."""
  runs = []
  for setting in plan.settings:
    task = plan.task(setting)
    for algo in plan.paper.algos:
      rates = {}
      if best is not None and (setting.key, algo) in best:
        rates = {k: best[(setting.key, algo)][k]
                 for k in ('client_learning_rate', 'server_learning_rate')}
      for seed in plan.seeds:
        name = comparison.run_name(task, algo, seed)
        runs.append(_rename(runner.train_run(plan.command_line, name, {
            **plan.overrides(setting), 'algo': algo, 'seed': seed, **rates,
            'total_rounds': plan.total_rounds, 'experiment_name': name,
            'root_output_dir': os.path.join(plan.directory, 'runs', setting.key),
        }), f'{setting.key}-{name}'))
  return runs


def check_data(plan: Plan) -> None:
  """Raises tasks.MissingDataError (with how to get it) before any run starts."""
  if plan.data_source != 'tff':
    return
  for task in dict.fromkeys(plan.task(s) for s in plan.settings):
    if task in tasks.CENTRALIZED_TASK_NAMES:
      tfds_source.ensure_database(task, plan.cache_dir)
    else:
      sources.load_client_data(task, 'tff', plan.cache_dir)


def planned_runs(plan: Plan) -> list[calibration.PlannedRun]:
  """Every run of the plan with its rounds: each grid's search at most
  (`lr_grid.planned_runs`), then the comparison."""
  planned = lr_grid.planned_runs(list(grid_groups(plan).values()), plan.search())
  return planned + [calibration.PlannedRun('comparison', run, run.config.total_rounds)
                    for run in comparison_runs(plan)]
