"""A warm worker: one process that trains a sweep's runs one after another, each exactly
as `python -m launch.train` with the run's arguments would, without paying again for what
the runs share: TensorFlow and TFF imported, the task's data read, the process built and
compiled, the evaluation set up (`launch.run.builds`).

The sweep's runner (`launch.sweeps.runner`) starts it as
`python -m launch.sweeps.warm_worker` and talks to it in JSON lines: the worker writes
`{"ready": where it runs}` to its stdout once it has started; the runner writes a request
`{"name": ..., "args": [launch.train's arguments], "log": path}` to the worker's stdin and
reads `{"name": ..., "status": exit status}` from its stdout once the run has ended. While
a run trains, the worker's standard output and error (file descriptors 1 and 2, so
TensorFlow's and TFF's too) go to the run's log, which then reads as `launch.train`'s
output would, ending in the same one line on failure; between runs they go to the
worker's own log (its stderr). A stop signal ends the run it trains, which says what is
kept as `launch.train` would, and then the worker; end of input ends it too.

`serve` is the same loop for a Ray actor (`launch.sweeps.ray_workers`), one request per
call.
"""

import contextlib
import json
import os
import socket
import sys
import time
from typing import Mapping

from absl import flags

from launch.cli import exit_status
from launch.cli import failures
from launch.cli import quiet
from launch.run import builds as builds_lib
from launch.run import settings as run_settings
from launch.run import training

# The program name a run's error line starts with: the runs are `launch.train`'s.
_RUN_PROGRAM = 'train'


@contextlib.contextmanager
def output_to(path: str):
  """File descriptors 1 and 2 (and so `print`, TensorFlow's and TFF's output) append to
  `path` inside the block."""
  sys.stdout.flush()
  sys.stderr.flush()
  saved = os.dup(1), os.dup(2)
  log = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
  try:
    os.dup2(log, 1)
    os.dup2(log, 2)
    yield
  finally:
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(saved[0], 1)
    os.dup2(saved[1], 2)
    for fd in (log, *saved):
      os.close(fd)


def where() -> str:
  """Where this worker runs: its pid, host (a Ray actor: its node's address), and the GPUs
  it may see."""
  host = socket.gethostname()
  ray = sys.modules.get('ray')
  if ray is not None and ray.is_initialized():
    host = f'{host}, Ray node {ray.util.get_node_ip_address()}'
  gpus = os.environ.get('CUDA_VISIBLE_DEVICES')
  return (f'warm worker {os.getpid()} on {host}'
          + ('' if gpus is None else f', CUDA_VISIBLE_DEVICES={gpus}'))


def run_cell(request: Mapping, builds: builds_lib.Builds) -> int:
  """Trains the run of `request` (its `args` and `log`); returns its exit status."""
  with output_to(request['log']):
    print(f'--- {where()}', flush=True)
    try:
      flags.FLAGS.unparse_flags()
      flags.FLAGS([_RUN_PROGRAM, *request['args']])
      training.train(run_settings.settings_from_flags(), builds)
      return exit_status.OK
    except BaseException as e:  # pylint: disable=broad-except
      return failures.report(_RUN_PROGRAM, e)


def serve(requests, results, builds: builds_lib.Builds) -> int:
  """Answers each request line of `requests` on `results`, until the input ends or a run
  is interrupted (then this worker stops too)."""
  for line in requests:
    request = json.loads(line)
    start = time.monotonic()
    status = run_cell(request, builds)
    results.write(json.dumps({'name': request['name'], 'status': status,
                              'seconds': time.monotonic() - start}) + '\n')
    results.flush()
    print(f'{request["name"]}: exit status {status}; built so far: {builds.built}',
          flush=True)
    if status == exit_status.INTERRUPTED:
      return exit_status.INTERRUPTED
  return exit_status.OK


def main(argv) -> int:
  del argv
  quiet.quiet_libraries()
  # The results go to the stdout the runner reads; everything printed goes to the log.
  results = os.fdopen(os.dup(1), 'w')
  os.dup2(2, 1)
  print(f'{where()}: ready', flush=True)
  results.write(json.dumps({'ready': where()}) + '\n')
  results.flush()
  return serve(sys.stdin, results, builds_lib.Builds())


if __name__ == '__main__':
  failures.run_program('warm_worker', main)
