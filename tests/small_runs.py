"""Flags of the small synthetic `launch.train` runs the program tests start, a run killed
with SIGKILL mid-way, and runs made once for the tests that only read or copy them."""

import os
import signal
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Six EMNIST-shaped clients of twelve examples, three a round, two for evaluation: a round
# takes seconds.
FLAGS = [
    '--data_source=synthetic',
    '--synthetic_train_clients=6',
    '--synthetic_test_clients=2',
    '--synthetic_examples_per_client=12',
    '--clients_per_round=3',
]

_MADE = {}


def made_once(key, make):
  """`make()`, called by the first test of this test process that asks for `key`; later
  tests get its result. For runs that tests only read or copy: a module-scoped fixture
  cannot take function-scoped ones such as `run_program`. Keys start with the test module's
  name, since one process runs several modules."""
  if key not in _MADE:
    _MADE[key] = make()
  return _MADE[key]


def kill_when(command, line_start: str) -> list[str]:
  """Runs `command` (a program's process, from the repository root) and SIGKILLs it as
  soon as it prints a line starting with `line_start`; its stdout lines until then."""
  proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          text=True, cwd=REPO)
  lines = []
  try:
    for line in proc.stdout:
      lines.append(line)
      if line.startswith(line_start):
        proc.send_signal(signal.SIGKILL)
        break
    proc.communicate(timeout=120)
  finally:
    if proc.poll() is None:
      proc.kill()
  return lines
