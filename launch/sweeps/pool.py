"""What trains a sweep's runs, some at a time: a pool of warm slots, each one process
that keeps what its runs share (`launch.sweeps.warm_slot`), on this machine
(`local_slots`) or as the actors of a Ray cluster (`ray_slots`); the calls
`runner.run_all` makes of them (`Slots`).

A slot trains one `Task` at a time, one run or runs batched as cells: `idle` slots take a
task (`start`), `wait` says which tasks have ended and how each of their runs did (an
`Outcome`, as the slot answered), `close` ends every slot's process. A task whose process
dies is started again, once, in a fresh one (`died`), each run from its last checkpoint;
the second death is its end, with the exit status of a lost worker: the same command
resumes it.

A sweep's `Pool` says where its slots are and how many runs each task holds: the value a
program builds once from its flags (`runner.pool_from_flags`) and hands down.
"""

import dataclasses
from typing import Any, Mapping, Optional

from launch.cli import exit_status


@dataclasses.dataclass(frozen=True)
class Pool:
  """How a sweep trains its runs: in `parallel` warm slot processes on this machine or,
  with `ray_address`, in the actors of that Ray cluster (`ray_slots`: `cells_per_gpu`
  a GPU, or `cpus_per_cell` CPUs each where the runs' `executor` is 'cpu', the driver
  reached at `ray_driver_ip`); each of its slots trains up to `batch_cells` runs that
  share a build at once. Each field is a flag of the sweep's programs (--parallel,
  --ray_address, ...), whose help says more; the flags take their defaults from here, but
  `executor`, launch.train's --executor, which the runs train on."""

  executor: str
  parallel: int = 1
  batch_cells: int = 1
  ray_address: Optional[str] = None
  ray_driver_ip: Optional[str] = None
  cells_per_gpu: int = 1
  cpus_per_cell: int = 2

  def __post_init__(self):
    for name in ('parallel', 'batch_cells', 'cells_per_gpu', 'cpus_per_cell'):
      if getattr(self, name) < 1:
        raise ValueError(f'{name} must be >= 1, got {getattr(self, name)}')

  def alone(self) -> 'Pool':
    """This pool, each run trained alone (`batch_cells` 1): for runs that share no build,
    so that the time left counts one run a slot, or that are timed one at a time."""
    return dataclasses.replace(self, batch_cells=1)


@dataclasses.dataclass(frozen=True)
class Outcome:
  """How one run ended, as its slot answered (`launch.sweeps.warm_slot`): its exit
  status, the one line it ended with unless it finished (`train: error: ...`), for a run
  given with others as batched cells why it trained alone (None: it did not), and the
  rounds' metrics its task asked for as its folder holds them once it ended (`metrics`:
  column -> {round: value}; the rounds of earlier attempts too)."""

  status: int
  error: Optional[str] = None
  alone: Optional[str] = None
  metrics: Mapping[str, Mapping[int, float]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Task:
  """What a slot trains in one request: one run (a `runner.Run`: its `name` and
  `given` settings), or several trained together as batched cells
  (`launch.sweeps.batched_cells`), each with its log; and the columns of metrics.csv
  whose rounds each run's answer carries (`Outcome.metrics`)."""

  runs: tuple[Any, ...]
  logs: tuple[str, ...]
  metrics: tuple[str, ...] = ()

  @property
  def name(self) -> str:
    return self.runs[0].name if len(self.runs) == 1 else '+'.join(r.name for r in self.runs)

  def request(self) -> dict:
    """The warm slot's request (`launch.sweeps.warm_slot`)."""
    requests = [{'name': run.name, 'settings': run.given, 'log': log,
                 'metrics': list(self.metrics)} for run, log in zip(self.runs, self.logs)]
    if len(requests) == 1:
      return requests[0]
    return {'name': self.name, 'runs': requests}

  def outcomes(self, answer: dict) -> dict[str, Outcome]:
    """Each run's `Outcome` by name, from the slot's answer to `request`."""
    return {run['name']: Outcome(run['status'], run.get('error'), run.get('alone'),
                                 _rounds_as_ints(run.get('metrics', {})))
            for run in answer.get('runs', [answer])}

  def each_ended(self, status: int, error: str) -> dict[str, Outcome]:
    """Every run's end with `status` and `error` (their slot's process died)."""
    return {run.name: Outcome(status, error) for run in self.runs}


def _rounds_as_ints(metrics: Mapping[str, Mapping[str, float]]) -> dict:
  """An answer's metrics with their rounds as numbers again (JSON made them strings)."""
  return {column: {int(r): v for r, v in by_round.items()} for column, by_round in metrics.items()}


class Slots:
  """A sweep's warm slots (a base: `local_slots`, `ray_slots`)."""

  def __init__(self):
    self._retried: set[str] = set()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  @property
  def size(self) -> int:
    raise NotImplementedError

  def idle(self) -> list[int]:
    """The slots free for a run."""
    raise NotImplementedError

  def key(self, slot: int):
    """What the last run of `slot` built (`runner.build_key`), None before one."""
    raise NotImplementedError

  def start_all(self, count: int) -> None:
    """Starts a process in each of the first `count` slots that have none and waits until
    each is ready for a run (TensorFlow and TFF imported)."""
    raise NotImplementedError

  def start(self, slot: int, task: Task, key) -> None:
    """Gives `task` to `slot`, starting its process if needed."""
    raise NotImplementedError

  def wait(self, timeout_s: float) -> list[tuple[Task, dict[str, Outcome]]]:
    """Waits up to `timeout_s` for tasks to end; (task, its runs' outcomes by name) of
    each that did."""
    raise NotImplementedError

  def close(self) -> None:
    raise NotImplementedError

  def died(self, slot: int, task: Task, key, how: str) -> Optional[dict[str, Outcome]]:
    """After the process of `slot` died training `task` (`how`): None once the task
    has started again in a fresh one (each run's log says so), or, if it did so before,
    each run's end: `exit_status.WORKER_LOST`, with the line the runs' own failures end
    with."""
    if task.name not in self._retried:
      self._retried.add(task.name)
      for path in task.logs:
        with open(path, 'a') as log:
          log.write(f'=== its warm slot died ({how}); the run starts again, once, in a'
                    ' fresh one\n')
      self.start(slot, task, key)
      return None
    return task.each_ended(
        exit_status.WORKER_LOST,
        f'train: error: its warm slot died again ({how}); re-run the same command to'
        ' resume it from its last checkpoint')
