"""What trains a sweep's runs, some at a time: the calls `runner.run_all` makes of warm
workers, on this machine (`local_workers`) or on a Ray cluster (`ray_workers`).

A worker slot trains one `Task` at a time, one run or runs batched as cells: `idle` slots
take a task (`start`), `wait` says which tasks have ended and how each of their runs did
(an `Outcome`, as the worker answered), `close` ends every worker. A task whose worker
dies is started again, once, in a fresh worker (`died`), each run from its last
checkpoint; the second death is its end, with the exit status of a lost worker: the same
command resumes it.
"""

import dataclasses
from typing import Any, Optional

from launch.cli import exit_status


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
