"""`launch.reproduce`'s program: grid search, comparison, report (see `__main__`)."""

import os
import sys
import time

from absl import flags

from launch import failures
from launch import grid_search
from launch import runner
from launch import train
from launch.reproduce import estimate
from launch.reproduce import plan as plan_lib
from launch.reproduce import report

_DRY_RUN = flags.DEFINE_bool(
    'dry_run', False, 'List every run, their count and an estimated time; train nothing.'
)


def reproduce(plan: plan_lib.Plan, stream=None) -> str:
  """Grid search (if the paper tuned), comparison, report; returns report.md's path."""
  stream = stream or sys.stdout
  os.makedirs(plan.directory, exist_ok=True)
  log_dir = os.path.join(plan.directory, 'logs')
  start = time.monotonic()
  groups = plan_lib.grid_groups(plan)
  best, heatmaps = {}, {}
  if groups:
    cells = [run for _, group in groups.values() for run in group.values()]
    client_lrs, server_lrs, _, _ = plan.grid_axes()
    score_rounds = plan.paper.grid.score_rounds
    print(f'reproduce {plan.paper.name}: grid search, {len(cells)} runs'
          f' ({len(groups)} grids of {len(client_lrs)} x {len(server_lrs)})', file=stream,
          flush=True)
    states = runner.run_all(
        cells, parallel=runner.PARALLEL.value, log_dir=log_dir, stream=stream,
        describe=lambda run, s: f'score={grid_search.cell_score(run, s, score_rounds):.4f}',
    )
    for (key, algo), (grid_dir, group) in groups.items():
      best[(key, algo)], heatmaps[(key, algo)] = grid_search.write_results(
          grid_dir, group, states, client_lrs, server_lrs, score_rounds)
      if best[(key, algo)] is None:
        raise ValueError(f'every grid cell of {algo} on {key} diverged ({grid_dir}); no'
                         ' learning rates to compare with')
      print(f'reproduce: {key} {algo}: best client learning rate'
            f' {best[(key, algo)]["client_learning_rate"]:.3g}, server'
            f' {best[(key, algo)]["server_learning_rate"]:.3g}', file=stream, flush=True)
  runs = plan_lib.comparison_runs(plan, best if groups else None)
  print(f'reproduce {plan.paper.name}: comparison, {len(runs)} runs', file=stream, flush=True)
  runner.run_all(runs, parallel=runner.PARALLEL.value, log_dir=log_dir, stream=stream)
  path = report.write_report(plan, best, heatmaps, stream=stream)
  print(f'reproduce {plan.paper.name}: report {path} ({time.monotonic() - start:.0f} s)',
        file=stream, flush=True)
  return path


@failures.one_line_errors('reproduce')
def main(argv) -> int:
  del argv
  train.quiet_libraries()
  plan = plan_lib.make_plan()
  if _DRY_RUN.value:
    estimate.dry_run(plan)
    return 0
  plan_lib.check_data(plan)
  path = reproduce(plan)
  with open(path) as f:
    print(f.read())
  return 0
