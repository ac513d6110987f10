"""A client-state store in memory, for populations whose states fit in RAM.

Fast (no file per client and round), but memory grows with every client that has
taken part. With a `snapshot_directory` it is checkpointed with the run: `commit`
writes every state to one file per checkpoint version, `restore` reads it back.

A round that reads and writes its clients' states itself (`state_file_paths`,
`adopt_state_files`, as the disk store) gets them as files in a scratch directory,
on the RAM disk `/dev/shm` where there is one, staged for that round only.
"""

import collections
import os
import shutil
import tempfile
from typing import Optional
import weakref

import numpy as np

from tff_zmg.client_states import state_file
from tff_zmg.client_states import store

_RAM_DISK = '/dev/shm'

_IDS = 'client_ids'
_LENGTHS = 'state_lengths'


class InMemoryClientStateStore(store.ClientStateStore):
  """Client states in a dict; snapshots under `snapshot_directory` if given."""

  def __init__(self, snapshot_directory: Optional[str] = None):
    self._states: dict[str, store.State] = {}
    self._snapshot_directory = snapshot_directory
    self._scratch: Optional[str] = None
    if snapshot_directory is not None:
      os.makedirs(snapshot_directory, exist_ok=True)

  def _scratch_directory(self) -> str:
    if self._scratch is None:
      ram_disk = _RAM_DISK if os.access(_RAM_DISK, os.W_OK) else None
      self._scratch = tempfile.mkdtemp(prefix='tff_zmg-client-states-', dir=ram_disk)
      weakref.finalize(self, shutil.rmtree, self._scratch, True)
    return self._scratch

  def state_file_paths(self, version: int, client_ids, initial_state: store.State):
    """The sampled clients' states staged as files for round `version` (see disk store)."""
    directory = self._scratch_directory()
    paths = []
    for n, client_id in enumerate(client_ids):
      read = os.path.join(directory, f'{version}-{n}-read{state_file.SUFFIX}')
      with open(read, 'wb') as f:
        f.write(state_file.encode(self._states.get(client_id, initial_state)))
      paths.append(
          collections.OrderedDict(
              read=read, write=os.path.join(directory, f'{version}-{n}-write{state_file.SUFFIX}')
          )
      )
    return paths

  def adopt_state_files(self, version: int, client_ids, bytes_written: int) -> None:
    """Reads the states the round wrote into memory and drops the staged files."""
    directory = self._scratch_directory()
    written = [
        os.path.join(directory, f'{version}-{n}-write{state_file.SUFFIX}')
        for n in range(len(client_ids))
    ]
    try:
      store.check_bytes_written(written, bytes_written)
      self.write(version, {i: state_file.load(p) for i, p in zip(client_ids, written)})
    finally:
      for name in os.listdir(directory):
        if name.startswith(f'{version}-'):
          os.remove(os.path.join(directory, name))

  def check_readable(self, client_ids) -> None:
    del client_ids  # States in memory are always readable.

  def _snapshot_path(self, version: int) -> str:
    return os.path.join(self._snapshot_directory, f'snapshot-{version:08d}.npz')

  def _snapshot_versions(self) -> list[int]:
    names = os.listdir(self._snapshot_directory)
    return sorted(
        int(n[len('snapshot-'): -len('.npz')])
        for n in names
        if n.startswith('snapshot-') and n.endswith('.npz')
    )

  def read(self, client_id: str) -> Optional[store.State]:
    return self._states.get(client_id)

  def write(self, version: int, states) -> None:
    del version  # Only the latest states are held; snapshots keep the versions.
    self._states.update({k: list(v) for k, v in states.items()})

  def commit(self, version: int, kept_versions) -> None:
    if self._snapshot_directory is None:
      return
    ids = sorted(self._states)
    arrays = {
        _IDS: np.array(ids, dtype=np.str_),
        _LENGTHS: np.array([len(self._states[i]) for i in ids], dtype=np.int64),
    }
    for n, client_id in enumerate(ids):
      for j, array in enumerate(self._states[client_id]):
        arrays[f'c{n}_{j}'] = np.asarray(array)
    store.save_arrays_atomically(self._snapshot_path(version), arrays)
    kept = set(kept_versions) | {version}
    for v in self._snapshot_versions():
      if v not in kept:
        os.remove(self._snapshot_path(v))

  def check_restorable(self, version: int) -> None:
    if self._snapshot_directory is None:
      raise ValueError(
          'an in-memory client-state store without a snapshot directory cannot be'
          f' restored to round {version}'
      )
    path = self._snapshot_path(version)
    if not os.path.exists(path):
      raise store.CorruptClientStateError(
          f'no client-state snapshot for checkpoint {version} ({path} is missing);'
          ' resume from an earlier checkpoint or start the run afresh with --overwrite'
      )

  def restore(self, version: Optional[int]) -> None:
    if version is None:
      self._states = {}
      return
    self.check_restorable(version)
    arrays = store.load_arrays(self._snapshot_path(version))
    self._states = {
        str(client_id): [arrays[f'c{n}_{j}'] for j in range(int(length))]
        for n, (client_id, length) in enumerate(zip(arrays[_IDS], arrays[_LENGTHS]))
    }

  def client_ids(self) -> list[str]:
    return sorted(self._states)
