"""What trains a sweep's runs, some at a time: the calls `runner.run_all` makes of warm
workers, on this machine (`local_workers`) or on a Ray cluster (`ray_workers`).

A worker slot trains one `Task` at a time, one run or runs batched as cells: `idle` slots
take a task (`start`), `wait` says which tasks have ended and how each of their runs did
(an `Outcome`, as the worker answered), `close` ends every worker. A task whose worker
dies is started again, once, in a fresh worker (`died`), each run from its last
checkpoint; the second death is its end, with the exit status of a lost worker: the same
command resumes it.

A sweep's `Pool` says which workers those are and how many runs each task holds: the
value a program builds once from its flags (`runner.pool_from_flags`) and hands down.
"""

import dataclasses
from typing import Any, Optional

from launch.cli import exit_status


@dataclasses.dataclass(frozen=True)
class Pool:
  """How a sweep trains its runs: in `parallel` warm worker processes on this machine or,
  with `ray_address`, in the actors of that Ray cluster (`ray_workers`: `cells_per_gpu`
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
  """How one run ended, as its worker answered (`launch.sweeps.warm_worker`): its exit
  status, the one line it ended with unless it finished (`train: error: ...`), and, for a
  run given with others as batched cells, why it trained alone (None: it did not)."""

  status: int
  error: Optional[str] = None
  alone: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class Task:
  """What a worker trains in one request: one run (a `runner.Run`: its `name` and
  `given` settings), or several trained together as batched cells
  (`launch.sweeps.batched_cells`), each with its log."""

  runs: tuple[Any, ...]
  logs: tuple[str, ...]

  @property
  def name(self) -> str:
    return self.runs[0].name if len(self.runs) == 1 else '+'.join(r.name for r in self.runs)

  def request(self) -> dict:
    """The warm worker's request (`launch.sweeps.warm_worker`)."""
    requests = [{'name': run.name, 'settings': run.given, 'log': log}
                for run, log in zip(self.runs, self.logs)]
    if len(requests) == 1:
      return requests[0]
    return {'name': self.name, 'runs': requests}

  def outcomes(self, answer: dict) -> dict[str, Outcome]:
    """Each run's `Outcome` by name, from the worker's answer to `request`."""
    return {run['name']: Outcome(run['status'], run.get('error'), run.get('alone'))
            for run in answer.get('runs', [answer])}

  def each_ended(self, status: int, error: str) -> dict[str, Outcome]:
    """Every run's end with `status` and `error` (their worker died)."""
    return {run.name: Outcome(status, error) for run in self.runs}


class Workers:
  """The slots of a sweep's warm workers (a base: `local_workers`, `ray_workers`)."""

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
    """Starts a worker in each of the first `count` slots that have none and waits until
    each is ready for a run (TensorFlow and TFF imported)."""
    raise NotImplementedError

  def start(self, slot: int, task: Task, key) -> None:
    """Gives `task` to the worker of `slot`, starting one if needed."""
    raise NotImplementedError

  def wait(self, timeout_s: float) -> list[tuple[Task, dict[str, Outcome]]]:
    """Waits up to `timeout_s` for tasks to end; (task, its runs' outcomes by name) of
    each that did."""
    raise NotImplementedError

  def close(self) -> None:
    raise NotImplementedError

  def died(self, slot: int, task: Task, key, how: str) -> Optional[dict[str, Outcome]]:
    """After the worker of `slot` died training `task` (`how`): None once the task has
    started again in a fresh worker (each run's log says so), or, if it did so before,
    each run's end: `exit_status.WORKER_LOST`, with the line the runs' own failures end
    with."""
    if task.name not in self._retried:
      self._retried.add(task.name)
      for path in task.logs:
        with open(path, 'a') as log:
          log.write(f'=== its warm worker died ({how}); the run starts again, once, in a'
                    ' fresh worker\n')
      self.start(slot, task, key)
      return None
    return task.each_ended(
        exit_status.WORKER_LOST,
        f'train: error: its warm worker died again ({how}); re-run the same command to'
        ' resume it from its last checkpoint')
