"""Runs a `StatefulClientsLearningProcess` in TFF's own training loop.

`tff.simulation.run_training_process` calls `process.next(state, selection)` and
saves the server state with a `tff.program.ProgramStateManager`. Two adapters let it
drive a stateful-clients process without a loop of our own:

- `StatefulClientsTrainer` has the `LearningProcess` interface; its `next` takes a
  `ClientSelection` (round, client ids, datasets), reads the sampled clients' states
  from the store, runs the process, and writes their new states back.
- `ClientStateCheckpointManager` wraps the run's program-state manager: saving
  checkpoint `v` commits the store at `v`, loading checkpoint `v` restores it to `v`,
  so the states are checkpointed and restored with the run.
"""

import collections
from collections.abc import Sequence
from typing import Any, NamedTuple, Optional

import tensorflow_federated as tff

from tff_zmg.client_states import state_file
from tff_zmg.client_states import store as store_lib


class ClientSelection(NamedTuple):
  """One round's sampled clients: their ids and datasets, in the same order."""

  round_num: int
  client_ids: Sequence[str]
  datasets: Sequence[Any]


class StatefulClientsTrainer:
  """A stateful-clients process with the `LearningProcess` interface.

  With `states_in_worker`, the runtime (TFF's worker, or this process) reads and writes
  the sampled clients' state files itself (`next_with_state_files`): the same round,
  without two model-sized vectors per client passing through the TFF call and back
  (the memory store stages its states as files for the round). That needs the runtime
  to see this machine's files; for TFF workers on other machines, pass
  `states_in_worker=False`, and the states go in the call (`process.next`).
  """

  def __init__(
      self,
      process: Any,
      store: store_lib.ClientStateStore,
      states_in_worker: bool = True,
  ):
    self._process = process
    self._store = store
    self._initial_client_state = process.initial_client_state()
    self._state_files = states_in_worker

  @property
  def process(self) -> Any:
    return self._process

  @property
  def store(self) -> store_lib.ClientStateStore:
    return self._store

  @property
  def initialize(self):
    return self._process.initialize

  @property
  def get_model_weights(self):
    return self._process.get_model_weights

  @property
  def set_model_weights(self):
    return self._process.set_model_weights

  def _flatten(self, client_state):
    # The order of the state's type, the one TFF's worker writes files in.
    return state_file.flatten(client_state, self._process.client_state_type)

  def client_state(self, client_id: str):
    """The client's current state (the initial state if it never took part)."""
    flat = self._store.read(client_id)
    if flat is None:
      return self._initial_client_state
    return state_file.pack(flat, self._process.client_state_type)

  def next(self, state, selection: ClientSelection):
    ids = list(selection.client_ids)
    if len(set(ids)) != len(ids):
      raise ValueError(f'a client was sampled twice in round {selection.round_num}: {ids}')
    if self._state_files:
      state, metrics = self._next_with_state_files(state, selection)
    else:
      output = self._process.next(
          state, list(selection.datasets), [self.client_state(i) for i in ids]
      )
      self._store.write(
          selection.round_num,
          {i: self._flatten(s) for i, s in zip(ids, output.client_states)},
      )
      state, metrics = output.state, output.metrics
    return tff.learning.templates.LearningProcessOutput(state, metrics)

  def _next_with_state_files(self, state, selection: ClientSelection):
    """`(state, metrics)` of the round, the clients' states read and written in files."""
    ids = list(selection.client_ids)
    files = self._store.state_file_paths(
        selection.round_num, ids, self._flatten(self._initial_client_state)
    )
    client_inputs = [
        collections.OrderedDict(data=data, state_files=paths)
        for data, paths in zip(selection.datasets, files)
    ]
    try:
      state, output = self._process.next_with_state_files(state, client_inputs)
    except Exception:
      # The runtime's parse error is long and names no client: say which file it is.
      self._store.check_readable(ids)
      raise
    self._store.adopt_state_files(
        selection.round_num, ids, int(output['client_state_bytes'])
    )
    return state, output['metrics']


class ClientStateCheckpointManager(tff.program.ProgramStateManager):
  """A program-state manager that checkpoints a client-state store with the state."""

  def __init__(
      self,
      program_state_manager: tff.program.ProgramStateManager,
      store: store_lib.ClientStateStore,
  ):
    self._manager = program_state_manager
    self._store = store

  async def get_versions(self) -> Optional[list[int]]:
    return await self._manager.get_versions()

  async def load(self, version: int, structure):
    program_state = await self._manager.load(version, structure)
    self._store.restore(version)
    return program_state

  async def load_latest(self, structure):
    program_state, version = await super().load_latest(structure)
    if program_state is None:  # A fresh run: no states from an earlier attempt.
      self._store.restore(None)
    return program_state, version

  async def save(self, program_state, version: int) -> None:
    # The states this checkpoint needs (and their list) are on the disk before it is.
    self._store.prepare_commit(version)
    await self._manager.save(program_state, version)
    self._store.commit(version, await self._manager.get_versions() or [])
