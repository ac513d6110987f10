"""FedProx, Mime-Lite, FedYogi, FedAdagrad and their compositions with the ZMG projection.

Mime-Lite, FedYogi and FedAdagrad are TFF's own algorithms: the registry's processes must
equal TFF's builders. FedProx is not TFF's (TFF 0.87's proximal term has the wrong sign,
which a test here pins) and the compositions (`fedzmg_prox`, `fedzmg_yogi`) are new: they
are checked against float64 NumPy over two rounds of several local steps, on a softmax
regression whose gradient the test writes by hand, so that the proximal term (zero at a
round's first step) and the server optimizer's state both show.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_zmg.algorithms import registry
import tiny_models

FEATURES, CLASSES, BATCH = 4, 3, 2
# Unequal example counts (example weighting shows) and several local steps per client.
CLIENT_EXAMPLES = (6, 4, 5)


model_fn = tiny_models.softmax_regression_model_fn(FEATURES, CLASSES)


def _client_arrays():
  rng = np.random.default_rng(0)
  return [
      (rng.normal(size=(n, FEATURES)).astype(np.float32),
       rng.integers(0, CLASSES, size=n).astype(np.int32))
      for n in CLIENT_EXAMPLES
  ]


CLIENTS = _client_arrays()


def _datasets():
  return [
      tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y)).batch(BATCH)
      for x, y in CLIENTS
  ]


def _weights(process, state):
  return [np.float64(w) for w in process.get_model_weights(state).trainable]


def _run(process, rounds=2):
  state = process.initialize()
  for _ in range(rounds):
    state = process.next(state, _datasets()).state
  return _weights(process, state)


def _np_client_round(w, hp, mu, project=True):
  """One round of FedZMG (or, without `project`, SGD(M)) clients on `g + mu (w_k - w^t)`:
  the example-weighted mean update `u`."""
  updates, counts = [], []
  for x, y in CLIENTS:
    x, y = np.float64(x), y
    wk, v = [t.copy() for t in w], [np.zeros_like(t) for t in w]
    for start in range(0, len(y), BATCH):
      g = tiny_models.np_softmax_regression_gradient(
          wk, x[start:start + BATCH], y[start:start + BATCH])
      g = [gi + mu * (a - b) for gi, a, b in zip(g, wk, w)]
      if project:
        g = [tiny_models.np_project(g[0]), g[1]]  # The kernel is projected, the bias is not.
      v = [hp.get('client_momentum', 0.0) * vi + gi for vi, gi in zip(v, g)]
      lr, decay = hp['client_learning_rate'], hp.get('weight_decay', 0.0)
      wk = [a - lr * vi - lr * decay * a for a, vi in zip(wk, v)]
    updates.append([a - b for a, b in zip(w, wk)])
    counts.append(len(y))
  return [sum(n * u[i] for n, u in zip(counts, updates)) / sum(counts) for i in range(2)]


def _initial(process):
  return _weights(process, process.initialize())


def test_the_baselines_are_tff_s_own_algorithms(tff_context):
  del tff_context
  h = {n: registry.get(n).defaults for n in ('mime_lite', 'fedyogi', 'fedadagrad')}
  sgd = tff.learning.optimizers.build_sgdm
  references = {
      'mime_lite': tff.learning.algorithms.build_weighted_mime_lite(
          model_fn,
          base_optimizer=sgd(h['mime_lite']['client_learning_rate'],
                             momentum=h['mime_lite']['client_momentum']),
          server_optimizer=sgd(h['mime_lite']['server_learning_rate'])),
      'fedyogi': tff.learning.algorithms.build_weighted_fed_avg(
          model_fn, client_optimizer_fn=sgd(h['fedyogi']['client_learning_rate']),
          server_optimizer_fn=tff.learning.optimizers.build_yogi(
              h['fedyogi']['server_learning_rate'], beta_1=0.9, beta_2=0.99,
              epsilon=1e-3, initial_preconditioner_value=1e-6)),
      'fedadagrad': tff.learning.algorithms.build_weighted_fed_avg(
          model_fn, client_optimizer_fn=sgd(h['fedadagrad']['client_learning_rate']),
          server_optimizer_fn=tff.learning.optimizers.build_adagrad(
              h['fedadagrad']['server_learning_rate'], initial_preconditioner_value=1e-6,
              epsilon=1e-6)),
  }
  for name, reference in references.items():
    ours = registry.build(name, model_fn)
    w0, expected = _initial(reference), _run(reference)
    for a, b, start in zip(_run(ours), expected, w0):
      np.testing.assert_allclose(a, b, rtol=0, atol=1e-6, err_msg=name)
      assert np.abs(b - start).max() > 1e-4, name  # The rounds moved the model.


def _np_rounds(process, hp, mu, project):
  """Two rounds of server SGD on `_np_client_round`'s update."""
  w = _initial(process)
  for _ in range(2):
    w = [a - hp['server_learning_rate'] * u
         for a, u in zip(w, _np_client_round(w, hp, mu, project))]
  return w


def test_fedprox_is_numpy_sgd_on_the_proximal_gradient(tff_context):
  del tff_context
  hp = dict(registry.get('fedprox').defaults, proximal_strength=0.5)
  process = registry.build('fedprox', model_fn, **hp)
  for ours, expected in zip(_run(process), _np_rounds(process, hp, 0.5, project=False)):
    np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-6)


def test_tff_fed_prox_adds_the_proximal_term_with_the_opposite_sign(tff_context):
  """Why fedprox is not TFF's `build_weighted_fed_prox` (TFF 0.87): its clients step
  along `g - mu (w - w^t)`, away from the round's model. If this fails, TFF changed:
  use its builder again."""
  del tff_context
  hp = dict(registry.get('fedprox').defaults, proximal_strength=0.5)
  sgd = tff.learning.optimizers.build_sgdm
  tff_prox = tff.learning.algorithms.build_weighted_fed_prox(
      model_fn, proximal_strength=0.5, client_optimizer_fn=sgd(hp['client_learning_rate']),
      server_optimizer_fn=sgd(hp['server_learning_rate']))
  theirs = _run(tff_prox)
  for a, b in zip(theirs, _np_rounds(tff_prox, hp, -0.5, project=False)):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
  assert np.abs(theirs[0] - _np_rounds(tff_prox, hp, 0.5, project=False)[0]).max() > 1e-4


def test_fedzmg_prox_is_numpy_fedzmg_on_the_proximal_gradient(tff_context):
  del tff_context
  hp = dict(registry.get('fedzmg_prox').defaults, proximal_strength=0.5,
            client_learning_rate=0.1)
  process = registry.build('fedzmg_prox', model_fn, **hp)
  w = _np_rounds(process, hp, hp['proximal_strength'], project=True)
  for ours, expected in zip(_run(process), w):
    np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-6)
  # The proximal term shows: without it the result differs.
  plain = _run(registry.build('fedzmg_prox', model_fn, **{**hp, 'proximal_strength': 0.0}))
  assert np.abs(plain[0] - w[0]).max() > 1e-4


def test_fedzmg_yogi_is_numpy_yogi_on_the_fedzmg_update(tff_context):
  del tff_context
  hp = dict(registry.get('fedzmg_yogi').defaults, client_learning_rate=0.1)
  process = registry.build('fedzmg_yogi', model_fn, **hp)
  b1, b2, eps = hp['yogi_beta_1'], hp['yogi_beta_2'], hp['yogi_epsilon']
  w = _initial(process)
  m = [np.zeros_like(t) for t in w]
  v = [np.full_like(t, hp['yogi_initial_accumulator']) for t in w]
  for t in (1, 2):
    u = _np_client_round(w, hp, 0.0)
    m = [b1 * mi + (1 - b1) * ui for mi, ui in zip(m, u)]
    v = [vi + (1 - b2) * np.sign(ui**2 - vi) * ui**2 for vi, ui in zip(v, u)]
    rate = hp['server_learning_rate'] * np.sqrt(1 - b2**t) / (1 - b1**t)
    w = [a - rate * mi / (np.sqrt(vi) + eps) for a, mi, vi in zip(w, m, v)]
  for ours, expected in zip(_run(process), w):
    np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-6)
