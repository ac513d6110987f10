"""The in-process runtime against TFF's C++ worker: the same rounds give the same numbers.

Every stateless algorithm of the registry and TFF's own FedAvg and federated evaluation
run three rounds on a tiny conv model, once in TFF's worker and once in this process
(`tff_zmg.runtime.in_process`), from the same initial state on the same data; every
weight and metric must agree to 1e-6. Both sides use TF's default threads. The stateful
algorithms are compared where their processes are already built and checked against
NumPy: FedRKMGC and its ablations in test_fedrkmgc.py (memory and disk stores), FedGPS
and FedGPS-CF in test_fedgps.py; there every weight, metric and client state of the
in-process run equals the worker's to 1e-6 and matches NumPy.
"""

import collections
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_zmg.algorithms import registry
from tff_zmg.runtime import client_slots
from tff_zmg.runtime import in_process
from tff_zmg.runtime import tf_computation
import tiny_models

NUM_CLASSES = 3
IMAGE_SHAPE = (5, 5, 1)
# Client 2 skips round 0, client 0 round 1, client 1 round 2.
PARTICIPATION = ((0, 1), (1, 2), (0, 2))
# Small steps; otherwise each algorithm's defaults.
HPARAMS = dict(client_learning_rate=0.05)
TOLERANCE = 1e-6


def tiny_keras_model():
  return tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=IMAGE_SHAPE),
      tf.keras.layers.Conv2D(
          2, 3, activation='relu', kernel_initializer=tf.keras.initializers.GlorotUniform(1)
      ),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(
          NUM_CLASSES, kernel_initializer=tf.keras.initializers.GlorotUniform(2)
      ),
  ])


tiny_model_fn = tiny_models.image_model_fn(tiny_keras_model, IMAGE_SHAPE)


def client_dataset(client: int) -> tf.data.Dataset:
  """Two batches of two examples, fixed per client."""
  rng = np.random.default_rng(client)
  x = rng.normal(size=(4,) + IMAGE_SHAPE).astype(np.float32)
  y = rng.integers(0, NUM_CLASSES, size=4).astype(np.int32)
  return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y)).batch(2)


def three_rounds(process):
  """Weights and metrics after the rounds of PARTICIPATION; each round's state has the
  initial state's structure, containers included, as a checkpoint is read into it."""
  state = initial = process.initialize()
  metrics = []
  for clients in PARTICIPATION:
    output = process.next(state, [client_dataset(c) for c in clients])
    state = output.state
    tf.nest.assert_same_structure(initial, state, check_types=True)
    metrics.append(output.metrics)
  return dict(weights=process.get_model_weights(state), metrics=metrics)


def assert_all_close(actual, expected):
  actual_leaves = tf.nest.flatten(actual)
  expected_leaves = tf.nest.flatten(expected)
  assert len(actual_leaves) == len(expected_leaves)
  for a, e in zip(actual_leaves, expected_leaves):
    np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=0, atol=TOLERANCE)


STATELESS = sorted(name for name, spec in registry.ALGORITHMS.items() if not spec.stateful)


# Compared with the worker in test_fedrkmgc.py (VARIANTS), test_fedgps.py and
# test_scaffold.py.
STATEFUL_COMPARED_ELSEWHERE = {
    'fedrkmgc', 'fedrkmgc_raw', 'fedrkmgc_re', 'fedrkmgc_km', 'fedrkmgc_fast_km',
    'fedrkmgc_re_km', 'fedgps', 'fedgps_cf', 'scaffold', 'fedzmg_scaffold',
}


def test_every_registry_algorithm_is_compared_with_the_worker():
  """A new stateful algorithm needs its own in-process comparison: this fails until then."""
  stateful = {name for name, spec in registry.ALGORITHMS.items() if spec.stateful}
  assert stateful == STATEFUL_COMPARED_ELSEWHERE
  assert set(STATELESS) | stateful == set(registry.ALGORITHMS)


@pytest.mark.parametrize('algo', STATELESS)
def test_three_rounds_in_process_equal_tff_worker(algo, tff_context):
  del tff_context  # Installed: the first run is in TFF's worker.
  process = registry.build(algo, tiny_model_fn, keras_model_fn=tiny_keras_model, **HPARAMS)
  expected = three_rounds(process)
  with in_process.in_process_context() as context:
    actual = three_rounds(process)
  assert context.rounds_run == len(PARTICIPATION)
  assert_all_close(actual, expected)
  assert all(np.all(np.isfinite(w)) for w in tf.nest.flatten(actual['weights']))


def test_tff_fed_avg_and_evaluation_in_process_equal_tff_worker(tff_context):
  del tff_context
  process = tff.learning.algorithms.build_weighted_fed_avg(
      tiny_model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1)
  )
  evaluation = tff.learning.algorithms.build_fed_eval(tiny_model_fn)
  data = [client_dataset(c) for c in range(3)]

  def run():
    state = process.initialize()
    for _ in range(3):
      state = process.next(state, data).state
    eval_state = evaluation.set_model_weights(
        evaluation.initialize(), process.get_model_weights(state)
    )
    return process.get_model_weights(state), evaluation.next(eval_state, data).metrics

  expected = run()
  with in_process.in_process_context():
    actual = run()
  assert_all_close(actual, expected)
  assert actual[1]['client_work']['eval']['current_round_metrics']['num_examples'] == 12


class _Stopped(Exception):
  pass


def _raising_on_call(n: int, before_raising=lambda: None):
  """A check between clients that raises `_Stopped` on its n-th call; its calls in `calls`."""
  calls = []

  def check():
    calls.append(threading.current_thread())
    if len(calls) == n:
      before_raising()
      raise _Stopped()

  return check, calls


@pytest.mark.parametrize('slots', [1, 2])
def test_a_check_between_clients_abandons_the_call_and_starts_no_other_client(slots):
  """The check runs in the caller's thread before each result is taken. Raising on its
  third call abandons the call: clients 0 and 1 were taken; with two slots, clients 2 and 3
  may be running and end; no other starts, although each has been free to since the
  check raised (without the check, all ten run)."""
  stopped = threading.Event()
  started = []

  def work(i):
    started.append(i)
    if i >= 2:
      stopped.wait(timeout=60)
    return i

  check, calls = _raising_on_call(3, stopped.set)
  slots_of_cpu = client_slots.ClientSlots(['/device:CPU:0'], slots)
  with client_slots.between_clients(check):
    with pytest.raises(_Stopped):
      list(slots_of_cpu.imap(work, range(10)))
  assert calls == [threading.current_thread()] * 3
  assert sorted(started)[:2] == [0, 1] and max(started) < 2 + slots
  # Outside, no check: every client runs.
  assert slots_of_cpu.map(lambda i: i * i, range(10)) == [i * i for i in range(10)]


def test_a_round_abandoned_between_clients_leaves_the_state_as_it_was():
  """A real FedAvg round in process, abandoned before its fourth client: the same round
  then run again gives the weights and metrics of one never stopped."""
  process = registry.build('fedavg', tiny_model_fn, keras_model_fn=tiny_keras_model, **HPARAMS)
  data = [client_dataset(c) for c in range(6)]
  with in_process.in_process_context(clients_per_device=2):
    state = process.initialize()
    expected = process.next(state, data)
    check, calls = _raising_on_call(4)
    with client_slots.between_clients(check):
      with pytest.raises(_Stopped):
        process.next(state, data)
    assert len(calls) == 4
    actual = process.next(state, data)
  assert_all_close((actual.state, actual.metrics), (expected.state, expected.metrics))


@tff.tensorflow.computation(np.int64, np.int64)
def _add(a, b):
  return a + b


@tff.federated_computation(
    tff.FederatedType(np.int64, tff.SERVER), tff.FederatedType(np.int64, tff.CLIENTS)
)
def _secure_round(state, values):
  """A round with the three secure sums: bit width 4, at most 9, modulo 7."""
  bitwidth_sum = tff.federated_secure_sum_bitwidth(values, 4)
  bounded_sum = tff.federated_secure_sum(values, np.int64(9))
  modular_sum = tff.backends.mapreduce.federated_secure_modular_sum(values, np.int64(7))
  return tff.federated_map(_add, (state, bitwidth_sum)), tff.federated_zip(
      (bounded_sum, modular_sum)
  )


def test_secure_sums_run_lowered_as_in_tff_test_backend():
  with in_process.in_process_context():
    state, (bounded, modular) = _secure_round(np.int64(100), [3, 5, 6])
    assert (state, bounded, modular) == (114, 14, 0)
    # 12 needs more than 4 bits (and exceeds 9): refused, as TFF's test backend does.
    with pytest.raises(tf.errors.InvalidArgumentError, match='larger than maximum'):
      _secure_round(np.int64(100), [3, 12])


@tff.tensorflow.computation(
    tff.TensorType(np.float32, [3]), tff.TensorType(np.float32, [None])
)
def _shift(a, b):
  return a + tf.reduce_sum(b)


def test_imported_computations_bind_their_arguments_to_a_signature():
  """Without one, every call first failed to bind and formatted each argument (NumPy's repr
  of every weight) into a discarded error: 12 ms per accumulate of EMNIST's update."""
  imported = tf_computation.ImportedComputation(_shift)
  specs, _ = imported._run.structured_input_signature  # pylint: disable=protected-access
  assert [(s.dtype, s.shape.as_list()) for s in specs[:2]] == [
      (tf.float32, [3]), (tf.float32, [None])
  ]
  result = imported(np.ones(3, np.float32), np.ones(5, np.float32))
  np.testing.assert_array_equal(result[0].numpy(), [6.0, 6.0, 6.0])


def test_threads_per_op_are_set_before_tensorflow_starts_and_kept_after():
  # A fresh interpreter: this one's TensorFlow has started.
  script = (
      'import tensorflow as tf\n'
      'from tff_zmg.runtime import in_process\n'
      'print(in_process.set_intra_op_threads(1))\n'
      'tf.constant(1.0) + 1.0\n'  # The runtime starts: its pools are fixed.
      'print(in_process.set_intra_op_threads(2), in_process.set_intra_op_threads(1))\n'
      'print(tf.config.threading.get_intra_op_parallelism_threads())\n'
  )
  out = subprocess.run(
      [sys.executable, '-c', script], capture_output=True, text=True, check=True,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'),
  ).stdout.split()
  assert out == ['True', 'False', 'True', '1']
