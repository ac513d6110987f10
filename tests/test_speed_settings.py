"""Speed settings never change results (issue 8): the guard for speed work.

A round's result may depend only on the run's inputs (weights, client data, seeds), never
on how the TFF worker schedules the clients or how client states travel:
`--max_concurrent_clients` (the setting the benchmark compares) and the worker's threads per
op (`--intra_op_threads`) must give the same weights to 1e-6 on the model and the rule the
benchmark times, and so must tf.data's autotuning, which the task preprocessing turns off.
The worker's cached computations are in play in every run here: each runs three rounds of
the same `next`. FedRKMGC's states read and written by TFF's worker itself (the disk
store's default) are guarded in `test_fedrkmgc.py`: the same weights and states as through
the TFF call, and as NumPy.
"""

import numpy as np
import pytest
import tensorflow as tf

from tff_zmg.runtime import cpp_worker
from tff_zmg.algorithms import registry

_ROUNDS = 3
_CLIENTS = 4


def _weights(process, state):
  weights = process.get_model_weights(state)
  return [np.asarray(w) for w in weights.trainable + weights.non_trainable]


def _initial_and_final_weights(process, datasets, **context_settings):
  with cpp_worker.execution_context(**context_settings):
    state = process.initialize()
    initial = _weights(process, state)
    for _ in range(_ROUNDS):
      state = process.next(state, datasets).state
    return initial, _weights(process, state)


@pytest.fixture(scope='module')
def fedzmg_reference(small_task):
  """(process, datasets, initial weights, final weights) with TFF's default settings."""
  task = small_task('emnist')
  data = task.datasets.train_data
  datasets = [
      task.train_preprocess_fn_for_seed(seed)(data.create_tf_dataset_for_client(cid))
      for seed, cid in enumerate(data.client_ids[:_CLIENTS])
  ]
  process = registry.build('fedzmg', task.model_fn)
  initial, final = _initial_and_final_weights(process, datasets)
  assert len(final) == 8
  # The rounds moved every tensor: the comparisons are not between two initial models.
  assert all(np.max(np.abs(a - w)) > 1e-4 for a, w in zip(final, initial))
  return process, datasets, final


@pytest.mark.parametrize(
    'settings',
    [
        dict(max_concurrent_computation_calls=1),  # One client at a time.
        dict(intra_op_threads=1),  # One thread per op, as launch.train picks here.
        dict(intra_op_threads=2, max_concurrent_computation_calls=2),
    ],
    ids=['one_client_at_a_time', 'one_thread_per_op', 'two_threads_two_clients'],
)
def test_worker_settings_never_change_the_weights(fedzmg_reference, settings):
  process, datasets, reference = fedzmg_reference
  _, final = _initial_and_final_weights(process, datasets, **settings)
  for a, b in zip(reference, final):
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)


def test_tf_data_autotuning_never_changes_the_weights(fedzmg_reference):
  process, datasets, reference = fedzmg_reference
  assert all(d.options().autotune.enabled is False for d in datasets)
  options = tf.data.Options()
  options.autotune.enabled = True
  _, final = _initial_and_final_weights(
      process, [d.with_options(options) for d in datasets]
  )
  for a, b in zip(reference, final):
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)
