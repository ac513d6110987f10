"""Speed settings never change results (issue 8): the guard for speed work.

A round's result may depend only on the run's inputs (weights, client data, seeds), never
on how the TFF worker schedules the clients or how client states travel:
`--max_concurrent_clients` (the setting the benchmark compares) must give the same weights
to 1e-6 (measured: equal) on the model and the rule the benchmark times, and FedRKMGC's
states read and written by the worker itself (the disk store's default) the same weights
and states as states passed through the TFF call.
"""

import os

import numpy as np

from tff_zmg import client_states
from tff_zmg import context
from tff_zmg.algorithms import registry

_ROUNDS = 2
_CLIENTS = 4


def _weights(process, state):
  weights = process.get_model_weights(state)
  return [np.asarray(w) for w in weights.trainable + weights.non_trainable]


def _initial_and_final_weights(process, datasets, max_concurrent):
  with context.execution_context(max_concurrent):
    state = process.initialize()
    initial = _weights(process, state)
    for _ in range(_ROUNDS):
      state = process.next(state, datasets).state
    return initial, _weights(process, state)


def test_concurrency_never_changes_the_weights(small_task):
  task = small_task('emnist')
  data = task.datasets.train_data
  datasets = [
      task.train_preprocess_fn_for_seed(seed)(data.create_tf_dataset_for_client(cid))
      for seed, cid in enumerate(data.client_ids[:_CLIENTS])
  ]
  process = registry.build('fedzmg', task.model_fn)
  initial, all_at_once = _initial_and_final_weights(process, datasets, -1)  # TFF's default.
  _, one_at_a_time = _initial_and_final_weights(process, datasets, 1)
  assert len(all_at_once) == 8
  for a, b in zip(all_at_once, one_at_a_time):
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)
  # Two rounds moved every tensor: the comparison is not between two initial models.
  assert all(np.max(np.abs(a - w)) > 1e-4 for a, w in zip(all_at_once, initial))


# Round -> sampled clients: client 2 joins late, client 0 skips a round and returns.
_PARTICIPATION = ((0, 1), (1, 2), (0, 2))


def _stateful_run(process, datasets, store, states_in_worker):
  trainer = client_states.StatefulClientsTrainer(process, store, states_in_worker)
  state = trainer.initialize()
  for round_num, clients in enumerate(_PARTICIPATION):
    selection = client_states.ClientSelection(
        round_num, [f'c{i}' for i in clients], [datasets[i] for i in clients]
    )
    state = trainer.next(state, selection).state
  states = [trainer.client_state(f'c{i}') for i in range(3)]
  return _weights(process, state), states


def test_states_read_and_written_by_the_worker_change_nothing(small_task, tmp_path, tff_context):
  task = small_task('emnist')
  data = task.datasets.train_data
  datasets = [
      task.train_preprocess_fn_for_seed(seed)(data.create_tf_dataset_for_client(cid))
      for seed, cid in enumerate(data.client_ids[:3])
  ]
  process = registry.build('fedrkmgc', task.model_fn)
  disk = client_states.DiskClientStateStore(str(tmp_path / 'disk'))
  in_call_weights, in_call_states = _stateful_run(
      process, datasets, client_states.InMemoryClientStateStore(), states_in_worker=True
  )
  files_weights, files_states = _stateful_run(process, datasets, disk, states_in_worker=True)
  # The worker wrote every state file, and they were moved into place.
  for client, versions in (('c0', '00000002'), ('c1', '00000001'), ('c2', '00000002')):
    assert versions + '.tfstate' in os.listdir(tmp_path / 'disk' / 'clients' / client)
  for a, b in zip(in_call_weights, files_weights):
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)
  for a, b in zip(in_call_states, files_states):
    assert int(a['participations']) == int(b['participations'])
    for x, y in zip(a['correction'] + a['raw_correction'], b['correction'] + b['raw_correction']):
      np.testing.assert_allclose(y, x, rtol=0, atol=1e-6)
  # The corrections are not all zero: the comparison is between trained states.
  assert int(files_states[0]['participations']) == 2
  assert max(np.max(np.abs(d)) for d in files_states[0]['correction']) > 1e-6
