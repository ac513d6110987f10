"""`dry_run`: every run of a plan, their count, and what they cost here (per table, in
total), from the timing of each kind of run (`calibration`)."""

import dataclasses
import os
import sys

from launch.reproduce import plan as plan_lib
from launch.sweeps import calibration
from launch.sweeps import pool as pool_lib
import tasks


def _setting_key(plan: plan_lib.Plan, planned: calibration.PlannedRun) -> str:
  """The setting a run belongs to: its folder is <plan>/grid/<setting>/... or
  <plan>/runs/<setting>/...."""
  return os.path.relpath(planned.run.config.output_dir, plan.directory).split(os.sep)[1]


def dry_run(plan: plan_lib.Plan, pool: pool_lib.Pool, stream=None) -> dict:
  """Prints every run (grid cells, then comparison runs), the count and a time estimate
  of them in `pool`."""
  stream = stream or sys.stdout
  planned = plan_lib.planned_runs(plan)
  by_stage = {stage: [p for p in planned if p.stage == stage]
              for stage in ('grid', 'stability', 'comparison')}
  print(f'{plan.paper.name} at scale {plan.scale.name} ({plan.scale.description}), tables'
        f' {[t.number for t in plan.tables]}, data {plan.data_source}:', file=stream)
  if by_stage['grid']:
    cells = len(plan.grid_axes()[0]) * len(plan.grid_axes()[1])
    print(f'grid search: {len(by_stage["grid"])} runs at most ({plan.search().describe(cells)}'
          ' per grid)', file=stream)
    previous = None
    for p in by_stage['grid']:
      c = p.run.config
      if p.note:  # A later rung: one line for the cells it continues.
        if p.note != previous:
          print(f'  {c.task} {c.algo}, {p.note} (+{p.rounds} each)', file=stream)
        previous = p.note
        continue
      previous = None
      print(f'  {p.run.name}: {c.task} {c.algo} clr={c.hparams["client_learning_rate"]:.3g}'
            f' slr={c.hparams["server_learning_rate"]:.3g} rounds={c.total_rounds}'
            f' cohort={c.clients_per_round}', file=stream)
  if by_stage['stability']:
    print(f'stability: {len(by_stage["stability"])} runs at least (one per grid)',
          file=stream)
    for p in by_stage['stability']:
      c = p.run.config
      print(f'  {c.task} {c.algo}: {p.note}, seed={c.seed} rounds={p.rounds}'
            f' cohort={c.clients_per_round}', file=stream)
  comparison = [p.run for p in by_stage['comparison']]
  print(f'comparison: {len(comparison)} runs'
        + (' (learning rates from the grid search)' if by_stage['grid'] else ''), file=stream)
  for run in comparison:
    c = run.config
    print(f'  {run.name}: {c.task} {c.algo} seed={c.seed} rounds={c.total_rounds}'
          f' cohort={c.clients_per_round}', file=stream)
  counts = dict(grid=len(by_stage['grid']), stability=len(by_stage['stability']),
                comparison=len(comparison), total=len(planned),
                rounds=sum(p.rounds for p in planned))
  print(f'total: {len(planned)} runs ({len(by_stage["grid"])} grid,'
        f' {len(by_stage["stability"])} stability, {len(comparison)} comparison),'
        f' {sum(p.rounds for p in planned)} rounds', file=stream)
  directory = os.path.join(plan.directory, calibration.DRY_RUN_DIRNAME)
  parallel = pool.parallel
  if calibration.untimed([p.run for p in planned], directory, parallel):
    try:
      plan_lib.check_data(plan)
    except (tasks.MissingDataError, tasks.CorruptDataError) as e:
      # Its times are those of its own data: a stand-in's would mislead.
      print(f'estimated time: none, the plan\'s data cannot be read to time its runs'
            f' ({str(e).splitlines()[0]})', file=stream, flush=True)
      return dict(counts, seconds=None, tables={}, timings={})
  labels = {table.number: f'table {table.number}' for table in plan.tables}
  found = calibration.estimate(
      planned, directory, pool, stream,
      parts=[(labels[table.number],
              [p for p in planned if _setting_key(plan, p) in
               {setting.key for setting in table.settings}])
             for table in plan.tables],
      note=' (runs the tables share counted once)')
  return dict(counts, seconds=found.seconds,
              tables={number: found.parts[label] for number, label in labels.items()},
              timings={k: dataclasses.asdict(t) for k, t in found.timings.items()})
