"""Tests for the algorithm builders and the registry (specification.md s. 2-4).

Each process is checked against an independent computation: TFF's own
`build_weighted_fed_avg`, or NumPy formulas applied to the aggregated update
that TFF's FedAvg (client SGD, server SGD with rate 1) reports as its weight
change `u = w^t - w^{t+1}`.

Runtime (~4.5 minutes on two CPU cores): building a process and running its
first round costs ~15 s whatever the model, so processes are shared by module
fixtures and only EMNIST runs every algorithm; CIFAR-100 runs FedZMG-Adam and
Shakespeare GC-Fed, which between them put every projected client and server
rule on conv, embedding (IndexedSlices) and GRU tensors.
"""

import collections
import re

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import tff_zmg
from tff_zmg.transforms import projection
from tff_zmg.algorithms import fedrkmgc
from tff_zmg.algorithms import gc_fed
from tff_zmg.algorithms import gcfed
from tff_zmg.algorithms import registry
from tff_zmg.algorithms import rules
from tff_zmg.templates import compose

EXAMPLES = tff.learning.ClientWeighting.NUM_EXAMPLES
UNIFORM = tff.learning.ClientWeighting.UNIFORM

# specification.md section 4: client rule, server rule, weighting.
SPEC_TABLE = {
    'fedavg': ('sgd', 'sgd', EXAMPLES),
    'fedadam': ('sgd', 'adam', EXAMPLES),
    'fedzmg': ('zmg_sgdm', 'sgd', EXAMPLES),
    'fedzmg_adam': ('zmg_sgdm', 'adam', EXAMPLES),
    # Issue 22's baselines and compositions (tests/test_tff_baselines.py checks them).
    'fedyogi': ('sgd', 'yogi', EXAMPLES),
    'fedadagrad': ('sgd', 'adagrad', EXAMPLES),
    'fedzmg_yogi': ('zmg_sgdm', 'yogi', EXAMPLES),
    'fedprox': ('prox_sgd', 'sgd', EXAMPLES),
    'fedzmg_prox': ('prox_zmg_sgdm', 'sgd', EXAMPLES),
    'mime_lite': ('sgdm', 'sgd', EXAMPLES),
    'local_gc': ('local_gc', 'sgd', UNIFORM),
    'global_gc': ('sgd', 'global_gc', UNIFORM),
    'gcfed': ('local_gc', 'global_gc', UNIFORM),
    # Stateful clients (tests/test_fedrkmgc.py checks their math).
    'fedrkmgc': ('corrected_sgdm', 'sgd', UNIFORM),
    'fedrkmgc_raw': ('corrected_sgdm', 'sgd', UNIFORM),
    'fedrkmgc_re': ('corrected_sgdm', 'sgd', UNIFORM),
    'fedrkmgc_km': ('corrected_sgdm', 'sgd', UNIFORM),
    'fedrkmgc_fast_km': ('corrected_sgdm', 'sgd', UNIFORM),
    'fedrkmgc_re_km': ('corrected_sgdm', 'sgd', UNIFORM),
    # Stateful clients, surrogate objective (tests/test_fedgps.py checks them).
    'fedgps': ('fedgps', 'sgd', UNIFORM),
    'fedgps_cf': ('fedgps', 'sgd', UNIFORM),
    # Stateful clients, control variates (tests/test_scaffold.py checks them).
    'scaffold': ('scaffold_sgd', 'sgd', UNIFORM),
    'fedzmg_scaffold': ('scaffold_zmg_sgdm', 'sgd', UNIFORM),
}
STATELESS = [n for n, s in registry.ALGORITHMS.items() if not s.stateful]

# EMNIST CNN trainable tensors: (kernel, bias) x 4 layers, the last one the
# classifier (specification.md section 5). The kernels each layer choice projects:
KERNELS = {
    'all': (True, False) * 4,
    'feature': (True, False) * 3 + (False, False),
    'classifier': (False,) * 6 + (True, False),
}

BATCH_SIZE = 20  # EMNIST's.
CLIENT_LR = 0.1  # Every EMNIST process and the TFF reference use it.
NUM_CLIENTS = 3
WEIGHT_DECAY = 0.5  # Set in one-step tests: large, so its term is visible.


def _np_project(g):
  """specification.md section 1, in float64: centre over all axes but the last."""
  g = np.asarray(g, np.float64)
  return g - g.mean(axis=tuple(range(g.ndim - 1)), keepdims=True)


def _column_means(g):
  return np.asarray(g, np.float64).mean(axis=tuple(range(g.ndim - 1)))


def _weights(process, state):
  return [np.asarray(w) for w in process.get_model_weights(state).trainable]


def _update(before, after):
  """The update the server applied: `w^t - w^{t+1}`, in float64."""
  return [np.float64(b) - np.float64(a) for b, a in zip(before, after)]


def _with_hparams(process, state, **client_hparams):
  """`state` with some client-optimizer hyperparameters replaced."""
  hparams = process.get_hparams(state)
  client = collections.OrderedDict(hparams['client_work'])
  client.update(client_hparams)
  return process.set_hparams(
      state,
      collections.OrderedDict(
          client_work=client, finalizer=hparams['finalizer']
      ),
  )


def _client_datasets(task, preprocess_fn, client_ids):
  return [
      preprocess_fn(task.datasets.train_data.create_tf_dataset_for_client(c))
      for c in client_ids
  ]


def _num_examples(task, client_id):
  dataset = task.datasets.train_data.create_tf_dataset_for_client(client_id)
  return int(dataset.reduce(0, lambda n, _: n + 1))


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


# Shared tasks, data and processes.


@pytest.fixture(scope='module')
def emnist(small_task):
  return small_task('emnist', max_elements=2 * BATCH_SIZE)


@pytest.fixture(scope='module')
def emnist_data(emnist):
  """Up to two local steps per client, no shuffling, unequal example counts."""
  client_ids = emnist.datasets.train_data.client_ids[:NUM_CLIENTS]
  counts = [min(_num_examples(emnist, c), 2 * BATCH_SIZE) for c in client_ids]
  assert len(set(counts)) > 1  # So that example weighting matters.
  return _client_datasets(
      emnist, emnist.train_preprocess_fn_for_seed(None), client_ids
  )


@pytest.fixture(scope='module')
def one_step_preprocess_fn(small_task):
  """Preprocessing to one batch of up to BATCH_SIZE examples: one local step."""
  return small_task(
      'emnist', max_elements=BATCH_SIZE
  ).train_preprocess_fn_for_seed(None)


@pytest.fixture(scope='module')
def one_step_data(emnist, one_step_preprocess_fn):
  """Exactly one local step of BATCH_SIZE examples per client.

  With equal example counts the example-weighted mean is the uniform mean, so
  TFF's weighted FedAvg is a reference for the uniform algorithms too.
  """
  client_ids = [
      c for c in emnist.datasets.train_data.client_ids
      if _num_examples(emnist, c) >= BATCH_SIZE
  ][:NUM_CLIENTS]
  assert len(client_ids) >= 2
  return _client_datasets(emnist, one_step_preprocess_fn, client_ids)


@pytest.fixture(scope='module')
def tff_fed_avg(emnist):
  """TFF's FedAvg: its weight change is the aggregated client SGD update."""
  return tff.learning.algorithms.build_weighted_fed_avg(
      emnist.model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(CLIENT_LR),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0),
  )


@pytest.fixture(scope='module')
def emnist_process(emnist):
  """`emnist_process(name)`: registry algorithm with CLIENT_LR, built once."""
  cache = {}

  def get(name):
    if name not in cache:
      cache[name] = registry.build(
          name, emnist.model_fn, client_learning_rate=CLIENT_LR
      )
    return cache[name]

  return get


def _reference_update(tff_fed_avg, weights, data):
  """The aggregated client SGD update at `weights` (a `ModelWeights`)."""
  state = tff_fed_avg.set_model_weights(tff_fed_avg.initialize(), weights)
  before = _weights(tff_fed_avg, state)
  after = _weights(tff_fed_avg, tff_fed_avg.next(state, data).state)
  return _update(before, after)


# Numerical identities.


def test_fedavg_matches_tff_weighted_fed_avg(
    tff_context, emnist_process, tff_fed_avg, emnist_data
):
  del tff_context
  ours = emnist_process('fedavg')
  state, reference_state = ours.initialize(), tff_fed_avg.initialize()
  for _ in range(2):
    state = ours.next(state, emnist_data).state
    reference_state = tff_fed_avg.next(reference_state, emnist_data).state
  weights, reference = _weights(ours, state), _weights(tff_fed_avg,
                                                       reference_state)
  for w, r in zip(weights, reference):
    np.testing.assert_allclose(w, r, rtol=0, atol=1e-6)
  assert any(np.abs(w - w0).max() > 1e-3 for w, w0 in zip(
      weights, _weights(tff_fed_avg, tff_fed_avg.initialize())))


def test_fedadam_is_numpy_server_adam_on_the_aggregated_update(
    tff_context, emnist_process, tff_fed_avg, emnist_data
):
  del tff_context
  fedadam = emnist_process('fedadam')
  lr, b1, b2, eps = 0.01, 0.9, 0.99, 1e-3  # Registry defaults (spec s. 3).
  assert registry.get('fedadam').defaults['server_learning_rate'] == lr
  state = fedadam.initialize()
  w = [np.float64(x) for x in _weights(fedadam, state)]
  m = [np.zeros_like(x) for x in w]
  v = [np.zeros_like(x) for x in w]
  for _ in range(2):
    u = _reference_update(
        tff_fed_avg, fedadam.get_model_weights(state), emnist_data
    )
    state = fedadam.next(state, emnist_data).state
    for i, u_i in enumerate(u):
      m[i] = b1 * m[i] + (1 - b1) * u_i
      v[i] = b2 * v[i] + (1 - b2) * u_i**2
      w[i] = w[i] - lr * m[i] / (np.sqrt(v[i]) + eps)  # No bias correction.
    for ours, expected in zip(_weights(fedadam, state), w):
      np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-5)
    w = [np.float64(x) for x in _weights(fedadam, state)]


def test_fedzmg_one_step_kernel_updates_have_zero_column_means(
    tff_context, emnist_process, one_step_data
):
  """Without weight decay, one ZMG step gives kernels zero-mean column updates.

  (With decoupled decay the update adds `lr * wd * w`, which is not zero-mean;
  `test_one_local_step_matches_numpy` checks that case.)
  """
  del tff_context
  fedzmg = emnist_process('fedzmg')
  state = _with_hparams(fedzmg, fedzmg.initialize(), weight_decay=0.0)
  w0 = _weights(fedzmg, state)
  u = _update(w0, _weights(fedzmg, fedzmg.next(state, one_step_data).state))
  for i in np.flatnonzero(KERNELS['all']):
    assert np.abs(u[i]).max() > 1e-4
    assert np.abs(_column_means(u[i])).max() < 1e-7
  # Biases are not projected. (The classifier bias's update is zero-mean
  # anyway: softmax cross-entropy gradients sum to zero over the classes.)
  bias_means = [
      abs(u[i].mean()) for i in np.flatnonzero(np.logical_not(KERNELS['all']))
  ]
  assert max(bias_means) > 1e-5, bias_means


def _np_client_update(spec, hparams, u_sgd, w0):
  """NumPy, from specification.md: the aggregated update `u` of one local step per client.

  From `v = 0` one local step of any client rule is `lr * d`, with `d` linear
  in the gradient, so the aggregate of the client updates follows from the
  aggregated SGD update `u_sgd` (equal example counts make the weighted and
  the uniform mean equal).
  """
  lr = hparams['client_learning_rate']
  weight_decay = hparams.get('weight_decay', 0.0)
  client_layers = {  # One step from w^t: the proximal term is still 0.
      'sgd': None,
      'prox_sgd': None,
      'sgdm': None,
      'zmg_sgdm': 'all',
      'prox_zmg_sgdm': 'all',
      'local_gc': hparams.get('local_gc_layers'),
  }[spec.client_rule]
  u = [
      (_np_project(x) if client_layers and KERNELS[client_layers][i] else x)
      + lr * weight_decay * np.float64(w)  # Decoupled or coupled: equal here.
      for i, (x, w) in enumerate(zip(u_sgd, w0))
  ]
  return u


def _np_server_step(spec, hparams, u):
  """NumPy, from specification.md: the first server step on the aggregated update `u`."""
  eta = hparams['server_learning_rate']
  if spec.server_rule == 'sgd':
    return [eta * x for x in u]
  if spec.server_rule == 'adam':  # The first step, from m = v = 0.
    b1, b2, eps = (
        hparams[k] for k in ('adam_beta_1', 'adam_beta_2', 'adam_epsilon')
    )
    return [eta * (1 - b1) * x / (np.sqrt((1 - b2) * x**2) + eps) for x in u]
  if spec.server_rule == 'yogi':  # The first, bias-corrected step from m = 0, v = v0.
    b1, b2, eps, v0 = (hparams[k] for k in (
        'yogi_beta_1', 'yogi_beta_2', 'yogi_epsilon', 'yogi_initial_accumulator'))
    rate = eta * np.sqrt(1 - b2) / (1 - b1)
    return [rate * (1 - b1) * x / (np.sqrt(v0 + (1 - b2) * np.sign(x**2 - v0) * x**2) + eps)
            for x in u]
  if spec.server_rule == 'adagrad':  # The first step from v = v0.
    eps, v0 = hparams['adagrad_epsilon'], hparams['adagrad_initial_accumulator']
    return [eta * x / np.sqrt(v0 + x**2 + eps) for x in u]
  assert spec.server_rule == 'global_gc'
  mask = KERNELS[hparams['global_gc_layers']]
  return [eta * (_np_project(x) if mask[i] else x) for i, x in enumerate(u)]


def _one_step(process, tff_fed_avg, one_step_data, weight_decay):
  """One round of one local step: (w0, server step, aggregated SGD update)."""
  state = process.initialize()
  if weight_decay is not None:
    state = _with_hparams(process, state, weight_decay=weight_decay)
  w0 = _weights(process, state)
  after = _weights(process, process.next(state, one_step_data).state)
  u_sgd = _reference_update(
      tff_fed_avg, process.get_model_weights(state), one_step_data
  )
  return w0, _update(w0, after), u_sgd


# Stateful algorithms take client states in `next`; their own files check their math.
@pytest.mark.parametrize('name', STATELESS)
def test_one_local_step_matches_numpy(
    tff_context, emnist_process, tff_fed_avg, one_step_data, name
):
  del tff_context
  spec = registry.get(name)
  hparams = {**spec.defaults, 'client_learning_rate': CLIENT_LR}
  weight_decay = None
  if hparams.get('weight_decay'):  # Built with a decay: a hyperparameter of its state.
    weight_decay = hparams['weight_decay'] = WEIGHT_DECAY
  w0, step, u_sgd = _one_step(
      emnist_process(name), tff_fed_avg, one_step_data, weight_decay
  )
  u = _np_client_update(spec, hparams, u_sgd, w0)
  expected = _np_server_step(spec, hparams, u)
  for i, (ours, theirs) in enumerate(zip(step, expected)):
    if spec.server_rule == 'yogi':
      # Yogi's sign(u^2 - v0) jumps where u^2 = v0: float32 and float64 may take
      # either side there, so those few entries are left out.
      away = ~np.isclose(u[i] ** 2, hparams['yogi_initial_accumulator'], rtol=0.05)
      assert away.mean() > 0.9
      ours, theirs = ours[away], theirs[away]
    np.testing.assert_allclose(
        ours, theirs, rtol=0, atol=1e-6, err_msg=f'tensor {i}'
    )


def test_gcfed_server_step_projects_exactly_the_classifier_kernels(
    tff_context, emnist_process, tff_fed_avg, one_step_data
):
  """GC-Fed's server step is `eta_g * M_c(P(u))`, `u` the mean client update.

  After one local step `u = M_f(P(u_sgd)) + lr * wd * w0` (feature kernels
  projected, coupled L2). The large weight decay makes every kernel's `u`
  visibly non-zero-mean, so projecting a feature kernel on the server, or not
  projecting the classifier kernel, would be caught.
  """
  del tff_context
  w0, step, u_sgd = _one_step(
      emnist_process('gcfed'), tff_fed_avg, one_step_data, WEIGHT_DECAY
  )
  eta_g = registry.get('gcfed').defaults['server_learning_rate']
  for i, w in enumerate(w0):
    u = _np_project(u_sgd[i]) if KERNELS['feature'][i] else u_sgd[i]
    u = u + CLIENT_LR * WEIGHT_DECAY * np.float64(w)
    expected = eta_g * (_np_project(u) if KERNELS['classifier'][i] else u)
    np.testing.assert_allclose(step[i], expected, rtol=0, atol=1e-6)
    if KERNELS['all'][i]:  # Projected and not differ by over 10 x atol.
      assert eta_g * np.abs(_np_project(u) - u).max() > 1e-5


def test_uniform_weighting_averages_clients_equally(
    tff_context, emnist, emnist_process, tff_fed_avg, one_step_preprocess_fn
):
  """GlobalGC, one local step on clients of unequal size: P(mean_k u_k), each client's
  `u_k` its SGD update plus the coupled decay `lr * wd * w0`."""
  del tff_context
  client_ids = emnist.datasets.train_data.client_ids[:NUM_CLIENTS]
  data = _client_datasets(emnist, one_step_preprocess_fn, client_ids)
  counts = [min(_num_examples(emnist, c), BATCH_SIZE) for c in client_ids]
  assert len(set(counts)) > 1
  process = emnist_process('global_gc')
  state = process.initialize()
  weights = process.get_model_weights(state)
  w0 = _weights(process, state)
  step = _update(w0, _weights(process, process.next(state, data).state))
  per_client = [_reference_update(tff_fed_avg, weights, [d]) for d in data]
  eta_g, weight_decay = (registry.get('global_gc').defaults[k]
                         for k in ('server_learning_rate', 'weight_decay'))
  for i, is_kernel in enumerate(KERNELS['all']):
    u = (np.mean([u_k[i] for u_k in per_client], axis=0)
         + CLIENT_LR * weight_decay * np.float64(w0[i]))
    expected = eta_g * (_np_project(u) if is_kernel else u)
    np.testing.assert_allclose(step[i], expected, rtol=0, atol=1e-6)


# Every algorithm trains.

EMNIST_RUNS = [('emnist', name) for name in STATELESS]
# One process each (~30-50 s apiece): together every projected rule on conv,
# embedding (IndexedSlices) and GRU tensors.
OTHER_RUNS = [('cifar100', 'fedzmg_adam'), ('shakespeare', 'gcfed')]
# Settings under which two rounds lower the training loss by several percent
# on the synthetic data (the synthetic CIFAR-100 is hard: it needs 3 epochs).
OTHER_TASK_SETTINGS = {
    'cifar100': (dict(num_epochs=3), 0.05),  # Task arguments, client rate.
    'shakespeare': (dict(), 0.05),
}


@pytest.mark.parametrize('task_name, name', EMNIST_RUNS + OTHER_RUNS)
def test_two_rounds_lower_the_training_loss(
    tff_context, small_task, emnist, emnist_process, emnist_data, task_name,
    name
):
  del tff_context
  if task_name == 'emnist':
    task, data, process = emnist, emnist_data, emnist_process(name)
  else:
    task_args, client_learning_rate = OTHER_TASK_SETTINGS[task_name]
    task = small_task(task_name, **task_args)
    client_ids = task.datasets.train_data.client_ids[:NUM_CLIENTS]
    data = _client_datasets(
        task, task.train_preprocess_fn_for_seed(None), client_ids
    )
    if task_name == 'shakespeare':  # The paper's 4M-parameter GRU: 4 batches a client.
      data = [dataset.take(4) for dataset in data]
    process = registry.build(
        name, task.model_fn, client_learning_rate=client_learning_rate
    )
  state = process.initialize()
  loss_before = _loss(task, process.get_model_weights(state), data)
  for _ in range(2):
    output = process.next(state, data)
    state = output.state
  loss_after = _loss(task, process.get_model_weights(state), data)
  assert np.isfinite(output.metrics['client_work']['train']['loss'])
  assert loss_after < 0.98 * loss_before, (loss_before, loss_after)


@pytest.mark.parametrize('center_vectors', [False, True])
@pytest.mark.parametrize('layers', ['all', 'feature', 'classifier'])
def test_masks_select_the_kernels_of_their_layers(emnist, layers, center_vectors):
  """The masks the rules project with: `center_vectors` adds those layers' biases."""
  variables = compose.trainable_variables(emnist.model_fn)
  expected = KERNELS[layers]
  if center_vectors:  # Each selected kernel's bias follows it.
    expected = tuple(expected[i - i % 2] for i in range(len(expected)))
  assert projection.projection_mask(variables, layers, None, center_vectors) == expected


def test_center_vectors_centres_every_bias_update_too(
    tff_context, emnist, one_step_data
):
  """FedZMG with `center_vectors`, no decay: one step gives every tensor's update zero
  column means, biases included (without it they are not: see the test above it)."""
  del tff_context
  process = registry.build(
      'fedzmg', emnist.model_fn, client_learning_rate=CLIENT_LR, weight_decay=0.0,
      center_vectors=True,
  )
  state = process.initialize()
  w0 = _weights(process, state)
  u = _update(w0, _weights(process, process.next(state, one_step_data).state))
  for i, u_i in enumerate(u):
    assert np.abs(u_i).max() > 1e-5, i
    assert np.abs(_column_means(u_i) if u_i.ndim > 1 else u_i.mean()).max() < 1e-7, i


# The registry.


def _never_called():
  raise AssertionError('model_fn must not be called before validation')


def test_registry_is_the_spec_table():
  assert set(registry.ALGORITHMS) == set(SPEC_TABLE)
  for name, (client_rule, server_rule, weighting) in SPEC_TABLE.items():
    spec = registry.get(name)
    assert spec.name == name
    assert (spec.client_rule, spec.server_rule, spec.client_weighting) == (
        client_rule, server_rule, weighting)
    assert spec.description and '\n' not in spec.description


def test_defaults_follow_the_spec_and_papers():
  defaults = {n: s.defaults for n, s in registry.ALGORITHMS.items()}
  for name in ('fedzmg', 'fedzmg_adam'):  # specification.md section 2.
    assert defaults[name]['client_momentum'] == 0.9
    assert defaults[name]['weight_decay'] == 1e-4
  for name in ('fedadam', 'fedzmg_adam'):  # Section 3.
    assert (defaults[name]['adam_beta_1'], defaults[name]['adam_beta_2'],
            defaults[name]['adam_epsilon'],
            defaults[name]['adam_bias_correction']) == (0.9, 0.99, 1e-3, False)
  for name in ('local_gc', 'global_gc', 'gcfed'):  # GC-Fed, section 4.1.
    assert defaults[name]['client_learning_rate'] == 0.01
    assert defaults[name]['client_momentum'] == 0.9
    assert defaults[name]['server_learning_rate'] == 1.0
  assert defaults['local_gc']['weight_decay'] == 1e-5
  assert defaults['gcfed']['weight_decay'] == 1e-5
  assert defaults['local_gc']['local_gc_layers'] == 'all'
  assert defaults['global_gc']['global_gc_layers'] == 'all'
  assert (defaults['gcfed']['local_gc_layers'],
          defaults['gcfed']['global_gc_layers']) == ('feature', 'classifier')
  assert defaults['fedavg']['server_learning_rate'] == 1.0
  assert defaults['global_gc']['weight_decay'] == 1e-5  # GC-Fed, section 4.1, every method.
  # The original FedAvg's client SGD (the FedZMG paper's baselines', section 5.2.2): no
  # momentum, no decay; a paper's protocol sets its own.
  for name in ('fedavg', 'fedadam', 'fedyogi', 'fedadagrad', 'fedprox'):
    assert (defaults[name]['client_momentum'], defaults[name]['weight_decay']) == (0, 0)
  # Reddi et al. 2021: b1 = 0.9, b2 = 0.99, tau = 1e-3, v_{-1} = tau^2.
  for name in ('fedyogi', 'fedzmg_yogi'):
    assert (defaults[name]['yogi_beta_1'], defaults[name]['yogi_beta_2'],
            defaults[name]['yogi_epsilon'],
            defaults[name]['yogi_initial_accumulator']) == (0.9, 0.99, 1e-3, 1e-6)
  assert (defaults['fedadagrad']['adagrad_epsilon'],
          defaults['fedadagrad']['adagrad_initial_accumulator']) == (1e-6, 1e-6)
  assert defaults['fedprox']['proximal_strength'] in (0.001, 0.01, 0.1, 1.0)  # Its grid.
  assert defaults['mime_lite']['client_momentum'] == 0.9


def test_builders_and_their_modules_are_spelt_after_algo_names():
  """One spelling: `build_` + an `--algo` name, in the module of its family's first name."""
  for name, spec in registry.ALGORITHMS.items():
    builder = getattr(spec.builder, 'func', spec.builder)  # An ablation: a partial.
    assert builder.__name__.removeprefix('build_') in registry.ALGORITHMS, name
    assert builder.__module__.split('.')[-1] in registry.ALGORITHMS, name
    assert getattr(tff_zmg, builder.__name__) is builder, name


def test_deprecated_names_still_work(monkeypatch):
  """`gc_fed` (now `gcfed`) and `build_fed_rkmgc(correction=)` (now `build_fedrkmgc(
  correction_update=)`) stay importable for a while."""
  for name in ('build_gcfed', 'build_local_gc', 'build_global_gc', 'GcFedHparams',
               'LocalGcHparams', 'GlobalGcHparams', 'local_gc', 'global_gc'):
    assert getattr(gc_fed, name) is getattr(gcfed, name), name
  calls = []
  monkeypatch.setattr(fedrkmgc, 'build_fedrkmgc', lambda *a, **k: calls.append((a, k)))
  tff_zmg.build_fed_rkmgc(_never_called, correction='km', rho=1.0)
  tff_zmg.build_fed_rkmgc(_never_called)
  assert calls == [((_never_called, None), dict(correction_update='km', rho=1.0)),
                   ((_never_called, None), dict(correction_update='fast_km'))]


def test_unknown_algorithm_raises_listing_the_valid_names():
  with pytest.raises(ValueError, match=r"'fedsgd'.*fedavg.*gcfed"):
    registry.get('fedsgd')
  with pytest.raises(ValueError, match='fedsgd'):
    registry.build('fedsgd', _never_called)


def test_registry_build_rejects_unknown_hyperparameters():
  with pytest.raises(ValueError, match=r"\['client_momentum'\].*'scaffold'"):
    registry.build('scaffold', _never_called, client_momentum=0.9)
  with pytest.raises(ValueError, match='learning_rate'):
    registry.build('gcfed', _never_called, learning_rate=0.1)


BAD_HYPERPARAMETERS = [
    ('fedavg', 'client_learning_rate', 0.0, r'> 0'),
    ('fedavg', 'server_learning_rate', -1.0, r'> 0'),
    ('fedadam', 'adam_beta_1', 1.0, r'\[0, 1\)'),
    ('fedadam', 'adam_beta_2', -0.1, r'\[0, 1\)'),
    ('fedadam', 'adam_epsilon', 0.0, r'> 0'),
    ('fedadam', 'adam_bias_correction', 'yes', r'bool'),
    ('fedzmg', 'client_momentum', 1.0, r'\[0, 1\)'),
    ('fedzmg', 'weight_decay', -1e-4, r'>= 0'),
    ('fedzmg_adam', 'client_momentum', -0.5, r'\[0, 1\)'),
    ('local_gc', 'gc_lambda', 1.5, r'\[0, 1\]'),
    ('local_gc', 'local_gc_layers', 'classifier', r"\['all', 'feature'\]"),
    ('global_gc', 'global_gc_layers', 'feature', r"\['classifier', 'all'\]"),
    ('global_gc', 'center_vectors', 1, r'bool'),
    ('gcfed', 'gc_lambda', -0.1, r'\[0, 1\]'),
    ('gcfed', 'client_learning_rate', float('nan'), r'> 0'),
    ('fedprox', 'proximal_strength', -0.01, r'>= 0'),
    ('fedzmg_prox', 'proximal_strength', float('inf'), r'>= 0'),
    ('fedyogi', 'yogi_epsilon', 0.0, r'> 0'),
    ('fedzmg_yogi', 'yogi_beta_2', 1.0, r'\[0, 1\)'),
    ('fedyogi', 'yogi_initial_accumulator', -1e-6, r'>= 0'),
    ('fedadagrad', 'adagrad_epsilon', -1e-6, r'> 0'),
    ('fedadagrad', 'adagrad_initial_accumulator', -1.0, r'>= 0'),
    ('mime_lite', 'client_momentum', 1.0, r'\[0, 1\)'),
]


@pytest.mark.parametrize('name, parameter, value, valid', BAD_HYPERPARAMETERS)
def test_bad_hyperparameters_raise_naming_parameter_value_and_range(
    name, parameter, value, valid
):
  with pytest.raises(ValueError) as error:
    registry.build(name, _never_called, **{parameter: value})
  message = str(error.value)
  assert message.startswith(f'{parameter} must'), message
  assert re.search(valid, message), message
  assert message.endswith(f'got {value!r}'), message


@pytest.mark.parametrize('client_rule, server_rule, bad', [
    ('adam', 'sgd', "client_rule.*'adam'"),
    ('sgd', 'zmg_sgdm', "server_rule.*'zmg_sgdm'"),
])
def test_unknown_rule_names_raise(client_rule, server_rule, bad):
  with pytest.raises(ValueError, match=bad):
    rules.build_process(
        _never_called, client_rule, server_rule, client_weighting=UNIFORM,
        client_learning_rate=0.1, server_learning_rate=1.0)


def test_build_process_rejects_hyperparameters_neither_rule_takes():
  with pytest.raises(ValueError, match=r"\['weight_decay'\].*'sgdm'"):
    rules.build_process(
        _never_called, 'sgdm', 'adam', client_weighting=EXAMPLES,
        client_learning_rate=0.1, server_learning_rate=0.01,
        weight_decay=1e-4)


def test_a_rule_pair_is_an_algorithm_with_each_rules_hyperparameters():
  """'<client rule>+<server rule>' names the pair as an algorithm (what --client_rule and
  --server_rule train): the client rule's learning rate and hyperparameters at its
  family's defaults, the server rule's at its, a shared one the client rule's (as
  `build_process`), examples weighting."""
  for client_rule, client in rules.CLIENT_RULES.items():
    for server_rule, server in rules.SERVER_RULES.items():
      spec = registry.get(registry.pair_name(client_rule, server_rule))
      assert (spec.name, spec.client_rule, spec.server_rule, spec.client_weighting) == (
          f'{client_rule}+{server_rule}', client_rule, server_rule, EXAMPLES)
      client_defaults = client.hparams_class().as_dict()
      server_defaults = server.hparams_class().as_dict()
      assert dict(spec.defaults) == {
          'client_learning_rate': client_defaults['client_learning_rate'],
          'server_learning_rate': server_defaults['server_learning_rate'],
          **server.hparams, **client.hparams}
      assert (spec.hparams_class.DECOUPLED_WEIGHT_DECAY
              == client.hparams_class.DECOUPLED_WEIGHT_DECAY)
  assert registry.get('zmg_sgdm+adam').defaults['server_learning_rate'] == 0.01  # FedAdam's.
  with pytest.raises(ValueError, match='client_momentum must be in'):
    registry.get('sgd+adam').hparams(client_momentum=1.5)
  with pytest.raises(ValueError, match="server_rule must be one of .*got 'zmg_sgdm'"):
    registry.get('sgd+zmg_sgdm')


def test_a_rule_pair_trains_as_the_named_algorithm_of_its_rules(
    tff_context, emnist_process, emnist_data):
  """`zmg_sgdm+sgd` is FedZMG's pairing (specification.md section 4): two rounds give
  FedZMG's weights bit for bit."""
  del tff_context
  pair, named = emnist_process('zmg_sgdm+sgd'), emnist_process('fedzmg')
  pair_state, named_state = pair.initialize(), named.initialize()
  for _ in range(2):
    pair_state = pair.next(pair_state, emnist_data).state
    named_state = named.next(named_state, emnist_data).state
  for a, b in zip(_weights(pair, pair_state), _weights(named, named_state), strict=True):
    np.testing.assert_array_equal(a, b)


def test_every_rule_pair_validates_with_its_own_hyperparameters():
  """Any client rule composes with any server rule (checked up to the model)."""
  for client_rule, client in rules.CLIENT_RULES.items():
    for server_rule, server in rules.SERVER_RULES.items():
      with pytest.raises(AssertionError, match='must not be called'):
        rules.build_process(
            _never_called, client_rule, server_rule, client_weighting=UNIFORM,
            client_learning_rate=0.1, server_learning_rate=1.0,
            **{**client.hparams, **server.hparams})
