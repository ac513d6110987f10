"""Centralized image datasets from `tensorflow_datasets`, made federated by a Dirichlet deal.

The GC-Fed, FedRKMGC and FedGPS papers train on CIFAR-10/100 pooled and dealt out to N
clients with Dirichlet(alpha) label distributions, and evaluate on the held-out test set.
Here the prepared tfds dataset (`tfds.load(name, data_dir=...)`, never downloaded by us)
is copied once into TFF's SQLite schema (`<data_dir>/tff_sqlite/<name>-<hash>/<name>.sqlite`):
the train split as one pooled client, the test split as `NUM_TEST_CLIENTS` fixed clients of
consecutive examples, so that evaluation on "the first N sorted test clients" covers the
whole test set. `tasks.partition` then deals the pooled train split out (the same code and
cache as for the TFF tasks), and TFF's `SqlClientData` reads the result: nothing is held in
memory, and every process asking for the same settings shares one file.

Examples are stored as `tf.train.Example`s with `image` (the raw 32x32x3 uint8 bytes) and
`label` (int64), and read back as `{'image': uint8 (32, 32, 3), 'label': int64}`, the
element layout of TFF's CIFAR-100, so the CIFAR preprocessing applies unchanged.
"""

import os
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import cache
from tasks import partition as partition_lib
from tasks import sources

# Task name -> tfds dataset name.
TFDS_DATASETS = {'cifar10': 'cifar10', 'cifar100_tfds': 'cifar100'}
SPLITS = ('train', 'test')
IMAGE_SHAPE = (32, 32, 3)
NUM_TEST_CLIENTS = 10
POOL_CLIENT_ID = 'pool'
DEFAULT_DATA_DIR = os.path.join(os.path.expanduser('~'), 'tensorflow_datasets')
# Bump when the SQLite layout changes, so converted files are not reused.
_VERSION = 1
_WRITE_CHUNK = 1000


def missing_data_message(dataset: str, data_dir: str, error: Exception) -> str:
  return (
      f'The {dataset} data is not on this machine: tfds.load({dataset!r},'
      f' data_dir={data_dir!r}) found no prepared dataset ({error}). On a machine with'
      f' network access, run  python -c "import tensorflow_datasets as tfds;'
      f" tfds.load('{dataset}', data_dir='DIR')\"  and copy DIR/{dataset} to"
      f' {os.path.join(data_dir, dataset)} (or point --cache_dir at a directory holding'
      f' {dataset}/<version>/ with its dataset_info.json and tfrecord files).'
  )


def _builder(dataset: str, data_dir: str):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  builder = tfds.builder(dataset, data_dir=data_dir)
  if not builder.is_prepared():
    raise sources.MissingDataError(
        missing_data_message(dataset, data_dir, f'no {builder.data_dir}')
    )
  return builder


def _serialize(image: np.ndarray, label: int) -> bytes:
  return tf.train.Example(features=tf.train.Features(feature={
      'image': tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
      'label': tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
  })).SerializeToString()


def test_client_ids(num_examples: int) -> list[str]:
  """The fixed test clients: `test_00`, ..., min(NUM_TEST_CLIENTS, N) of them."""
  return [f'test_{k:02d}' for k in range(min(NUM_TEST_CLIENTS, num_examples))]


def _test_client_of(num_examples: int) -> np.ndarray:
  """Client index per test example: consecutive runs, sizes differing by at most one."""
  ids = test_client_ids(num_examples)
  return np.repeat(
      np.arange(len(ids)), [len(c) for c in np.array_split(np.arange(num_examples), len(ids))]
  )


def write_database(builder, database_path: str) -> None:
  """Copies the builder's train and test splits into TFF's SQLite schema (atomically)."""
  with cache.new_tff_sqlite(database_path, prefix='.tfds.') as con:
    for split in SPLITS:
      num_examples = builder.info.splits[split].num_examples
      if split == 'train':
        client_of = np.zeros(num_examples, dtype=np.int64)
        ids = [POOL_CLIENT_ID]
      else:
        client_of, ids = _test_client_of(num_examples), test_client_ids(num_examples)
      # shuffle_files=False keeps tfds' stored order, so the copy is deterministic.
      dataset = builder.as_dataset(split=split, shuffle_files=False).batch(_WRITE_CHUNK)
      index = 0
      for batch in dataset.as_numpy_iterator():
        rows = []
        for image, label in zip(batch['image'], batch['label']):
          rows.append((split, ids[client_of[index]], _serialize(image, label)))
          index += 1
        con.executemany('INSERT INTO examples VALUES (?, ?, ?)', rows)
      if index != num_examples:
        raise ValueError(
            f'{builder.data_dir}: the {split!r} split holds {index} examples, its'
            f' dataset_info.json says {num_examples}'
        )
      con.executemany(
          'INSERT INTO client_metadata VALUES (?, ?, ?)',
          ((cid, split, int(n)) for cid, n in zip(ids, np.bincount(client_of))),
      )


def ensure_database(task_name: str, data_dir: Optional[str] = None) -> str:
  """The SQLite copy of the task's tfds dataset; converts it once (under a lock).

  Raises:
    sources.MissingDataError: `tfds.load(name, data_dir=data_dir)` would find nothing.
  """
  dataset = TFDS_DATASETS[task_name]
  data_dir = os.path.abspath(os.path.expanduser(data_dir or DEFAULT_DATA_DIR))
  builder = _builder(dataset, data_dir)
  info_path = os.path.join(builder.data_dir, 'dataset_info.json')
  stat = os.stat(info_path)
  description = dict(
      dataset=dataset, tfds_dir=os.path.realpath(str(builder.data_dir)),
      info_size=stat.st_size, info_mtime_ns=stat.st_mtime_ns, version=_VERSION,
  )
  digest = cache.settings_digest(description)
  directory = os.path.join(data_dir, 'tff_sqlite', f'{task_name}-{digest}')
  database_path = os.path.join(directory, f'{task_name}.sqlite')
  cache.build_once(
      directory, database_path, description, lambda: write_database(builder, database_path),
      label='tfds', doing=f"copying {builder.data_dir} into TFF's SQLite schema",
  )
  return database_path


def _parse(serialized: tf.Tensor):
  features = tf.io.parse_single_example(serialized, {
      'image': tf.io.FixedLenFeature([], tf.string),
      'label': tf.io.FixedLenFeature([], tf.int64),
  })
  image = tf.reshape(tf.io.decode_raw(features['image'], tf.uint8), IMAGE_SHAPE)
  return {'image': image, 'label': features['label']}


def _client_data(database_path: str, split: str) -> tff.simulation.datasets.ClientData:
  return tff.simulation.datasets.SqlClientData(database_path, split).preprocess(
      lambda dataset: dataset.map(_parse)
  )


def load_client_data(task_name: str, data_dir: Optional[str], partition: dict):
  """(train, test) ClientData: the tfds train split dealt out, the test split's clients.

  Args:
    task_name: One of `TFDS_DATASETS`.
    data_dir: The tfds data directory (tfds' default `~/tensorflow_datasets` when None).
    partition: Keyword arguments of `partition.ensure_partitioned_cache_dir`
      (`partition`, `dirichlet_alpha`, `num_clients`, `partition_seed`); required.
  """
  path = database_path(task_name, data_dir, partition)
  return _client_data(path, 'train'), _client_data(path, 'test')


def database_path(task_name: str, data_dir: Optional[str], partition: dict) -> str:
  """The SQLite file `load_client_data` reads (same arguments), made once."""
  if task_name not in TFDS_DATASETS:
    raise ValueError(f'Unknown tfds task {task_name!r}; choose one of {list(TFDS_DATASETS)}.')
  if partition is None:
    raise ValueError(
        f'{task_name} is a centralized dataset: it needs partition="dirichlet" with'
        ' dirichlet_alpha and num_clients (--partition=dirichlet --dirichlet_alpha=A'
        ' --num_clients=N, or a --protocol).'
    )
  partition_lib.check_settings(task_name, **partition)
  source = ensure_database(task_name, data_dir)
  directory = partition_lib.ensure_partitioned_cache_dir(
      task_name, source, splits=SPLITS, **partition
  )
  return os.path.join(directory, os.path.basename(source))
