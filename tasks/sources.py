"""Where a task's federated data comes from: TFF's own files, or our synthetic ones.

Both sources end in TFF's real loaders (`tff.simulation.datasets.<name>.load_data`), which
read `<cache_dir>/<file>.sqlite` and download it only when it is missing. A missing file on
a machine without network access ends in one `MissingDataError` that says which file to put
where; nothing ever falls back silently to other data.
"""

import contextlib
import os
import sqlite3
from typing import Callable, Optional

from google.protobuf import message as protobuf_message
import tensorflow as tf
import tensorflow_federated as tff

from tasks import partition as partition_lib
from tasks import synthetic

DATA_SOURCES = ('tff', 'synthetic')
DEFAULT_CACHE_DIR = os.path.join(os.path.expanduser('~'), '.tff')
_DOWNLOAD_ROOT = 'https://storage.googleapis.com/tff-datasets-public/'

_LOADERS: dict[str, Callable[[str], tuple]] = {
    'emnist': lambda d: tff.simulation.datasets.emnist.load_data(
        only_digits=False, cache_dir=d
    ),
    'cifar100': lambda d: tff.simulation.datasets.cifar100.load_data(cache_dir=d),
    'shakespeare': lambda d: tff.simulation.datasets.shakespeare.load_data(cache_dir=d),
}


class MissingDataError(FileNotFoundError):
  """The task's data file is not on this machine and could not be downloaded."""


class CorruptDataError(ValueError):
  """The task's data file exists but is not a TFF federated SQLite database."""


def _first_examples(con: sqlite3.Connection, path: str, splits) -> None:
  """Reads and parses one example of each split: garbage pages fail here, not in a round.

  Only the pages read are checked (a whole-file check would read gigabytes at every start);
  a bad page met later fails the run with TensorFlow's `DataLossError` (exit 2 too).
  """
  for split in splits:
    row = con.execute(
        'SELECT serialized_example_proto FROM examples WHERE split_name = ? LIMIT 1', (split,)
    ).fetchone()
    if row is None:
      raise CorruptDataError(
          f'{path} lists clients of the split {split!r} but holds none of its examples;'
          ' delete it and fetch it again.'
      )
    try:
      tf.train.Example.FromString(row[0])
    except (protobuf_message.DecodeError, TypeError) as e:
      raise CorruptDataError(
          f'{path} holds an example of the split {split!r} that is not a tf.train.Example'
          f' ({e}); the file is damaged: delete it and fetch it again.'
      ) from e


def _check_database(path: str, splits: tuple[str, ...]) -> None:
  """Fails with one clear message unless `path` holds TFF's tables, the splits, and a
  readable first example of each."""
  try:
    with contextlib.closing(sqlite3.connect(f'file:{path}?mode=ro', uri=True)) as con:
      tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
      missing = {'examples', 'client_metadata'} - tables
      found = set()
      if not missing:
        found = {r[0] for r in con.execute('SELECT DISTINCT split_name FROM client_metadata')}
      if not missing and set(splits) <= found:
        _first_examples(con, path, splits)
  except sqlite3.DatabaseError as e:
    raise CorruptDataError(
        f'{path} is not a readable SQLite database ({e}). Delete it and fetch it again.'
    ) from e
  if missing:
    raise CorruptDataError(
        f'{path} lacks the table(s) {sorted(missing)} of TFF\'s federated SQLite schema;'
        ' delete it and fetch it again.'
    )
  if not set(splits) <= found:
    raise CorruptDataError(
        f'{path} has the splits {sorted(found)}, not the {list(splits)} this task reads;'
        ' is it the right file?'
    )


def _missing_data_message(task_name: str, path: str, error: Exception) -> str:
  name = os.path.basename(path)
  return (
      f'The federated {task_name} data is not on this machine: {path} does not exist, and'
      f' downloading it failed ({error}). On a machine with network access, fetch'
      f' {_DOWNLOAD_ROOT}{name}.lzma, decompress it (`xz -d {name}.lzma`) and put'
      f' {name} in {os.path.dirname(path)} (or point --cache_dir at the directory that holds'
      ' it). To try the package without the real data, use --data_source=synthetic.'
  )


def load_client_data(
    task_name: str,
    data_source: str = 'tff',
    cache_dir: Optional[str] = None,
    synthetic_settings: Optional[dict] = None,
    partition: Optional[dict] = None,
):
  """Returns the raw `(train, test)` `tff.simulation.datasets.ClientData` of a task.

  Args:
    task_name: 'emnist', 'cifar100' or 'shakespeare'.
    data_source: 'tff' (TFF's published files) or 'synthetic' (generated, cached).
    cache_dir: Where the SQLite files live; TFF's default `~/.tff` when None.
    synthetic_settings: Keyword arguments for `synthetic.ensure_synthetic_cache_dir`
      (client counts, examples per client, Dirichlet alpha, seed, volume skew).
    partition: Keyword arguments for `partition.ensure_partitioned_cache_dir`
      (`partition`, `dirichlet_alpha`, `num_clients`, `partition_seed`) to train on the
      task's examples dealt out to new clients; None keeps the dataset's own clients.

  Raises:
    MissingDataError: the real file is absent and cannot be downloaded.
    CorruptDataError: the file is not a TFF federated database.
    ValueError: unknown task or data source.
  """
  path = database_path(task_name, data_source, cache_dir, synthetic_settings, partition)
  return _LOADERS[task_name](os.path.dirname(path))


def database_path(
    task_name: str,
    data_source: str = 'tff',
    cache_dir: Optional[str] = None,
    synthetic_settings: Optional[dict] = None,
    partition: Optional[dict] = None,
) -> str:
  """The SQLite file `load_client_data` reads (same arguments and errors): TFF's
  (downloaded by TFF's loader where it is missing and the network allows), a synthetic
  one, or a partition of either, made first where it is derived data."""
  if task_name not in _LOADERS:
    raise ValueError(f'Unknown task {task_name!r}; choose one of {sorted(_LOADERS)}.')
  if data_source not in DATA_SOURCES:
    raise ValueError(
        f'Unknown data_source {data_source!r}; choose one of {list(DATA_SOURCES)}.'
    )
  if partition is not None:
    partition_lib.check_settings(task_name, **partition)
  cache_dir = os.path.expanduser(cache_dir or DEFAULT_CACHE_DIR)
  if data_source == 'synthetic':
    cache_dir = synthetic.ensure_synthetic_cache_dir(
        task_name, cache_dir, **(synthetic_settings or {})
    )
  elif synthetic_settings:
    raise ValueError('synthetic_settings only apply to data_source="synthetic".')
  path = os.path.join(cache_dir, synthetic.SQLITE_FILENAMES[task_name])
  if not os.path.exists(path):
    try:
      _LOADERS[task_name](cache_dir)  # TFF downloads it when the network allows.
    except OSError as e:
      with contextlib.suppress(OSError):
        os.remove(path)  # TFF writes the download in place: never leave half a file.
      raise MissingDataError(_missing_data_message(task_name, path, e)) from e
  _check_database(path, synthetic.SPLIT_NAMES[task_name])
  if partition is None:
    return path
  directory = partition_lib.ensure_partitioned_cache_dir(
      task_name, path, splits=synthetic.SPLIT_NAMES[task_name], **partition
  )
  return os.path.join(directory, os.path.basename(path))
