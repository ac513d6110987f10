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

from collections.abc import Sequence
from typing import Any, NamedTuple, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_zmg.algorithms import stateful_clients
from tff_zmg.client_states import store as store_lib


class ClientSelection(NamedTuple):
  """One round's sampled clients: their ids and datasets, in the same order."""

  round_num: int
  client_ids: Sequence[str]
  datasets: Sequence[Any]


class StatefulClientsTrainer:
  """A stateful-clients process with the `LearningProcess` interface."""

  def __init__(
      self,
      process: stateful_clients.StatefulClientsLearningProcess,
      store: store_lib.ClientStateStore,
  ):
    self._process = process
    self._store = store
    self._initial_client_state = process.initial_client_state()

  @property
  def process(self) -> stateful_clients.StatefulClientsLearningProcess:
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

  def client_state(self, client_id: str):
    """The client's current state (the initial state if it never took part)."""
    flat = self._store.read(client_id)
    if flat is None:
      return self._initial_client_state
    return tf.nest.pack_sequence_as(self._initial_client_state, flat)

  def next(self, state, selection: ClientSelection):
    ids = list(selection.client_ids)
    if len(set(ids)) != len(ids):
      raise ValueError(f'a client was sampled twice in round {selection.round_num}: {ids}')
    output = self._process.next(
        state, list(selection.datasets), [self.client_state(i) for i in ids]
    )
    self._store.write(
        selection.round_num,
        {i: tf.nest.flatten(s) for i, s in zip(ids, output.client_states)},
    )
    return tff.learning.templates.LearningProcessOutput(output.state, output.metrics)


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
    await self._manager.save(program_state, version)
    self._store.commit(version, await self._manager.get_versions() or [])
