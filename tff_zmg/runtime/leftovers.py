"""Temporary files named after the process that owns them, removed once it is gone.

A process killed with SIGKILL runs no clean-up, so what it kept in the temporary folder (a
program's private folder, a TFF worker's log) stays there for ever. Each such name carries
its owner's pid and start time, `<prefix><pid>-<start>...`; the next process that makes one
removes those whose owner no longer runs. The start time tells a dead owner from a new
process that got the same pid. A file meant to outlive its owner (a log an error message
names) is renamed without the tag (`disown`).
"""

import contextlib
import os
import re
from typing import Callable, Optional


def process_start_time(pid: int) -> Optional[str]:
  """When `pid` started (clock ticks since boot, Linux's /proc); None if it does not run."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().rsplit(')', 1)[1].split()[19]  # Field 22: start time since boot.
  except (OSError, IndexError):
    return None


def owner_tag() -> Optional[str]:
  """`<pid>-<start>` of this process, for a name `remove_if_owner_gone` can judge; None
  where the start time is unknown (not Linux): nothing could tell its owner gone."""
  start = process_start_time(os.getpid())
  return None if start is None else f'{os.getpid()}-{start}'


def _owned(prefix: str) -> re.Pattern:
  return re.compile(re.escape(prefix) + r'(\d+)-(\d+)(?:-|$)')


def disown(path: str, prefix: str) -> str:
  """Renames `<prefix><pid>-<start>-<rest>` to `<prefix><rest>`, which no later process
  removes; returns its path then (`path` itself if not so named or not renamed)."""
  folder, name = os.path.split(path)
  match = _owned(prefix).match(name)
  if not match:
    return path
  kept = os.path.join(folder, prefix + name[match.end():])
  try:
    os.replace(path, kept)
  except OSError:
    return path
  return kept


def remove_if_owner_gone(parent: str, prefix: str, remove: Callable[[str], None]) -> None:
  """Calls `remove(path)` on each entry of `parent` named `<prefix><pid>-<start>...` whose
  process has ended (or is another process with the same pid); never raises OSError.
  Nothing where start times are unknown (not Linux): no owner could be told gone."""
  if owner_tag() is None:
    return
  owned = _owned(prefix)
  with contextlib.suppress(OSError):
    for name in os.listdir(parent):
      match = owned.match(name)
      if match and process_start_time(int(match.group(1))) != match.group(2):
        with contextlib.suppress(OSError):
          remove(os.path.join(parent, name))
