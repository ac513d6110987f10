"""What trains a sweep's runs, some at a time: the calls `runner.run_all` makes of warm
workers, on this machine (`local_workers`) or on a Ray cluster (`ray_workers`).

A worker slot trains one run at a time: `idle` slots take a run (`start`), `wait` says which
runs have ended and how, `close` ends every worker. A run whose worker dies is started
again, once, in a fresh worker (`died`), from its last checkpoint; the second death is its
end.
"""

from typing import Optional


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

  def start(self, slot: int, run, log_path: str, key) -> None:
    """Gives `run` (a `runner.Run`) to the worker of `slot`, starting one if needed."""
    raise NotImplementedError

  def wait(self, timeout_s: float) -> list[tuple[object, int]]:
    """Waits up to `timeout_s` for runs to end; (run, exit status) of each that did."""
    raise NotImplementedError

  def close(self) -> None:
    raise NotImplementedError

  def died(self, slot: int, run, log_path: str, key, how: str,
           status: int) -> Optional[int]:
    """After the worker of `slot` died training `run` (`how`, for its log): None once the
    run has started again in a fresh worker, or `status`, its end, if it did so before."""
    if run.name not in self._retried:
      self._retried.add(run.name)
      with open(log_path, 'a') as log:
        log.write(f'=== its warm worker died ({how}); the run starts again, once, in a fresh'
                  ' worker\n')
      self.start(slot, run, log_path, key)
      return None
    with open(log_path, 'a') as log:
      log.write(f'train: error: its warm worker died again ({how})\n')
    return status
