"""A warm slot: one process that trains a sweep's runs one after another, each exactly
as `python -m launch.train` with the run's arguments would, without paying again for what
the runs share: TensorFlow and TFF imported, the task's data read, the process built and
compiled, the evaluation set up (`launch.run.builds`).

The sweep's runner (`launch.sweeps.runner`) starts it as
`python -m launch.sweeps.warm_slot` and talks to it in JSON lines: the slot writes
`{"ready": where it runs}` to its stdout once it has started; the runner writes a request
`{"name": ..., "settings": {flag: value}, "log": path, "metrics": [column, ...]}` to the
slot's stdin (the run's settings as data: the `launch.train` flags its command line gives,
`launch.run.settings.settings_of`; the metrics.csv columns the runner reads) and reads the
run's outcome from its stdout once it has ended: `{"name": ..., "status": exit status,
"error": the one line it ended with, or null, "metrics": {column: {round: value}}}`. A
request `{"name": ..., "runs": [such requests]}` trains its runs as batched cells
(`launch.sweeps.batched_cells`) and is answered `{"name": ..., "runs": [such outcomes]}`
once all have ended, each with `"alone"`: why the run trained alone, or null.
While a run trains, the slot's standard output and error (file descriptors 1 and 2, so
TensorFlow's and TFF's too) go to the run's log, which then reads as `launch.train`'s
output would, under the command that trains it alone and ending in the same one line on
failure; between runs they go to the slot's own log (its stderr). A stop signal ends
the run it trains at its next safe point, between rounds or a round's clients, as
`launch.train` (`launch.cli.stops.between_rounds`), saying what is kept, and then the
slot; end of input ends it too. absl's flags are not read for a run.

A Ray actor (`launch.sweeps.ray_driver`) answers the same requests, one per call
(`answer`); there a stop lands where it lands (Ray ends its workers by SIGTERM).
"""

import contextlib
import json
import os
import socket
import sys
import threading
import time
from typing import Mapping, Optional

from launch.cli import exit_status
from launch.cli import failures
from launch.cli import quiet
from launch.cli import stops
from launch.run import builds as builds_lib
from launch.run import experiment
from launch.run import settings as run_settings
from launch.run import training
from launch.sweeps import batched_cells
from tff_zmg import analysis

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
  """Where this slot runs: its pid, host (a Ray actor: its node's address), and the GPUs
  it may see."""
  host = socket.gethostname()
  ray = sys.modules.get('ray')
  if ray is not None and ray.is_initialized():
    host = f'{host}, Ray node {ray.util.get_node_ip_address()}'
  gpus = os.environ.get('CUDA_VISIBLE_DEVICES')
  return (f'warm slot {os.getpid()} on {host}'
          + ('' if gpus is None else f', CUDA_VISIBLE_DEVICES={gpus}'))


def start_line(settings: run_settings.Settings) -> str:
  """The line a run's log starts each attempt with: when, and the command that trains the
  run alone."""
  command = [sys.executable, '-m', 'launch.train', *settings.command_line()]
  return f'=== start {time.strftime("%Y-%m-%d %H:%M:%S")}: {" ".join(command)}'


def run_cell(request: Mapping, builds: builds_lib.Builds,
             between_rounds: experiment.BetweenRounds) -> dict:
  """Trains the run of `request` (its `settings` and `log`), its rounds entered in
  `between_rounds`; returns its outcome."""
  with output_to(request['log']):
    try:
      settings = run_settings.settings_of(request['settings'])
      print(start_line(settings), flush=True)
      print(f'--- {where()}', flush=True)
      training.train(settings, between_rounds, builds)
      return _outcome(request, exit_status.OK)
    except BaseException as e:  # pylint: disable=broad-except
      return _outcome(request, *failures.report(_RUN_PROGRAM, e))


def _outcome(request: Mapping, status: int, error: Optional[str] = None, **more) -> dict:
  """A run's answer: its name, exit status, one-line error (None: it finished) and the
  rounds' metrics it asks for (`rounds_of`)."""
  return {'name': request['name'], 'status': status, 'error': error,
          'metrics': rounds_of(request), **more}


def rounds_of(request: Mapping) -> dict:
  """`{column: {round: value}}` of the metrics.csv columns `request` asks for ('metrics')
  as its run's folder holds them now, earlier attempts' rounds too; {} when it asks for
  none or its settings make no run."""
  columns = request.get('metrics') or ()
  if not columns:
    return {}
  try:
    config = run_settings.config_of(run_settings.settings_of(request['settings']))
  except ValueError:
    return {}
  return analysis.runs.metrics_by_round(config.metrics_csv, columns)


def run_cells(request: Mapping, builds: builds_lib.Builds) -> list[dict]:
  """Trains the runs of `request['runs']` as batched cells; returns their outcomes, each
  with why it trained alone (None: it did not)."""
  runs = request['runs']
  ended_as: dict[str, tuple] = {}  # name -> (status, error)
  alone: dict[str, Optional[str]] = {}
  group = batched_cells.CellGroup(len(runs), builds)
  logs = {run['name']: open(run['log'], 'a') for run in runs}  # pylint: disable=consider-using-with

  # Set as each run's thread ends. (Not `Thread.join`: on Python 3.11 a signal landing
  # in it marks a thread that still runs as ended, and a run was cut off unreported.)
  ended = [threading.Event() for _ in runs]

  def train(member: int, name: str, stdout, stderr):
    try:
      with stdout.to(logs[name]), stderr.to(logs[name]), group.turn(member) as cell:
        try:
          settings = run_settings.settings_of(runs[member]['settings'])
          print(start_line(settings), flush=True)
          print(f'--- {where()}, one of {len(runs)} batched cells', flush=True)
          training.train(settings, experiment.stops_where_they_land, builds, cell)
          ended_as[name] = (exit_status.OK,)
        except BaseException as e:  # pylint: disable=broad-except
          ended_as[name] = failures.report(_RUN_PROGRAM, e)
        finally:
          alone[name] = cell.alone
    finally:
      ended[member].set()

  try:
    with batched_cells.thread_outputs() as (stdout, stderr):
      threads = [threading.Thread(target=train, args=(k, run['name'], stdout, stderr),
                                  name=f'cell-{run["name"]}', daemon=True)
                 for k, run in enumerate(runs)]
      for thread in threads:
        thread.start()
      try:
        _wait_for(ended)
      except KeyboardInterrupt:
        group.stop()  # Each run stops as on Ctrl-C, saying what it keeps.
        _wait_for(ended, through_stops=True)
  finally:
    for log in logs.values():
      log.close()
  return [_outcome(run, *ended_as.get(run['name'], (exit_status.INTERRUPTED,)),
                   alone=alone.get(run['name']))
          for run in runs]


def _wait_for(events: list[threading.Event], through_stops: bool = False) -> None:
  """Returns once every event is set; a stop signal reaches this (main) thread meanwhile,
  or, `through_stops`, is ignored (the runs already stop)."""
  for event in events:
    while True:
      try:
        if event.wait(0.5):
          break
      except KeyboardInterrupt:
        if not through_stops:
          raise


def answer(request: Mapping, builds: builds_lib.Builds,
           between_rounds: experiment.BetweenRounds) -> dict:
  """The answer to one request: its run's outcome (its rounds entered in
  `between_rounds`), or its batched runs' outcomes (a stop ends them where it lands)."""
  start = time.monotonic()
  if 'runs' in request:
    result = {'name': request['name'], 'runs': run_cells(request, builds)}
  else:
    result = run_cell(request, builds, between_rounds)
  return {**result, 'seconds': time.monotonic() - start}


def statuses(answer_: Mapping):
  """The exit status of the answer's run, or those of its batched runs by name."""
  if 'runs' not in answer_:
    return answer_['status']
  return {run['name']: run['status'] for run in answer_['runs']}


def interrupted(answer_: Mapping) -> bool:
  """Whether a run of the answer was interrupted (then its slot stops too)."""
  return exit_status.INTERRUPTED in [run['status'] for run in answer_.get('runs', [answer_])]


def serve(requests, results, builds: builds_lib.Builds) -> int:
  """Answers each request line of `requests` on `results`, until the input ends or a run
  is interrupted (then this slot stops too)."""
  for line in requests:
    request = json.loads(line)
    result = answer(request, builds, stops.between_rounds)
    results.write(json.dumps(result) + '\n')
    results.flush()
    print(f'{request["name"]}: exit status {statuses(result)}; built so far: {builds.built}',
          flush=True)
    if interrupted(result):
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
  failures.run_program('warm_slot', main)
