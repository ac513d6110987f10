"""Derived data files on disk: content-addressed directories, built once, written atomically.

The synthetic data, the Dirichlet re-partitions and the SQLite copies of tfds datasets are
all files derived from settings. Each lives in a directory named by a digest of those
settings (with a `settings.json` describing them), is built by the first caller only, and
is written to a temporary file that is renamed into place, so a reader never sees a
partial file. `new_tff_sqlite` holds TFF's SQLite schema (the one
`tff.simulation.datasets.load_and_parse_sql_client_data` reads), which two of them write.
"""

import contextlib
import fcntl
import hashlib
import json
import os
import pathlib
import sqlite3
import sys
import tempfile
import time
from typing import Callable, Iterator, Optional


def settings_digest(description: dict) -> str:
  """The first 12 hex digits of the SHA-256 of `description` as sorted JSON."""
  return hashlib.sha256(json.dumps(description, sort_keys=True).encode('utf-8')).hexdigest()[:12]


def build_once(
    directory: str,
    file_path: str,
    description: dict,
    build: Callable[[], None],
    label: Optional[str] = None,
    doing: str = '',
) -> None:
  """Runs `build()` (which writes `file_path`) unless the file exists; one builder at a time.

  `directory` gets `settings.json` (`description`) and a `.lock` that concurrent callers
  (parallel grid cells) wait on instead of building the file twice. With `label`,
  progress goes to stderr: `<label>: <doing> ...` before, the path and the time after.
  """
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, '.lock'), 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if os.path.exists(file_path):
      return
    start = time.monotonic()
    if label:
      print(f'{label}: {doing} ...', file=sys.stderr, flush=True)
    with open(os.path.join(directory, 'settings.json'), 'w') as f:
      json.dump(description, f, indent=2, sort_keys=True)
    build()
    if label:
      print(
          f'{label}: wrote {file_path} ({time.monotonic() - start:.1f} s)',
          file=sys.stderr, flush=True,
      )


@contextlib.contextmanager
def atomic_path(path: str, prefix: str) -> Iterator[str]:
  """Yields a temporary path beside `path`, renamed over `path` if the block succeeds.

  On an error the temporary file is removed and `path` is left as it was. The writer
  holds an `flock` on its temporary file while it writes, so one whose writer is gone
  (killed with SIGKILL: nothing removed it) is unlocked, and the next writer of `path`
  removes it first.
  """
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  _remove_abandoned(directory, prefix)
  fd, tmp_path = tempfile.mkstemp(dir=directory, prefix=prefix, suffix='.tmp')
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)
    yield tmp_path
    os.replace(tmp_path, path)
  finally:
    os.close(fd)
    if os.path.exists(tmp_path):
      os.remove(tmp_path)


def _remove_abandoned(directory: str, prefix: str) -> None:
  """Removes `<prefix>*.tmp` files in `directory` that no live writer holds locked, with
  what SQLite keeps beside them (`<file>.tmp-journal`)."""
  names = [n for n in os.listdir(directory) if n.startswith(prefix) and '.tmp' in n]
  for stem in {n[:n.index('.tmp') + len('.tmp')] for n in names}:
    if _being_written(os.path.join(directory, stem)):
      continue
    for name in names:
      if name.startswith(stem):
        with contextlib.suppress(OSError):
          os.remove(os.path.join(directory, name))


def _being_written(path: str) -> bool:
  """Whether a live writer holds `path` locked (`atomic_path`)."""
  try:
    fd = os.open(path, os.O_RDONLY)
  except OSError:
    return False
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return False
  except BlockingIOError:
    return True
  finally:
    os.close(fd)


@contextlib.contextmanager
def new_tff_sqlite(path: str, prefix: str) -> Iterator[sqlite3.Connection]:
  """Yields a connection to a new database in TFF's schema, moved to `path` on success.

  The block fills `examples (split_name, client_id, serialized_example_proto)` and
  `client_metadata (client_id, split_name, num_examples)`; on leaving it the index TFF's
  per-client queries use is built and the changes committed before the rename.
  """
  with atomic_path(path, prefix) as tmp_path:
    with contextlib.closing(sqlite3.connect(pathlib.Path(tmp_path).as_uri(), uri=True)) as con:
      con.executescript("""
          CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL,
                                 serialized_example_proto BLOB NOT NULL);
          CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name TEXT NOT NULL,
                                        num_examples INTEGER NOT NULL);
      """)
      yield con
      # TFF reads a client with `WHERE client_id = ... AND split_name = ...`.
      con.execute('CREATE INDEX examples_by_client ON examples (client_id, split_name)')
      con.commit()
