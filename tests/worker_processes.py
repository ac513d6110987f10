"""TFF's worker processes as the tests see them: the workers below a process, and whether a
process has ended (no worker may outlive the program or the test that started it)."""

import time
from typing import Optional

import psutil


def worker_pids(parent: Optional[int] = None, *, recursive: bool = True,
                live: bool = True) -> set[int]:
  """The TFF worker_binary processes among `parent`'s descendants (default: this
  process's), or only its children; with `live`, not those that ended and await their
  parent (zombies)."""
  pids = set()
  for p in psutil.Process(parent).children(recursive=recursive):
    try:
      if 'worker_binary' in ' '.join(p.cmdline()) and not (
          live and p.status() == psutil.STATUS_ZOMBIE):
        pids.add(p.pid)
    except psutil.NoSuchProcess:
      pass
  return pids


def is_gone(pid: int, timeout: float = 15.0) -> bool:
  """Whether process `pid` has ended (or is a zombie) within `timeout` seconds."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    try:
      if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
        return True
    except psutil.NoSuchProcess:
      return True
    time.sleep(0.1)
  return False
