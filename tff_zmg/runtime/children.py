"""Child processes that end with the process that started them.

Linux sends a process a signal once the thread that started it exits, if the process asked
for it (`prctl(PR_SET_PDEATHSIG)`), and the request survives `exec`. util-linux's
`setpriv --pdeathsig` asks and then runs the command, so nothing of Python runs in the forked
child before `exec`. A `preexec_fn` would: that is unsafe in a process with threads, as
TensorFlow's are (a TFF worker's start once segfaulted there, in the test suite), and the
forked child runs the parent's pending signal handlers. The request comes too late if the
parent dies before `setpriv` makes it (the orphan would outlive it): so a shell between
`setpriv` and the command runs it only if its parent is still the process that started it.
Where there is no `setpriv` (not Linux, or no util-linux) the command runs as given, and the
programs' own clean-up (their stop handlers, `atexit`) still ends it.
"""

from collections.abc import Sequence
import os
import shutil
import sys


def dying_with_parent(command: Sequence[str], signal_name: str) -> list[str]:
  """`command`, run so that Linux sends it SIG`signal_name` ('TERM', 'KILL') once the
  thread that starts it exits. Start it from this process: started by another, it does not
  run (the shell exits 1)."""
  setpriv = shutil.which('setpriv') if sys.platform.startswith('linux') else None
  if setpriv is None:
    return list(command)
  # `$PPID` is read after the request: a parent gone by then left the child to another.
  only_if_parent_lives = f'[ "$PPID" = {os.getpid()} ] && exec "$@"'
  return [setpriv, f'--pdeathsig={signal_name}', '--',
          '/bin/sh', '-c', only_if_parent_lives, 'sh', *command]
