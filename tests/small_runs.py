"""Flags of the small synthetic `launch.train` runs the program tests start, the matrix of
models and algorithm families every guarantee is tested on (`MATRIX`, with each row's
uninterrupted run, trained once per test session), a program running while a test acts on
it (and its warm slots), a run killed with SIGKILL mid-way, runs made once for the tests
that only read or copy them, runs written as `launch.train` leaves them, and what a trained
run holds (its metrics but times, its last checkpoint)."""

import contextlib
import csv
import json
import os
import signal
import subprocess
import sys

import psutil

from launch.sweeps import comparison
from tasks import cache
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

# The guarantees (issue 52: the same command twice gives the same numbers; a killed run
# resumed, a warm, batched or Ray cell, one client at a time and TFF's worker each give its
# uninterrupted run's) are each tested on every row: every family of algorithm and every
# kind of model of the tests, each at least once, two rounds of two clients on tiny data.
# Two clients a round everywhere, so that every process picks the same threads per TF op
# (cores // clients at once) and a warm slot or Ray actor that trains several rows trains
# each with its own run's.
_SYNTHETIC = ('--data_source=synthetic', '--synthetic_train_clients=6',
              '--synthetic_test_clients=2')
_TWO_ROUNDS = ('--total_rounds=2', '--clients_per_round=2')
MATRIX = {
    # Stateless: FedZMG, on the EMNIST CNN (no random numbers).
    'emnist_cnn-fedzmg': ('--task=emnist', '--algo=fedzmg', *_SYNTHETIC,
                          '--synthetic_examples_per_client=12', '--client_batch_size=4',
                          *_TWO_ROUNDS),
    # FedGPS on the CIFAR-100 CNN, whose three dropouts draw masks in every step: three
    # steps a client (two at once in process failed to repeat when the masks were drawn
    # from a generator's state; FedGPS failed with AlreadyExistsError).
    'cifar100_cnn-fedgps': ('--task=cifar100', '--algo=fedgps', *_SYNTHETIC,
                            '--synthetic_examples_per_client=12', '--client_batch_size=4',
                            *_TWO_ROUNDS),
    # Stateful clients (SCAFFOLD's control variates) on GC-Fed's CIFAR CNN, from tfds.
    'cifar_cnn-scaffold': ('--task=cifar10', '--model=cnn', '--algo=scaffold',
                           '--num_clients=6', '--client_batch_size=5',
                           '--max_elements_per_client=10', *_TWO_ROUNDS),
    # An adaptive server (Adam) on the Shakespeare GRU (4M parameters): one snippet a client.
    'shakespeare_gru-fedadam': ('--task=shakespeare', '--algo=fedadam', *_SYNTHETIC,
                                '--synthetic_examples_per_client=2',
                                '--max_elements_per_client=1', *_TWO_ROUNDS),
}
# Not a row: GC-Fed on ResNet-18-GN (11M parameters), one step of two examples a client,
# its evaluation at the start and the end only, trained once for tests/test_cifar10.py,
# which reads its GC. A stateless round of a deterministic model is the first row's case;
# its reruns (killed, the same command, one client at a time) were the matrix's slowest.
RESNET18_GN_GCFED = ('--task=cifar10', '--model=resnet18_gn', '--algo=gcfed',
                     '--num_clients=2', '--client_batch_size=2', '--max_elements_per_client=2',
                     '--rounds_per_eval=2', *_TWO_ROUNDS)
# Every run `reference_run` makes, by name: the matrix's rows and that one.
RUNS = {**MATRIX, 'resnet18_gn-gcfed': RESNET18_GN_GCFED}
# Where the matrix's data and uninterrupted runs live: a folder of this test session
# (tests/conftest.py), shared by its processes (xdist's workers).
SHARED_ENV = 'TFF_ZMG_TEST_SHARED'
# tfds' CIFAR-10 written by `write_tiny_cifar10`: train and test examples.
TINY_CIFAR10 = (60, 20)


def write_tiny_cifar10(data_dir: str) -> None:
  """A tiny CIFAR-10 in tfds' own on-disk format under `data_dir`: TFRecord shards of
  examples serialized by the real `cifar10` builder's features (every class in each split),
  and the dataset_info.json tfds' `write_metadata` computes from them, so that
  `tfds.load('cifar10', data_dir=...)` reads it like the prepared download."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  builder = tfds.builder('cifar10', data_dir=data_dir)
  os.makedirs(builder.data_dir)
  rng = np.random.default_rng(0)
  for split, n in zip(('train', 'test'), TINY_CIFAR10):
    path = os.path.join(builder.data_dir, f'cifar10-{split}.tfrecord-00000-of-00001')
    with tf.io.TFRecordWriter(path) as writer:
      for i in range(n):
        writer.write(builder.info.features.serialize_example({
            'id': f'{split}_{i}',
            'image': rng.integers(0, 256, (32, 32, 3), dtype=np.uint8),
            'label': int(rng.integers(10)) if i >= 10 else i,
        }))
  tfds.folder_dataset.write_metadata(data_dir=builder.data_dir, features=builder.info.features)


def made_once_per_session(key: str, make) -> str:
  """`<shared folder>/<key>`, made by `make(folder)` once in this test session: the first
  process (of xdist's workers) to ask makes it, the others wait for it."""
  folder = os.path.join(os.environ[SHARED_ENV], key)
  done = os.path.join(folder, '.made')

  def build():
    make(folder)
    open(done, 'w').close()

  cache.build_once(folder, done, {'made by': 'tests/small_runs.py', 'key': key}, build)
  return folder


def matrix_data() -> str:
  """The cache folder of the matrix's runs: the tiny CIFAR-10 in it (the synthetic tasks'
  files are written by the first run that reads them)."""
  return made_once_per_session(
      'data', lambda folder: write_tiny_cifar10(folder))


def matrix_args(row: str, root, name: str = 'run', *extra) -> list[str]:
  """`launch.train`'s arguments of `RUNS[row]`, its run at `root/name`."""
  return [*RUNS[row], f'--cache_dir={matrix_data()}', f'--root_output_dir={root}',
          f'--experiment_name={name}', *extra]


def matrix_flag(row: str, name: str) -> str:
  """The value `RUNS[row]` gives flag `name` ('task', 'algo', ...)."""
  (value,) = [a.split('=', 1)[1] for a in RUNS[row] if a.startswith(f'--{name}=')]
  return value


def settings_of(args):
  """`launch.train`'s settings of its arguments `args` (parsed, absl's flags left unparsed)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from launch.run import settings  # pylint: disable=g-import-not-at-top
  flags.FLAGS.unparse_flags()
  try:
    flags.FLAGS(['train', *args])
    return settings.settings_from_flags()
  finally:
    flags.FLAGS.unparse_flags()


def cell_request(name: str, args, log: str) -> dict:
  """A warm slot's request (`launch.sweeps.warm_slot`) to train `launch.train`'s
  arguments `args` as run `name`, its output to `log`."""
  return {'name': name, 'settings': settings_of(args).given_values(), 'log': log}


def train_command(args) -> list[str]:
  return [sys.executable, '-m', 'launch.train', *args]


def reference_run(row: str) -> str:
  """The folder of `python -m launch.train` of `RUNS[row]`, uninterrupted: trained once
  per test session, by the first test to ask, and only read."""

  def train(folder):
    proc = subprocess.run(train_command(matrix_args(row, folder)), cwd=REPO,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr

  return os.path.join(made_once_per_session(f'reference/{row}', train), 'run')


TIME_COLUMNS = ('training_time_in_seconds', 'evaluation/evaluation_time_in_seconds')


def metric_rows(run_dir) -> list[dict]:
  """A run's metrics.csv rows without the columns of seconds."""
  with open(os.path.join(run_dir, run_files.METRICS)) as f:
    return [{k: v for k, v in row.items() if k not in TIME_COLUMNS}
            for row in csv.DictReader(f)]


def checkpoint(run_dir, version=None):
  """The state a run's checkpoint `version` holds (None: its newest), as TFF saved it."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  folder = os.path.join(run_dir, run_files.CHECKPOINTS)
  if version is None:
    version = max(int(n.rsplit('_', 1)[1]) for n in os.listdir(folder)
                  if n.startswith('program_state_'))
  return tf.saved_model.load(os.path.join(folder, f'program_state_{version}'))()


def checkpoint_arrays(run_dir, version=None) -> list:
  """The arrays of a run's checkpoint `version` (None: its newest), flattened."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return [np.asarray(v) for v in tf.nest.flatten(checkpoint(run_dir, version))]


def final_checkpoint(run_dir) -> list:
  """The arrays of a run's newest checkpoint, flattened."""
  return checkpoint_arrays(run_dir)


def client_states(run_dir) -> dict:
  """{client id: (version, arrays)} of each client's latest state in a run's disk store
  ({} where clients keep no state)."""
  from tff_zmg.client_states import state_file  # pylint: disable=g-import-not-at-top
  root = os.path.join(run_dir, 'client_states', 'clients')
  if not os.path.isdir(root):
    return {}
  states = {}
  for client in sorted(os.listdir(root)):
    latest = max(os.listdir(os.path.join(root, client)))
    states[client] = (latest, state_file.load(os.path.join(root, client, latest)))
  return states


def assert_same_run(run_dir, reference) -> None:
  """`run_dir` ends as `reference` does, bit for bit: its metrics (but times), its last
  checkpoint and each client's latest state."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  assert metric_rows(run_dir) == metric_rows(reference)
  for ours, theirs in zip(final_checkpoint(run_dir), final_checkpoint(reference), strict=True):
    np.testing.assert_array_equal(ours, theirs)
  ours, theirs = client_states(run_dir), client_states(reference)
  assert ours.keys() == theirs.keys()
  for client, (version, arrays) in theirs.items():
    assert ours[client][0] == version, client
    for a, b in zip(ours[client][1], arrays, strict=True):
      np.testing.assert_array_equal(a, b, err_msg=client)


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


def warm_slots(parent: int) -> list[psutil.Process]:
  """The warm slots (`launch.sweeps.warm_slot`) among the processes below `parent`."""
  try:
    children = psutil.Process(parent).children(recursive=True)
  except psutil.NoSuchProcess:
    return []
  return [p for p in children if 'launch.sweeps.warm_slot' in ' '.join(p.cmdline())]


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
