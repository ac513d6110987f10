"""A grid search's folder and what it writes there: grid.csv, grid.md and the heatmap of
each grid, best.json (the pick), the line that describes the pick, and the dry run's plan.

`launch.grid_search` writes them for its grid, `launch.reproduce` for each of a paper's grids.
"""

import json
import math
import os
import sys
from typing import Optional

import numpy as np

from launch.run import errors
from launch.run import run_directory
from launch.sweeps import calibration
from launch.sweeps import halving
from launch.sweeps import lr_grid
from launch.sweeps import runner
from launch.sweeps import pool as pool_lib
from tff_zmg import analysis


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
  if os.path.isdir(path) and not os.path.isdir(os.path.join(path, lr_grid.LOGS_DIRNAME)):
    entries = sorted(os.listdir(path))
    if entries:
      raise errors.ExperimentError(
          f'{path} holds files no grid search wrote ({entries[0]!r}'
          f'{f" and {len(entries) - 1} more" if len(entries) > 1 else ""}); a grid'
          ' replaces only its own: choose another --experiment_name'
      )
  return path


def dry_run(grids: list[lr_grid.Grid], search: lr_grid.Search, grid_dir: str,
            pool: pool_lib.Pool) -> float:
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
  os.makedirs(os.path.join(grid_dir, lr_grid.LOGS_DIRNAME), exist_ok=True)
  return calibration.estimate(
      planned, os.path.join(grid_dir, calibration.DRY_RUN_DIRNAME), pool, sys.stdout).seconds
