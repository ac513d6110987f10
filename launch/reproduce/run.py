"""`launch.reproduce`'s program: grid search, comparison, report (see `__main__`)."""

import os
import sys
import time

from launch.cli import failures
from launch.cli import quiet
from launch.reproduce import estimate
from launch.reproduce import plan as plan_lib
from launch.reproduce import report
from launch.sweeps import calibration
from launch.sweeps import grid_outputs
from launch.sweeps import lr_grid
from launch.sweeps import runner
from launch.sweeps import pool as pool_lib
from tff_zmg import run_files


def reproduce(plan: plan_lib.Plan, pool: pool_lib.Pool, stream=None) -> str:
  """Grid search (if the paper tuned), comparison, report; returns report.md's path.
  One set of warm slots, `pool`'s, trains every run."""
  stream = stream or sys.stdout
  os.makedirs(plan.directory, exist_ok=True)
  log_dir = os.path.join(plan.directory, 'logs')
  start = time.monotonic()
  with runner.slots_for(pool, log_dir) as slots:
    best, heatmaps = _tune(plan, pool, log_dir, slots, stream)
    runs = plan_lib.comparison_runs(plan, best or None)
    print(f'reproduce {plan.paper.name}: comparison, {len(runs)} runs', file=stream,
          flush=True)
    # Each of another algorithm, seed or setting: no two share a build.
    runner.run_all(runs, pool=pool.alone(), log_dir=log_dir, stream=stream, slots=slots)
  path = report.write_report(plan, best, heatmaps, stream=stream)
  print(f'reproduce {plan.paper.name}: report {path} ({time.monotonic() - start:.0f} s)',
        file=stream, flush=True)
  return path


def _tune(plan: plan_lib.Plan, pool: pool_lib.Pool, log_dir: str, slots,
          stream) -> tuple[dict, dict]:
  """The grid searches where the paper tuned: (setting key, algo) -> the pick's record,
  and -> its grid's heatmap (both empty where it did not)."""
  grids = plan_lib.grid_groups(plan)
  best, heatmaps = {}, {}
  if not grids:
    return best, heatmaps
  search = plan.search()
  client_lrs, server_lrs, _ = plan.grid_axes()
  cells = len(client_lrs) * len(server_lrs)
  print(f'reproduce {plan.paper.name}: grid search, {cells * len(grids)} runs'
        f' ({len(grids)} grids of {len(client_lrs)} x {len(server_lrs)}), each'
        f' {search.describe(cells)}', file=stream, flush=True)
  outcomes = lr_grid.run_search(
      list(grids.values()), search, pool=pool, log_dir=log_dir, stream=stream,
      slots=slots)
  for index, ((key, algo), grid) in enumerate(grids.items()):
    outcome = outcomes[grid.group]
    heatmaps[(key, algo)] = grid_outputs.write_results(grid, index, search, outcome)
    if outcome.best is None:
      raise ValueError(
          f'no stable learning rates for {algo} on {key} ({grid.directory}): every cell'
          ' diverged, or the best and each of its neighbours diverged with another seed')
    grid_outputs.write_best(os.path.join(grid.directory, run_files.BEST), outcome.best)
    best[(key, algo)] = outcome.best
    print(f'reproduce: {key} {algo}: picked {grid_outputs.describe_pick(outcome.best)}',
          file=stream, flush=True)
  return best, heatmaps


@failures.one_line_errors('reproduce')
def main(argv) -> int:
  del argv
  quiet.quiet_libraries()
  pool = runner.pool_from_flags(batches=True)
  plan = plan_lib.plan_from_flags()
  if calibration.DRY_RUN.value:
    estimate.dry_run(plan, pool)
    return 0
  plan_lib.check_data(plan)
  path = reproduce(plan, pool)
  with open(path) as f:
    print(f.read())
  return 0
