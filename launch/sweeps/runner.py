"""Many training runs, each an ordinary `launch.train` run, some at a time in warm slots.

The grid search and the comparison program describe each run by the flags of
`launch.train` (this program's own flags as the user gave them, plus a few set per run)
and hand the list to `run_all`. A run whose folder holds the whole run is not started
again (`launch.run.resumption.missing`: every round recorded whole, with the evaluations
it is scored by, and its last checkpoint on the disk), so an interrupted program picks up
where it stopped: any other run is `launch.train`'s to resume, which repairs what a kill
left. Each run's slot answers with its outcome (`pool.Outcome`): a run that
diverges (exit 3) has said why in a `diverged.txt` in its directory and is not retried;
any other failure stops everything with the one line the run ended with, and a run that
ends without its folder whole is a bug that stops everything too. Each run's output goes
to `<log_dir>/<name>.log`, one `=== start` header per attempt, the command that trains it
alone. The runs are trained by warm slots (`launch.sweeps.warm_slot`), those of the
program's `pool.Pool`: `parallel` processes on this machine (`local_slots`), or Ray
actors over a cluster (`ray_slots`, with --ray_address), each training one run after
another; a slot prefers runs that share its last run's build (all but the learning
rates). A run's 'done' line says how many runs are still to go and, at the pace of the
rounds trained so far, about how long they take (and the whole they make with later runs,
such as a grid search's later rungs).
"""

import dataclasses
import os
import sys
import time
from typing import Callable, Mapping, Optional, Sequence

from absl import flags

from launch.cli import exit_status
from launch.cli import stops
from launch.cli import unused_flags
from launch.run import builds
from launch.run import errors
from launch.run import resumption
from launch.run import run_config
from launch.run import settings as run_settings
from launch.sweeps import local_slots
from launch.sweeps import ray_slots
from launch.sweeps import pool as pool_lib
from tff_zmg import analysis
from tff_zmg import run_files

PARALLEL = flags.DEFINE_integer(
    'parallel', pool_lib.Pool.parallel,
    'How many warm slot processes on this machine train runs at once, each one run after'
    ' another (launch.sweeps.warm_slot); with --ray_address the cluster sets that.',
    lower_bound=1,
)
BATCH_CELLS = flags.DEFINE_integer(
    'batch_cells', pool_lib.Pool.batch_cells,
    'Grid cells that differ only in their learning rates trained together as one'
    ' computation, at most this many at once in each slot (tff_zmg.templates.cells;'
    ' algorithms whose clients keep state train alone); 1: each cell alone. On a CPU'
    ' it measured no faster than 1 (docs/performance.md, "Batched cells").',
    lower_bound=1,
)
FINISHED, DIVERGED, PENDING = 'finished', 'diverged', 'pending'
_POLL_S = 0.5


@dataclasses.dataclass(frozen=True)
class Result:
  """A run as `run_all` leaves it: FINISHED or DIVERGED, and the rounds of the metrics.csv
  columns the call asked for (`metrics`: column -> {round: value}), as its slot answered
  or, for a run done before the call, as its folder holds them."""

  state: str
  metrics: Mapping[str, Mapping[int, float]]


@dataclasses.dataclass(frozen=True)
class Run:
  """One training run: a name for progress lines and logs, and its settings, which its
  warm slot receives as they are (`pool.Task.request`). Its config and command line
  are computed from them by the code `launch.train` uses, so the config is exactly what
  the run records, and the command line trains it alone."""

  name: str
  settings: run_settings.Settings
  config: run_config.ExperimentConfig = dataclasses.field(init=False, repr=False,
                                                          compare=False)

  def __post_init__(self):
    # Made here, so that settings `launch.train` would refuse fail early.
    object.__setattr__(self, 'config', run_settings.config_of(self.settings))

  @property
  def given(self) -> dict:
    """What the warm slot receives (`Settings.given_values`)."""
    return self.settings.given_values()

  @property
  def args(self) -> tuple[str, ...]:
    return self.settings.command_line()


def train_run(base: run_settings.Settings, name: str, overrides: Mapping[str, object]) -> Run:
  """The run `launch.train` would make of `base` (a program's command line, read once at
  its door: `settings_from_flags`) with `overrides` set (`Settings.replace`).

  Raises:
    ValueError: If an override is not a flag of `launch.train`, or the run's settings
      are invalid (here, early, on settings `launch.train` would refuse).
  """
  return Run(name=name, settings=base.replace(overrides))


def status(run: Run) -> str:
  """FINISHED (its folder holds the whole run), DIVERGED (recorded as such) or PENDING.

  Raises:
    errors.ExperimentError: the run's directory holds a run with other settings, or one
      that no resumption can make whole (`resumption.missing`).
  """
  if run.config.overwrite:
    return PENDING
  finished = resumption.is_finished(run.config)  # Checks the recorded settings first.
  if os.path.exists(os.path.join(run.config.output_dir, run_files.DIVERGED)):
    return DIVERGED
  return FINISHED if finished else PENDING


def duration_text(seconds: float) -> str:
  """'2 h 05 min', '4 min 09 s' under an hour, '33 s' under a minute."""
  hours, rest = divmod(int(round(seconds)), 3600)
  if hours:
    return f'{hours} h {rest // 60:02d} min'
  return f'{rest // 60} min {rest % 60:02d} s' if rest >= 60 else f'{rest} s'


def time_left(elapsed_s: float, rounds_trained: int, rounds_left: int, parallel: int,
              runs_left: int) -> Optional[float]:
  """Seconds `rounds_left` rounds of `runs_left` runs take at the pace so far:
  `rounds_trained` rounds in `elapsed_s` by `parallel` runs side by side, a pace that
  fewer runs than `parallel` share in proportion:

    rounds_left x elapsed_s / rounds_trained x parallel / min(parallel, runs_left)

  Start-ups and evaluations are in the pace, as they are in the runs left. None before a
  round is trained."""
  if rounds_trained <= 0 or runs_left <= 0:
    return None
  return rounds_left * elapsed_s / rounds_trained * parallel / min(parallel, runs_left)


@dataclasses.dataclass(frozen=True)
class LaterWork:
  """The runs that follow a batch, at most, and make one whole with it (e.g. a grid
  search's later rungs and its stability re-runs): their count, their rounds, and the
  name of the whole ('the whole search')."""

  runs: int
  rounds: int
  whole: str


class Progress:
  """What is left of one `run_all`: the runs still to go and the time they take.

  Rounds are counted from the runs' metrics.csv: those each run held when the call began,
  and those it holds now (a running run's, as far as it has got).
  """

  def __init__(self, runs: Sequence[Run], parallel: int, later: Optional[LaterWork] = None,
               clock: Callable[[], float] = time.monotonic):
    self._parallel = parallel
    self._later = later
    self._clock = clock
    self._began = clock()
    self._at_start = {run.name: 0 if run.config.overwrite else resumption.rounds_done(run.config)
                      for run in runs}
    self._trained_by_done = 0

  def done(self, run: Run) -> None:
    """Counts the rounds a run that has ended trained in this call."""
    self._trained_by_done += self._trained(run)

  def _trained(self, run: Run) -> int:
    return max(0, resumption.rounds_done(run.config) - self._at_start[run.name])

  def text(self, pending: Sequence[Run], running: Sequence[Run]) -> str:
    """'(N to go, about <time>)' of the runs not yet started and those still running, and
    '; <the whole>, about <time>' with the later work; '' when no run is to go."""
    to_go = len(pending) + len(running)
    if not to_go:
      return ''
    elapsed = self._clock() - self._began
    trained_by_running = {run.name: self._trained(run) for run in running}
    trained = self._trained_by_done + sum(trained_by_running.values())
    rounds_left = sum(run.config.total_rounds - self._at_start[run.name]
                      for run in (*pending, *running)) - sum(trained_by_running.values())
    seconds = time_left(elapsed, trained, rounds_left, self._parallel, to_go)
    if seconds is None:
      return f'  ({to_go} to go)'
    about = f'about {duration_text(seconds)}'
    if self._later is not None and self._later.runs:
      seconds += time_left(elapsed, trained, self._later.rounds, self._parallel,
                           self._later.runs)
      about += f'; {self._later.whole}, about {duration_text(seconds)}'
    return f'  ({to_go} to go, {about})'


def build_key(config: run_config.ExperimentConfig) -> str:
  """What a run builds in a warm slot (`launch.run.builds`), roughly: its settings but
  the learning rates, its name and its rounds. Runs with one key share a build."""
  recorded = dict(config.recorded())
  for name in ('experiment_name', 'root_output_dir', 'total_rounds', 'overwrite'):
    recorded.pop(name, None)
  recorded['hparams'] = {k: v for k, v in recorded.get('hparams', {}).items()
                         if not k.endswith('learning_rate')}
  return builds.key_of(recorded)


def _next_for(key, pending: list, keys: Mapping[str, str],
              batch_cells: int = 1) -> list[tuple[int, Run]]:
  """The first pending (index, run) that shares a build with `key`, else the first (`keys`:
  each run's `build_key` by its name), and up to `batch_cells` - 1 more that share its
  build (taken out of `pending`)."""
  position = next((p for p, (_, run) in enumerate(pending) if keys[run.name] == key), 0)
  taken = [pending.pop(position)]
  first_key = keys[taken[0][1].name]
  for position in reversed([p for p, (_, run) in enumerate(pending)
                            if keys[run.name] == first_key][:batch_cells - 1]):
    taken.insert(1, pending.pop(position))
  return taken


def pool_from_flags(batches: bool) -> pool_lib.Pool:
  """The pool this program's flags describe (--parallel, --batch_cells, --ray_address,
  ... and launch.train's --executor), built once by a program's `main`; refuses those it
  would not use: --batch_cells unless it `batches` (its runs may share a build), the Ray
  cluster's without one (`ray_slots.check_flags`)."""
  if not batches:
    unused_flags.refuse(('batch_cells',), 'does not apply here: no two runs of this program'
                        ' differ only in their learning rates, so none train batched')
  pool = pool_lib.Pool(
      parallel=PARALLEL.value, batch_cells=BATCH_CELLS.value,
      ray_address=ray_slots.RAY_ADDRESS.value, ray_driver_ip=ray_slots.RAY_DRIVER_IP.value,
      cells_per_gpu=ray_slots.CELLS_PER_GPU.value,
      cpus_per_cell=ray_slots.CPUS_PER_CELL.value, executor=flags.FLAGS['executor'].value)
  ray_slots.check_flags(pool)
  return pool


def slots_for(pool: pool_lib.Pool, log_dir: str) -> pool_lib.Slots:
  """The warm slots a program's runs share: the Ray actors of `pool.ray_address` (the
  cluster's GPUs and CPUs say how many), else `pool.parallel` processes on this machine."""
  if pool.ray_address:
    return ray_slots.RaySlots(pool, log_dir)
  return local_slots.LocalSlots(pool.parallel, log_dir)


def run_all(
    runs: Sequence[Run], *, pool: pool_lib.Pool, log_dir: str,
    describe: Optional[Callable[[Run, Result], str]] = None, stream=None,
    later: Optional[LaterWork] = None, slots: Optional[pool_lib.Slots] = None,
    metrics: Sequence[str] = (),
) -> dict[str, Result]:
  """Brings every run to FINISHED or DIVERGED in `slots` (`slots_for(pool)`'s, kept
  for the next call; None: this call's own), runs that share a build up to
  `pool.batch_cells` at once in one slot as batched cells.

  Prints one line per run as it is skipped, started and done; `describe(run, result)`
  may add to the 'done' line (e.g. a score), which ends with the runs to go and their
  time (`Progress`), and that of the whole they and `later` make.

  Returns:
    name -> its `Result`, with the rounds of the columns `metrics` names.

  Raises:
    errors.RunFailed: a run failed otherwise; the others are stopped (they resume next time).
    errors.ExperimentError: a run's directory holds a run with other settings.
  """
  stream = stream or sys.stdout
  total = len(runs)
  results, pending = {}, []
  for i, run in enumerate(runs):
    state = status(run)
    if state == PENDING:
      pending.append((i, run))
    else:  # No slot answers for it: its folder is its record.
      results[run.name] = Result(state,
                                 analysis.runs.metrics_by_round(run.config.metrics_csv, metrics))
      extra = f'  {describe(run, results[run.name])}' if describe else ''
      print(f'[{i + 1}/{total}] {run.name}: already {state}{extra}', file=stream, flush=True)
  if not pending:
    return results
  os.makedirs(log_dir, exist_ok=True)
  own = slots is None
  if own:
    slots = slots_for(pool, log_dir)
  keys = {run.name: build_key(run.config) for _, run in pending}
  running = {}  # name -> (index, run, log path, start time)
  said = set()  # Why batched runs trained alone, said once each.
  progress = Progress([run for _, run in pending], slots.size * pool.batch_cells, later)
  with stops.deferred('the runs still going were stopped; re-run the same command to'
                     ' resume') as stop_if_received:
    try:
      while pending or running:
        stop_if_received()
        for slot in slots.idle():
          if not pending:
            break
          taken = _next_for(slots.key(slot), pending, keys, pool.batch_cells)
          logs = []
          for i, run in taken:
            logs.append(os.path.join(log_dir, f'{run.name}.log'))  # The slot writes it.
            running[run.name] = (i, run, logs[-1], time.monotonic())
            print(f'[{i + 1}/{total}] {run.name}: started', file=stream, flush=True)
          slots.start(slot, pool_lib.Task(tuple(r for _, r in taken), tuple(logs),
                                          tuple(metrics)), keys[taken[0][1].name])
        for task, outcomes in slots.wait(_POLL_S):
          ended = [running.pop(run.name) for run in task.runs]  # Batched runs end together.
          for i, run, log_path, start in ended:
            results[run.name] = _outcome(run, outcomes[run.name], log_path,
                                         time.monotonic() - start)
            progress.done(run)
          left = progress.text([r for _, r in pending], [r for _, r, _, _ in running.values()])
          if len(ended) > 1:
            why = next((o.alone for o in outcomes.values() if o.alone), None)
            if why and why not in said:  # Once: cells of one build say the same.
              said.add(why)
              print(f'batched cells: {ended[0][1].config.algo} cells train one after another:'
                    f' {why}', file=stream, flush=True)
          for i, run, _, start in ended:
            result = results[run.name]
            extra = f'  {describe(run, result)}' if describe else ''
            print(f'[{i + 1}/{total}] {run.name}: {result.state} in'
                  f' {time.monotonic() - start:.0f} s{extra}{left}', file=stream, flush=True)
    except BaseException:
      slots.close()  # Stops the runs still going: they resume next time.
      raise
    finally:
      if own:
        slots.close()
  return results


def _outcome(run: Run, outcome: pool_lib.Outcome, log_path: str, seconds: float) -> Result:
  """FINISHED or DIVERGED (the run recorded it in its directory), as its slot answered,
  with the metrics it answered; else `errors.RunFailed`."""
  returncode = outcome.status
  if returncode == 0:
    missing = resumption.missing(run.config)
    if missing is not None:
      raise errors.RunFailed(
          f'{run.name} ended as done but its folder lacks {missing} (a bug; its log:'
          f' {log_path})', exit_status.UNEXPECTED)
    return Result(FINISHED, outcome.metrics)
  if returncode == exit_status.DIVERGED:  # The run wrote its diverged.txt.
    return Result(DIVERGED, outcome.metrics)
  raise errors.RunFailed(
      f'{run.name} failed ({local_slots.signal_text(returncode)}) after {seconds:.0f} s:'
      f' {outcome.error or "no error line"} (its log: {log_path})',
      returncode if returncode in exit_status.DOCUMENTED else exit_status.UNEXPECTED,
  )
