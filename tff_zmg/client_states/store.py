"""Where clients' states live between the rounds they take part in.

A store maps client ids to states, each state a flat list of NumPy arrays (the
training loop flattens and packs them; stores do not know their structure). Writes
are versioned by round, so that a store can be checkpointed with the run:

    write(v, states)       the sampled clients' states after round v
    commit(v, kept)        checkpoint v was saved; `kept` are the checkpoint versions
                           still on disk (states no kept version needs may go)
    restore(v)             back to the states of checkpoint v (None: no states at all),
                           forgetting every write after it

so a run resumed from checkpoint v continues with exactly the states it had then.
"""

import abc
from collections.abc import Mapping, Sequence
import contextlib
import os
import tempfile
from typing import Optional
import zipfile

import numpy as np

State = list[np.ndarray]


class CorruptClientStateError(ValueError):
  """A stored client state cannot be read; the message names the file."""


class ClientStateStore(abc.ABC):
  """The interface every client-state store implements."""

  @abc.abstractmethod
  def read(self, client_id: str) -> Optional[State]:
    """The client's latest state, or None if it has never been written."""

  @abc.abstractmethod
  def write(self, version: int, states: Mapping[str, State]) -> None:
    """Records the states of some clients after round `version`."""

  @abc.abstractmethod
  def commit(self, version: int, kept_versions: Sequence[int]) -> None:
    """Makes the states written up to round `version` those of checkpoint `version`."""

  @abc.abstractmethod
  def restore(self, version: Optional[int]) -> None:
    """Returns to the states of checkpoint `version` (None: no states)."""

  @abc.abstractmethod
  def client_ids(self) -> list[str]:
    """The ids of the clients with a state, sorted."""


def save_arrays_atomically(path: str, arrays: Mapping[str, np.ndarray]) -> None:
  """Writes `arrays` to the `.npz` file `path` so that a crash never leaves it torn.

  The data goes to a temporary file in the same directory, is flushed to disk,
  and is then renamed over `path` (an atomic replace on POSIX); a crash leaves
  either the old file or the new one, plus at worst a stray `*.tmp` file that
  readers ignore.
  """
  directory = os.path.dirname(path) or '.'
  fd, tmp = tempfile.mkstemp(dir=directory, prefix='.', suffix='.tmp')
  try:
    with os.fdopen(fd, 'wb') as f:
      np.savez(f, **arrays)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.remove(tmp)
    raise
  # The rename itself must reach the disk before the write counts as done.
  dir_fd = os.open(directory, os.O_RDONLY)
  try:
    os.fsync(dir_fd)
  finally:
    os.close(dir_fd)


def load_arrays(path: str) -> dict[str, np.ndarray]:
  """The arrays of an `.npz` file written by `save_arrays_atomically`."""
  try:
    with np.load(path, allow_pickle=False) as data:
      return {name: data[name] for name in data.files}
  except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
    raise CorruptClientStateError(
        f'client state file {path} is unreadable ({type(e).__name__}: {e}); resume'
        ' from an earlier checkpoint or start the run afresh with --overwrite'
    ) from e


def state_to_arrays(state: State) -> dict[str, np.ndarray]:
  return {f'a{i}': np.asarray(a) for i, a in enumerate(state)}


def arrays_to_state(arrays: Mapping[str, np.ndarray]) -> State:
  return [arrays[f'a{i}'] for i in range(len(arrays))]
