"""A client-state store on disk: one directory per client, one file per version.

Memory stays flat in the number of clients: only the states of the clients being
read or written are ever in memory. (3,400 EMNIST clients with FedRKMGC's two
1.69M-parameter corrections each are 46 GB: a disk, not a memory, workload.)

Layout: `<directory>/clients/<quoted client id (also '.')>/<round, 8 digits>.tfstate`
(format: `state_file`) and `<directory>/initial.tfstate`, the state of a client that
never took part. A client's version `v` is kept as long as some kept checkpoint `k`
needs it (`v` is the client's latest version <= `k`); restoring to checkpoint `k`
deletes every version after `k`. `<directory>/index/<k, 8 digits>.json` lists the
version of every client that checkpoint `k` needs, written before the checkpoint, so
that restoring to `k` refuses a missing file instead of falling back to the client's
older version.

States arrive two ways. `write` writes them from Python, each file atomically. With
`state_file_paths` and `adopt_state_files`, TFF's worker reads each sampled client's
latest file and writes its new state to a temporary file itself, and adopting renames
those into place: a round's states (two model-sized vectors per FedRKMGC client) then
never travel between Python and the worker. Either way files reach the disk at
`sync()`, before a checkpoint that needs them is saved, not after every write: a round
no checkpoint holds is dropped on resume anyway.
"""

import collections
import json
import os
from typing import Optional
import urllib.parse

from tff_zmg.client_states import state_file
from tff_zmg.client_states import store

_SUFFIX = state_file.SUFFIX
_LEGACY_SUFFIX = '.npz'  # Before state files: NumPy archives written from Python only.
_WORKER_SUFFIX = '.worker.tmp'
_MAX_NAME_LENGTH = 240  # File systems allow 255 bytes per name.


def _directory_name(client_id: str) -> str:
  """A reversible file name for any client id ('/', '..', spaces, non-ASCII)."""
  name = urllib.parse.quote(client_id, safe='').replace('.', '%2E')
  if not name or len(name) > _MAX_NAME_LENGTH:
    raise ValueError(
        f'client id {client_id!r} cannot be a directory name (empty, or over'
        f' {_MAX_NAME_LENGTH} characters once quoted)'
    )
  return name


class DiskClientStateStore(store.ClientStateStore):
  """Client states as files under `directory` (created if missing)."""

  def __init__(self, directory: str):
    self._root = os.path.join(directory, 'clients')
    os.makedirs(self._root, exist_ok=True)
    self._index_dir = os.path.join(directory, 'index')
    # client id -> its latest version (None: not read from the disk yet).
    self._latest: Optional[dict[str, int]] = None
    # Clients that may hold versions no kept checkpoint needs any more.
    self._unpruned: set[str] = set()
    # Files written since the last `sync`.
    self._unsynced: set[str] = set()
    self._initial_state_written = False

  @property
  def directory(self) -> str:
    return os.path.dirname(self._root)

  def _client_dir(self, client_id: str) -> str:
    return os.path.join(self._root, _directory_name(client_id))

  def _path(self, client_id: str, version: int) -> str:
    return os.path.join(self._client_dir(client_id), f'{version:08d}{_SUFFIX}')

  def _worker_path(self, client_id: str, version: int) -> str:
    # Hidden and not ending in the suffix: readers skip it and `restore` deletes it.
    return os.path.join(self._client_dir(client_id), f'.{version:08d}{_WORKER_SUFFIX}')

  def _initial_path(self) -> str:
    return os.path.join(self.directory, f'initial{_SUFFIX}')

  def _versions(self, client_id: str) -> list[int]:
    try:
      names = os.listdir(self._client_dir(client_id))
    except FileNotFoundError:
      return []
    return sorted(
        int(n[: -len(_SUFFIX)])
        for n in names
        if n.endswith(_SUFFIX) and n[: -len(_SUFFIX)].isdigit()
    )

  def _latest_path(self, client_id: str) -> Optional[str]:
    versions = self._versions(client_id)
    return self._path(client_id, versions[-1]) if versions else None

  def _written(self, client_id: str, version: int, path: str) -> None:
    self._unsynced.add(path)
    self._unpruned.add(client_id)
    if self._latest is not None:
      self._latest[client_id] = max(version, self._latest.get(client_id, version))

  def _latest_versions(self) -> dict[str, int]:
    if self._latest is None:
      self._latest = {}
      for name in os.listdir(self._root):
        versions = self._versions(urllib.parse.unquote(name))
        if versions:
          self._latest[urllib.parse.unquote(name)] = versions[-1]
    return self._latest

  def _index_path(self, version: int) -> str:
    return os.path.join(self._index_dir, f'{version:08d}.json')

  def _index_versions(self) -> list[int]:
    try:
      names = os.listdir(self._index_dir)
    except FileNotFoundError:
      return []
    return sorted(int(n[:-5]) for n in names if n.endswith('.json') and n[:-5].isdigit())

  def _write_index(self, version: int) -> None:
    """Records the version of each client's state that checkpoint `version` needs."""
    needed = {}
    for client_id, latest in self._latest_versions().items():
      if latest > version:  # Written after `version`: the checkpoint needs an older one.
        latest = max((v for v in self._versions(client_id) if v <= version), default=None)
      if latest is not None:
        needed[client_id] = latest
    os.makedirs(self._index_dir, exist_ok=True)
    data = json.dumps(needed, sort_keys=True).encode('utf-8')
    path = self._index_path(version)
    store.replace_atomically(path, lambda f: f.write(data), sync=False)
    self._unsynced.add(path)

  def _check_index(self, version: int) -> None:
    """Raises `CorruptClientStateError` naming a state file checkpoint `version` needs
    but that is missing (older runs have no index and are not checked)."""
    path = self._index_path(version)
    try:
      with open(path, 'rb') as f:
        needed = json.loads(f.read().decode('utf-8'))
    except FileNotFoundError:
      self._latest = None
      return
    except (OSError, ValueError) as e:
      raise store.corrupt_state_error(path, e) from e
    for client_id, needed_version in sorted(needed.items()):
      state_path = self._path(client_id, needed_version)
      if not os.path.exists(state_path):
        raise store.CorruptClientStateError(
            f'client state file {state_path} is missing: checkpoint {version} needs it'
            f' (the state of client {client_id!r} after round {needed_version}; an older'
            ' one would give other results); restore the file, or start the run afresh'
            ' with --overwrite'
        )
    self._latest = dict(needed)

  def read(self, client_id: str) -> Optional[store.State]:
    path = self._latest_path(client_id)
    return None if path is None else state_file.load(path)

  def write(self, version: int, states) -> None:
    for client_id, state in states.items():
      os.makedirs(self._client_dir(client_id), exist_ok=True)
      data = state_file.encode(state)
      path = self._path(client_id, version)
      store.replace_atomically(path, lambda f, data=data: f.write(data), sync=False)
      self._written(client_id, version, path)

  def state_file_paths(self, version: int, client_ids, initial_state: store.State):
    """Where TFF's worker reads and writes the clients' states in round `version`.

    Args:
      version: The round.
      client_ids: The sampled clients.
      initial_state: The state of a client that never took part (flat, in file order).

    Returns:
      One `OrderedDict(read=path, write=path)` per client: its latest state file (the
      initial state's if none), and the temporary file for its new state, which
      `adopt_state_files` moves into place once the round is done.
    """
    if not self._initial_state_written:
      data = state_file.encode(initial_state)
      store.replace_atomically(self._initial_path(), lambda f: f.write(data), sync=False)
      self._initial_state_written = True
    paths = []
    for client_id in client_ids:
      os.makedirs(self._client_dir(client_id), exist_ok=True)
      paths.append(
          collections.OrderedDict(
              read=self._latest_path(client_id) or self._initial_path(),
              write=self._worker_path(client_id, version),
          )
      )
    return paths

  def adopt_state_files(self, version: int, client_ids, bytes_written: int) -> None:
    """Renames the files the worker wrote in round `version` into place.

    Args:
      version: The round.
      client_ids: The clients of `state_file_paths`, in its order.
      bytes_written: The bytes the worker reported writing to all their files; files
        that hold fewer (a full disk) are refused, not adopted.
    """
    written = [self._worker_path(client_id, version) for client_id in client_ids]
    store.check_bytes_written(written, bytes_written)
    for client_id, path_written in zip(client_ids, written):
      path = self._path(client_id, version)
      os.replace(path_written, path)
      self._written(client_id, version, path)

  def check_readable(self, client_ids) -> None:
    """Raises `CorruptClientStateError` naming the first unreadable latest state."""
    for client_id in client_ids:
      path = self._latest_path(client_id)
      if path is not None:
        state_file.load(path)

  def sync(self) -> None:
    # A file written and then pruned or restored away no longer needs the disk.
    store.fsync_files(sorted(p for p in self._unsynced if os.path.exists(p)))
    self._unsynced.clear()

  def prepare_commit(self, version: int) -> None:
    self._write_index(version)
    self.sync()

  def commit(self, version: int, kept_versions) -> None:
    if not os.path.exists(self._index_path(version)):  # No `prepare_commit` call.
      self._write_index(version)
    self.sync()
    kept = sorted(set(kept_versions) | {version})
    for v in self._index_versions():
      if v not in kept:
        os.remove(self._index_path(v))
    for client_id in sorted(self._unpruned):
      versions = self._versions(client_id)
      needed = {max((v for v in versions if v <= k), default=None) for k in kept}
      for v in versions:
        if v <= version and v not in needed:
          os.remove(self._path(client_id, v))
      if len(self._versions(client_id)) <= 1:
        self._unpruned.discard(client_id)

  def restore(self, version: Optional[int]) -> None:
    self._refuse_legacy_files()
    self._unpruned.clear()
    for name in os.listdir(self._root):
      client_dir = os.path.join(self._root, name)
      for file_name in os.listdir(client_dir):
        stem = file_name[: -len(_SUFFIX)]
        stale = not (file_name.endswith(_SUFFIX) and stem.isdigit())  # *.tmp
        if stale or version is None or int(stem) > version:
          os.remove(os.path.join(client_dir, file_name))
      remaining = os.listdir(client_dir)
      if not remaining:
        os.rmdir(client_dir)
      elif len(remaining) > 1:
        self._unpruned.add(urllib.parse.unquote(name))
    for v in self._index_versions():
      if version is None or v > version:
        os.remove(self._index_path(v))
    if version is None:
      self._latest = {}
    else:
      self._check_index(version)

  def _refuse_legacy_files(self) -> None:
    # Deleting them as strays would silently restart those clients from zero.
    for name in os.listdir(self._root):
      for file_name in os.listdir(os.path.join(self._root, name)):
        if file_name.endswith(_LEGACY_SUFFIX):
          raise store.CorruptClientStateError(
              f'{os.path.join(self._root, name, file_name)} is a client state in the'
              ' .npz format of tff_zmg before state files; resume this run with that'
              ' version, or start it afresh with --overwrite'
          )

  def client_ids(self) -> list[str]:
    return sorted(
        urllib.parse.unquote(name)
        for name in os.listdir(self._root)
        if self._versions(urllib.parse.unquote(name))
    )
