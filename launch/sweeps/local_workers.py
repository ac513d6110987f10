"""Warm workers on this machine: `count` processes of `launch.sweeps.warm_worker`, each
training one run at a time, kept from run to run (and from one `run_all` to the next) for
as long as the program holds them.

A worker that dies while training a run (SIGSEGV, the kernel's OOM killer) costs only that
run: it is started again once in a fresh worker, from its last checkpoint, and reported as
lost, with both logs named, if that worker dies too (the same command resumes it). No
worker outlives the program: each gets SIGTERM when the program's process dies (Linux),
and `close` ends them (SIGTERM, which stops a run once its round under way is trained and
checkpointed, then SIGKILL after a grace period). A worker has a session of its own, so a
terminal's Ctrl-C reaches the program only: a second signal from `close` would have cut
the round short.
"""

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import Optional

from launch.sweeps import workers
from tff_zmg.runtime import children

_STOP_GRACE_S = 30.0
_POLL_S = 0.5
# The package's root: the worker imports `launch` from here, as the program did.
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def child_environment() -> dict:
  """This environment, with the package importable from its checkout."""
  env = dict(os.environ)
  env['PYTHONPATH'] = os.pathsep.join(filter(None, [_REPO_ROOT, env.get('PYTHONPATH')]))
  return env


def signal_text(returncode: int) -> str:
  """'killed by SIGKILL' for a negative status, else 'exit N'."""
  if returncode < 0:
    with contextlib.suppress(ValueError):
      return f'killed by {signal.Signals(-returncode).name}'
  return f'exit {returncode}'


class _Worker:
  """One warm worker process and the run it trains, if any."""

  def __init__(self, log_path: str):
    self.log_path = log_path
    with open(log_path, 'a') as log:
      self.process = subprocess.Popen(
          children.dying_with_parent([sys.executable, '-m', 'launch.sweeps.warm_worker'],
                                     'TERM'),
          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=child_environment(),
          start_new_session=True,
      )
    os.set_blocking(self.process.stdout.fileno(), False)
    self._pending = b''
    self.ready = False  # Until its first line.
    self.task = None  # The `workers.Task` it trains, if any.
    self.key = None  # What the last run it trained built (`launch.sweeps.runner`).

  def send(self, task: workers.Task) -> None:
    self.process.stdin.write((json.dumps(task.request()) + '\n').encode())
    self.process.stdin.flush()

  def answer(self) -> Optional[dict]:
    """The answer to the task it trains, once there (None before)."""
    with contextlib.suppress(BlockingIOError):
      while True:
        chunk = os.read(self.process.stdout.fileno(), 65536)
        if not chunk:
          break
        self._pending += chunk
    while b'\n' in self._pending:
      line, self._pending = self._pending.split(b'\n', 1)
      message = json.loads(line)
      if 'ready' not in message:
        return message
      self.ready = True
    return None

  def dead(self) -> Optional[int]:
    """Its exit status once it has ended (None while it runs)."""
    return self.process.poll()


class LocalWorkers(workers.Workers):
  """`count` warm worker processes on this machine."""

  def __init__(self, count: int, log_dir: str):
    super().__init__()
    if count < 1:
      raise ValueError(f'count must be >= 1, got {count}')
    self._dir = os.path.join(log_dir, 'workers')
    self._count = count
    self._workers: list[Optional[_Worker]] = [None] * count
    self._started = 0

  @property
  def size(self) -> int:
    return self._count

  def idle(self) -> list[int]:
    return [i for i, w in enumerate(self._workers) if w is None or w.task is None]

  def key(self, slot: int):
    worker = self._workers[slot]
    return None if worker is None else worker.key

  def _new_worker(self, slot: int) -> _Worker:
    os.makedirs(self._dir, exist_ok=True)
    self._started += 1
    worker = _Worker(os.path.join(self._dir, f'worker{self._started}.log'))
    self._workers[slot] = worker
    return worker

  def start_all(self, count: int) -> None:
    for slot, worker in enumerate(self._workers[:count]):
      if worker is None or worker.dead() is not None:
        self._new_worker(slot)
    waiting = [w for w in self._workers[:count] if not w.ready]
    while waiting:
      select.select([w.process.stdout for w in waiting], [], [], _POLL_S)
      for worker in list(waiting):
        worker.answer()  # Its first line, the only one before a run.
        if worker.ready:
          waiting.remove(worker)
        elif worker.dead() is not None:
          raise RuntimeError(f'a warm worker ended as it started'
                             f' ({signal_text(worker.dead())}); its log: {worker.log_path}')

  def start(self, slot: int, task: workers.Task, key) -> None:
    worker = self._workers[slot]
    if worker is None or worker.dead() is not None:
      worker = self._new_worker(slot)
    worker.task = task
    worker.key = key
    worker.send(task)

  def wait(self, timeout_s: float) -> list[tuple[workers.Task, dict[str, workers.Outcome]]]:
    """See `workers.Workers.wait`."""
    busy = [w for w in self._workers if w is not None and w.task is not None]
    if busy:
      select.select([w.process.stdout for w in busy], [], [], timeout_s)
    else:
      time.sleep(timeout_s)
    ended = []
    for slot, worker in enumerate(self._workers):
      if worker is None or worker.task is None:
        continue
      answer = worker.answer()
      task = worker.task
      if answer is not None:
        worker.task = None
        ended.append((task, task.outcomes(answer)))
        continue
      status = worker.dead()
      if status is None:
        continue
      worker.task = None
      self._workers[slot] = None
      how = f'{signal_text(status)}; its log: {worker.log_path}'
      outcomes = self.died(slot, task, worker.key, how)
      if outcomes is not None:
        ended.append((task, outcomes))
    return ended

  def close(self) -> None:
    """Ends every worker: a run still training stops as on Ctrl-C, after its round
    under way (it resumes next time); after the grace period, SIGKILL."""
    live = [w for w in self._workers if w is not None and w.dead() is None]
    for worker in live:
      with contextlib.suppress(OSError):
        worker.process.stdin.close()  # An idle worker ends at the end of its input.
      if worker.task is not None:
        worker.process.terminate()
    deadline = time.monotonic() + _STOP_GRACE_S
    for worker in live:
      try:
        worker.process.wait(timeout=max(0.0, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        worker.process.kill()
        worker.process.wait()
    for worker in self._workers:
      if worker is not None:
        with contextlib.suppress(OSError):
          worker.process.stdout.close()
    self._workers = [None] * self._count
