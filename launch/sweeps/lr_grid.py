"""Client x server learning-rate grids as training runs, and their search.

A `Grid` names each of its cells' runs (`cell_name`; a cell is one `launch.train` run,
continued from rung to rung) and a `Search` says how its cells are searched: exhaustively
(one rung) or by successive halving (`launch.sweeps.halving`), with the pick re-run with another
seed (the stability check). `run_search` searches grids side by side in a sweep's pool
(`launch.sweeps.runner`), scores each cell at each rung (`rung_score`) and returns each
group's `Outcome`, whose `best` is the pick's record (best.json) with the search's cost
(`run_cost`), both from the rounds' metrics each run's slot answers with
(`SCORED_METRICS`); `planned_runs` lists a search's runs for a dry run's estimate.
`launch.grid_search` (the program) and `launch.reproduce` build the grids and write the
results.
"""

import dataclasses
import math
import sys
from typing import Hashable, Mapping, Optional, Sequence

from launch.run import settings as run_settings
from launch.sweeps import calibration
from launch.sweeps import halving
from launch.sweeps import runner
from launch.sweeps import pool as pool_lib
from tff_zmg import analysis

EXHAUSTIVE, HALVING = 'exhaustive', 'halving'
STABILITY_DIRNAME = 'stability'
# A grid's folder holds its cells and this folder of their logs, which marks it as a grid's.
LOGS_DIRNAME = 'logs'


def cell_name(client_lr: float, server_lr: float) -> str:
  return f'clr{client_lr:.3g}_slr{server_lr:.3g}'


@dataclasses.dataclass(frozen=True)
class Search:
  """How grids are searched.

  Attributes:
    rung_rounds: The rounds of each rung of successive halving (`launch.sweeps.halving`); one
      rung is the exhaustive search, every cell trained to it.
    score_rounds: A cell scores the mean accuracy of its last this many rounds of a rung
      (all of them, when the rung has fewer).
    stability_check: Re-run the pick with another seed for the last rung's rounds.
  """

  rung_rounds: tuple[int, ...]
  score_rounds: int
  stability_check: bool = True

  def __post_init__(self):
    halving.check_rung_rounds(self.rung_rounds)
    if self.score_rounds < 1:
      raise ValueError(f'score_rounds must be >= 1, got {self.score_rounds}')

  @property
  def kind(self) -> str:
    return HALVING if len(self.rung_rounds) > 1 else EXHAUSTIVE

  @property
  def final_rounds(self) -> int:
    return self.rung_rounds[-1]

  def scored_rounds(self, rounds: int) -> int:
    """The rounds a cell's score at a rung of `rounds` rounds averages."""
    return min(self.score_rounds, rounds)

  def rungs(self, num_cells: int) -> list[tuple[int, int]]:
    """(cells, rounds) of each rung, at most: fewer cells go on if some fail."""
    return list(zip(halving.rung_sizes(num_cells, len(self.rung_rounds)), self.rung_rounds))

  def rung_steps(self, num_cells: int) -> list[tuple[int, int, int]]:
    """(cells, rounds, rounds beyond the rung before) of each rung, at most."""
    rungs = self.rungs(num_cells)
    before = [0] + [rounds for _, rounds in rungs[:-1]]
    return [(cells, rounds, rounds - b) for (cells, rounds), b in zip(rungs, before)]

  def describe(self, num_cells: int) -> str:
    """'successive halving: 81 cells x 10 rounds, 27 x 20, 9 x 50' or 'exhaustive: ...'."""
    rungs = ', '.join(f'{c} x {r}' for c, r in self.rungs(num_cells))
    return (f'{"successive halving" if self.kind == HALVING else "exhaustive"}: {rungs}'
            f' (cells x rounds)')


@dataclasses.dataclass(frozen=True)
class Grid:
  """One client x server learning-rate grid: its directory, axes and its runs' flags.

  Attributes:
    directory: Its cells go to `<directory>/<cell>/`, its stability re-runs to
      `<directory>/stability/`, its grid.csv, grid.md and heatmap beside them.
    base: The settings its cells start from: `launch.train`'s flags as the program's
      command line gave them (`run.settings.settings_from_flags`, read at its door).
    client_lrs, server_lrs: The axes.
    overrides: `launch.train` flags of every cell (e.g. task, algo, a third axis' value).
    group: Grids of one group are one search (their cells compete); each group gets a
      pick of its own.
    prefix: Of its runs' names (progress lines, logs), unique across grids.
    label: Fields of the pick's record saying which grid it is (e.g. the third axis').
    score_rounds: Its cells evaluate only round 0 and the last this many rounds of each
      rung, all that their scores read (None: every round).
  """

  directory: str
  base: run_settings.Settings
  client_lrs: tuple[float, ...]
  server_lrs: tuple[float, ...]
  overrides: Mapping[str, object] = dataclasses.field(default_factory=dict)
  group: Hashable = None
  prefix: str = ''
  label: Mapping[str, object] = dataclasses.field(default_factory=dict)
  score_rounds: Optional[int] = None

  @property
  def cells(self) -> list[tuple[float, float]]:
    """(client lr, server lr) of every cell, server-major."""
    return [(c, s) for s in self.server_lrs for c in self.client_lrs]

  def run(self, cell, rounds: int, seed: Optional[int] = None,
          continued: bool = False) -> runner.Run:
    """The cell's run trained to `rounds`; with `seed`, its stability re-run.

    A cell is one run at every rung: asked for more rounds, it continues (launch.train
    resumes a run whose --total_rounds grew). `continued`: a later rung, which never
    starts a cell afresh, even with --overwrite (the first rung did).
    """
    c, s = cell
    name = cell_name(c, s)
    values = {**self.overrides, 'root_output_dir': self.directory, 'experiment_name': name,
              'client_learning_rate': c, 'server_learning_rate': s, 'total_rounds': rounds}
    if self.score_rounds is not None:
      values.setdefault('eval_last_rounds', self.score_rounds)
    if continued:
      values['overwrite'] = False
    if seed is not None:
      name = f'{name}_seed{seed}'
      values.update(seed=seed, experiment_name=f'{STABILITY_DIRNAME}/{name}')
    return dataclasses.replace(runner.train_run(self.base, name, values),
                               name=self.prefix + name)

  def stability_seed(self) -> int:
    """Another seed than the cells': theirs + 1."""
    return self.run(self.cells[0], 1).config.seed + 1


_TRAINING_S = 'training_time_in_seconds'
_EVALUATION_S = 'evaluation/evaluation_time_in_seconds'
# The metrics.csv columns a cell's score and cost read: what each run's slot answers with.
SCORED_METRICS = (analysis.runs.TRAIN_LOSS, analysis.runs.EVAL_ACCURACY, _TRAINING_S,
                  _EVALUATION_S)


def rung_score(metrics: Mapping[str, Mapping[int, float]], rounds: int,
               score_rounds: int) -> float:
  """A cell's score at a rung, from its rounds' `metrics` (`SCORED_METRICS`): its mean
  accuracy over the last min(score_rounds, rounds) of its first `rounds` rounds; NaN
  (failed) unless it trained all `rounds` of them.

  Rounds beyond `rounds` (a cell continued to a later rung) are not looked at, so a
  resumed search scores every rung as the first pass did.
  """
  if max(metrics.get(analysis.runs.TRAIN_LOSS, {}), default=0) < rounds:
    return math.nan  # It diverged before (a diverged round is never recorded).
  accuracy = metrics.get(analysis.runs.EVAL_ACCURACY, {})
  got = sorted(r for r in accuracy if 0 < r <= rounds)
  if not got:
    return math.nan
  return analysis.mean_of_last_rounds([accuracy[r] for r in got], got,
                                      min(score_rounds, rounds))


def run_cost(metrics: Mapping[str, Mapping[int, float]], up_to: int) -> tuple[int, float]:
  """(rounds trained up to round `up_to`, their training and evaluation seconds), from
  a run's rounds' `metrics` (`SCORED_METRICS`): TFF's own timings, so process start-up
  is not counted."""
  trained = {r: t for r, t in metrics.get(_TRAINING_S, {}).items() if 1 <= r <= up_to}
  evaluated = metrics.get(_EVALUATION_S, {})
  seconds = sum(trained.values()) + sum(t for r, t in evaluated.items() if r <= up_to)
  return len(trained), seconds


@dataclasses.dataclass(frozen=True)
class Outcome:
  """One group's search.

  Attributes:
    rungs: The rungs of its cells (keys (grid index, client lr, server lr)).
    stability: The stability check (None: not run).
    best: The pick's record (best.json); None when nothing could be picked.
  """

  rungs: tuple[halving.Rung, ...]
  stability: Optional[halving.StablePick]
  best: Optional[dict]


def planned_runs(grids: Sequence[Grid], search: Search) -> list[calibration.PlannedRun]:
  """The runs of searching `grids` with the rounds each trains, at most (fewer cells go on
  when some diverge): each group's cells rung by rung, then its pick's stability re-run
  (more if it diverges: a neighbour's each)."""
  members = {}
  for grid in grids:
    members.setdefault(grid.group, []).extend((grid, cell) for cell in grid.cells)
  planned = []
  for cells in members.values():
    for k, (count, rounds, extra) in enumerate(search.rung_steps(len(cells))):
      note = '' if k == 0 else (f'rung {k + 1}: the best {count} of {len(cells)} cells'
                                f' continue to {rounds} rounds')
      planned += [calibration.PlannedRun('grid', grid.run(cell, rounds), extra, note)
                  for grid, cell in cells[:count]]
    if search.stability_check:
      grid, cell = cells[0]
      planned.append(calibration.PlannedRun(
          'stability', grid.run(cell, search.final_rounds, seed=grid.stability_seed()),
          search.final_rounds, 'the pick, or its neighbours while re-runs diverge'))
  return planned


def later_work(group_sizes: Sequence[int], search: Search, rung: int) -> runner.LaterWork:
  """What a search has left after its `rung`-th rung (1-based), at most: in each group
  of `group_sizes` cells, the cells of every later rung, each training the rounds beyond
  the rung before, and the pick's stability re-run."""
  runs = rounds = 0
  for size in group_sizes:
    for count, _, extra in search.rung_steps(size)[rung:]:
      runs, rounds = runs + count, rounds + count * extra
    if search.stability_check:
      runs, rounds = runs + 1, rounds + search.final_rounds
  return runner.LaterWork(runs=runs, rounds=rounds, whole='the whole search')


def run_search(
    grids: Sequence[Grid], search: Search, *, pool: pool_lib.Pool, log_dir: str,
    stream=None, slots: Optional[pool_lib.Slots] = None,
) -> dict[Hashable, Outcome]:
  """Searches every group of `grids` side by side; group -> its `Outcome`.

  Each rung's runs of all groups go together, in `pool`'s slots (cells of one grid up to
  `pool.batch_cells` at once, batched, in each); so do the stability re-runs. Cells are
  keyed (grid index, client lr, server lr). One set of warm slots (`slots`, or the
  search's own) trains every rung, so that each builds a grid once.
  """
  stream = stream or sys.stdout
  if slots is None:
    with runner.slots_for(pool, log_dir) as own:
      return run_search(grids, search, pool=pool, log_dir=log_dir, stream=stream,
                        slots=own)

  measured = {}  # A run's folder -> its rounds' metrics, as its last run_all gave them.

  def train(runs, pool_, **more):
    results = runner.run_all(
        list(runs.values()), pool=pool_, log_dir=log_dir, stream=stream, slots=slots,
        metrics=SCORED_METRICS, **more)
    measured.update({run.config.output_dir: results[run.name].metrics
                     for run in runs.values()})
    return {key: results[run.name] for key, run in runs.items()}

  def train_and_score(keys, rounds):
    k = search.rung_rounds.index(rounds) + 1
    print(f'rung {k}/{len(search.rung_rounds)}: {len(keys)} cells to {rounds} rounds',
          file=stream, flush=True)
    results = train(
        {key: grids[key[0]].run(key[1:], rounds, continued=k > 1) for key in keys}, pool,
        describe=lambda run, result: f'score={score(result, rounds):.4f}',
        later=later_work([len(cells) for cells in members.values()], search, k))
    return {key: score(result, rounds) for key, result in results.items()}

  def score(result: runner.Result, rounds: int) -> float:
    return rung_score(result.metrics, rounds, search.score_rounds)

  def check(keys):
    print(f'stability: {len(keys)} picks re-run with another seed for'
          f' {search.final_rounds} rounds', file=stream, flush=True)
    results = train({key: _stability_run(grids, key, search) for key in keys},
                    pool.alone())  # One a grid: no shared build.
    return {key: result.state == runner.FINISHED for key, result in results.items()}

  keys = [(i, *cell) for i, grid in enumerate(grids) for cell in grid.cells]
  members = {}
  for key in keys:
    members.setdefault(grids[key[0]].group, []).append(key)
  rungs = halving.successive_halving(
      keys, search.rung_rounds, train_and_score, group=lambda key: grids[key[0]].group)
  orders = {group: halving.ranking(rungs, cells) for group, cells in members.items()}
  stability = None
  if search.stability_check:
    stability = halving.stable_picks(
        orders, lambda key: _neighbours(grids, key), check)
  outcomes = {}
  for group, cells in members.items():
    cells = set(cells)
    group_rungs = tuple(  # The rungs this group's cells reached.
        halving.Rung(rung.rounds, {k: v for k, v in rung.scores.items() if k in cells})
        for rung in rungs if cells & set(rung.scores))
    checked = None if stability is None else stability[group]
    pick = orders[group][0] if orders[group] else None
    if checked is not None:
      pick = checked.pick
    outcomes[group] = Outcome(
        rungs=group_rungs, stability=checked,
        best=None if pick is None else _record(grids, search, group_rungs, pick, checked,
                                               measured))
  return outcomes


def _stability_run(grids, key, search: Search) -> runner.Run:
  grid = grids[key[0]]
  return grid.run(key[1:], search.final_rounds, seed=grid.stability_seed())


def _neighbours(grids, key) -> set:
  """The cells a half decade (one step of either axis) from `key`, in its grid."""
  i, c, s = key
  grid = grids[i]
  return {(i, *cell) for cell in halving.grid_neighbours((c, s), (grid.client_lrs,
                                                                   grid.server_lrs))}


def _rates(grids, key) -> dict:
  i, c, s = key
  return dict(client_learning_rate=c, server_learning_rate=s, **grids[i].label)


def _record(grids, search: Search, rungs, key, stability, measured) -> dict:
  """best.json: the pick, its score and the rounds scored, the search and its cost (from
  `measured`: each run's rounds' metrics by its folder)."""
  grid = grids[key[0]]
  last = halving.last_scores(rungs)
  rounds, score = last[key]
  config = grid.run(key[1:], rounds).config
  record = dict(
      task=config.task, algo=config.algo, **_rates(grids, key), score=score,
      score_rounds=search.scored_rounds(rounds), total_rounds=rounds, search=search.kind,
      run_dir=config.output_dir,
      rungs=[dict(rounds=r.rounds, cells=len(r.scores)) for r in rungs],
  )
  # Each cell up to its last rung (a cell continued by a later search is not charged
  # here for rounds this one did not ask for), and the stability re-runs.
  trained = [(grids[cell[0]].run(cell[1:], r).config.output_dir, r)
             for cell, (r, _) in last.items()]
  if stability is not None:
    trained += [(_stability_run(grids, cell, search).config.output_dir, search.final_rounds)
                for cell, _ in stability.checked]
    record['stability'] = dict(
        seed=grid.stability_seed(), rounds=search.final_rounds,
        checked=[dict(**_rates(grids, cell), stable=stable)
                 for cell, stable in stability.checked],
        replaced=stability.replaced,
        diverged_best=_rates(grids, stability.best) if stability.replaced else None,
    )
  costs = [run_cost(measured[run_dir], up_to) for run_dir, up_to in trained]
  record['cost'] = dict(rounds=sum(n for n, _ in costs), seconds=sum(t for _, t in costs))
  return record
