r"""Client x server learning-rate grid search: `python -m launch.grid_search --task=... --algo=...`.

The FedZMG paper's protocol (docs/specification.md section 6): every pair of a 9 x 9 grid of
client and server learning rates 10^-3, 10^-2.5, ..., 10^1, trained for 50 rounds with
10 clients per round, scored by the mean validation accuracy of the last 10 rounds:

  python -m launch.grid_search --task=emnist --algo=fedzmg --parallel=4

Either axis can be set as a comma list, and every flag of `launch.train` is passed on to
each cell (--total_rounds defaults to 50 here, not 10):

  python -m launch.grid_search --task=emnist --algo=fedavg --data_source=synthetic \
      --client_learning_rates=0.01,0.1 --server_learning_rates=0.1,1.0 --total_rounds=5

A third axis, one more hyperparameter of the algorithm, runs the client x server grid at
each of its values (e.g. FedProx's mu over the FedProx paper's grid):

  python -m launch.grid_search --task=emnist --algo=fedprox \
      --hparam_grid=proximal_strength:0.001,0.01,0.1,1

Each value's grid goes to `<grid>/<name>=<value>/` with its own grid.csv, grid.md and
heatmap; the cells of all values are one search, and `<grid>/best.json` is its pick.

Successive halving (`launch/sweeps/halving.py`) reaches the same rounds for a third of the
cost: every cell trains a fifth of the rounds, the best third go on to two fifths, the
best ninth to all (--rung_rounds sets other rungs); a promoted cell is its run continued:

  python -m launch.grid_search --task=emnist --algo=fedavg --search=halving --parallel=2

A cell scores at each rung the mean of its last --score_rounds rounds of that rung (all of
them when the rung is shorter); a cell that diverged before a rung's last round fails
there and is never promoted nor picked. The pick is then re-run with another seed (--seed
+ 1) for the last rung's rounds; if that diverges, its adjacent cells (half a decade away
in either or both rates) are tried best first and the first that does not diverge is
picked (--nostability_check skips this). best.json records the pick, the rounds its
score averages, the rungs, the stability check and the cost (rounds trained and their
seconds, from the runs' metrics.csv).

Each cell is an ordinary training run in `<root_output_dir>/<experiment_name>/<cell>/`
(experiment_name defaults to grid_<task>_<algo>), trained by its own `launch.train`
process, `--parallel` at a time; a cell's output is in `logs/<cell>.log` there.
Re-running the same command resumes an interrupted search: finished cells are not run
again, unfinished ones resume from their checkpoints. A diverging cell is recorded as
diverged (score NaN); --overwrite retrains every cell from scratch. Outputs, next to the
cells: grid.csv, grid.md, grid_heatmap.png and best.json (the pick). The grids as runs and
their search are `launch.sweeps.lr_grid`'s; this program reads the flags, makes the grids and
writes what the search found.

--dry_run trains none of it: it says how many runs and rounds the search takes at most
and about how long here, timed by a 3-round run of the grid's settings (kept in
`<grid>/dry_run/calibration.json` and reused by the next dry run):

  python -m launch.grid_search --task=emnist --algo=fedzmg --search=halving --dry_run

Exit status (launch/cli/failures.py): 0 done, 1 an unexpected failure (a bug), 2 bad flags,
settings or data, 3 every cell diverged (or the pick and all its neighbours did with
another seed), 4 a TFF worker lost, 5 the machine refused (disk
full, permissions), 130 interrupted (Ctrl-C, SIGTERM, SIGHUP; re-run the same command to
resume); a cell failing otherwise passes on its own status.
Every failure is one line `grid_search: error: ...` on stderr; --verbose adds the traceback.
"""

import json
import math
import os
import sys
from typing import Optional

from absl import flags
import numpy as np

from launch.sweeps import calibration
from launch.run import errors
from launch.cli import failures
from launch.sweeps import halving
from launch.sweeps import lr_grid
from launch.run import run_directory
from launch.sweeps import runner
from launch import train
from launch.papers import fedzmg as fedzmg_paper
from tff_zmg import analysis
from tff_zmg.algorithms import registry
# pylint: disable=g-bad-import-order,unused-import
# Re-exported: other programs and tests name them `grid_search.<name>`.
from launch.sweeps.lr_grid import cell_name
from launch.sweeps.lr_grid import Grid
from launch.sweeps.lr_grid import Search
from launch.sweeps.lr_grid import run_search
# pylint: enable=g-bad-import-order,unused-import

# The FedZMG paper's grid: 10^-3 ... 10^1 in half decades, 50 rounds per cell.
HALF_DECADES = fedzmg_paper.HALF_DECADES
DEFAULT_TOTAL_ROUNDS = fedzmg_paper.GRID.total_rounds
LOGS_DIRNAME = 'logs'

_CLIENT_LRS = flags.DEFINE_list(
    'client_learning_rates', None,
    'Client learning rates to try (comma list). Default: 10^-3 ... 10^1 in half decades.',
)
_SERVER_LRS = flags.DEFINE_list(
    'server_learning_rates', None,
    'Server learning rates to try (comma list). Default: 10^-3 ... 10^1 in half decades.',
)
_HPARAM_GRID = flags.DEFINE_string(
    'hparam_grid', None,
    'A third axis: one more hyperparameter of --algo and its values, name:v1,v2,... (e.g.'
    ' proximal_strength:0.001,0.01,0.1,1, the FedProx paper\'s mu grid). The client x'
    ' server grid runs at each value, in <grid>/<name>=<value>/.',
)
_SCORE_ROUNDS = flags.DEFINE_integer(
    'score_rounds', analysis.metrics.GRID_SCORE_ROUNDS,
    'A cell scores the mean validation accuracy of its last this many rounds (of a'
    ' rung\'s rounds, when fewer).',
)
_SEARCH = flags.DEFINE_enum(
    'search', lr_grid.EXHAUSTIVE, [lr_grid.EXHAUSTIVE, lr_grid.HALVING],
    'exhaustive: every cell trains --total_rounds. halving: successive halving, every'
    f' cell trains the first of --rung_rounds, the best 1/{halving.ETA} of them continue'
    ' to the next, and so on; the pick is the best cell of the last rung.',
)
_RUNG_ROUNDS = flags.DEFINE_list(
    'rung_rounds', None,
    'With --search=halving: the rounds of each rung (increasing comma list; the last is'
    ' the rounds of the pick). Default: '
    + ', '.join(f'{f:g}' for f in halving.RUNG_FRACTIONS)
    + ' of --total_rounds, rounded up (10,20,50 for 50 rounds).',
)
_STABILITY_CHECK = flags.DEFINE_bool(
    'stability_check', True,
    'Re-run the best cell with another seed (--seed + 1) for the last rung\'s rounds; if'
    ' it diverges, pick its best adjacent cell whose re-run does not.',
)
for _name in ('task', 'algo', 'total_rounds', 'root_output_dir', 'experiment_name',
              'parallel', 'dry_run'):
  flags.declare_key_flag(_name)


def parse_learning_rates(name: str, values) -> tuple[float, ...]:
  """Positive, distinct floats from a comma list; the half-decade grid when None."""
  if values is None:
    return HALF_DECADES
  try:
    rates = tuple(float(v) for v in values)
  except ValueError:
    raise ValueError(f'--{name} must be a comma list of numbers, got {values}') from None
  if not rates or any(not (r > 0 and math.isfinite(r)) for r in rates):
    raise ValueError(f'--{name} must be positive numbers, got {values}')
  if len(set(rates)) != len(rates):
    raise ValueError(f'--{name} has repeated values: {values}')
  return rates


def parse_hparam_grid(text, algo: str) -> tuple[Optional[str], tuple]:
  """(name, values) of `--hparam_grid` ('name:v1,v2,...'); (None, (None,)) when unset.

  Raises:
    ValueError: (one line) for a malformed axis, a name `algo` does not take, a
      repeated value, or a value out of the hyperparameter's range.
  """
  if text is None:
    return None, (None,)
  name, sep, listed = text.partition(':')
  if not sep or not name or not listed:
    raise ValueError(f'--hparam_grid must be name:v1,v2,..., got {text!r}')
  spec = registry.get(algo)
  if name not in spec.hparams_class.names():
    raise ValueError(
        f'--hparam_grid: {name!r} is not a hyperparameter of --algo={algo}; its'
        f' hyperparameters are {sorted(spec.hparams_class.names())}'
    )
  if name in ('client_learning_rate', 'server_learning_rate'):
    raise ValueError(f'--hparam_grid: the grid sets {name}; give it with --{name}s')
  values = []
  for text_value in listed.split(','):
    try:  # The flag's own parser: numbers, True/False, text as on the command line.
      value = flags.FLAGS[name].parser.parse(text_value)
    except ValueError as e:
      raise ValueError(f'--hparam_grid: {name}={text_value!r}: {e}') from None
    values.append(spec.hparams(**{name: value}).as_dict()[name])
  values = tuple(values)
  if len(set(values)) != len(values):
    raise ValueError(f'--hparam_grid has repeated values: {listed}')
  return name, values


def axis_value_text(value) -> str:
  """A third axis' value in names and lines: numbers as %g, text and booleans as they are."""
  if isinstance(value, float):
    return f'{value:g}'
  return str(value)


def axis_dir(grid_dir: str, name: Optional[str], value) -> str:
  """The directory of the grid at one value of the third axis (`grid_dir` without one)."""
  if name is None:
    return grid_dir
  return os.path.join(grid_dir, f'{name}={axis_value_text(value)}')


def write_results(
    grid: lr_grid.Grid, index: int, search: lr_grid.Search, outcome: lr_grid.Outcome
) -> str:
  """Writes grid.csv, grid.md and grid_heatmap.png of `grid` (`run_search`'s `index`-th)
  from its group's outcome; returns the heatmap's path.

  A row per cell: the rounds of the last rung it trained at, its score there (NaN:
  failed: diverged before) and the rounds that score averages; with halving, its score
  at each rung too.
  """
  last = halving.last_scores(outcome.rungs)
  rows = []
  scores = np.full((len(grid.server_lrs), len(grid.client_lrs)), np.nan)
  for c, s in grid.cells:
    rounds, score = last[(index, c, s)]
    scores[grid.server_lrs.index(s), grid.client_lrs.index(c)] = score
    row = dict(client_learning_rate=c, server_learning_rate=s,
               status=runner.DIVERGED if halving.failed(score) else runner.FINISHED,
               rounds=rounds, score=score, score_rounds=search.scored_rounds(rounds))
    if search.kind == lr_grid.HALVING:
      row.update({f'score_at_{rung.rounds}': rung.scores.get((index, c, s), math.nan)
                  for rung in outcome.rungs})
    rows.append(dict(row, output_dir=grid.run((c, s), rounds).config.output_dir))
  analysis.write_csv(os.path.join(grid.directory, 'grid.csv'), rows)
  with open(os.path.join(grid.directory, 'grid.md'), 'w') as f:
    f.write(analysis.markdown_table(rows, [
        'client_learning_rate', 'server_learning_rate', 'status', 'rounds', 'score']))
  best = outcome.best
  highlight = None
  if best is not None and all(best.get(k) == v for k, v in grid.label.items()):
    highlight = (grid.server_lrs.index(best['server_learning_rate']),
                 grid.client_lrs.index(best['client_learning_rate']))
  config = grid.run(grid.cells[0], search.final_rounds).config
  path = os.path.join(grid.directory, 'grid_heatmap.png')
  where = ('each cell at the last rung it reached (grid.csv)' if search.kind == lr_grid.HALVING
           else f'{search.final_rounds} rounds')
  analysis.heatmap(
      scores, [f'{s:.3g}' for s in grid.server_lrs], [f'{c:.3g}' for c in grid.client_lrs],
      path, xlabel='client learning rate', ylabel='server learning rate',
      title=f'{config.algo} on {config.task}, {search.kind} search\nmean validation'
      f' accuracy of the last {search.score_rounds} rounds, {where}',
      colorbar_label='validation accuracy', highlight=highlight,
  )
  return path


def write_best(path: str, best: dict) -> None:
  """Writes the pick's record, its run directory relative to the file's folder."""
  record = dict(best, run_dir=os.path.relpath(best['run_dir'], os.path.dirname(path)))
  with open(path, 'w') as f:
    json.dump(record, f, indent=2)


def describe_pick(best: dict) -> str:
  """One line: the pick, its score and rounds, and a stability replacement if any."""
  text = (f'client {best["client_learning_rate"]:.3g}, server'
          f' {best["server_learning_rate"]:.3g}'
          + ''.join(f', {k} {axis_value_text(v)}'
                    for k, v in analysis.tuning.hparams_of(best).items()
                    if not k.endswith('learning_rate'))
          + f' (score {best["score"]:.4f}: mean of rounds'
          f' {best["total_rounds"] - best["score_rounds"] + 1}-{best["total_rounds"]})')
  stability = best.get('stability')
  if stability and stability['replaced']:
    old = stability['diverged_best']
    text += (f'; the best cell, client {old["client_learning_rate"]:.3g}, server'
             f' {old["server_learning_rate"]:.3g}, diverged with seed {stability["seed"]}'
             ' and was replaced by its best stable neighbour')
  return text


def search_from_flags() -> lr_grid.Search:
  """The search --search, --rung_rounds, --total_rounds, --score_rounds and
  --stability_check describe (--total_rounds defaults to the paper's 50 here)."""
  total = flags.FLAGS['total_rounds']
  final = total.value if total.present else DEFAULT_TOTAL_ROUNDS
  if _SEARCH.value == lr_grid.EXHAUSTIVE:
    if _RUNG_ROUNDS.value is not None:
      raise ValueError('--rung_rounds needs --search=halving')
    rungs = (final,)
  elif _RUNG_ROUNDS.value is None:
    rungs = halving.default_rung_rounds(final)
  else:
    try:
      rungs = tuple(int(r) for r in _RUNG_ROUNDS.value)
    except ValueError:
      raise ValueError(f'--rung_rounds must be a comma list of integers, got'
                       f' {",".join(_RUNG_ROUNDS.value)}') from None
    halving.check_rung_rounds(rungs)
    if total.present and rungs[-1] != final:
      raise ValueError(f'--rung_rounds ends at {rungs[-1]} rounds but --total_rounds is'
                       f' {final}; give one of them')
  if _SCORE_ROUNDS.value < 1:
    raise ValueError(f'--score_rounds must be >= 1, got {_SCORE_ROUNDS.value}')
  return lr_grid.Search(rung_rounds=rungs, score_rounds=_SCORE_ROUNDS.value,
                stability_check=_STABILITY_CHECK.value)


def grid_directory(root_output_dir: str, name: str) -> str:
  """`<root_output_dir>/<name>`, a grid's folder: the name checked as `launch.train` checks
  a run's, inside the root once links are followed, and new, empty or a grid's own.

  A grid replaces its grid.csv, grid.md, heatmap and best.json on every pass; a folder
  without the `logs/` folder a grid makes first is not one, and its files are not
  replaced.

  Raises:
    errors.ExperimentError: (one line) a bad name, or a folder that is not a grid's.
  """
  run_directory.check_name(name)
  path = os.path.join(root_output_dir, name)
  run_directory.check_inside(root_output_dir, path, 'a grid search writes only inside it')
  if os.path.isdir(path) and not os.path.isdir(os.path.join(path, LOGS_DIRNAME)):
    entries = sorted(os.listdir(path))
    if entries:
      raise errors.ExperimentError(
          f'{path} holds files no grid search wrote ({entries[0]!r}'
          f'{f" and {len(entries) - 1} more" if len(entries) > 1 else ""}); a grid'
          ' replaces only its own: choose another --experiment_name'
      )
  return path


def dry_run(grids: list[lr_grid.Grid], search: lr_grid.Search, grid_dir: str) -> float:
  """Prints the search's runs and rounds at most and their time here; returns the seconds."""
  planned = lr_grid.planned_runs(grids, search)
  print(f'dry run: {len(planned)} runs, {sum(p.rounds for p in planned)} rounds at most'
        ' (fewer cells go on when some diverge; a pick that diverges with another seed'
        ' adds a re-run of a neighbour):', flush=True)
  lines = {}  # What each run of a stage stands for -> its count and rounds.
  for p in planned:
    what = (p.note or 'every cell') if p.stage == 'grid' else f'{p.stage} re-run: {p.note}'
    lines.setdefault((p.stage, what), [0, p.rounds])[0] += 1
  for (stage, what), (runs, rounds) in lines.items():
    more = '+' if stage == 'grid' and what != 'every cell' else ''
    print(f'  {runs} run{"s" * (runs != 1)} of {more}{rounds} rounds: {what}')
  # The dry run's folder makes the grid's folder: `logs/` marks it as a grid's.
  os.makedirs(os.path.join(grid_dir, LOGS_DIRNAME), exist_ok=True)
  return calibration.estimate(planned, os.path.join(grid_dir, calibration.DRY_RUN_DIRNAME),
                              runner.PARALLEL.value, sys.stdout)


def _check_flags() -> None:
  for name in ('task', 'algo'):
    if flags.FLAGS[name].value is None:
      raise ValueError(f'--{name} is required')
  for name in ('client_learning_rate', 'server_learning_rate'):
    if flags.FLAGS[name].present:
      raise ValueError(f'the grid sets --{name}; give the values with --{name}s')
  algo = flags.FLAGS.algo
  # Said here, in the grid's terms: each cell would refuse the server rate it is given.
  if 'server_learning_rate' not in registry.get(algo).hparams_class.names():
    raise ValueError(
        f'--algo={algo} has no server learning rate and the grid search tunes client x'
        ' server rates; train it with launch.train or launch.compare at the client rates'
        ' to try'
    )


@failures.one_line_errors('grid_search')
def main(argv) -> int:
  del argv
  train.quiet_libraries()
  _check_flags()
  search = search_from_flags()
  client_lrs = parse_learning_rates('client_learning_rates', _CLIENT_LRS.value)
  server_lrs = parse_learning_rates('server_learning_rates', _SERVER_LRS.value)
  grid_dir = grid_directory(
      flags.FLAGS.root_output_dir,
      flags.FLAGS.experiment_name or f'grid_{flags.FLAGS.task}_{flags.FLAGS.algo}',
  )
  axis, values = parse_hparam_grid(_HPARAM_GRID.value, flags.FLAGS.algo)
  if axis is not None and flags.FLAGS[axis].present:
    raise ValueError(f'the grid sets --{axis}; give its values with --hparam_grid')
  grids = [
      lr_grid.Grid(directory=axis_dir(grid_dir, axis, value), client_lrs=client_lrs,
                   server_lrs=server_lrs, **({} if axis is None else dict(
                       overrides={axis: value}, label={axis: value},
                       prefix=f'{axis}{axis_value_text(value)}_')))  # Unique names (and logs).
      for value in values
  ]
  for grid in grids:  # Refuses bad settings before anything trains.
    grid.run(grid.cells[0], search.final_rounds)
  third = '' if axis is None else f' x {len(values)} {axis} values'
  cells = len(client_lrs) * len(server_lrs) * len(values)
  print(
      f'grid search: {flags.FLAGS.algo} on {flags.FLAGS.task}, {len(client_lrs)} client x'
      f' {len(server_lrs)} server learning rates{third}, {search.describe(cells)},'
      f' {runner.PARALLEL.value} at a time, in {grid_dir}', flush=True,
  )
  if calibration.DRY_RUN.value:
    dry_run(grids, search, grid_dir)
    return 0
  (outcome,) = lr_grid.run_search(grids, search, parallel=runner.PARALLEL.value,
                                  log_dir=os.path.join(grid_dir, LOGS_DIRNAME)).values()
  for index, grid in enumerate(grids):
    heatmap_path = write_results(grid, index, search, outcome)
    print(f'table: {os.path.join(grid.directory, "grid.csv")}\nheatmap: {heatmap_path}')
  best = outcome.best
  if best is None:
    why = ('every cell diverged' if outcome.stability is None or not outcome.stability.checked
           else 'the best cell and each of its neighbours diverged with another seed')
    print(f'best: none ({why})', flush=True)
    print(f'grid_search: error: {why}; try smaller learning rates', file=sys.stderr,
          flush=True)
    return failures.EXIT_DIVERGED
  write_best(os.path.join(grid_dir, 'best.json'), best)
  print(f'search: {best["cost"]["rounds"]} rounds trained,'
        f' {best["cost"]["seconds"]:.0f} s in rounds', flush=True)
  print(f'picked: {describe_pick(best)}', flush=True)
  print(
      f'best: --client_learning_rate={best["client_learning_rate"]!r}'
      f' --server_learning_rate={best["server_learning_rate"]!r}'
      + ('' if axis is None else f' {train.flag_argument(axis, best[axis])}')
      + f' (score {best["score"]:.4f})', flush=True,
  )
  return 0


if __name__ == '__main__':
  failures.run_program('grid_search', main)
