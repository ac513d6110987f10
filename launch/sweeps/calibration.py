"""What planned runs cost here: a short timed run per kind of run, and the estimate.

The dry runs of `launch.grid_search`, `launch.compare` and `launch.reproduce` (--dry_run)
list their runs as `PlannedRun`s and estimate them here.

Runs of one kind (`kind_of`: the same task, model, data, cohort, local work, evaluation and
runtime, and an algorithm of the same client rule) cost the same per round. The runs go to
warm slots (`runner`), which start once and build once what runs of one build share
(`runner.build_key`). Fresh warm slots are timed until they are ready (imports), then
each kind by three 3-round runs of the planned runs' own settings (its data, cohort and
first algorithm of the kind) in turn: the first at the run's seed, then two at the next
seed (a build of its own). They give

  slot      = a slot's start until it is ready (`Timing.worker_s`)
  first     = the first run's time - the second's  (what a slot's first run of the kind
              pays once: the first kind timed, what a slot's first run pays at all)
  build     = the second run's time - the third's  (task, process and evaluation)
  start-up  = the third run's time - 3 x round - 4 x evaluation  (its folder, its state)
  round     = the median training time of rounds 2-3
  evaluation = the median evaluation time of rounds 1-3 (round 0's traces it)
  step, fixed = the line seconds = fixed + steps x step fitted to rounds 2-3 of all
              three runs (their steps: the batches their clients trained, metrics.csv's
              client_work/train/num_batches), by least squares (`round_cost`)

A round trains the steps of the cohort it samples, and where clients' sizes are skewed
the few timed rounds can be far from the mean (real Shakespeare: rounds of 10 clients
expected to train 589 sequences, timed ones that trained 338 and 288). So a round is
charged fixed + its expected steps x step (`Timing.expected_round_s`): the mean over the
cohorts it may sample of the sum of its clients' steps, from the training clients' sizes,
local epochs, cap on examples and batch size, read from the data before training
(`round_work`, `tasks.client_work`); with the standard deviation of that sum, the
spread the sampling brings. (A run whose rounds record no steps is charged the median
round.) The fixed part is real: rounds of 10 skewed Shakespeare clients here took 12-18 s
more than their steps' share (20-round runs, a line fitted to each), and a step's cost
taken as the timed rounds' seconds over their steps, with the timed cohorts larger than
the mean, charged 0.61-0.76x the measured rounds. The timed rounds sample four cohorts
only, so the line is a rough one; the slope is kept within [0, their seconds over their
steps], so neither part is negative.

Runs are estimated at (their sum, over N slots):

  slots x slot + sum over kinds of min(N, its runs) x first + builds x build
    + sum over runs of (start-up + R x round + E x evaluation)

for R rounds left and E evaluations left of each run, the slots being min(N, runs) (a
slot trains runs of every kind) and a build each slot's first run of a build key (N
slots share a key's runs: min(N, its runs) builds; a stateful algorithm's runs each
build). With --parallel=N the runs go N at a time on shared cores, so a kind is timed by N
slots at once (each value their median): a round of two runs sharing two cores is slower
than one run's. Timings are kept in `calibration.json` in the program's dry_run folder, per
N, and reused by every later dry run.
"""

import collections
import dataclasses
import hashlib
import json
import math
import os
import statistics
import time
from typing import Optional, Sequence

from absl import flags
import numpy as np

from launch.run import resumption
from launch.run import rounds
from launch.run import run_config
from launch.run import run_directory
from launch.sweeps import runner
from launch.sweeps import pool as pool_lib
import tasks
from tasks import client_work
from tff_zmg import analysis
from tff_zmg.algorithms import registry
from tff_zmg import run_files

CALIBRATION_ROUNDS = 3
CALIBRATION_FILENAME = 'calibration.json'
DRY_RUN_DIRNAME = 'dry_run'
# Settings that do not change what a round costs (or are set per calibration run).
_COST_FREE = frozenset({
    'algo', 'hparams', 'seed', 'experiment_name', 'root_output_dir', 'total_rounds',
    'overwrite', 'rounds_per_checkpoint', 'rounds_per_eval', 'eval_last_rounds',
    'partition_seed', 'divergence_factor',
})


DRY_RUN = flags.DEFINE_bool(
    'dry_run', False,
    'List the runs, their count and the time they take here; train none of them, only three'
    f' {CALIBRATION_ROUNDS}-round timing runs of each kind of run not timed before, in turn'
    ' in fresh warm slots (kept in'
    f' {DRY_RUN_DIRNAME}/{CALIBRATION_FILENAME} in the output folder and reused).'
)


@dataclasses.dataclass(frozen=True)
class PlannedRun:
  """One run to train, or one rung of a grid cell continued from the rung before.

  Attributes:
    stage: 'grid', 'stability' or 'comparison'.
    run: The run. Which cells reach a later rung, and which cell is re-run for
      stability, the earlier scores decide: there it stands for any of them.
    rounds: The rounds it trains in this stage (a promoted cell: those beyond the rung
      before).
    note: Where `run` stands for a cell chosen later: which and how many.
  """

  stage: str
  run: runner.Run
  rounds: int
  note: str = ''


@dataclasses.dataclass(frozen=True)
class Timing:
  """Seconds of one kind of run (the module's): its build in a warm slot, a run's
  start-up in a warm slot, a training round, an evaluation, a slot's first run of
  the kind, and a warm slot's start; and, where the timed rounds' steps are known, a
  step and a round's fixed part (`round_cost`), with a round's steps over the cohorts it
  may sample (mean, standard deviation)."""

  startup_s: float
  round_s: float
  evaluation_s: float
  source: str  # The timed run's folder.
  build_s: float = 0.0
  first_s: float = 0.0
  worker_s: float = 0.0
  step_s: Optional[float] = None
  round_fixed_s: float = 0.0
  round_steps: Optional[float] = None
  round_steps_std: Optional[float] = None
  timed_steps: tuple[float, ...] = ()  # The steps of the timed rounds.

  @property
  def by_steps(self) -> bool:
    return self.step_s is not None and self.round_steps is not None

  @property
  def expected_round_s(self) -> float:
    """A round's seconds: its fixed part + its expected steps x a step's, or the timed
    rounds' median."""
    if not self.by_steps:
      return self.round_s
    return self.round_fixed_s + self.step_s * self.round_steps

  @property
  def round_spread_s(self) -> float:
    """The standard deviation of a round's seconds over the cohorts it may sample."""
    return self.step_s * self.round_steps_std if self.by_steps else 0.0


def kind_of(config: run_config.ExperimentConfig) -> str:
  """A short name of what a run's round costs: its settings but the free ones, and
  its algorithm's client rule (FedAvg and FedAdam cost alike; FedZMG's rule differs)."""
  spec = registry.get(config.algo)
  settings = {k: v for k, v in config.recorded().items() if k not in _COST_FREE}
  settings['client_rule'] = (spec.client_rule, spec.stateful, spec.full_gradient_pass)
  digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode())
  return f'{config.task}-{spec.client_rule}-{digest.hexdigest()[:10]}'


def evaluations(config: run_config.ExperimentConfig, first_round: int) -> int:
  """How many evaluations rounds first_round..total_rounds make (round 0 evaluates)."""
  return sum(1 for r in range(first_round, config.total_rounds + 1)
             if rounds.evaluation_due(config, r))


def rounds_to_train(planned: PlannedRun) -> int:
  """The rounds of `planned` its metrics.csv does not hold yet (all of them with
  --overwrite, which trains the run afresh)."""
  config = planned.run.config
  done = 0 if config.overwrite else resumption.rounds_done(config)
  return max(0, config.total_rounds - max(done, config.total_rounds - planned.rounds))


def estimate_planned(planned: PlannedRun, timings: dict[str, Timing]) -> float:
  """Seconds of one planned run (`planned.rounds` rounds up to its config's total) in a
  warm slot that has built it: start-up + rounds left x round (`Timing.expected_round_s`)
  + evaluations left x evaluation, 0 when its metrics.csv already holds them."""
  config = planned.run.config
  timing = timings[kind_of(config)]
  rounds = rounds_to_train(planned)
  if not rounds:
    return 0.0
  start = config.total_rounds - rounds
  return (timing.startup_s + rounds * timing.expected_round_s
          + evaluations(config, start + 1 if start else 0) * timing.evaluation_s)


def steady_rounds(run_dir: str) -> list[tuple[float, float]]:
  """(steps, seconds) of each round from 2 on of a calibration run's metrics.csv that
  records both (`client_work/train/num_batches`: every client's steps, summed)."""
  csv_path = os.path.join(run_dir, run_files.METRICS)
  train = analysis.runs.metric_by_round(csv_path, 'training_time_in_seconds')
  steps = analysis.runs.metric_by_round(csv_path, 'client_work/train/num_batches')
  return [(steps[r], train[r]) for r in sorted(train) if r >= 2 and r in steps]


def round_cost(rounds: Sequence[tuple[float, float]]) -> Optional[tuple[float, float]]:
  """(fixed, step): the line seconds = fixed + steps x step through the timed rounds'
  (steps, seconds), by least squares, its slope kept within [0, mean seconds / mean steps]
  (neither part negative); where the steps do not vary, no fixed part. None without
  steps."""
  if not rounds or sum(s for s, _ in rounds) <= 0:
    return None
  steps, seconds = np.array(rounds, dtype=np.float64).T
  ratio = seconds.mean() / steps.mean()
  if np.ptp(steps) == 0:
    return 0.0, ratio
  slope = np.cov(steps, seconds, bias=True)[0, 1] / steps.var()
  slope = min(max(slope, 0.0), ratio)
  return float(seconds.mean() - slope * steps.mean()), float(slope)


def round_work(config: run_config.ExperimentConfig) -> tuple[float, float]:
  """The mean and standard deviation of the steps of a round of `config`'s runs over the
  cohorts it may sample, from its training clients' sizes (`tasks.client_work`)."""
  examples, inputs = tasks.training_volumes(
      config.task, data_source=config.data_source, cache_dir=config.cache_dir,
      synthetic_settings=config.synthetic_settings, partition=config.partition,
      dirichlet_alpha=config.dirichlet_alpha, num_clients=config.num_clients,
      partition_seed=config.partition_seed,
  )
  steps = client_work.client_steps(
      examples, inputs, config.client_epochs_per_round,
      config.client_batch_size or tasks.SPECS[config.task].batch_size,
      config.max_elements_per_client,
  )
  return client_work.round_steps(steps, config.clients_per_round)


def read_timing(run_dir: str, wall_s: float) -> Optional[Timing]:
  """The timing of a finished calibration run (None without its rounds)."""
  csv_path = os.path.join(run_dir, run_files.METRICS)
  train = analysis.runs.metric_by_round(csv_path, 'training_time_in_seconds')
  evaluation = analysis.runs.metric_by_round(csv_path, 'evaluation/evaluation_time_in_seconds')
  steady = [train[r] for r in sorted(train) if r >= 2]
  later_evaluations = [evaluation[r] for r in sorted(evaluation) if r >= 1]
  if not steady or not later_evaluations:
    return None
  round_s = statistics.median(steady)
  evaluation_s = statistics.median(later_evaluations)
  startup_s = wall_s - len(train) * round_s - len(evaluation) * evaluation_s
  return Timing(startup_s=max(0.0, startup_s), round_s=round_s, evaluation_s=evaluation_s,
                source=run_dir)


def builds(to_train: Sequence[PlannedRun], parallel: int) -> dict[str, int]:
  """kind -> the warm slots' builds of `to_train` (planned runs with rounds to train):
  each build key's runs spread over at most `parallel` slots, which build it once each
  (a stateful algorithm's run, whose rates its state does not hold, builds at each)."""
  runs_of = collections.Counter()
  for p in to_train:
    config = p.run.config
    key = runner.build_key(config)
    if registry.get(config.algo).stateful:
      key += json.dumps(config.recorded()['hparams'], sort_keys=True)
    runs_of[kind_of(config), key] += 1
  out = {}
  for (kind, _), count in runs_of.items():
    out[kind] = out.get(kind, 0) + min(parallel, count)
  return out


def estimate_seconds(planned: Sequence[PlannedRun], timings: dict[str, Timing],
                     parallel: int) -> float:
  """Wall seconds of `planned` by `parallel` warm slots (the module's formula)."""
  to_train = [p for p in planned if rounds_to_train(p)]
  runs = sum(estimate_planned(p, timings) for p in to_train)
  built = sum(timings[kind].build_s * count for kind, count in builds(to_train, parallel).items())
  runs_of_kind = collections.Counter(kind_of(p.run.config) for p in to_train)
  firsts = sum(timings[kind].first_s * min(parallel, count)
               for kind, count in runs_of_kind.items())
  worker_s = max((timings[kind].worker_s for kind in runs_of_kind), default=0.0)
  return (runs + built + firsts + min(parallel, len(to_train)) * worker_s) / parallel


def spread_seconds(planned: Sequence[PlannedRun], timings: dict[str, Timing],
                   parallel: int) -> float:
  """The standard deviation of `estimate_seconds` that the clients each round samples
  bring: rounds independent, sqrt(sum over rounds of a round's variance) / parallel."""
  variance = sum(rounds_to_train(p) * timings[kind_of(p.run.config)].round_spread_s**2
                 for p in planned)
  return math.sqrt(variance) / parallel


def estimate_text(seconds: float, spread_s: float, parallel: int) -> str:
  """'<duration> at N at a time', with the sampling's spread where there is one."""
  spread = (f' (± {runner.duration_text(spread_s)} with the clients sampled)'
            if spread_s >= 0.5 else '')
  return f'{runner.duration_text(seconds)}{spread} at {parallel} at a time'


def _calibration_run(run: runner.Run, directory: str, name: str, seed: int) -> runner.Run:
  """`run`'s settings at `seed`, 3 rounds, evaluated each round, in `directory/name`, at
  the algorithm's (or its protocol's) rates: a grid's corner cell may diverge before it
  is timed."""
  changes = dict(total_rounds=CALIBRATION_ROUNDS, rounds_per_eval=1, experiment_name=name,
                 root_output_dir=directory, overwrite=True, seed=seed,
                 client_learning_rate=None, server_learning_rate=None)
  return runner.Run(name=f'calibrate-{name}', settings=run.settings.replace(changes))


def timing_key(kind: str, parallel: int) -> str:
  """calibration.json's name of a kind's timing by warm slots, `parallel` at a time
  (older timings are not used: those whose build includes the slot's start, and those
  with no step's cost, which charged every round the timed ones' median)."""
  at_once = '' if parallel == 1 else f' x{parallel}'
  # The words of older calibration.json files, which are read again (a key, not prose).
  return f'{kind} by warm workers, per step{at_once}'


def _stored(directory: str) -> dict[str, Timing]:
  path = os.path.join(directory, CALIBRATION_FILENAME)
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return {key: Timing(**dict(values, timed_steps=tuple(values.get('timed_steps', ()))))
            for key, values in json.load(f).items()}


def untimed(runs: Sequence[runner.Run], directory: str, parallel: int) -> set[str]:
  """The kinds of `runs` that `directory`'s calibration.json has no timing of at
  `parallel` runs at a time."""
  stored = _stored(directory)
  return {kind for kind in map(kind_of, (run.config for run in runs))
          if timing_key(kind, parallel) not in stored}


def calibrate(runs: Sequence[runner.Run], directory: str, stream,
              pool: pool_lib.Pool) -> dict[str, Timing]:
  """{kind: Timing} of every kind of `runs` with `pool.parallel` runs at a time: kept ones
  from `directory`'s calibration.json, the others timed now, one kind after another, by
  that many fresh warm slots of `pool` at once, each training three 3-round copies in
  turn, one at a time (`say_if_batched`)."""
  parallel = pool.parallel
  stored = _stored(directory)
  first_of_kind = {}
  for run in runs:
    first_of_kind.setdefault(kind_of(run.config), run)
  timings = {kind: stored[timing_key(kind, parallel)] for kind in first_of_kind
             if timing_key(kind, parallel) in stored}
  to_time = {kind: run for kind, run in first_of_kind.items() if kind not in timings}
  if not to_time:
    return timings
  log_dir = os.path.join(directory, 'logs')
  alone = pool.alone()
  with runner.slots_for(alone, log_dir) as slots:
    start = time.monotonic()
    slots.start_all(parallel)
    worker_s = time.monotonic() - start
    for kind, run in to_time.items():
      timings[kind] = stored[timing_key(kind, parallel)] = _time_kind(
          kind, run, directory, slots, alone, stream, worker_s)
      run_directory.write_json_atomically(
          os.path.join(directory, CALIBRATION_FILENAME),
          {k: dataclasses.asdict(t) for k, t in stored.items()})
  return timings


def _time_kind(kind: str, run: runner.Run, directory: str, slots, pool: pool_lib.Pool,
               stream, worker_s: float) -> Timing:
  """The Timing of `kind` by `slots` (`pool`'s), which started in `worker_s` (the
  module's)."""
  parallel = pool.parallel
  seeds = dict(first=run.config.seed, built=run.config.seed + 1, warm=run.config.seed + 1)
  batches = [[_calibration_run(run, directory, f'{kind}-{turn}-{i}', seed)
              for i in range(parallel)] for turn, seed in seeds.items()]
  at_once = f', {parallel} slots at once as the runs will go' if parallel > 1 else ''
  print(f'dry run: timing {CALIBRATION_ROUNDS} rounds of {run.config.task}'
        f' {run.config.algo} (cohort {run.config.clients_per_round}) three times in a'
        f' warm slot{at_once} ...', file=stream, flush=True)
  walls = []
  for batch in batches:
    # The copies of a batch start together and do the same work: each took the whole.
    start = time.monotonic()
    runner.run_all(batch, pool=pool, log_dir=os.path.join(directory, 'logs'),
                   stream=stream, slots=slots)
    walls.append(time.monotonic() - start)
  measured = [read_timing(copy.config.output_dir, walls[2]) for copy in batches[2]]
  if None in measured:
    raise ValueError(f'the timing run {batches[2][0].config.output_dir} recorded no round'
                     ' times')
  # Every copy's steady rounds: two seeds, so two cohorts' worth of steps.
  rounds = [r for batch in batches for copy in batch
            for r in steady_rounds(copy.config.output_dir)]
  fixed_s, step_s = round_cost(rounds) or (0.0, None)
  steps, steps_std = round_work(run.config) if step_s is not None else (None, None)
  return Timing(
      startup_s=statistics.median(t.startup_s for t in measured),
      round_s=statistics.median(t.round_s for t in measured),
      evaluation_s=statistics.median(t.evaluation_s for t in measured),
      source=measured[0].source, build_s=max(0.0, walls[1] - walls[2]),
      first_s=max(0.0, walls[0] - walls[1]), worker_s=worker_s, step_s=step_s,
      round_fixed_s=fixed_s, round_steps=steps, round_steps_std=steps_std,
      timed_steps=tuple(s for s, _ in rounds))


def print_timings(timings: dict[str, Timing], planned: Sequence[PlannedRun], parallel: int,
                  stream) -> None:
  """One line per kind of the planned runs: its build, start-up, round, evaluation, a
  slot's first run of it, and a warm slot's start, in seconds."""
  at_once = f', {parallel} at once' if parallel > 1 else ''
  print('timings (a build in a warm slot, a run\'s start-up, training round, evaluation,'
        ' a slot\'s first run of the kind, a warm slot\'s start) of each kind of run,'
        ' measured on this machine by'
        f' {CALIBRATION_ROUNDS}-round runs of its settings{at_once}:', file=stream)
  kinds = {kind_of(p.run.config) for p in planned}
  for kind, timing in timings.items():
    if kind in kinds:
      print(f'  {kind}: {timing.build_s:.1f} s, {timing.startup_s:.1f} s,'
            f' {timing.round_s:.2f} s, {timing.evaluation_s:.2f} s, {timing.first_s:.1f} s,'
            f' {timing.worker_s:.1f} s'
            f' ({timing.source})',
            file=stream)
      if timing.by_steps:
        print(f'    {round_text(timing)}', file=stream)


def round_text(timing: Timing) -> str:
  """One line: what a round of the kind is charged, from its steps, and their spread."""
  timed = sorted(timing.timed_steps)
  return (f'a round: {timing.round_fixed_s:.3g} s + {timing.round_steps:.0f}'
          f' ± {timing.round_steps_std:.0f} steps (mean ± std over the cohorts it may'
          f' sample) x {timing.step_s:.3g} s'
          f' = {timing.expected_round_s:.2f} ± {timing.round_spread_s:.2f} s'
          f' (the timed rounds: {timed[0]:.0f}-{timed[-1]:.0f} steps, median'
          f' {timing.round_s:.2f} s)')


def say_if_batched(batch_cells: int, stream) -> None:
  """One line when cells will train batched: the estimate times them one at a time."""
  if batch_cells > 1:
    print(f'--batch_cells={batch_cells}: the estimate times the cells one at a time; batched,'
          ' 9 cells took 1.28x that time on a 2-core CPU (docs/performance.md, "Batched'
          ' cells")', file=stream, flush=True)


@dataclasses.dataclass(frozen=True)
class Estimate:
  """What `estimate` found: the wall seconds of all the runs, of each part, and the timings
  they came from."""
  seconds: float
  parts: dict
  timings: dict[str, Timing]


def estimate(planned: Sequence[PlannedRun], directory: str, pool: pool_lib.Pool,
             stream, parts: Sequence[tuple[str, Sequence[PlannedRun]]] = (),
             note: str = '') -> Estimate:
  """Wall seconds of `planned` at `pool.parallel` at a time, each kind timed first if
  `directory` has no timing of it (`calibrate`); prints the timings, a line per part
  (label, its runs) and the estimate, followed by `note`."""
  parallel = pool.parallel
  timings = calibrate([p.run for p in planned], directory, stream, pool)
  seconds = estimate_seconds(planned, timings, parallel)
  print_timings(timings, planned, parallel, stream)
  part_seconds = {}
  for label, runs in parts:
    part_seconds[label] = estimate_seconds(runs, timings, parallel)
    print(f'{label}: {runner.duration_text(part_seconds[label])}', file=stream)
  spread = spread_seconds(planned, timings, parallel)
  print(f'estimated time: {estimate_text(seconds, spread, parallel)}{note}', file=stream,
        flush=True)
  say_if_batched(pool.batch_cells, stream)
  return Estimate(seconds, part_seconds, timings)


def estimate_runs(runs: Sequence[runner.Run], directory: str, pool: pool_lib.Pool,
                  stream) -> float:
  """`estimate` of the runs still to train (finished and diverged ones skipped, unfinished
  ones counted from where they stopped), after a line of their count and rounds."""
  pending = [PlannedRun('comparison', run, run.config.total_rounds)
             for run in runs if runner.status(run) == runner.PENDING]
  left = [rounds_to_train(p) for p in pending]
  resumed = sum(rounds < p.rounds for rounds, p in zip(left, pending))
  print(f'dry run: {len(pending)} of {len(runs)} runs to train ({resumed} of them resumed),'
        f' {sum(left)} rounds', file=stream, flush=True)
  return estimate(pending, directory, pool, stream).seconds if pending else 0.0
