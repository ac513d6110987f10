"""Speed settings never change results (issue 8): the guard for speed work.

A round's result may depend only on the run's inputs (weights, client data, seeds), never
on how the TFF worker schedules the clients or how client states travel:
`--max_concurrent_clients` (the setting the benchmark compares) must give the same weights
to 1e-6 (measured: equal) on the model and the rule the benchmark times. FedRKMGC's states
read and written by TFF's worker itself (the disk store's default) are guarded in
`test_fedrkmgc.py`: the same weights and states as through the TFF call, and as NumPy.
"""

import numpy as np

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

