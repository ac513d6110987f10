r"""Client x server learning-rate grid search: `python -m launch.grid_search --task=... --algo=...`.

The FedZMG paper's protocol (ALGORITHMS.md section 6): every pair of a 9 x 9 grid of
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

Each value's grid goes to `<grid>/<name>=<value>/` with its own grid.csv, grid.md, heatmap
and best.json; `<grid>/best.json` is the best cell over all values.

Each cell is an ordinary training run in `<root_output_dir>/<experiment_name>/<cell>/`
(experiment_name defaults to grid_<task>_<algo>), trained by its own `launch.train`
process, `--parallel` at a time; a cell's output is in `logs/<cell>.log` there.
Re-running the same command resumes an interrupted search: finished cells are not run
again, unfinished ones resume from their checkpoints. A diverging cell is recorded as
diverged (score NaN); --overwrite retrains every cell from scratch. Outputs, next to the
cells: grid.csv, grid.md, grid_heatmap.png and best.json (the best pair).

Exit status (launch/failures.py): 0 done, 1 an unexpected failure (a bug), 2 bad flags,
settings or data, 3 every cell diverged, 4 a TFF worker lost, 5 the machine refused (disk
full, permissions), 130 interrupted (Ctrl-C, SIGTERM, SIGHUP; re-run the same command to
resume); a cell failing otherwise passes on its own status.
Every failure is one line `grid_search: error: ...` on stderr; --verbose adds the traceback.
"""

import dataclasses
import json
import math
import os
import sys
from typing import Optional

from absl import flags
import numpy as np

from launch import failures
from launch import runner
from launch import train
from launch.papers import fedzmg as fedzmg_paper
from tff_zmg import analysis
from tff_zmg.algorithms import registry

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
    'A cell scores the mean validation accuracy of its last this many rounds.',
)
for _name in ('task', 'algo', 'total_rounds', 'root_output_dir', 'experiment_name',
              'parallel'):
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
  values = tuple(spec.hparams(**{name: v}).as_dict()[name] for v in listed.split(','))
  if len(set(values)) != len(values):
    raise ValueError(f'--hparam_grid has repeated values: {listed}')
  return name, values


def axis_dir(grid_dir: str, name: Optional[str], value) -> str:
  """The directory of the grid at one value of the third axis (`grid_dir` without one)."""
  return grid_dir if name is None else os.path.join(grid_dir, f'{name}={value:g}')


def cell_name(client_lr: float, server_lr: float) -> str:
  return f'clr{client_lr:.3g}_slr{server_lr:.3g}'


def cell_score(run: runner.Run, state: str, score_rounds: int) -> float:
  """The mean validation accuracy of the last rounds; NaN if diverged or not evaluated."""
  if state != runner.FINISHED:
    return math.nan
  try:
    rounds, acc = analysis.accuracy_series(run.config.output_dir)
  except (OSError, ValueError):
    return math.nan
  return analysis.mean_of_last_rounds(acc, rounds, score_rounds) if acc.size else math.nan


def _check_flags() -> None:
  for name in ('task', 'algo'):
    if flags.FLAGS[name].value is None:
      raise ValueError(f'--{name} is required')
  for name in ('client_learning_rate', 'server_learning_rate'):
    if flags.FLAGS[name].present:
      raise ValueError(f'the grid sets --{name}; give the values with --{name}s')
  if _SCORE_ROUNDS.value < 1:
    raise ValueError(f'--score_rounds must be >= 1, got {_SCORE_ROUNDS.value}')


def grid_runs(
    grid_dir: str, client_lrs, server_lrs, total_rounds: int, overrides=None,
) -> dict[tuple[float, float], runner.Run]:
  """(client lr, server lr) -> the cell's run in `<grid_dir>/<cell>/`, server-major order.

  `overrides` are further `launch.train` flags set on every cell (e.g. the task).
  """
  cells = {}
  for s in server_lrs:
    for c in client_lrs:
      cells[(c, s)] = runner.train_run(cell_name(c, s), {
          **(overrides or {}), 'root_output_dir': grid_dir, 'experiment_name': cell_name(c, s),
          'client_learning_rate': c, 'server_learning_rate': s, 'total_rounds': total_rounds,
      })
  return cells


def write_results(
    grid_dir: str, cells, states, client_lrs, server_lrs, score_rounds: int,
):
  """Writes grid.csv, grid.md, grid_heatmap.png and best.json (unless all diverged).

  Args:
    cells: `grid_runs`' dict; states: run name -> `runner` state.

  Returns:
    (best, heatmap path): best is the best.json dict, or None when every cell diverged.
  """
  rows = []
  scores = np.full((len(server_lrs), len(client_lrs)), np.nan)
  for (c, s), run in cells.items():
    score = cell_score(run, states[run.name], score_rounds)
    scores[server_lrs.index(s), client_lrs.index(c)] = score
    rows.append(dict(
        client_learning_rate=c, server_learning_rate=s, status=states[run.name],
        score=score, output_dir=run.config.output_dir,
    ))
  analysis.write_csv(os.path.join(grid_dir, 'grid.csv'), rows)
  with open(os.path.join(grid_dir, 'grid.md'), 'w') as f:
    f.write(analysis.markdown_table(rows, [
        'client_learning_rate', 'server_learning_rate', 'status', 'score']))
  config = next(iter(cells.values())).config
  best = None
  if np.isfinite(scores).any():
    i, j = np.unravel_index(np.nanargmax(scores), scores.shape)
    best = dict(
        task=config.task, algo=config.algo, client_learning_rate=client_lrs[j],
        server_learning_rate=server_lrs[i], score=float(scores[i, j]),
        score_rounds=score_rounds, total_rounds=config.total_rounds,
    )
    with open(os.path.join(grid_dir, 'best.json'), 'w') as f:
      json.dump(best, f, indent=2)
  heatmap_path = os.path.join(grid_dir, 'grid_heatmap.png')
  analysis.heatmap(
      scores, [f'{s:.3g}' for s in server_lrs], [f'{c:.3g}' for c in client_lrs],
      heatmap_path, xlabel='client learning rate', ylabel='server learning rate',
      title=f'{config.algo} on {config.task}, {config.total_rounds} rounds\nmean'
      f' validation accuracy of the last {score_rounds} rounds',
      colorbar_label='validation accuracy',
      highlight=None if best is None else (i, j),
  )
  return best, heatmap_path


@failures.one_line_errors('grid_search')
def main(argv) -> int:
  del argv
  train.quiet_libraries()
  _check_flags()
  client_lrs = parse_learning_rates('client_learning_rates', _CLIENT_LRS.value)
  server_lrs = parse_learning_rates('server_learning_rates', _SERVER_LRS.value)
  total_rounds = (
      flags.FLAGS.total_rounds if flags.FLAGS['total_rounds'].present
      else DEFAULT_TOTAL_ROUNDS
  )
  grid_dir = os.path.join(
      flags.FLAGS.root_output_dir,
      flags.FLAGS.experiment_name or f'grid_{flags.FLAGS.task}_{flags.FLAGS.algo}',
  )
  axis, values = parse_hparam_grid(_HPARAM_GRID.value, flags.FLAGS.algo)
  if axis is not None and flags.FLAGS[axis].present:
    raise ValueError(f'the grid sets --{axis}; give its values with --hparam_grid')
  grids = {}
  for value in values:
    cells = grid_runs(axis_dir(grid_dir, axis, value), client_lrs, server_lrs, total_rounds,
                      None if axis is None else {axis: value})
    if axis is not None:  # Names (and logs) unique across the values.
      cells = {lrs: dataclasses.replace(run, name=f'{axis}{value:g}_{run.name}')
               for lrs, run in cells.items()}
    grids[value] = cells
  third = '' if axis is None else f' x {len(values)} {axis} values'
  print(
      f'grid search: {flags.FLAGS.algo} on {flags.FLAGS.task}, {len(client_lrs)} client x'
      f' {len(server_lrs)} server learning rates{third}, {total_rounds} rounds per'
      f' cell, {runner.PARALLEL.value} at a time, in {grid_dir}', flush=True,
  )
  score_rounds = _SCORE_ROUNDS.value
  states = runner.run_all(
      [run for cells in grids.values() for run in cells.values()],
      parallel=runner.PARALLEL.value, log_dir=os.path.join(grid_dir, 'logs'),
      describe=lambda run, state: f'score={cell_score(run, state, score_rounds):.4f}',
  )
  best = None
  for value, cells in grids.items():
    found, heatmap_path = write_results(
        axis_dir(grid_dir, axis, value), cells, states, client_lrs, server_lrs, score_rounds)
    print(f'table: {os.path.join(axis_dir(grid_dir, axis, value), "grid.csv")}\n'
          f'heatmap: {heatmap_path}')
    if found is not None and axis is not None:
      found[axis] = value
    if found is not None and (best is None or found['score'] > best['score']):
      best = found
  if best is None:
    print('best: none (every cell diverged)', flush=True)
    print('grid_search: error: every cell diverged; try smaller learning rates',
          file=sys.stderr, flush=True)
    return failures.EXIT_DIVERGED
  if axis is not None:
    with open(os.path.join(grid_dir, 'best.json'), 'w') as f:
      json.dump(best, f, indent=2)
  print(
      f'best: --client_learning_rate={best["client_learning_rate"]!r}'
      f' --server_learning_rate={best["server_learning_rate"]!r}'
      + ('' if axis is None else f' --{axis}={best[axis]!r}')
      + f' (score {best["score"]:.4f})', flush=True,
  )
  return 0


if __name__ == '__main__':
  failures.run_program('grid_search', main)
