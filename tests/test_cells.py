"""Batched cells (`tff_zmg.templates.cells`): K cells of a composed process trained as one
computation equal the K processes trained alone, a diverging cell included."""

import collections

import numpy as np
import pytest
import tensorflow as tf

import tiny_models
from tff_zmg import aggregation
from tff_zmg.algorithms import registry
from tff_zmg.runtime import in_process
from tff_zmg.templates import cells
from tff_zmg.templates import state_hparams

# Trained batched and alone: one algorithm per family of client rule and server step. The
# batched process vectorizes the clients' work over the cells and runs each cell's server
# step (finalizer) alone, on that cell's state, as its process does: FedAdam's server
# stands for Yogi's and Adagrad's, GC-Fed's (LocalGC on the feature layers, GlobalGC on the
# classifier) for LocalGC's and GlobalGC's, which are built batched untrained
# (`test_the_untrained_families_build_batched_cells`). FedZMG's Adam, Yogi and prox variants
# pair a rule and an optimizer trained here.
TRAINED = ('fedavg', 'fedadam', 'fedzmg', 'fedprox', 'gcfed')
BUILT = ('fedyogi', 'fedadagrad', 'local_gc', 'global_gc')
BATCHABLE = (*TRAINED, *BUILT, 'fedzmg_adam', 'fedzmg_yogi', 'fedzmg_prox')
# The last cell's server rate takes its weights near float32's largest after round 1:
# its round 2 overflows.
_CLIENT_RATES = (0.01, 0.05, 0.2, 0.1)
_SERVER_RATES = (1.0, 0.5, 1.0, 1e37)
_ROUNDS = 5
_FEATURES, _CLASSES = 6, 3


def _client_data(num_clients=3, examples=7, batch=3):
  rng = np.random.default_rng(0)
  data = []
  for _ in range(num_clients):
    x = rng.normal(size=(examples, _FEATURES)).astype(np.float32) * 10
    y = rng.integers(0, _CLASSES, size=examples).astype(np.int32)
    data.append(tf.data.Dataset.from_tensor_slices(
        collections.OrderedDict(x=x, y=y)).batch(batch))
  return data


def _flat(weights) -> np.ndarray:
  return np.concatenate([np.ravel(w) for w in weights.trainable])


def _leaves(metrics) -> dict:
  """Metric name -> value, flattened."""
  flat = {}
  for key, value in metrics.items():
    if isinstance(value, collections.abc.Mapping):
      flat.update({f'{key}/{k}': v for k, v in _leaves(value).items()})
    else:
      flat[key] = np.asarray(value)
  return flat


def _run_alone_and_batched(process):
  """Each cell's states and metrics of `_ROUNDS` rounds: alone, and as 4 batched cells."""
  data = _client_data()
  initial = process.initialize()
  held = state_hparams.held_in_state(process)
  starts = [state_hparams.set_in_state(process, initial, {
      n: v for n, v in dict(client_learning_rate=c, server_learning_rate=s).items()
      if n in held}) for c, s in zip(_CLIENT_RATES, _SERVER_RATES)]
  alone = [[] for _ in starts]
  for cell, state in enumerate(starts):
    for _ in range(_ROUNDS):
      state, metrics = process.next(state, data)
      alone[cell].append((state, metrics))
  batched_process = cells.build_cells_process(process, len(starts))
  batched = [[] for _ in starts]
  states = tuple(starts)
  for _ in range(_ROUNDS):
    states, metrics = batched_process.next(states, data)
    for cell in range(len(starts)):
      batched[cell].append((states[cell], metrics[cell]))
  return alone, batched


@pytest.mark.parametrize('algo', TRAINED)
def test_four_batched_cells_equal_four_runs_alone_one_diverging_in_round_two(algo):
  model_fn = tiny_models.softmax_regression_model_fn(_FEATURES, _CLASSES)
  with in_process.in_process_context():
    alone, batched = _run_alone_and_batched(registry.build(algo, model_fn, num_clients=3))
  for cell, (cell_alone, cell_batched) in enumerate(zip(alone, batched)):
    for round_num, ((state_a, metrics_a), (state_b, metrics_b)) in enumerate(
        zip(cell_alone, cell_batched), start=1):
      where = f'{algo} cell {cell} round {round_num}'
      np.testing.assert_allclose(_flat(state_b.global_model_weights),
                                 _flat(state_a.global_model_weights), rtol=1e-4, err_msg=where)
      leaves_a, leaves_b = _leaves(metrics_a), _leaves(metrics_b)
      assert leaves_a.keys() == leaves_b.keys(), where
      for name in leaves_a:
        np.testing.assert_allclose(leaves_b[name], leaves_a[name], rtol=1e-4,
                                   err_msg=f'{where}: {name}')
  # The last cell's round 2 overflows (its loss, or its update, which is dropped).
  diverged = [not np.isfinite(m['client_work']['train']['loss'])
              or m['finalizer']['update_non_finite'] > 0
              or m['client_work']['train']['num_examples'] == 0 for _, m in batched[-1]]
  assert diverged[:2] == [False, True], (algo, diverged)
  for cell in batched[:-1]:
    assert all(np.isfinite(_flat(s.global_model_weights)).all() for s, _ in cell), algo


def test_processes_whose_clients_keep_state_are_not_batched():
  model_fn = tiny_models.softmax_regression_model_fn(_FEATURES, _CLASSES)
  process = registry.build('scaffold', model_fn, num_clients=3)
  assert 'keep state' in cells.unbatchable_reason(process)
  with pytest.raises(ValueError, match='cannot train cells batched: its clients keep state'):
    cells.build_cells_process(process, 2)
  for algo in BATCHABLE:
    assert cells.unbatchable_reason(registry.build(algo, model_fn, num_clients=3)) is None, algo


def test_the_untrained_families_build_batched_cells():
  """Untrained: the batched process's state is the cells' states, each its process's, and
  its `next` takes and returns that state and the process's client data."""
  model_fn = tiny_models.softmax_regression_model_fn(_FEATURES, _CLASSES)
  for algo in BUILT:
    process = registry.build(algo, model_fn, num_clients=3)
    batched = cells.build_cells_process(process, 2)
    state = process.initialize.type_signature.result
    states = batched.initialize.type_signature.result
    assert states.placement == state.placement, algo
    assert [states.member[k] for k in range(2)] == [state.member] * 2, algo
    parameter, result = batched.next.type_signature.parameter, batched.next.type_signature.result
    assert parameter[0] == states and result[0] == states, algo
    assert parameter[1] == process.next.type_signature.parameter[1], algo


def test_each_cell_has_its_own_aggregator_state():
  """A DP aggregator's noise comes from its state: batched, each cell draws its own, as
  alone."""
  model_fn = tiny_models.softmax_regression_model_fn(_FEATURES, _CLASSES)
  settings = aggregation.AggregatorSettings(kind='dp_fixed', noise_multiplier=0.5, clip=1.0,
                                          clients_per_round=3, noise_seed=7)
  with in_process.in_process_context():
    # DP's mean is uniform whatever FedAvg's weighting (tests/test_aggregation.py).
    with pytest.warns(UserWarning, match='averages client updates uniformly'):
      process = registry.build('fedavg', model_fn, num_clients=3, aggregator=settings)
    alone, batched = _run_alone_and_batched(process)
  for cell_alone, cell_batched in zip(alone[:-1], batched[:-1]):
    for (state_a, _), (state_b, _) in zip(cell_alone, cell_batched):
      np.testing.assert_allclose(_flat(state_b.global_model_weights),
                                 _flat(state_a.global_model_weights), rtol=1e-4)
