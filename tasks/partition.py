"""Dirichlet re-partitioning of an image task's training examples over new clients.

The protocol of the GC-Fed, FedRKMGC and FedGPS papers (specification.md section 5): pool
the training examples of all clients and deal them out to K new clients, client k
drawing its label distribution q_k ~ Dirichlet(alpha * 1_C) over the C classes present;
small alpha gives clients dominated by a few classes, large alpha approaches IID. Every
client gets an equal share of the N examples (N // K, the first N % K clients one more),
so no client is empty, and every example goes to exactly one client
(`dirichlet_partition`, a pure function of the labels and a seed).

The new clients are written, with the task's test split unchanged, to a SQLite file in
TFF's own schema next to the source file (`<dir>/partitions/<task>-<hash>/<file>`), which
TFF's loader reads like the original: nothing is held in memory, the file is built once
per (source file, alpha, K, seed) and shared by every process and program that asks for
it (`ensure_partitioned_cache_dir`). The partition seed is separate from a run's training
seed, so runs with different seeds train on identical splits.
"""

import contextlib
import json
import os
import pathlib
import sqlite3
from typing import Sequence

import numpy as np
import tensorflow as tf

from tasks import cache
from tasks import checks

PARTITIONS = ('dirichlet',)
# Tasks whose examples carry one class label each (the `label` feature of TFF's files).
PARTITIONABLE_TASKS = ('emnist', 'cifar100', 'cifar10', 'cifar100_tfds')
# Bump when the algorithm or the file layout changes, so cached files are not reused.
_VERSION = 1
_READ_CHUNK = 10_000


def check_settings(
    task_name: str, partition: str, dirichlet_alpha, num_clients, partition_seed
) -> tuple[float, int, int]:
  """Validates a partition request; returns (alpha, num_clients, seed) as numbers."""
  if partition not in PARTITIONS:
    raise ValueError(f'Unknown partition {partition!r}; choose one of {list(PARTITIONS)}.')
  if task_name not in PARTITIONABLE_TASKS:
    raise ValueError(
        f'partition={partition!r} re-partitions by class label and applies to the image'
        f' tasks {list(PARTITIONABLE_TASKS)}, not {task_name!r} (its examples are text'
        ' snippets without one label each).'
    )
  if dirichlet_alpha is None or num_clients is None:
    raise ValueError(
        f'partition={partition!r} needs dirichlet_alpha and num_clients, got'
        f' {dirichlet_alpha!r} and {num_clients!r}.'
    )
  return (
      checks.check_positive('dirichlet_alpha', dirichlet_alpha),
      checks.check_integer('num_clients', num_clients, 1),
      checks.check_integer('partition_seed', 0 if partition_seed is None else partition_seed, 0),
  )


def dirichlet_partition(
    labels: Sequence[int], num_clients: int, alpha: float, seed: int = 0
) -> list[np.ndarray]:
  """Splits examples over clients with Dirichlet(alpha) label distributions per client.

  Client k draws q_k ~ Dirichlet(alpha * 1_C) over the C classes present in `labels` and
  holds n_k = N // K examples (the first N % K clients one more). Its class counts are
  drawn from Multinomial(n_k, q_k); a class asked for more often than it has examples
  left keeps a uniformly random subset of the requests (multivariate hypergeometric)
  and the clients cut short draw their remainder again from q_k restricted to the
  classes with examples left (from the remaining class sizes when q_k has no mass
  there). Each round exhausts at least one class, so at most C rounds. The examples of
  each class are then shuffled and dealt out in those counts.

  Args:
    labels: Integer class label of each of the N pooled examples.
    num_clients: K, 1 <= K <= N.
    alpha: The Dirichlet concentration, > 0; smaller is more skewed.
    seed: Seeds a `numpy.random.Generator`; equal arguments give equal partitions.

  Returns:
    K sorted arrays of indices into `labels`; each index is in exactly one.
  """
  labels = np.asarray(labels)
  if labels.ndim != 1 or labels.size == 0 or not np.issubdtype(labels.dtype, np.integer):
    raise ValueError('labels must be a non-empty 1-D array of integers')
  alpha = checks.check_positive('alpha', alpha)
  num_clients = checks.check_integer('num_clients', num_clients, 1)
  if num_clients > labels.size:
    raise ValueError(
        f'num_clients must be <= the number of examples ({labels.size}), got {num_clients}'
    )
  rng = np.random.default_rng(checks.check_integer('seed', seed, 0))
  classes, class_of_example = np.unique(labels, return_inverse=True)
  supply = np.bincount(class_of_example)
  sizes = np.full(num_clients, labels.size // num_clients)
  sizes[: labels.size % num_clients] += 1

  q = rng.dirichlet(np.full(classes.size, alpha), size=num_clients)
  counts = np.zeros((num_clients, classes.size), dtype=np.int64)
  left, short = supply.copy(), sizes.copy()
  while short.any():
    p = q * (left > 0)
    mass = p.sum(axis=1, keepdims=True)
    p = np.where(mass > 0, p / np.where(mass > 0, mass, 1), left / left.sum())
    draw = rng.multinomial(short, p)
    for c in np.flatnonzero(draw.sum(axis=0) > left):
      draw[:, c] = rng.multivariate_hypergeometric(draw[:, c], left[c])
    counts += draw
    left -= draw.sum(axis=0)
    short -= draw.sum(axis=1)

  parts = [[] for _ in range(num_clients)]
  for c in range(classes.size):
    members = rng.permutation(np.flatnonzero(class_of_example == c))
    for k, piece in enumerate(np.split(members, np.cumsum(counts[:, c])[:-1])):
      parts[k].append(piece)
  return [np.sort(np.concatenate(p)) for p in parts]


def _source_identity(path: str) -> dict:
  stat = os.stat(path)
  return {'path': os.path.realpath(path), 'size': stat.st_size, 'mtime_ns': stat.st_mtime_ns}


def _read_labels(con: sqlite3.Connection, split: str) -> tuple[np.ndarray, np.ndarray]:
  """(rowids, labels) of a split's examples, parsing only the `label` feature."""
  spec = {'label': tf.io.FixedLenFeature([], tf.int64)}
  rowids, labels = [], []
  cursor = con.execute(
      'SELECT rowid, serialized_example_proto FROM examples WHERE split_name = ?'
      ' ORDER BY rowid', (split,),
  )
  while chunk := cursor.fetchmany(_READ_CHUNK):
    ids, protos = zip(*chunk)
    rowids.append(np.array(ids, dtype=np.int64))
    labels.append(tf.io.parse_example(list(protos), spec)['label'].numpy())
  if not rowids:
    raise ValueError(f'the split {split!r} holds no examples to re-partition')
  return np.concatenate(rowids), np.concatenate(labels)


def write_partitioned_database(
    source_path: str, database_path: str, *, train_split: str, test_split: str,
    num_clients: int, alpha: float, seed: int,
) -> list[str]:
  """Writes TFF's SQLite schema with the re-partitioned train split and the test split.

  New client ids are `client_00000`, ...; each client's examples keep their pooled
  order. The file is written next to `database_path` and moved into place, so readers
  never see a partial file. Returns the new client ids.
  """
  source_uri = pathlib.Path(os.path.abspath(source_path)).as_uri() + '?mode=ro'
  with contextlib.closing(sqlite3.connect(source_uri, uri=True)) as src:
    rowids, labels = _read_labels(src, train_split)
  parts = dirichlet_partition(labels, num_clients, alpha, seed)
  width = max(5, len(str(num_clients - 1)))
  client_ids = [f'client_{k:0{width}d}' for k in range(num_clients)]
  with cache.new_tff_sqlite(database_path, prefix='.partition.') as con:
    con.execute('ATTACH DATABASE ? AS src', (source_uri,))
    con.execute(
        'CREATE TEMP TABLE assignment (source_rowid INTEGER PRIMARY KEY,'
        ' client_id TEXT NOT NULL)'
    )
    con.executemany(
        'INSERT INTO assignment VALUES (?, ?)',
        ((int(rowids[i]), cid) for cid, part in zip(client_ids, parts) for i in part),
    )
    con.execute(
        'INSERT INTO examples SELECT ?, a.client_id, e.serialized_example_proto'
        ' FROM assignment a JOIN src.examples e ON e.rowid = a.source_rowid'
        ' ORDER BY a.client_id, a.source_rowid', (train_split,),
    )
    con.executemany(
        'INSERT INTO client_metadata VALUES (?, ?, ?)',
        ((cid, train_split, len(part)) for cid, part in zip(client_ids, parts)),
    )
    con.execute(
        'INSERT INTO examples SELECT split_name, client_id, serialized_example_proto'
        ' FROM src.examples WHERE split_name = ? ORDER BY rowid', (test_split,),
    )
    con.execute(
        'INSERT INTO client_metadata SELECT client_id, split_name, num_examples'
        ' FROM src.client_metadata WHERE split_name = ?', (test_split,),
    )
  return client_ids


def ensure_partitioned_cache_dir(
    task_name: str, source_path: str, *, splits: tuple[str, str], partition: str,
    dirichlet_alpha: float, num_clients: int, partition_seed: int = 0,
) -> str:
  """The directory holding the re-partitioned copy of `source_path`; builds it once.

  The directory is `<dir of source>/partitions/<task>-<hash>/`, the hash covering the
  source file (path, size, modification time), the settings and the algorithm version;
  it also gets a settings.json. Concurrent callers (parallel grid cells) wait on a lock
  instead of building it twice. Pass the directory as `cache_dir` to TFF's loader.

  Args:
    task_name: One of `PARTITIONABLE_TASKS`.
    source_path: The task's SQLite file (TFF's, or a synthetic one).
    splits: The (train, test) split names TFF's loader reads.
    partition: 'dirichlet'.
    dirichlet_alpha: Dirichlet concentration, > 0.
    num_clients: Number of new training clients, >= 1.
    partition_seed: Seed of the partition, >= 0.

  Returns:
    The directory path.
  """
  alpha, num_clients, seed = check_settings(
      task_name, partition, dirichlet_alpha, num_clients, partition_seed
  )
  description = dict(
      task_name=task_name, source=_source_identity(source_path), partition=partition,
      dirichlet_alpha=alpha, num_clients=num_clients, partition_seed=seed,
      version=_VERSION,
  )
  directory = os.path.join(
      os.path.dirname(os.path.abspath(source_path)), 'partitions',
      f'{task_name}-{cache.settings_digest(description)}',
  )
  database_path = os.path.join(directory, os.path.basename(source_path))
  cache.build_once(
      directory, database_path, description,
      lambda: write_partitioned_database(
          source_path, database_path, train_split=splits[0], test_split=splits[1],
          num_clients=num_clients, alpha=alpha, seed=seed,
      ),
      label='partition',
      doing=f'dealing the {splits[0]!r} examples of {source_path} to {num_clients} clients,'
      f' Dirichlet alpha={alpha:g}, seed={seed}',
  )
  return directory
