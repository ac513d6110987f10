"""FedGPS and FedGPS-CF against NumPy re-computations of specification.md ("FedGPS client").

The pure pieces (surrogate data, prototypes, the non-self direction, the objective) are
checked one by one. Then a softmax-regression model on 4x4x1 images (feature extractor
Flatten, classifier Dense(3)) runs two rounds on three clients with partial
participation, and the weights, the server's mean update, prototypes and the clients'
states must equal the spec's formulas computed here in float64: no look-ahead in round
0; in round 1 client 1 (which took part in round 0) leaves its own update out of the
direction and client 2 (which did not) uses the mean update. The alignment weights are
0 there (the flattened features have no weights, so those terms would not move them);
the objective test checks them.

Runtime: each process build and first round costs ~25 s here, so the test builds four
(the tiny model twice, CIFAR-100 once, EMNIST once through `launch.train`).
"""

import collections
import contextlib
import csv
import functools

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from launch import train
from tasks import models
from tff_zmg import client_states
from tff_zmg.transforms import prototypes
from tff_zmg.transforms import rectification
from tff_zmg.transforms import surrogate
from tff_zmg.algorithms import fedgps
from tff_zmg.algorithms import registry
from tff_zmg.runtime import in_process
import tiny_models

NUM_CLASSES = 3
IMAGE_SHAPE = (4, 4, 1)  # Low resolution 1x1x1: every surrogate image is constant.
HPARAMS = dict(
    client_learning_rate=0.1, client_momentum=0.5, lambda1=0.0, lambda2=0.0,
    lambda3=0.01, lambda_g=0.5, surrogate_samples_per_class=2, surrogate_seed=3,
)
# Client 1 takes part in both rounds, client 0 only in round 0, client 2 only in 1.
PARTICIPATION = ((0, 1), (1, 2))
BATCH = 2


def tiny_keras_model():
  return tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=IMAGE_SHAPE),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(
          NUM_CLASSES, kernel_initializer=tf.keras.initializers.GlorotUniform(1)
      ),
  ])


tiny_model_fn = tiny_models.image_model_fn(tiny_keras_model, IMAGE_SHAPE)


def _client_data(seed):
  """Two batches of two examples, fixed."""
  rng = np.random.default_rng(seed)
  x = rng.uniform(size=(4,) + IMAGE_SHAPE).astype(np.float32)
  y = rng.integers(0, NUM_CLASSES, size=4).astype(np.int32)
  return x, y


CLIENT_DATA = [_client_data(seed) for seed in range(3)]


def _dataset(client):
  x, y = CLIENT_DATA[client]
  return tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict(x=x, y=y)
  ).batch(BATCH)


def _never_called():
  raise AssertionError('model functions must not be called before validation')


# The surrogate data.


@pytest.mark.parametrize('keras_model_fn, num_classes, low_shape', [
    (models.emnist_cnn, models.EMNIST_NUM_CLASSES, (7, 7, 1)),
    (models.cifar100_cnn, models.CIFAR100_NUM_CLASSES, (8, 8, 3)),
])
def test_surrogate_data_is_seeded_shaped_and_labelled(
    keras_model_fn, num_classes, low_shape
):
  image_shape = keras_model_fn().input_shape[1:]
  assert surrogate.low_resolution_shape(image_shape) == low_shape
  x, y = surrogate.surrogate_dataset(num_classes, 2, image_shape, seed=0)
  again, _ = surrogate.surrogate_dataset(num_classes, 2, image_shape, seed=0)
  other, _ = surrogate.surrogate_dataset(num_classes, 2, image_shape, seed=1)
  assert x.shape == (num_classes * 2,) + image_shape and x.dtype == tf.float32
  np.testing.assert_array_equal(x, again)  # What every client generates.
  assert np.abs(np.asarray(x) - np.asarray(other)).max() > 0.1
  np.testing.assert_array_equal(y, np.repeat(np.arange(num_classes), 2))
  assert 0.0 <= np.min(x) and np.max(x) <= 1.0
  assert 0.0 < np.mean(x) < 1.0  # Clipping leaves images, not a constant.


def test_surrogate_classes_are_gaussians_around_their_means():
  low = np.asarray(surrogate.low_resolution_samples(4, 2000, (2, 2, 1), seed=5))
  per_class = low.reshape(4, 2000, -1)
  means = per_class.mean(axis=1)
  # Samples N(mu_c, 0.5^2); means mu_c ~ N(0, 1), different for every class.
  np.testing.assert_allclose((per_class - means[:, None]).std(), 0.5, rtol=0.03)
  assert np.abs(means[:, None] - means[None]).max() > 0.5


def test_surrogate_images_are_the_clipped_bilinear_upsampling():
  low = np.array([-0.3, 0.4, 1.7], np.float32).reshape(3, 1, 1, 1)
  images = np.asarray(surrogate.to_images(low, (4, 4, 1)))
  expected = np.broadcast_to(np.clip(low, 0, 1), (3, 4, 4, 1))
  np.testing.assert_allclose(images, expected, atol=1e-7)
  ramp = np.array([[0.0, 1.0]], np.float32).reshape(1, 1, 2, 1)  # Two pixels.
  row = np.asarray(surrogate.to_images(ramp, (1, 4, 1)))[0, 0, :, 0]
  np.testing.assert_allclose(row, [0.0, 0.25, 0.75, 1.0], atol=1e-6)


def test_surrogate_batches_depend_on_seed_round_and_step():
  draw = lambda *a: np.asarray(surrogate.batch_indices(*a, batch_size=64, num_samples=10))
  np.testing.assert_array_equal(draw(0, 1, 2), draw(0, 1, 2))
  for other in (draw(1, 1, 2), draw(0, 2, 2), draw(0, 1, 3)):
    assert np.any(draw(0, 1, 2) != other)
  assert draw(0, 1, 2).min() >= 0 and draw(0, 1, 2).max() < 10


# Prototypes, the non-self direction, the objective.


def test_class_prototypes_and_distance_match_numpy():
  rng = np.random.default_rng(0)
  features = rng.normal(size=(7, 5)).astype(np.float32)
  labels = np.array([0, 2, 2, 0, 2, 3, 0])
  p, n = prototypes.class_prototypes(features, labels, 4)
  np.testing.assert_array_equal(n, [3, 0, 3, 1])
  for c in range(4):
    expected = features[labels == c].mean(axis=0) if n[c] else np.zeros(5)
    np.testing.assert_allclose(p[c], expected, rtol=1e-6)
  other = rng.normal(size=(4, 5)).astype(np.float32)
  mask = np.array([True, False, True, False])
  expected = ((np.asarray(p) - other)[mask] ** 2).mean()
  np.testing.assert_allclose(prototypes.prototype_distance(p, other, mask), expected, rtol=1e-6)
  assert float(prototypes.prototype_distance(p, other, np.zeros(4, bool))) == 0.0


def test_prototype_merge_is_count_weighted_and_keeps_unseen_classes():
  # Two clients; class 0 seen by both (3 and 1 features), 1 by client b only, 2 by none.
  a, a_counts = np.array([[1.0, 2.0], [9.0, 9.0], [0.0, 0.0]]), np.array([3.0, 0.0, 0.0])
  b, b_counts = np.array([[5.0, -2.0], [4.0, 6.0], [0.0, 0.0]]), np.array([1.0, 2.0, 0.0])
  previous, previous_counts = np.full((3, 2), 7.0), np.array([5.0, 5.0, 4.0])
  merged, counts = prototypes.merge_prototypes(
      a * a_counts[:, None] + b * b_counts[:, None], a_counts + b_counts,
      previous, previous_counts,
  )
  np.testing.assert_allclose(merged, [[2.0, 1.0], [4.0, 6.0], [7.0, 7.0]])
  np.testing.assert_allclose(counts, [4.0, 2.0, 4.0])


def test_non_self_direction_and_look_ahead():
  mean = (np.array([1.0, 2.0], np.float32), np.array([[3.0]], np.float32))
  own = (np.array([4.0, -1.0], np.float32), np.array([[0.0]], np.float32))
  cases = {
      (3, True): [(3 * m - o) / 2 for m, o in zip(mean, own)],  # Own update out.
      (3, False): list(mean),  # Did not take part last round.
      (1, True): [np.zeros_like(m) for m in mean],  # Was last round's only client.
      (0, False): list(mean),
  }
  for (k, took_part), expected in cases.items():
    d = rectification.non_self_direction(mean, own, k, took_part)
    for a, e in zip(d, expected):
      np.testing.assert_allclose(a, e, rtol=1e-6, err_msg=f'K={k} {took_part}')
  offset = rectification.look_ahead_offset(mean, 0.5)
  norm = np.sqrt(sum(np.sum(m.astype(np.float64) ** 2) for m in mean))
  for o, m in zip(offset, mean):
    np.testing.assert_allclose(o, 0.5 * m / norm, rtol=1e-6)
  zero = rectification.look_ahead_offset(cases[(1, True)], 0.5)
  assert all(not np.any(o) for o in zero)


def _np_cross_entropy(logits, labels):
  z = logits - logits.max(axis=1, keepdims=True)
  log_p = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
  return -log_p[np.arange(len(labels)), labels].mean()


def test_objective_terms_match_numpy_and_round_0_has_no_global_alignment():
  rng = np.random.default_rng(1)
  c, f = 4, 3
  local_f, surr_f = rng.normal(size=(5, f)), rng.normal(size=(6, f))
  local_y, surr_y = np.array([0, 1, 1, 3, 0]), np.array([0, 0, 1, 2, 2, 2])
  local_logits, surr_logits = rng.normal(size=(5, c)), rng.normal(size=(6, c))
  weights = [rng.normal(size=(2, 2)), rng.normal(size=(2,))]
  global_p = rng.normal(size=(c, f))
  lambdas = dict(lambda1=0.3, lambda2=0.7, lambda3=0.01)

  def objective(global_counts):
    as32 = lambda a: tf.constant(a, tf.float32)
    terms = fedgps.fedgps_objective(
        local_logits=as32(local_logits), local_labels=local_y,
        local_features=as32(local_f), surrogate_logits=as32(surr_logits),
        surrogate_labels=surr_y, surrogate_features=as32(surr_f),
        global_prototypes=as32(global_p), global_counts=as32(global_counts),
        weights=[as32(w) for w in weights], num_classes=c, **lambdas,
    )
    return {k: float(v) for k, v in terms.items()}

  def np_prototype(feats, labels, k):
    return feats[labels == k].mean(axis=0)

  # Classes in both batches: 0, 1. In the surrogate batch with a global prototype: 0, 2.
  d1 = np.mean([(np_prototype(local_f, local_y, k) - np_prototype(surr_f, surr_y, k)) ** 2
                for k in (0, 1)])
  d2 = np.mean([(global_p[k] - np_prototype(surr_f, surr_y, k)) ** 2 for k in (0, 2)])
  ce = _np_cross_entropy(local_logits, local_y)
  ce_s = _np_cross_entropy(surr_logits, surr_y)
  l2 = sum(np.sum(w ** 2) for w in weights)
  terms = objective([2.0, 0.0, 5.0, 1.0])
  expected = dict(loss=ce, surrogate_loss=ce_s, local_alignment=d1, global_alignment=d2,
                  l2=l2, objective=ce + ce_s + 0.3 * d1 + 0.7 * d2 + 0.01 * l2)
  for name, value in expected.items():
    assert terms[name] == pytest.approx(value, rel=1e-5), name
  round_0 = objective(np.zeros(c))  # No global prototypes yet.
  assert round_0['global_alignment'] == 0.0
  assert round_0['objective'] == pytest.approx(ce + ce_s + 0.3 * d1 + 0.01 * l2, rel=1e-5)


# Two rounds of the tiny model against NumPy.


def _surrogate_images():
  """The surrogate set in NumPy: 1x1 low resolution, so images are clipped constants."""
  low = np.asarray(surrogate.low_resolution_samples(
      NUM_CLASSES, HPARAMS['surrogate_samples_per_class'], (1, 1, 1),
      HPARAMS['surrogate_seed'],
  ), np.float64)
  images = np.broadcast_to(np.clip(low, 0, 1), (len(low),) + IMAGE_SHAPE)
  labels = np.repeat(np.arange(NUM_CLASSES), HPARAMS['surrogate_samples_per_class'])
  return images.reshape(len(low), -1), labels


def _np_gradient(w, x, y):
  """Gradient of the mean softmax cross-entropy of `x @ K + b`, float64."""
  kernel, bias = w
  logits = x @ kernel + bias
  p = np.exp(logits - logits.max(axis=1, keepdims=True))
  p /= p.sum(axis=1, keepdims=True)
  p[np.arange(len(y)), y] -= 1.0
  p /= len(y)
  return [x.T @ p, p.sum(axis=0)]


def _np_client(w, client, d, t):
  """One client's round from the spec: (w_k, surrogate feature sums, counts)."""
  lr, mu = HPARAMS['client_learning_rate'], HPARAMS['client_momentum']
  lambda3, lambda_g = HPARAMS['lambda3'], HPARAMS['lambda_g']
  s_images, s_labels = _surrogate_images()
  x, y = CLIENT_DATA[client]
  x = np.float64(x).reshape(len(x), -1)
  norm = np.sqrt(sum(np.sum(a ** 2) for a in d))
  offset = [lambda_g * a / norm if norm > 0 else np.zeros_like(a) for a in d]
  local = [a.copy() for a in w]
  v = [np.zeros_like(a) for a in w]
  sums, counts = np.zeros((NUM_CLASSES, x.shape[1])), np.zeros(NUM_CLASSES)
  for step in range(2):
    batch = slice(BATCH * step, BATCH * (step + 1))
    indices = np.asarray(surrogate.batch_indices(
        HPARAMS['surrogate_seed'], t, step, BATCH, len(s_labels)))
    xs, ys = s_images[indices], s_labels[indices]
    look = [a + o for a, o in zip(local, offset)]
    g_local, g_surrogate = _np_gradient(look, x[batch], y[batch]), _np_gradient(look, xs, ys)
    g = [gl + gs + 2 * lambda3 * a for gl, gs, a in zip(g_local, g_surrogate, look)]
    v = [mu * vi + gi for vi, gi in zip(v, g)]
    local = [a - lr * vi for a, vi in zip(local, v)]
    np.add.at(sums, ys, xs)  # The features are the flattened images.
    np.add.at(counts, ys, 1.0)
  return local, sums, counts


def _np_run(w0, exclude_own_update):
  """Two rounds of the spec: per round (weights, Dbar, prototypes, counts, own deltas)."""
  w = [np.float64(a) for a in w0]
  mean_update, num_clients = [np.zeros_like(a) for a in w], 0
  protos, proto_counts = np.zeros((NUM_CLASSES, 16)), np.zeros(NUM_CLASSES)
  own, last_round = {}, {}
  history = []
  for t, clients in enumerate(PARTICIPATION):
    deltas, sums, counts = [], 0.0, 0.0
    for c in clients:
      took_part = last_round.get(c) == t - 1
      if exclude_own_update and took_part:
        d = [(num_clients * m - o) / (num_clients - 1) for m, o in zip(mean_update, own[c])]
      else:
        d = mean_update
      local, s, n = _np_client(w, c, d, t)
      deltas.append([a - b for a, b in zip(local, w)])
      sums, counts = sums + s, counts + n
    for c, delta in zip(clients, deltas):
      own[c], last_round[c] = delta, t
    mean_update = [np.mean(ds, axis=0) for ds in zip(*deltas)]
    num_clients = len(clients)
    w = [a + m for a, m in zip(w, mean_update)]  # eta_g = 1.
    seen = counts > 0
    protos = np.where(seen[:, None], sums / np.maximum(counts, 1)[:, None], protos)
    proto_counts = np.where(seen, counts, proto_counts)
    history.append((w, mean_update, protos, proto_counts, dict(own), dict(last_round)))
  return history


# One in-process runtime for the module, so that each built process compiles once.
IN_PROCESS = in_process.InProcessContext()


@functools.lru_cache(maxsize=None)
def _process(name):
  return registry.build(name, tiny_model_fn, keras_model_fn=tiny_keras_model, **HPARAMS)


@functools.lru_cache(maxsize=None)
def _run(name, runtime='tff_worker'):
  """Two rounds through the package's trainer and in-memory store, on `runtime`."""
  trainer = client_states.StatefulClientsTrainer(
      _process(name), client_states.InMemoryClientStateStore()
  )
  with contextlib.ExitStack() as stack:
    if runtime == 'in_process':
      stack.enter_context(tff.framework.get_context_stack().install(IN_PROCESS))
    state = trainer.initialize()
    w0 = [np.asarray(a) for a in trainer.get_model_weights(state).trainable]
    history = []
    for t, clients in enumerate(PARTICIPATION):
      selection = client_states.ClientSelection(
          t, [f'client{c}' for c in clients], [_dataset(c) for c in clients]
      )
      output = trainer.next(state, selection)
      state = output.state
      weights = [np.asarray(a) for a in trainer.get_model_weights(state).trainable]
      states = {c: trainer.client_state(f'client{c}') for c in range(3)}
      history.append((weights, state['shared'], states, output.metrics, state))
  return w0, history


def _assert_close(actual, expected, what):
  for i, (a, e) in enumerate(zip(actual, expected)):
    np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-6, err_msg=f'{what}[{i}]')


@pytest.mark.parametrize('runtime', ['tff_worker', 'in_process'])
@pytest.mark.parametrize('name, exclude_own_update', [
    ('fedgps', True), ('fedgps_cf', False),
])
def test_two_rounds_match_numpy(tff_context, name, exclude_own_update, runtime):
  """On TFF's worker and in process; in process, every weight, metric, shared and client
  state also equals the worker's to 1e-6 (issue 19)."""
  del tff_context
  w0, history = _run(name, runtime)
  if runtime == 'in_process':
    for a, b in zip(tf.nest.flatten(history), tf.nest.flatten(_run(name)[1])):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)
  expected = _np_run(w0, exclude_own_update)
  for t, ((weights, shared, states, metrics, _), exp) in enumerate(zip(history, expected)):
    w, mean_update, protos, proto_counts, own, last_round = exp
    _assert_close(weights, w, f'round {t} weights')
    _assert_close(shared['last_update'], mean_update, f'round {t} Dbar')
    assert int(shared['num_clients']) == 2
    # Count-weighted means of what both clients' steps drew: the pooled class means.
    np.testing.assert_allclose(shared['prototype_counts'], proto_counts)
    np.testing.assert_allclose(shared['prototypes'], protos, rtol=1e-5, atol=1e-6)
    for c in range(3):
      assert int(states[c]['last_round']) == last_round.get(c, -1), (t, c)
      if exclude_own_update:
        expected_own = own.get(c, [np.zeros_like(a) for a in w0])
        _assert_close(states[c]['own_update'], expected_own, f'round {t} client {c} own')
      else:
        assert 'own_update' not in states[c]
    assert metrics['client_work']['train']['num_examples'] == 8
  # The two variants differ only in client 1's direction in round 1, visibly so.
  other = _np_run(w0, not exclude_own_update)
  assert max(np.abs(a - b).max() for a, b in zip(expected[1][0], other[1][0])) > 1e-3


@pytest.mark.parametrize('name', ['fedgps', 'fedgps_cf'])
def test_a_rounds_state_has_the_initial_states_containers(tff_context, name):
  """A checkpoint is read into `initialize()`'s structure, containers included (TFF's
  `FileProgramStateManager.load`): the mean update was a list after a round and a tuple
  at the start, so no checkpoint after round 0 could be read, and a stopped run resumed
  from round 0."""
  initial = _process(name).initialize()
  for runtime in ('tff_worker', 'in_process'):
    for *_, state in _run(name, runtime)[1]:
      tf.nest.assert_same_structure(initial, state, check_types=True)


def test_the_local_update_is_one_clients_round_in_plain_tf(tff_context):
  """`build_local_update()` runs what the worker runs for one client (the benchmark's
  bound): client 1 in round 1, after taking part in round 0, against NumPy."""
  del tff_context
  w0, history = _run('fedgps')
  weights, shared, states, *_ = history[0]
  process = _process('fedgps')
  result, new_state, upload, _ = process.build_local_update()(
      tff.learning.models.ModelWeights(trainable=list(weights), non_trainable=[]),
      _dataset(1),
      states[1],
      process.round_input(collections.OrderedDict(round_num=np.int32(1), shared=shared)),
  )
  w, mean_update, _, _, own, _ = _np_run(w0, True)[0]
  d = [(2 * m - o) / (2 - 1) for m, o in zip(mean_update, own[1])]  # Non-self direction.
  local, sums, counts = _np_client(w, 1, d, 1)
  _assert_close(result.update, [a - b for a, b in zip(w, local)], 'update')
  _assert_close(new_state['own_update'], [b - a for a, b in zip(w, local)], 'own update')
  assert int(new_state['last_round']) == 1
  np.testing.assert_allclose(upload['counts'], counts)
  seen = counts > 0
  np.testing.assert_allclose(
      upload['prototypes'][seen], sums[seen] / counts[seen][:, None], rtol=1e-5, atol=1e-6
  )


def test_a_client_with_a_non_finite_update_is_dropped_as_every_stateful_client(tff_context):
  """`stateful_clients`' one policy, as FedRKMGC's test checks it on a whole round: a
  client whose update is not finite sends a zero update with weight 0 and no
  prototypes, keeps its state, and its metrics are reset."""
  del tff_context
  w0, history = _run('fedgps')
  weights, shared, states, *_ = history[0]
  process = _process('fedgps')
  x, y = CLIENT_DATA[1]
  poisoned = tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict(x=np.full_like(x, np.nan), y=y)
  ).batch(BATCH)
  output = process.build_local_update()(
      tff.learning.models.ModelWeights(trainable=list(weights), non_trainable=[]),
      poisoned,
      states[1],
      process.round_input(collections.OrderedDict(round_num=np.int32(1), shared=shared)),
  )
  assert float(output.result.update_weight) == 0.0
  assert all(not np.any(u) for u in output.result.update)
  assert int(output.state['last_round']) == int(states[1]['last_round']) == 0
  for a, b in zip(output.state['own_update'], states[1]['own_update']):
    np.testing.assert_array_equal(a, b)
  assert all(not np.any(v) for v in tf.nest.flatten(output.upload))
  assert all(not np.any(v) for v in tf.nest.flatten(output.metrics))


# Real tasks.


def _loss(task, model_weights, datasets):
  """The task loss of `model_weights` on `datasets`, in eager Keras."""
  keras_model = task.keras_model_fn()
  model_weights.assign_weights_to(keras_model)
  loss_fn = task.spec.loss_fn()
  total, count = 0.0, 0
  for dataset in datasets:
    for batch in dataset:
      n = int(tf.shape(batch['y'])[0])
      total += n * float(loss_fn(batch['y'], keras_model(batch['x'])))
      count += n
  return total / count


def test_three_rounds_on_cifar100_lower_the_training_loss(tff_context, small_task):
  del tff_context
  task = small_task('cifar100', num_epochs=3)
  client_ids = task.datasets.train_data.client_ids[:3]
  preprocess = task.train_preprocess_fn_for_seed(None)
  data = [preprocess(task.datasets.train_data.create_tf_dataset_for_client(c))
          for c in client_ids]
  process = registry.build(
      'fedgps', task.model_fn, keras_model_fn=task.keras_model_fn,
      client_learning_rate=0.03, surrogate_samples_per_class=2,
  )
  trainer = client_states.StatefulClientsTrainer(
      process, client_states.InMemoryClientStateStore()
  )
  state = trainer.initialize()
  loss_before = _loss(task, trainer.get_model_weights(state), data)
  # Three rounds: with dropout keyed by the data, two lowered it by 1.1% (a fixed draw now,
  # whatever the threads do), three by 2.6%.
  for t in range(3):
    output = trainer.next(state, client_states.ClientSelection(t, client_ids, data))
    state = output.state
  loss_after = _loss(task, trainer.get_model_weights(state), data)
  assert np.isfinite(output.metrics['client_work']['train']['objective'])
  assert int(state['shared']['num_clients']) == 3
  assert np.asarray(state['shared']['prototype_counts']).sum() > 0
  assert loss_after < 0.98 * loss_before, (loss_before, loss_after)


@pytest.fixture
def run_main(run_program, synthetic_cache_dir, tmp_path):
  """`launch.train` in this process (conftest's `run_program`) on three FedGPS clients of
  40 examples, all in every round; returns (rc, out, err)."""

  def run(*args):
    return run_program(
        train, f'--cache_dir={synthetic_cache_dir}', f'--root_output_dir={tmp_path}',
        '--data_source=synthetic', '--synthetic_train_clients=3',
        '--synthetic_test_clients=2', '--synthetic_examples_per_client=40',
        '--clients_per_round=3', *args)

  return run


def test_launch_train_runs_fedgps_on_emnist(run_main, tmp_path):
  # Every client in both rounds, one epoch each: round 1 trains on the data of round 0.
  rc, out, err = run_main('--task=emnist', '--algo=fedgps', '--total_rounds=2',
                          '--client_batch_size=10', '--client_learning_rate=0.05',
                          '--lambda_g=0.1', '--surrogate_samples_per_class=2')
  assert rc == 0, err
  exp = tmp_path / 'emnist_fedgps_seed0'
  with open(exp / 'metrics.csv', newline='') as f:
    rows = list(csv.DictReader(f))
  assert [int(r['key']) for r in rows] == [0, 1, 2]
  loss = [float(r['client_work/train/loss']) for r in rows[1:]]
  assert all(np.isfinite(loss)) and loss[1] < 0.98 * loss[0], loss
  assert float(rows[1]['client_work/train/global_alignment']) == 0.0  # Round 0.
  assert float(rows[2]['client_work/train/global_alignment']) > 0.0
  assert len(list((exp / 'client_states' / 'clients').iterdir())) == 3
  assert 'round 2/2' in out


def test_launch_train_on_shakespeare_is_one_clear_line(run_main, tmp_path):
  rc, _, err = run_main('--task=shakespeare', '--algo=fedgps')
  assert rc == 2 and 'FedGPS needs an image task' in err
  assert len(err.strip().splitlines()) == 1
  assert not list(tmp_path.iterdir())


# Arguments.


def test_registry_lists_both_variants_with_the_papers_defaults(tff_context):
  del tff_context
  for name in ('fedgps', 'fedgps_cf'):
    spec = registry.get(name)
    assert spec.stateful and spec.needs_keras_model
    assert spec.client_weighting == tff.learning.ClientWeighting.UNIFORM
    assert {k: spec.defaults[k] for k in (
        'client_learning_rate', 'client_momentum', 'server_learning_rate', 'lambda1',
        'lambda2', 'lambda3', 'lambda_g', 'surrogate_samples_per_class')} == dict(
            client_learning_rate=0.01, client_momentum=0.9, server_learning_rate=1.0,
            lambda1=0.1, lambda2=0.2, lambda3=1e-5, lambda_g=0.5,
            surrogate_samples_per_class=100)
  # FedGPS keeps each client's own last update; the CF variant never does.
  assert set(_process('fedgps').initial_client_state()) == {'last_round', 'own_update'}
  assert set(_process('fedgps_cf').initial_client_state()) == {'last_round'}


BAD = [
    ('lambda1', -0.1, r'lambda1 must be >= 0'),
    ('lambda2', float('nan'), r'lambda2 must be >= 0'),
    ('lambda3', -1e-5, r'lambda3 must be >= 0'),
    ('lambda_g', -0.5, r'lambda_g must be >= 0'),
    ('surrogate_samples_per_class', 0, r'surrogate_samples_per_class must be an integer >= 1'),
    ('surrogate_samples_per_class', 2.5, r'surrogate_samples_per_class must be an integer'),
    ('surrogate_seed', -1, r'surrogate_seed must be an integer >= 0'),
    ('client_momentum', 1.0, r'client_momentum must be in \[0, 1\)'),
]


@pytest.mark.parametrize('name, value, message', BAD)
def test_bad_hyperparameters_raise(name, value, message):
  with pytest.raises(ValueError, match=message):
    registry.build('fedgps', _never_called, keras_model_fn=_never_called, **{name: value})


def test_missing_keras_model_and_text_task_are_clear_errors():
  with pytest.raises(ValueError, match='keras_model_fn=task.keras_model_fn'):
    registry.build('fedgps_cf', _never_called)
  with pytest.raises(ValueError, match='FedGPS needs an image task'):
    registry.build('fedgps', _never_called, keras_model_fn=models.shakespeare_gru)
  with pytest.raises(ValueError, match='must end in a Dense classifier'):
    registry.build('fedgps', _never_called, keras_model_fn=lambda: tf.keras.Sequential(
        [tf.keras.layers.InputLayer(input_shape=(8, 8, 1)), tf.keras.layers.Flatten()]))
