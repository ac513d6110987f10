"""A client-state store on disk: one directory per client, one file per version.

Memory stays flat in the number of clients: only the states of the clients being
read or written are ever in memory. (3,400 EMNIST clients with FedRKMGC's two
1.69M-parameter corrections each are 46 GB: a disk, not a memory, workload.)

Layout: `<directory>/clients/<quoted client id (also '.')>/<round, 8 digits>.npz`. Each file is
written atomically (`store.save_arrays_atomically`). A client's version `v` is kept as
long as some kept checkpoint `k` needs it (`v` is the client's latest version <= `k`);
restoring to checkpoint `k` deletes every version after `k`.
"""

import os
from typing import Optional
import urllib.parse

from tff_zmg.client_states import store

_SUFFIX = '.npz'
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
    # Clients that may hold versions no kept checkpoint needs any more.
    self._unpruned: set[str] = set()

  @property
  def directory(self) -> str:
    return os.path.dirname(self._root)

  def _client_dir(self, client_id: str) -> str:
    return os.path.join(self._root, _directory_name(client_id))

  def _path(self, client_id: str, version: int) -> str:
    return os.path.join(self._client_dir(client_id), f'{version:08d}{_SUFFIX}')

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

  def read(self, client_id: str) -> Optional[store.State]:
    versions = self._versions(client_id)
    if not versions:
      return None
    return store.arrays_to_state(
        store.load_arrays(self._path(client_id, versions[-1]))
    )

  def write(self, version: int, states) -> None:
    for client_id, state in states.items():
      os.makedirs(self._client_dir(client_id), exist_ok=True)
      store.save_arrays_atomically(
          self._path(client_id, version), store.state_to_arrays(state)
      )
      self._unpruned.add(client_id)

  def commit(self, version: int, kept_versions) -> None:
    kept = sorted(set(kept_versions) | {version})
    for client_id in sorted(self._unpruned):
      versions = self._versions(client_id)
      needed = {max((v for v in versions if v <= k), default=None) for k in kept}
      for v in versions:
        if v <= version and v not in needed:
          os.remove(self._path(client_id, v))
      if len(self._versions(client_id)) <= 1:
        self._unpruned.discard(client_id)

  def restore(self, version: Optional[int]) -> None:
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

  def client_ids(self) -> list[str]:
    return sorted(
        urllib.parse.unquote(name)
        for name in os.listdir(self._root)
        if self._versions(urllib.parse.unquote(name))
    )
