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
(experiment_name defaults to grid_<task>_<algo>), trained as `launch.train` would train it,
to the bit, by warm slot processes (`launch.sweeps.warm_slot`): `--parallel` of them on
this machine, or Ray actors with --ray_address, each training one cell after another and
paying once for what cells share (imports, data, the process's build). A cell's output is
in `logs/<cell>.log` there, under the `launch.train` command that trains it alone.
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

Exit status: as every program's (docs/operations.md, "Exit statuses"); 3 here means
that every cell diverged, or the pick and all its neighbours did with another seed; a cell
failing otherwise passes on its own status.
"""

import math
import os
import sys
from typing import Optional

from absl import flags

from launch.cli import exit_status
from launch.cli import failures
from launch.cli import quiet
from launch.papers import fedzmg as fedzmg_paper
from launch.run import settings as run_settings
from launch.sweeps import calibration
from launch.sweeps import grid_outputs
from launch.sweeps import halving
from launch.sweeps import lr_grid
from launch.sweeps import runner
from launch.sweeps import pool as pool_lib
from tff_zmg.algorithms import registry
from tff_zmg import analysis
from tff_zmg import run_files

# The FedZMG paper's grid: 10^-3 ... 10^1 in half decades, 50 rounds per cell.
HALF_DECADES = fedzmg_paper.HALF_DECADES
DEFAULT_TOTAL_ROUNDS = fedzmg_paper.GRID.total_rounds

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
              'parallel', 'batch_cells', 'dry_run'):
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


def _check_flags(base: run_settings.Settings) -> None:
  if base.values['task'] is None:
    raise ValueError('--task is required')
  if base.values['algo'] is None:
    raise ValueError('--algo is required (or --client_rule with --server_rule)')
  for name in ('client_learning_rate', 'server_learning_rate'):
    if name in base.given:
      raise ValueError(f'the grid sets --{name}; give the values with --{name}s')
  algo = base.values['algo']
  # Said here, in the grid's terms: each cell would refuse the server rate it is given.
  if 'server_learning_rate' not in registry.get(algo).hparams_class.names():
    raise ValueError(
        f'--algo={algo} has no server learning rate and the grid search tunes client x'
        ' server rates; train it with launch.train or launch.compare at the client rates'
        ' to try'
    )


def _grids(base: run_settings.Settings, search: lr_grid.Search,
           pool: pool_lib.Pool) -> tuple[str, Optional[str], list[lr_grid.Grid]]:
  """The grid folder, the third axis' name (None without one) and a grid per value of it,
  each checked by making its first cell's run (bad settings are refused before any run);
  says in one line what the search is."""
  client_lrs = parse_learning_rates('client_learning_rates', _CLIENT_LRS.value)
  server_lrs = parse_learning_rates('server_learning_rates', _SERVER_LRS.value)
  task, algo = base.values['task'], base.values['algo']
  grid_dir = grid_outputs.grid_directory(
      base.values['root_output_dir'],
      base.values['experiment_name'] or f'grid_{task}_{algo}',
  )
  axis, values = parse_hparam_grid(_HPARAM_GRID.value, algo)
  if axis is not None and axis in base.given:
    raise ValueError(f'the grid sets --{axis}; give its values with --hparam_grid')
  grids = [
      lr_grid.Grid(directory=grid_outputs.axis_dir(grid_dir, axis, value), base=base,
                   client_lrs=client_lrs, server_lrs=server_lrs,
                   score_rounds=search.score_rounds,
                   **({} if axis is None else dict(
                       overrides={axis: value}, label={axis: value},
                       # Unique names (and logs).
                       prefix=f'{axis}{grid_outputs.axis_value_text(value)}_')))
      for value in values
  ]
  for grid in grids:
    grid.run(grid.cells[0], search.final_rounds)
  third = '' if axis is None else f' x {len(values)} {axis} values'
  cells = len(client_lrs) * len(server_lrs) * len(values)
  print(
      f'grid search: {algo} on {task}, {len(client_lrs)} client x'
      f' {len(server_lrs)} server learning rates{third}, {search.describe(cells)},'
      f' {pool.parallel} at a time, in {grid_dir}', flush=True,
  )
  return grid_dir, axis, grids


def _write_pick(grid_dir: str, axis: Optional[str], best: dict) -> None:
  """best.json, and the lines that say the search's cost, its pick and the pick's flags."""
  grid_outputs.write_best(os.path.join(grid_dir, run_files.BEST), best)
  print(f'search: {best["cost"]["rounds"]} rounds trained,'
        f' {best["cost"]["seconds"]:.0f} s in rounds', flush=True)
  print(f'picked: {grid_outputs.describe_pick(best)}', flush=True)
  print(
      f'best: --client_learning_rate={best["client_learning_rate"]!r}'
      f' --server_learning_rate={best["server_learning_rate"]!r}'
      + ('' if axis is None else f' {run_settings.flag_argument(axis, best[axis])}')
      + f' (score {best["score"]:.4f})', flush=True,
  )


@failures.one_line_errors('grid_search')
def main(argv) -> int:
  del argv
  quiet.quiet_libraries()
  base = run_settings.settings_from_flags()
  _check_flags(base)
  pool = runner.pool_from_flags(batches=True)
  search = search_from_flags()
  grid_dir, axis, grids = _grids(base, search, pool)
  if calibration.DRY_RUN.value:
    grid_outputs.dry_run(grids, search, grid_dir, pool)
    return 0
  (outcome,) = lr_grid.run_search(grids, search, pool=pool,
                                  log_dir=os.path.join(grid_dir, lr_grid.LOGS_DIRNAME)).values()
  for index, grid in enumerate(grids):
    heatmap_path = grid_outputs.write_results(grid, index, search, outcome)
    print(f'table: {os.path.join(grid.directory, "grid.csv")}\nheatmap: {heatmap_path}')
  if outcome.best is None:
    why = ('every cell diverged' if outcome.stability is None or not outcome.stability.checked
           else 'the best cell and each of its neighbours diverged with another seed')
    print(f'best: none ({why})', flush=True)
    print(f'grid_search: error: {why}; try smaller learning rates', file=sys.stderr,
          flush=True)
    return exit_status.DIVERGED
  _write_pick(grid_dir, axis, outcome.best)
  return 0


if __name__ == '__main__':
  failures.run_program('grid_search', main)
