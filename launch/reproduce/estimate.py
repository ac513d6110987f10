"""How long a plan takes: round times read from earlier runs (or measured), and `dry_run`."""

import dataclasses
import os
import statistics
import sys
from typing import Optional

from absl import flags

from launch import experiment
from launch import runner
from launch.reproduce import plan as plan_lib
from launch.reproduce import scales
from tff_zmg import analysis


@dataclasses.dataclass(frozen=True)
class RoundTime:
  """Timings read from one run's metrics.csv (TFF's training and evaluation times)."""

  source: str
  train_s_per_client: float  # A later round's training time / its clients per round.
  eval_s: float  # A later round's evaluation time.
  startup_s: float  # The first round and first evaluation beyond a later round's.


def read_round_time(run_dir: str) -> Optional[RoundTime]:
  """The median later-round times of a finished run (None without two trained rounds)."""
  recorded = analysis.runs.read_flags(run_dir)
  csv_path = os.path.join(run_dir, analysis.runs.METRICS_FILENAME)
  train = experiment.read_metric(csv_path, 'training_time_in_seconds')
  evaluation = experiment.read_metric(csv_path, 'evaluation/evaluation_time_in_seconds')
  later = sorted(r for r in train if r >= 2)
  if not recorded or not later:
    return None
  steady_train = statistics.median(train[r] for r in later)
  steady_eval = statistics.median([evaluation[r] for r in later if r in evaluation] or [0.0])
  first = train.get(1, steady_train) + evaluation.get(0, steady_eval)
  return RoundTime(
      source=run_dir,
      train_s_per_client=steady_train / max(1, recorded.get('clients_per_round') or 1),
      eval_s=steady_eval,
      startup_s=max(0.0, first - steady_train - steady_eval),
  )


def find_round_time(roots, prefer=()) -> Optional[RoundTime]:
  """The timings of the newest finished run under the first root that has one.

  Runs whose recorded (task, model) is in `prefer` come first: a ResNet's round says
  little about a CNN's.
  """
  for root in roots:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
      dirnames[:] = [d for d in dirnames if d not in ('checkpoints', 'tensorboard',
                                                      'client_states', 'logs')]
      if analysis.runs.METRICS_FILENAME in filenames and 'flags.json' in filenames:
        recorded = analysis.runs.read_flags(dirpath) or {}
        found.append((
            (recorded.get('task'), recorded.get('model')) in prefer,
            os.path.getmtime(os.path.join(dirpath, 'metrics.csv')), dirpath,
        ))
    for _, _, run_dir in sorted(found, reverse=True):
      timing = read_round_time(run_dir)
      if timing is not None:
        return timing
  return None


def measure_round_time(plan: plan_lib.Plan, stream) -> RoundTime:
  """Trains 2 rounds of the paper's first algorithm at the ci scale on synthetic data.

  Synthetic, so that a dry run never needs the real data.
  """
  small = dataclasses.replace(plan, data_source='synthetic', scale=scales.SCALES['ci'])
  name = 'measure_round_time'
  run = runner.train_run(name, {
      **small.overrides(small.settings[0]), 'data_source': 'synthetic',
      'algo': plan.paper.algos[0], 'total_rounds': 2, 'experiment_name': name,
      'root_output_dir': os.path.join(plan.directory, 'dry_run'),
  })
  print('dry run: no earlier run to time; training 2 rounds of a small synthetic build to'
        ' measure a round ...', file=stream, flush=True)
  runner.run_all([run], parallel=1, log_dir=os.path.join(plan.directory, 'dry_run'),
                 stream=stream)
  timing = read_round_time(run.config.output_dir)
  if timing is None:
    raise ValueError(f'the timing run {run.config.output_dir} recorded no round times')
  return timing


def estimate_seconds(planned, timing: RoundTime, parallel: int) -> float:
  """sum over runs of (startup + rounds x (cohort x train per client + evaluation)) / parallel.

  `planned`: `plan.planned_runs`' entries; a grid cell continued to a later rung counts
  its start-up again and only its new rounds. Runs are assumed to go `parallel` at a
  time at the measured speed; a rough guide only: the real data's clients are larger
  than a small build's, and a process's TensorFlow import and first tracing beyond its
  first round are not counted.
  """
  total = sum(
      timing.startup_s + p.rounds * (
          p.run.config.clients_per_round * timing.train_s_per_client + timing.eval_s)
      for p in planned
  )
  return total / max(1, parallel)


def _duration(seconds: float) -> str:
  hours, rest = divmod(int(round(seconds)), 3600)
  return f'{hours} h {rest // 60:02d} min' if hours else f'{rest // 60} min {rest % 60:02d} s'


def dry_run(plan: plan_lib.Plan, stream=None) -> dict:
  """Prints every run (grid cells, then comparison runs), the count and a time estimate."""
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
  timing = find_round_time(
      (plan.directory, flags.FLAGS.root_output_dir),
      prefer={(r.config.task, r.config.model) for r in comparison})
  how = 'read from the earlier run'
  if timing is None:
    timing = measure_round_time(plan, stream)
    how = 'measured now on'
  seconds = estimate_seconds(planned, timing, runner.PARALLEL.value)
  print(f'total: {len(planned)} runs ({len(by_stage["grid"])} grid,'
        f' {len(by_stage["stability"])} stability, {len(comparison)} comparison),'
        f' {sum(p.rounds for p in planned)} rounds', file=stream)
  print(f'estimated time: {_duration(seconds)} at {runner.PARALLEL.value} at a time, from'
        f' round times {how} {timing.source} ({timing.train_s_per_client:.3g} s per client'
        f' per round, {timing.eval_s:.3g} s per evaluation, {timing.startup_s:.3g} s'
        ' start-up per run)', file=stream, flush=True)
  timed = analysis.runs.read_flags(timing.source) or {}
  if timed.get('data_source') != plan.data_source or timed.get('task') not in {
      plan.task(s) for s in plan.settings}:
    print(f'note: the timed run trained {timed.get("task")} on {timed.get("data_source")}'
          f' data, not this plan\'s {sorted({plan.task(s) for s in plan.settings})} on'
          f' {plan.data_source}: other models and real clients (larger than small synthetic'
          ' ones) take other times', file=stream, flush=True)
  return dict(grid=len(by_stage['grid']), stability=len(by_stage['stability']),
              comparison=len(comparison), total=len(planned),
              rounds=sum(p.rounds for p in planned), seconds=seconds,
              timing=dataclasses.asdict(timing))
