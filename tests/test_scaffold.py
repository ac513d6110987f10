"""SCAFFOLD and FedZMG-SCAFFOLD against a float64 NumPy re-computation of option II.

A softmax regression (3 inputs, 2 classes) on N = 3 clients with 1, 2 and 3 local steps
(so K differs), three rounds with partial participation: client 2 sits out round 0 and
client 0 round 1, keeping its `c_i`. The model weights, every client's `c_i` and the
server's `c` must equal Karimireddy et al.'s Algorithm 1 (option II), the gradient of
the mean cross-entropy computed here by hand, on TFF's worker and on the in-process runtime.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf

from tff_zmg import client_states
from tff_zmg.algorithms import registry
from tff_zmg.runtime import in_process
import tiny_models

PARTICIPATION = ((0, 1), (1, 2), (0, 2))
NUM_CLIENTS = 3
BATCH = 2
EXAMPLES = (2, 4, 6)  # K_i = 1, 2, 3 local steps.
model_fn = tiny_models.softmax_regression_model_fn(3, 2)


def _client_data(seed, n):
  rng = np.random.default_rng(seed)
  return rng.normal(size=(n, 3)).astype(np.float32), rng.integers(0, 2, n).astype(np.int32)


CLIENT_DATA = [_client_data(seed, n) for seed, n in enumerate(EXAMPLES)]


def _dataset(client):
  x, y = CLIENT_DATA[client]
  return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y)).batch(BATCH)


def _np_client(x_model, c_i, c, client, hp, project):
  """One client's round: K steps on `g - c_i + c` (projected for FedZMG), then option II."""
  lr = hp['client_learning_rate']
  mu, decay = hp.get('client_momentum', 0.0), hp.get('weight_decay', 0.0)
  data_x, data_y = CLIENT_DATA[client]
  y = [a.copy() for a in x_model]
  v = [np.zeros_like(a) for a in y]
  steps = 0
  for start in range(0, len(data_y), BATCH):
    g = tiny_models.np_softmax_regression_gradient(
        y, np.float64(data_x[start:start + BATCH]), data_y[start:start + BATCH])
    d = [gi - ci + ci_server for gi, ci, ci_server in zip(g, c_i, c)]
    if project:
      d = [tiny_models.np_project(d[0]), d[1]]  # The kernel, not the bias.
    v = [mu * vi + di for vi, di in zip(v, d)]
    y = [a - lr * vi - lr * decay * a for a, vi in zip(y, v)]
    steps += 1
  new_c_i = [ci - cs + (xm - ym) / (steps * lr) for ci, cs, xm, ym in zip(c_i, c, x_model, y)]
  return y, new_c_i


def _np_run(w0, hp, rounds, project):
  """Per round: (weights, {client: c_i}, c)."""
  x = [np.float64(a) for a in w0]
  zeros = [np.zeros_like(a) for a in x]
  c_i = {i: zeros for i in range(NUM_CLIENTS)}
  c = zeros
  history = []
  for clients in PARTICIPATION[:rounds]:
    ys, deltas = [], []
    for i in clients:
      y, new = _np_client(x, c_i[i], c, i, hp, project)
      ys.append(y)
      deltas.append([n - o for n, o in zip(new, c_i[i])])
      c_i[i] = new
    x = [xm + hp['server_learning_rate'] * np.mean([y[k] - xm for y in ys], axis=0)
         for k, xm in enumerate(x)]
    c = [cs + len(clients) / NUM_CLIENTS * np.mean([d[k] for d in deltas], axis=0)
         for k, cs in enumerate(c)]
    history.append((x, dict(c_i), c))
  return history


def _run(name, hp, rounds, runtime):
  """`rounds` rounds through the package's trainer and in-memory client-state store, on
  the test session's TFF worker or in process."""
  process = registry.build(name, model_fn, num_clients=NUM_CLIENTS, **hp)
  trainer = client_states.StatefulClientsTrainer(
      process, client_states.InMemoryClientStateStore()
  )
  if runtime == 'tff_worker':
    return _rounds(trainer, rounds)
  with in_process.in_process_context() as context:
    result = _rounds(trainer, rounds)
  assert context.rounds_run == rounds  # The rounds ran in this process.
  return result


def _rounds(trainer, rounds):
  """Each round's state has the initial state's structure, containers included (what a
  checkpoint is read into)."""
  state = initial = trainer.initialize()
  w0 = [np.asarray(a) for a in trainer.get_model_weights(state).trainable]
  history = []
  for t, clients in enumerate(PARTICIPATION[:rounds]):
    selection = client_states.ClientSelection(
        t, [f'client{i}' for i in clients], [_dataset(i) for i in clients]
    )
    state = trainer.next(state, selection).state
    tf.nest.assert_same_structure(initial, state, check_types=True)
    history.append((
        [np.asarray(a) for a in trainer.get_model_weights(state).trainable],
        {i: trainer.client_state(f'client{i}')['control'] for i in range(NUM_CLIENTS)},
        state['shared']['control'],
    ))
  return w0, history


def _assert_close(actual, expected, what):
  for k, (a, e) in enumerate(zip(actual, expected)):
    np.testing.assert_allclose(a, e, rtol=2e-5, atol=1e-6, err_msg=f'{what}[{k}]')


@pytest.mark.parametrize('runtime', ['tff_worker', 'in_process'])
@pytest.mark.parametrize('name, hp, rounds, project', [
    ('scaffold', dict(client_learning_rate=0.3, server_learning_rate=0.7), 3, False),
    ('fedzmg_scaffold', dict(client_learning_rate=0.3, server_learning_rate=0.7,
                             client_momentum=0.5, weight_decay=0.1), 2, True),
])
def test_weights_and_control_variates_follow_option_ii(tff_context, name, hp, rounds,
                                                       project, runtime):
  del tff_context
  w0, history = _run(name, hp, rounds, runtime)
  expected = _np_run(w0, hp, rounds, project)
  for t, ((weights, c_i, c), (w_np, c_i_np, c_np)) in enumerate(zip(history, expected)):
    _assert_close(weights, w_np, f'round {t} weights')
    _assert_close(c, c_np, f'round {t} c')
    for i in range(NUM_CLIENTS):
      _assert_close(c_i[i], c_i_np[i], f'round {t} c_{i}')
  # Client 0 sat out round 1: its c_i is the one of round 0.
  _assert_close(history[1][1][0], history[0][1][0], 'absent client 0')
  # c is the mean of all N clients' c_i (they and c start at 0), and it moved.
  final_c_i, final_c = history[-1][1], history[-1][2]
  _assert_close(final_c, [np.mean([final_c_i[i][k] for i in range(NUM_CLIENTS)], axis=0)
                          for k in range(2)], 'c = mean c_i')
  assert np.abs(final_c[0]).max() > 1e-3


def test_scaffold_needs_the_number_of_clients():
  with pytest.raises(ValueError, match=r'number of training clients N .* got None'):
    registry.build('scaffold', model_fn)
  with pytest.raises(ValueError, match=r'client_learning_rate must be > 0, got -0.1'):
    registry.build('scaffold', model_fn, num_clients=3, client_learning_rate=-0.1)


def test_a_client_that_runs_no_step_keeps_its_control_variate(tff_context):
  """K = 0 (no batch): option II would divide by zero; the client keeps c_i."""
  del tff_context
  process = registry.build('scaffold', model_fn, num_clients=NUM_CLIENTS)
  state = process.initialize()
  c_i = (np.full((3, 2), 0.5, np.float32), np.full((2,), -0.5, np.float32))
  output = process.build_local_update()(
      process.get_model_weights(state), _dataset(0).take(0),
      collections.OrderedDict(control=c_i), process.round_input(state),
  )
  assert float(output.result.update_weight) == 1.0  # Kept, not dropped as non-finite.
  for new, old in zip(output.state['control'], c_i):
    np.testing.assert_array_equal(new, old)
  assert all(not np.any(d) for d in output.upload['control_delta'])
