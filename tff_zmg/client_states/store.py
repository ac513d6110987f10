"""Where clients' states live between the rounds they take part in.

A store maps client ids to states, each state a flat list of NumPy arrays (the
training loop flattens and packs them; stores do not know their structure). Writes
are versioned by round, so that a store can be checkpointed with the run:

    write(v, states)       the sampled clients' states after round v
    sync()                 every write so far is on the disk
    prepare_commit(v)      before checkpoint v is saved: `sync`, and record what the
                           checkpoint needs, so that `restore(v)` can check it is there
    commit(v, kept)        checkpoint v was saved; `kept` are the checkpoint versions
                           still on disk (states no kept version needs may go)
    restore(v)             back to the states of checkpoint v (None: no states at all),
                           forgetting every write after it

so a run resumed from checkpoint v continues with exactly the states it had then.
"""

import abc
from collections.abc import Callable, Iterable, Mapping, Sequence
import contextlib
import os
import tempfile
from typing import BinaryIO, Optional
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

  def sync(self) -> None:
    """Makes every write so far survive a crash of the machine (default: nothing to do)."""

  def prepare_commit(self, version: int) -> None:
    """Called before checkpoint `version` is saved: the states it needs reach the disk.

    A store may also record which states the checkpoint needs (default: only `sync`).
    """
    del version
    self.sync()

  @abc.abstractmethod
  def commit(self, version: int, kept_versions: Sequence[int]) -> None:
    """Makes the states written up to round `version` those of checkpoint `version`."""

  @abc.abstractmethod
  def restore(self, version: Optional[int]) -> None:
    """Returns to the states of checkpoint `version` (None: no states)."""

  def check_restorable(self, version: int) -> None:
    """Raises `CorruptClientStateError` if `restore(version)` would find its files
    missing, changing nothing (default: nothing to check before `restore`)."""
    del version

  @abc.abstractmethod
  def client_ids(self) -> list[str]:
    """The ids of the clients with a state, sorted."""


def corrupt_state_error(path: str, error: Exception) -> CorruptClientStateError:
  """The error for a state file that cannot be read, saying what to do about it."""
  return CorruptClientStateError(
      f'client state file {path} is unreadable ({type(error).__name__}: {error}); resume'
      ' from an earlier checkpoint or start the run afresh with --overwrite'
  )


def check_bytes_written(paths: Sequence[str], bytes_written: int) -> None:
  """Raises `CorruptClientStateError` unless the files at `paths` hold `bytes_written` bytes."""
  actual = sum(os.path.getsize(p) for p in paths)
  if actual != bytes_written:
    raise CorruptClientStateError(
        f'the round wrote {bytes_written} bytes of client state to {len(paths)} files'
        f' ({", ".join(paths[:3])}{", ..." if len(paths) > 3 else ""}), but they hold'
        f' {actual}; is the disk full?'
    )


def replace_atomically(
    path: str, write: Callable[[BinaryIO], None], sync: bool = True
) -> None:
  """Writes `path` with `write(file)` so that a crash never leaves it torn.

  The data goes to a temporary file in the same directory and is then renamed over
  `path` (an atomic replace on POSIX): a crash leaves either the old file or the new
  one, plus at worst a stray `.*.tmp` file that readers ignore. With `sync`, the file
  and the rename reach the disk before this returns; without, the caller must
  `fsync_files` before anything relies on the file surviving a power loss.
  """
  directory = os.path.dirname(path) or '.'
  fd, tmp = tempfile.mkstemp(dir=directory, prefix='.', suffix='.tmp')
  try:
    with os.fdopen(fd, 'wb') as f:
      write(f)
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.remove(tmp)
    raise
  if sync:
    fsync_files([path])


def fsync_files(paths: Iterable[str]) -> None:
  """Flushes files, and their directory entries, to the disk."""
  paths = list(paths)
  for path in paths + sorted({os.path.dirname(p) or '.' for p in paths}):
    fd = os.open(path, os.O_RDONLY)
    try:
      os.fsync(fd)
    finally:
      os.close(fd)


def save_arrays_atomically(path: str, arrays: Mapping[str, np.ndarray]) -> None:
  """Writes `arrays` to the `.npz` file `path` atomically and durably."""
  replace_atomically(path, lambda f: np.savez(f, **arrays))


def load_arrays(path: str) -> dict[str, np.ndarray]:
  """The arrays of an `.npz` file written by `save_arrays_atomically`."""
  try:
    with np.load(path, allow_pickle=False) as data:
      return {name: data[name] for name in data.files}
  except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
    raise corrupt_state_error(path, e) from e
