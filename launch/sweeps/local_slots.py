"""A pool's warm slots on this machine: `count` processes of `launch.sweeps.warm_slot`, each
training one run at a time, kept from run to run (and from one `run_all` to the next) for
as long as the program holds them.

A process that dies while training a run (SIGSEGV, the kernel's OOM killer) costs only that
run: it is started again once in a fresh process, from its last checkpoint, and reported as
lost, with both logs named, if that process dies too (the same command resumes it). No
process outlives the program: each gets SIGTERM when the program's process dies (Linux),
and `close` ends them (SIGTERM, which stops a run once its round under way is trained and
checkpointed, then SIGKILL after a grace period). A process has a session of its own, so a
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

from launch.sweeps import pool as pool_lib
from tff_zmg.runtime import children

_STOP_GRACE_S = 30.0
_POLL_S = 0.5
# The package's root: the process imports `launch` from here, as the program did.
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


class _SlotProcess:
  """One warm slot's process and the run it trains, if any."""

  def __init__(self, log_path: str):
    self.log_path = log_path
    with open(log_path, 'a') as log:
      self.popen = subprocess.Popen(
          children.dying_with_parent([sys.executable, '-m', 'launch.sweeps.warm_slot'],
                                     'TERM'),
          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=child_environment(),
          start_new_session=True,
      )
    os.set_blocking(self.popen.stdout.fileno(), False)
    self._pending = b''
    self.ready = False  # Until its first line.
    self.task = None  # The `pool.Task` it trains, if any.
    self.key = None  # What the last run it trained built (`launch.sweeps.runner`).

  def send(self, task: pool_lib.Task) -> None:
    self.popen.stdin.write((json.dumps(task.request()) + '\n').encode())
    self.popen.stdin.flush()

  def answer(self) -> Optional[dict]:
    """The answer to the task it trains, once there (None before)."""
    with contextlib.suppress(BlockingIOError):
      while True:
        chunk = os.read(self.popen.stdout.fileno(), 65536)
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
    return self.popen.poll()


class LocalSlots(pool_lib.Slots):
  """`count` warm slots on this machine."""

  def __init__(self, count: int, log_dir: str):
    super().__init__()
    if count < 1:
      raise ValueError(f'count must be >= 1, got {count}')
    # The slots' logs keep the names older sweeps wrote: workers/workerN.log.
    self._dir = os.path.join(log_dir, 'workers')
    self._count = count
    self._processes: list[Optional[_SlotProcess]] = [None] * count
    self._started = 0

  @property
  def size(self) -> int:
    return self._count

  def idle(self) -> list[int]:
    return [i for i, w in enumerate(self._processes) if w is None or w.task is None]

  def key(self, slot: int):
    process = self._processes[slot]
    return None if process is None else process.key

  def _new_process(self, slot: int) -> _SlotProcess:
    os.makedirs(self._dir, exist_ok=True)
    self._started += 1
    process = _SlotProcess(os.path.join(self._dir, f'worker{self._started}.log'))
    self._processes[slot] = process
    return process

  def start_all(self, count: int) -> None:
    for slot, process in enumerate(self._processes[:count]):
      if process is None or process.dead() is not None:
        self._new_process(slot)
    waiting = [w for w in self._processes[:count] if not w.ready]
    while waiting:
      select.select([w.popen.stdout for w in waiting], [], [], _POLL_S)
      for process in list(waiting):
        process.answer()  # Its first line, the only one before a run.
        if process.ready:
          waiting.remove(process)
        elif process.dead() is not None:
          raise RuntimeError(f'a warm slot ended as it started'
                             f' ({signal_text(process.dead())}); its log: {process.log_path}')

  def start(self, slot: int, task: pool_lib.Task, key) -> None:
    process = self._processes[slot]
    if process is None or process.dead() is not None:
      process = self._new_process(slot)
    process.task = task
    process.key = key
    process.send(task)

  def wait(self, timeout_s: float) -> list[tuple[pool_lib.Task, dict[str, pool_lib.Outcome]]]:
    """See `pool.Slots.wait`."""
    busy = [w for w in self._processes if w is not None and w.task is not None]
    if busy:
      select.select([w.popen.stdout for w in busy], [], [], timeout_s)
    else:
      time.sleep(timeout_s)
    ended = []
    for slot, process in enumerate(self._processes):
      if process is None or process.task is None:
        continue
      answer = process.answer()
      task = process.task
      if answer is not None:
        process.task = None
        ended.append((task, task.outcomes(answer)))
        continue
      status = process.dead()
      if status is None:
        continue
      process.task = None
      self._processes[slot] = None
      how = f'{signal_text(status)}; its log: {process.log_path}'
      outcomes = self.died(slot, task, process.key, how)
      if outcomes is not None:
        ended.append((task, outcomes))
    return ended

  def close(self) -> None:
    """Ends every process: a run still training stops as on Ctrl-C, after its round
    under way (it resumes next time); after the grace period, SIGKILL."""
    live = [w for w in self._processes if w is not None and w.dead() is None]
    for process in live:
      with contextlib.suppress(OSError):
        process.popen.stdin.close()  # An idle process ends at the end of its input.
      if process.task is not None:
        process.popen.terminate()
    deadline = time.monotonic() + _STOP_GRACE_S
    for process in live:
      try:
        process.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        process.popen.kill()
        process.popen.wait()
    for process in self._processes:
      if process is not None:
        with contextlib.suppress(OSError):
          process.popen.stdout.close()
    self._processes = [None] * self._count
