"""Flags of the small synthetic `launch.train` runs the program tests start, a program
running while a test acts on it (and its warm workers), a run killed with SIGKILL mid-way,
runs made once for the tests that only read or copy them, runs
written as `launch.train` leaves them, and what a trained run holds (its metrics but
times, its last checkpoint)."""

import contextlib
import csv
import json
import os
import signal
import subprocess

import psutil

from launch.sweeps import comparison
from tff_zmg import run_files

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


TIME_COLUMNS = ('training_time_in_seconds', 'evaluation/evaluation_time_in_seconds')


def metric_rows(run_dir) -> list[dict]:
  """A run's metrics.csv rows without the columns of seconds."""
  with open(os.path.join(run_dir, run_files.METRICS)) as f:
    return [{k: v for k, v in row.items() if k not in TIME_COLUMNS}
            for row in csv.DictReader(f)]


def final_checkpoint(run_dir) -> list:
  """The arrays of a run's newest checkpoint, flattened."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  folder = os.path.join(run_dir, run_files.CHECKPOINTS)
  versions = [int(n.rsplit('_', 1)[1]) for n in os.listdir(folder)
              if n.startswith('program_state_')]
  module = tf.saved_model.load(os.path.join(folder, f'program_state_{max(versions)}'))
  return [np.asarray(v) for v in tf.nest.flatten(module())]


def made_once(key, make):
  """`make()`, called by the first test of this test process that asks for `key`; later
  tests get its result. For runs that tests only read or copy: a module-scoped fixture
  cannot take function-scoped ones such as `run_program`. Keys start with the test module's
  name, since one process runs several modules."""
  if key not in _MADE:
    _MADE[key] = make()
  return _MADE[key]


@contextlib.contextmanager
def running(command, stderr=subprocess.PIPE, env=None):
  """`command` (a program's process, from the repository root, its stdout piped) running
  inside the block; killed if it still runs at the block's end (a failed test)."""
  proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=stderr,
                          text=True, env=env)
  try:
    yield proc
  finally:
    if proc.poll() is None:
      proc.kill()


def warm_workers(parent: int) -> list[psutil.Process]:
  """The warm workers (`launch.sweeps.warm_worker`) among the processes below `parent`."""
  try:
    children = psutil.Process(parent).children(recursive=True)
  except psutil.NoSuchProcess:
    return []
  return [p for p in children if 'launch.sweeps.warm_worker' in ' '.join(p.cmdline())]


def kill_when(command, line_start: str) -> list[str]:
  """Runs `command` and SIGKILLs it as soon as it prints a line starting with
  `line_start`; its stdout lines until then."""
  lines = []
  with running(command, stderr=subprocess.DEVNULL) as proc:
    for line in proc.stdout:
      lines.append(line)
      if line.startswith(line_start):
        proc.send_signal(signal.SIGKILL)
        break
    proc.communicate(timeout=120)
  return lines


def write_run(run, accuracies, diverged=False):
  """A run directory as launch.train leaves a finished run: flags.json, metrics.csv and
  the folder of its last checkpoint (empty: the runner only looks for it).

  flags.json holds exactly the settings of `run`, so the runner reuses the run only if
  the program (`launch.reproduce`, `launch.grid_search`) plans the very same run (other
  learning rates, rounds or data would be refused as 'a run with other settings').
  Diverged: as the runner records a run that diverged (with no round recorded, when
  `accuracies` is empty).
  """
  _write_run_files(run.config.output_dir, run.config.recorded(), accuracies, diverged)


def write_found_run(root, task, algo, seed, accuracies, diverged=False, **recorded):
  """A run as `launch.compare --collect_only` finds it in `root`: the settings recorded are
  a small synthetic run's, with `recorded` in place of any of them."""
  settings = dict(task=task, algo=algo, seed=seed, total_rounds=len(accuracies), hparams={},
                  data_source='synthetic', synthetic_settings={'seed': 0}, partition=None,
                  num_eval_clients=2)
  settings.update(recorded)
  _write_run_files(os.path.join(root, comparison.run_name(task, algo, seed)), settings,
                   accuracies, diverged)


def _write_run_files(run_dir, recorded, accuracies, diverged):
  os.makedirs(run_dir)
  with open(os.path.join(run_dir, 'flags.json'), 'w') as f:
    json.dump(recorded, f)
  with open(os.path.join(run_dir, 'metrics.csv'), 'w') as f:
    f.write('key,evaluation/sparse_categorical_accuracy,client_work/train/loss,'
            'training_time_in_seconds,evaluation/evaluation_time_in_seconds\n0,0.0,,,2.0\n')
    for r, a in enumerate(accuracies, start=1):
      f.write(f'{r},{a},1.0,{5.0 if r == 1 else 0.5},0.25\n')
  if diverged:
    with open(os.path.join(run_dir, run_files.DIVERGED), 'w') as f:
      f.write('diverged\n')
  else:
    os.makedirs(os.path.join(run_dir, run_files.CHECKPOINTS, f'program_state_{len(accuracies)}'))
