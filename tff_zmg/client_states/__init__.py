"""Client-state stores and the adapters that run stateful-clients processes.

    store = client_states.create_store('disk', directory)
    trainer = client_states.StatefulClientsTrainer(process, store)
"""

from tff_zmg.client_states.disk_store import DiskClientStateStore
from tff_zmg.client_states.memory_store import InMemoryClientStateStore
from tff_zmg.client_states.store import ClientStateStore
from tff_zmg.client_states.store import CorruptClientStateError
from tff_zmg.client_states.training import ClientSelection
from tff_zmg.client_states.training import ClientStateCheckpointManager
from tff_zmg.client_states.training import StatefulClientsTrainer

STORES = ('disk', 'memory')


def create_store(kind: str, directory: str) -> ClientStateStore:
  """A store of `kind` in `STORES` keeping its files (or snapshots) in `directory`."""
  if kind == 'disk':
    return DiskClientStateStore(directory)
  if kind == 'memory':
    return InMemoryClientStateStore(snapshot_directory=directory)
  raise ValueError(f'client_state_store must be one of {list(STORES)}, got {kind!r}')
