"""Client-state stores: versions, checkpoints, crashes mid-write, odd client ids."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_zmg import client_states
from tff_zmg.client_states import state_file
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
  assert sorted(os.listdir(client_dir)) == ['00000003.tfstate', '00000004.tfstate', '00000005.tfstate']
  # 'b' was written once, at 2: checkpoints 3-5 all need that version.
  assert sorted(os.listdir(tmp_path / 'clients' / 'b')) == ['00000002.tfstate']
  store.restore(3)
  assert _value(store.read('a')) == 3 and _value(store.read('b')) == 20


def test_disk_store_refuses_a_missing_state_a_checkpoint_needs(tmp_path):
  # Falling back to the client's older state would silently change the results.
  store = client_states.DiskClientStateStore(str(tmp_path))
  store.write(1, {'a': _state(1), 'b': _state(10)})
  store.prepare_commit(1)  # As the checkpoint manager calls it, before the save.
  store.commit(1, [1])
  store.write(2, {'a': _state(2)})
  store.commit(2, [1, 2])  # Without `prepare_commit`: the list is written here.
  os.remove(tmp_path / 'clients' / 'a' / '00000002.tfstate')
  reopened = client_states.DiskClientStateStore(str(tmp_path))
  with pytest.raises(
      client_states.CorruptClientStateError,
      match=r"clients/a/00000002.tfstate is missing: checkpoint 2 needs it \(the state of"
      r" client 'a' after round 2",
  ):
    reopened.restore(2)
  reopened.restore(1)  # Checkpoint 1 needs only states that are there.
  assert _value(reopened.read('a')) == 1 and _value(reopened.read('b')) == 10


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

  def interrupted_rename(source, target):
    assert os.path.getsize(source) > 0  # The new state was written in full ...
    raise KeyboardInterrupt  # ... and then Ctrl-C came before it replaced the old one.

  monkeypatch.setattr(store_lib.os, 'replace', interrupted_rename)
  with pytest.raises(KeyboardInterrupt):
    store.write(1, {'a': _state(2)})
  monkeypatch.undo()
  assert _value(store.read('a')) == 1
  assert os.listdir(tmp_path / 'clients' / 'a') == ['00000001.tfstate']


def test_memory_store_stages_state_files_for_one_round_only(tmp_path):
  """The memory store's side of a round that reads and writes its states as files."""
  store = client_states.InMemoryClientStateStore(str(tmp_path / 'snapshots'))
  store.write(1, {'a': _state(1)})
  files = store.state_file_paths(2, ['a', 'new'], _state(0))
  assert _value(state_file.load(files[0]['read'])) == 1
  assert _value(state_file.load(files[1]['read'])) == 0  # The initial state.
  total = 0
  for paths, value in zip(files, [2, 20]):
    data = state_file.serialize([tf.constant(a) for a in _state(value)])  # As in the runtime.
    tf.io.write_file(paths['write'], data)
    total += len(data.numpy())
  store.adopt_state_files(2, ['a', 'new'], total)
  assert _value(store.read('a')) == 2 and _value(store.read('new')) == 20
  assert not any(os.path.exists(p) for f in files for p in f.values())
  # A short file (a full RAM disk) is refused, and the staged files still go.
  files = store.state_file_paths(3, ['a'], _state(0))
  data = state_file.serialize([tf.constant(a) for a in _state(3)])
  tf.io.write_file(files[0]['write'], tf.strings.substr(data, 0, 10))
  with pytest.raises(client_states.CorruptClientStateError, match='disk full'):
    store.adopt_state_files(3, ['a'], len(data.numpy()))
  assert _value(store.read('a')) == 2
  assert not any(os.path.exists(p) for p in files[0].values())


def test_state_files_written_by_the_worker_are_adopted_only_whole(tmp_path):
  """The TFF worker's side of the store, with the worker's own TF ops writing the files."""
  store = client_states.DiskClientStateStore(str(tmp_path))
  store.write(1, {'a': _state(1)})
  initial = _state(0)
  files = store.state_file_paths(2, ['a', 'new'], initial)
  assert files[0]['read'].endswith(os.path.join('a', '00000001.tfstate'))
  assert state_file.load(files[1]['read'])[0].tolist() == [0.0] * 4  # The initial state.
  total = 0
  for paths, value in zip(files, [2, 20]):
    data = state_file.serialize([tf.constant(a) for a in _state(value)])  # As in the worker.
    tf.io.write_file(paths['write'], data)
    total += len(data.numpy())
  assert store.read('a') is not None and _value(store.read('a')) == 1  # Not adopted yet.
  store.adopt_state_files(2, ['a', 'new'], total)
  assert _value(store.read('a')) == 2 and _value(store.read('new')) == 20
  assert store.read('new')[1].dtype == np.int32
  # A file shorter than the worker reported (a full disk) is refused, not adopted.
  files = store.state_file_paths(3, ['a'], initial)
  data = state_file.serialize([tf.constant(a) for a in _state(3)])
  tf.io.write_file(files[0]['write'], tf.strings.substr(data, 0, 10))
  with pytest.raises(client_states.CorruptClientStateError, match='disk full'):
    store.adopt_state_files(3, ['a'], len(data.numpy()))
  assert _value(store.read('a')) == 2
  store.restore(2)  # Resuming deletes the refused file.
  assert sorted(os.listdir(tmp_path / 'clients' / 'a')) == ['00000001.tfstate', '00000002.tfstate']


def test_python_and_tf_ops_read_each_others_state_files():
  arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array(7, np.int32)]
  types = [tff.TensorType(np.float32, [2, 3]), tff.TensorType(np.int32)]
  from_tf = state_file.serialize([tf.constant(a) for a in arrays]).numpy()
  from_python = state_file.encode(arrays)
  for decoded in (
      state_file.decode(from_tf, 'x'),
      [t.numpy() for t in state_file.parse(tf.constant(from_python), types)],
  ):
    for a, d in zip(arrays, decoded, strict=True):
      assert d.dtype == a.dtype
      np.testing.assert_array_equal(d, a)
  with pytest.raises(tf.errors.InvalidArgumentError):  # A wrong shape is not accepted.
    state_file.parse(tf.constant(from_tf), [tff.TensorType(np.float32, [3, 2]), types[1]])
  with pytest.raises(client_states.CorruptClientStateError, match='state file x'):
    state_file.decode(from_tf[:-3], 'x')


def test_old_npz_states_are_refused_not_silently_dropped(tmp_path):
  store = client_states.DiskClientStateStore(str(tmp_path))
  store.write(1, {'a': _state(1)})
  legacy = tmp_path / 'clients' / 'a' / '00000001.npz'
  np.savez(legacy, a0=np.zeros(4, np.float32))
  with pytest.raises(client_states.CorruptClientStateError, match='npz format'):
    store.restore(1)
  assert legacy.exists()


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
    # Killed once a version is complete, whatever the machine's load, and 0.3 s later:
    # each 16 MB write takes tens of ms, so the kill lands mid-write.
    folder = tmp_path / 'clients' / 'client'
    deadline = time.monotonic() + 120
    while not (folder.is_dir() and any(n.endswith('.tfstate') for n in os.listdir(folder))):
      assert time.monotonic() < deadline and proc.poll() is None, 'no state was written'
      time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
  finally:
    if proc.poll() is None:
      proc.kill()
  names = os.listdir(tmp_path / 'clients' / 'client')
  versions = sorted(int(n[:-8]) for n in names if n.endswith('.tfstate'))
  assert versions, names
  store = client_states.DiskClientStateStore(str(tmp_path))
  # Every complete-looking file is a whole state: the atomic rename never exposes a
  # torn one. The newest is what a reader sees.
  for version in versions:
    (array,) = state_file.load(str(tmp_path / 'clients' / 'client' / f'{version:08d}.tfstate'))
    assert array.shape == (4_000_000,) and np.all(array == version)
  assert _value(store.read('client')) == versions[-1]
  store.restore(versions[-1])  # Resuming clears any temporary file left behind.
  assert all(n.endswith('.tfstate') for n in os.listdir(tmp_path / 'clients' / 'client'))


def test_a_corrupt_state_file_is_a_clear_error(tmp_path):
  store = client_states.DiskClientStateStore(str(tmp_path))
  store.write(1, {'a': _state(1)})
  path = tmp_path / 'clients' / 'a' / '00000001.tfstate'
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
