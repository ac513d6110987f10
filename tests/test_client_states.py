"""Client-state stores: versions, checkpoints, crashes mid-write, odd client ids."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from tff_zmg import client_states
from tff_zmg.client_states import store as store_lib

STORE_KINDS = ('disk', 'memory')


def _state(value, size=4):
  return [np.full(size, value, np.float32), np.array(int(value), np.int32)]


def _value(state):
  assert state is not None
  return float(state[0][0])


@pytest.mark.parametrize('kind', STORE_KINDS)
def test_read_returns_the_latest_write_and_none_for_new_clients(tmp_path, kind):
  store = client_states.create_store(kind, str(tmp_path))
  assert store.read('a') is None
  store.write(1, {'a': _state(1), 'b': _state(10)})
  store.write(2, {'a': _state(2)})
  assert _value(store.read('a')) == 2 and _value(store.read('b')) == 10
  assert store.read('a')[1].dtype == np.int32
  assert store.client_ids() == ['a', 'b']


@pytest.mark.parametrize('kind', STORE_KINDS)
def test_restore_returns_to_the_states_of_a_checkpoint(tmp_path, kind):
  store = client_states.create_store(kind, str(tmp_path))
  store.write(1, {'a': _state(1), 'b': _state(10)})
  store.commit(1, [1])
  store.write(2, {'a': _state(2)})
  store.commit(2, [1, 2])
  store.write(3, {'a': _state(3), 'c': _state(30)})  # Round 3: never checkpointed.
  store.restore(2)
  assert _value(store.read('a')) == 2 and _value(store.read('b')) == 10
  assert store.read('c') is None
  store.restore(1)
  assert _value(store.read('a')) == 1
  # A store opened afresh on the same directory (a resumed process) agrees.
  reopened = client_states.create_store(kind, str(tmp_path))
  reopened.restore(1)
  assert _value(reopened.read('a')) == 1 and _value(reopened.read('b')) == 10
  reopened.restore(None)
  assert reopened.read('a') is None and reopened.client_ids() == []


def test_disk_store_keeps_exactly_the_versions_kept_checkpoints_need(tmp_path):
  store = client_states.DiskClientStateStore(str(tmp_path))
  for version in range(1, 6):
    store.write(version, {'a': _state(version)})
    if version == 2:
      store.write(version, {'b': _state(20)})
    store.commit(version, list(range(max(1, version - 2), version + 1)))
  client_dir = tmp_path / 'clients' / 'a'
  # Checkpoints 3, 4, 5 are kept: each needs its own version of 'a'.
  assert sorted(os.listdir(client_dir)) == ['00000003.npz', '00000004.npz', '00000005.npz']
  # 'b' was written once, at 2: checkpoints 3-5 all need that version.
  assert sorted(os.listdir(tmp_path / 'clients' / 'b')) == ['00000002.npz']
  store.restore(3)
  assert _value(store.read('a')) == 3 and _value(store.read('b')) == 20


def test_disk_store_takes_any_client_id(tmp_path):
  store = client_states.DiskClientStateStore(str(tmp_path))
  ids = ['THE TRAGEDY/OF_KING LEAR', "o'brien%20", '..', 'a' * 100]
  store.write(0, {cid: _state(i) for i, cid in enumerate(ids)})
  assert store.client_ids() == sorted(ids)
  assert [_value(store.read(cid)) for cid in ids] == [0, 1, 2, 3]
  assert sorted(os.listdir(tmp_path)) == ['clients']
  with pytest.raises(ValueError, match='cannot be a directory name'):
    store.write(1, {'': _state(0)})


def test_a_failed_write_leaves_the_previous_state(tmp_path, monkeypatch):
  store = client_states.DiskClientStateStore(str(tmp_path))
  store.write(1, {'a': _state(1)})

  def half_a_write(f, **arrays):
    f.write(b'PK\x03\x04 the first bytes of a zip, then the process dies')
    raise KeyboardInterrupt

  monkeypatch.setattr(store_lib.np, 'savez', half_a_write)
  with pytest.raises(KeyboardInterrupt):
    store.write(1, {'a': _state(2)})
  monkeypatch.undo()
  assert _value(store.read('a')) == 1
  assert os.listdir(tmp_path / 'clients' / 'a') == ['00000001.npz']


_WRITER = textwrap.dedent('''
    import sys
    import numpy as np
    from tff_zmg.client_states import disk_store
    store = disk_store.DiskClientStateStore(sys.argv[1])
    print('writing', flush=True)
    version = 0
    while True:  # Until killed: rewrite one big state, version after version.
      version += 1
      store.write(version, {'client': [np.full(4_000_000, version, np.float32)]})
''')


def test_disk_store_survives_a_process_killed_during_writes(tmp_path):
  proc = subprocess.Popen(
      [sys.executable, '-c', _WRITER, str(tmp_path)],
      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
      cwd=os.path.dirname(os.path.dirname(__file__)),
  )
  try:
    assert proc.stdout.readline().strip() == 'writing'
    time.sleep(1.5)  # Each 16 MB write takes tens of ms: the kill lands mid-write.
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
  finally:
    if proc.poll() is None:
      proc.kill()
  names = os.listdir(tmp_path / 'clients' / 'client')
  versions = sorted(int(n[:-4]) for n in names if n.endswith('.npz'))
  assert versions, names
  store = client_states.DiskClientStateStore(str(tmp_path))
  # Every complete-looking file is a whole state: the atomic rename never exposes a
  # torn one. The newest is what a reader sees.
  for version in versions:
    array = np.load(tmp_path / 'clients' / 'client' / f'{version:08d}.npz')['a0']
    assert array.shape == (4_000_000,) and np.all(array == version)
  assert _value(store.read('client')) == versions[-1]
  store.restore(versions[-1])  # Resuming clears any temporary file left behind.
  assert all(n.endswith('.npz') for n in os.listdir(tmp_path / 'clients' / 'client'))


def test_a_corrupt_state_file_is_a_clear_error(tmp_path):
  store = client_states.DiskClientStateStore(str(tmp_path))
  store.write(1, {'a': _state(1)})
  path = tmp_path / 'clients' / 'a' / '00000001.npz'
  path.write_bytes(path.read_bytes()[:20])
  with pytest.raises(client_states.CorruptClientStateError, match=str(path)):
    store.read('a')


def test_memory_store_snapshots_only_kept_checkpoints(tmp_path):
  store = client_states.InMemoryClientStateStore(str(tmp_path))
  for version in range(1, 5):
    store.write(version, {'a': _state(version)})
    store.commit(version, [v for v in (version - 1, version) if v >= 1])
  assert sorted(os.listdir(tmp_path)) == ['snapshot-00000003.npz', 'snapshot-00000004.npz']
  with pytest.raises(client_states.CorruptClientStateError, match='snapshot'):
    store.restore(1)
  with pytest.raises(ValueError, match='without a snapshot directory'):
    client_states.InMemoryClientStateStore().restore(3)


def test_unknown_store_kind_is_refused(tmp_path):
  with pytest.raises(ValueError, match=r"client_state_store must be one of \['disk', 'memory'\]"):
    client_states.create_store('redis', str(tmp_path))
