"""The aggregators (DP, compression, robust) with every algorithm, epsilon, and the bytes.

docs/privacy_and_communication.md. Each behaviour is checked against a value computed here:
the DP round on a softmax regression against the clipped, noised mean by hand (the noise
redrawn from the seed as `seeded_noise` documents, and its scale measured over a thousand
coordinates), the adaptive clip against its geometric update by hand; epsilon against
`dp_accounting` driven here and, when every client takes part, against the Gaussian
mechanism's RDP by hand; the bytes against the parameter count of the EMNIST CNN
(specification.md section 5: 1,690,046) and the quantizer's bit packing.

Runtime (~2 minutes on two cores): a build costs ~2 s and a round's MapReduceForm ~5 s,
so each algorithm is built with one aggregator kind, the kinds taken in turn (every builder
passes any factory the same way, and each kind is built with example-weighted, uniform and
stateful algorithms), and the refusals, which come before any model is built, for all.
"""

import asyncio
import collections
import itertools
import json
import math
import os
import warnings

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import tff_zmg
from tff_zmg import aggregation
from tff_zmg.algorithms import registry
from tff_zmg.runtime import forms
from tff_zmg.templates import compose
import tiny_models

EMNIST_PARAMETERS = 1_690_046  # specification.md section 5.
FLOAT32 = 4  # Bytes.
NON_MEAN_KINDS = tuple(k for k in aggregation.KINDS if k != 'mean')
# What each refusing algorithm's clients upload besides their update, as the refusal says.
REFUSED = {
    'mime_lite': 'full-batch gradients',
    'scaffold': 'control-variate deltas',
    'fedzmg_scaffold': 'control-variate deltas',
    'fedgps': 'surrogate prototypes',
    'fedgps_cf': 'surrogate prototypes',
}
BUILT = [name for name in registry.NAMES if name not in REFUSED]
# Each built algorithm with one kind, in turn: every kind meets example-weighted, uniform
# and stateful algorithms.
BUILT_WITH = list(zip(BUILT, itertools.cycle(NON_MEAN_KINDS)))


def _settings(kind, **values):
  values.setdefault('clients_per_round', 10)
  return aggregation.AggregatorSettings(kind=kind, **values)


# The settings: each bad value ends in one line.


@pytest.mark.parametrize('values, message', [
    (dict(noise_multiplier=-1.0), 'noise_multiplier must be in [0, 1e+06], got -1.0'),
    (dict(clip=0.0), 'clip must be > 0, got 0.0'),
    (dict(clip=-0.5), 'clip must be > 0, got -0.5'),
    (dict(target_delta=0.0), 'target_delta must be in (0, 1), got 0.0'),
    (dict(target_delta=1.0), 'target_delta must be in (0, 1), got 1.0'),
    (dict(target_delta=1.5), 'target_delta must be in (0, 1), got 1.5'),
    (dict(kind='private'), "kind must be one of ['mean', 'dp_fixed', 'dp_adaptive',"
                           " 'compressed', 'robust'], got 'private'"),
    (dict(compression_bits=17), 'compression_bits must be an integer in [1, 16], got 17'),
    (dict(clients_per_round=0), 'clients_per_round must be an integer >= 1, got 0'),
    (dict(kind='dp_fixed', clients_per_round=None), 'aggregator dp_fixed needs'
                                                     ' clients_per_round'),
    (dict(kind='dp_adaptive', clients_per_round=10), 'dp_adaptive with noise_multiplier=1'
                                                     ' needs clients_per_round > 10'),
])
def test_a_bad_setting_ends_in_one_line(values, message):
  with pytest.raises(ValueError) as raised:
    aggregation.AggregatorSettings(**values)
  assert message in str(raised.value)
  assert '\n' not in str(raised.value)


def test_each_kind_reads_its_fields_and_says_which():
  assert sorted(aggregation.READS) == sorted(aggregation.KINDS)
  fields = set(aggregation.AggregatorSettings.names()) - {'kind'}
  assert set().union(*aggregation.READS.values()) == fields  # Each field is read by a kind.
  assert aggregation.AggregatorSettings(clip=0.5).used() == {'kind': 'mean'}
  assert _settings('compressed', compression_bits=4).used() == {
      'kind': 'compressed', 'compression_bits': 4, 'compression_threshold': 20000}
  assert _settings('dp_fixed', clip=0.5, noise_seed=3, compression_bits=4).used() == {
      'kind': 'dp_fixed', 'noise_multiplier': 1.0, 'clip': 0.5, 'target_delta': 1e-5,
      'clients_per_round': 10, 'noise_seed': 3}


def test_mean_leaves_the_algorithm_its_own_mean():
  for weighting in tff.learning.ClientWeighting:
    assert aggregation.model_aggregator(aggregation.AggregatorSettings(), weighting) is None


def test_dp_averages_uniformly_and_says_so():
  examples = tff.learning.ClientWeighting.NUM_EXAMPLES
  with pytest.warns(UserWarning, match=r'averages client updates uniformly'):
    factory = aggregation.model_aggregator(_settings('dp_fixed'), examples)
  assert isinstance(factory, tff.aggregators.UnweightedAggregationFactory)
  assert aggregation.client_weighting(_settings('dp_adaptive', clients_per_round=11),
                                      examples) == tff.learning.ClientWeighting.UNIFORM
  assert aggregation.client_weighting(_settings('robust'), examples) == examples


# Every registry algorithm with every aggregator, or a one-line refusal.


@pytest.mark.parametrize('name', sorted(REFUSED))
@pytest.mark.parametrize('kind', NON_MEAN_KINDS)
def test_an_algorithm_that_uploads_more_than_its_update_refuses_in_one_line(name, kind):
  settings = _settings(kind, clients_per_round=11)
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')  # DP's uniform weighting: said for mime_lite.
    with pytest.raises(ValueError) as raised:
      registry.build(
          name, tiny_models.softmax_regression_model_fn(3, 2), num_clients=3,
          keras_model_fn=lambda: None, aggregator=settings,
      )
  message = str(raised.value)
  assert '\n' not in message
  assert f'{name} takes no model_aggregator' in message and REFUSED[name] in message


@pytest.mark.parametrize('kind', aggregation.KINDS)
def test_check_aggregator_refuses_as_build_does_without_a_model(kind):
  settings = _settings(kind, clients_per_round=11)
  for name in registry.NAMES:
    if name in REFUSED and kind != 'mean':
      with pytest.raises(ValueError, match=f'^{name} takes no model_aggregator: .*'
                                            f'{REFUSED[name]}'):
        registry.check_aggregator(name, settings)
    else:
      registry.check_aggregator(name, settings)  # Accepted: no error.


@pytest.mark.parametrize('name, kind', BUILT_WITH)
def test_an_algorithm_aggregates_its_updates_with_the_aggregator_asked(name, kind):
  """The process's aggregator state is the one the kind's factory makes (each kind's has
  its own type: DP's query state and seed, the encoder's, the zeroing norms')."""
  model_fn = tiny_models.softmax_regression_model_fn(3, 2)
  settings = _settings(kind, clients_per_round=11)
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    process = registry.build(name, model_fn, num_clients=3, aggregator=settings)
    factory = aggregation.model_aggregator(settings, registry.get(name).client_weighting)
  trainable = tff.learning.models.weights_type_from_model(model_fn).trainable
  expected = compose.weighted_factory(tff.learning.ClientWeighting.UNIFORM, factory).create(
      trainable, tff.TensorType(np.float32)
  ).initialize.type_signature.result.member
  actual = process.initialize.type_signature.result.member['aggregator']
  assert actual.is_equivalent_to(expected), (actual, expected)
  assert actual.is_equivalent_to(
      compose.weighted_factory(tff.learning.ClientWeighting.UNIFORM).create(
          trainable, tff.TensorType(np.float32)
      ).initialize.type_signature.result.member
  ) is False  # Not the mean's.


def test_every_registry_algorithm_is_built_or_refused():
  assert sorted(BUILT + list(REFUSED)) == sorted(registry.NAMES)
  assert {kind for _, kind in BUILT_WITH} == set(NON_MEAN_KINDS)


# DP on a softmax regression, by hand.

FEATURES, CLASSES = 3, 2
CLIENT_LR = 0.5
SERVER_LR = 1.0


def _client_batches(num_clients, features, classes, seed=0):
  """Each client's data as one batch: its round is one SGD step, `u_k = eta_l g_k(w0)`."""
  rng = np.random.default_rng(seed)
  data = []
  for k in range(num_clients):
    n = 4 + 2 * k
    x = (rng.normal(size=(n, features)) * (1 + k)).astype(np.float32)
    data.append((x, rng.integers(0, classes, n).astype(np.int32)))
  return data


def _datasets(data):
  return [
      tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y)).batch(len(y))
      for x, y in data
  ]


def _initial_weights(features, classes, seed=1):
  rng = np.random.default_rng(seed)
  return [rng.normal(size=(features, classes)).astype(np.float32),
          rng.normal(size=(classes,)).astype(np.float32)]


def _np_updates(w0, data):
  return [[CLIENT_LR * g for g in tiny_models.np_softmax_regression_gradient(w0, x, y)]
          for x, y in data]


def _norm(update):
  return math.sqrt(sum(float(np.sum(np.square(t))) for t in update))


def _np_clipped_sum(updates, clip):
  """`sum_k u_k min(1, C / ||u_k||)`, the norm global over the update's tensors."""
  return [sum(u[j] * min(1.0, clip / _norm(u)) for u in updates) for j in range(2)]


def _np_noise(noise_seed, shapes, stddev, round_index=0):
  """The noise `seeded_noise` documents: `s_0 = split((seed, 0), 2)[0]`, then per round
  `k_0..k_{n-1}, s_{t+1} = split(s_t, n + 1)` and tensor j's noise `N(0, stddev^2)` from k_j."""
  seed = tf.random.experimental.stateless_split(tf.constant([noise_seed, 0], tf.int64), 2)[0]
  for _ in range(round_index + 1):
    keys = tf.random.experimental.stateless_split(seed, len(shapes) + 1)
    seed = keys[-1]
  return [tf.random.stateless_normal(shape, keys[j], stddev=stddev).numpy()
          for j, shape in enumerate(shapes)]


def _run_round(process, w0, datasets, state=None):
  if state is None:
    state = process.initialize()
    state = process.set_model_weights(
        state, tff.learning.models.ModelWeights(trainable=w0, non_trainable=[])
    )
  state, metrics = process.next(state, datasets)
  return state, metrics, [np.asarray(w) for w in process.get_model_weights(state).trainable]


def _dp_fedavg(settings):
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')  # FedAvg averages uniformly under DP.
    return registry.build(
        'fedavg', tiny_models.softmax_regression_model_fn(FEATURES, CLASSES),
        client_learning_rate=CLIENT_LR, server_learning_rate=SERVER_LR, aggregator=settings,
    )


def test_dp_fixed_clips_each_update_and_adds_the_seeded_noise(tff_context):
  del tff_context
  data = _client_batches(3, FEATURES, CLASSES)
  w0 = _initial_weights(FEATURES, CLASSES)
  updates = _np_updates(w0, data)
  norms = sorted(_norm(u) for u in updates)
  clip = (norms[0] + norms[1]) / 2  # One update kept, two clipped.
  settings = _settings('dp_fixed', noise_multiplier=0.7, clip=clip, clients_per_round=3,
                       noise_seed=5)
  _, _, weights = _run_round(_dp_fedavg(settings), w0, _datasets(data))
  noise = _np_noise(5, [t.shape for t in w0], 0.7 * clip)
  expected = [w - SERVER_LR * (s + n) / 3
              for w, s, n in zip(w0, _np_clipped_sum(updates, clip), noise)]
  for actual, wanted in zip(weights, expected):
    np.testing.assert_allclose(actual, wanted, rtol=1e-5, atol=1e-6)


def test_dp_noise_has_stddev_z_clip_over_m(tff_context):
  """Over the 1,010 coordinates of a 100 x 10 softmax regression: (noised - clipped mean)
  m / (z C) has mean 0 and stddev 1."""
  del tff_context
  features, classes, clients = 100, 10, 2
  data = _client_batches(clients, features, classes)
  w0 = _initial_weights(features, classes)
  updates = _np_updates(w0, data)
  clip = min(_norm(u) for u in updates) / 2  # Every update clipped.
  z = 2.0
  settings = _settings('dp_fixed', noise_multiplier=z, clip=clip, clients_per_round=clients,
                       noise_seed=11)
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    process = registry.build(
        'fedavg', tiny_models.softmax_regression_model_fn(features, classes),
        client_learning_rate=CLIENT_LR, server_learning_rate=SERVER_LR, aggregator=settings,
    )
  _, _, weights = _run_round(process, w0, _datasets(data))
  clipped_mean = [s / clients for s in _np_clipped_sum(updates, clip)]
  noise = np.concatenate([
      ((w - SERVER_LR * c) - w_new).ravel() / SERVER_LR
      for w, c, w_new in zip(w0, clipped_mean, weights)
  ])
  standardized = noise * clients / (z * clip)
  assert standardized.size == features * classes + classes
  assert abs(standardized.mean()) < 4 / math.sqrt(standardized.size)
  assert abs(standardized.std() - 1.0) < 0.1


@pytest.mark.parametrize('kind', aggregation.DP_KINDS)
def test_a_resumed_dp_run_redraws_the_same_noise(tff_context, tmp_path, kind):
  """Round 2 in a new process from round 1's checkpoint (TFF's file program state manager,
  the runs' checkpoints) equals round 2 of the run that went on: the seed is in the state."""
  del tff_context
  data = _datasets(_client_batches(3, FEATURES, CLASSES))
  w0 = _initial_weights(FEATURES, CLASSES)
  settings = _settings(kind, noise_multiplier=0.2, clip=0.05, clients_per_round=3)
  process = _dp_fedavg(settings)
  state_1, _, weights_1 = _run_round(process, w0, data)
  state_2, _, weights_2 = _run_round(process, w0, data, state_1)
  checkpoints = tff.program.FileProgramStateManager(str(tmp_path))
  asyncio.run(checkpoints.save(state_1, 1))
  resumed_process = _dp_fedavg(settings)
  checkpoint = asyncio.run(checkpoints.load(1, resumed_process.initialize()))
  resumed_state, _, resumed = _run_round(resumed_process, w0, data, checkpoint)
  for a, b in zip(weights_2, resumed):
    np.testing.assert_array_equal(a, b)
  aggregator_states = [tf.nest.flatten(s.aggregator) for s in (state_2, resumed_state)]
  assert len(aggregator_states[0]) == len(aggregator_states[1])
  for a, b in zip(*aggregator_states):
    np.testing.assert_array_equal(a, b)
  # And the seed moved on: round 2 drew other noise than round 1 (same data, clip).
  assert not np.array_equal(weights_2[0] - weights_1[0], weights_1[0] - w0[0])


def test_dp_adaptive_clip_follows_the_target_quantile(tff_context):
  """No noise: the round's update is the mean clipped at C_0, and the next clip is
  `C_0 exp(-rate (fraction of norms <= C_0 - target quantile))` (geometric update)."""
  del tff_context
  data = _client_batches(3, FEATURES, CLASSES)
  w0 = _initial_weights(FEATURES, CLASSES)
  updates = _np_updates(w0, data)
  norms = sorted(_norm(u) for u in updates)
  clip = (norms[0] + norms[1]) / 2  # One of three unclipped.
  settings = _settings('dp_adaptive', noise_multiplier=0.0, clip=clip, clients_per_round=3,
                       target_unclipped_quantile=0.5, clip_learning_rate=0.2)
  _, metrics, weights = _run_round(_dp_fedavg(settings), w0, _datasets(data))
  expected = [w - SERVER_LR * s / 3 for w, s in zip(w0, _np_clipped_sum(updates, clip))]
  for actual, wanted in zip(weights, expected):
    np.testing.assert_allclose(actual, wanted, rtol=1e-5, atol=1e-6)
  next_clip = clip * math.exp(-0.2 * (1 / 3 - 0.5))
  assert metrics['aggregator']['dp_query_metrics']['clip'] == pytest.approx(next_clip, 1e-5)


# Epsilon, against dp_accounting driven here.


def _dp_accounting_epsilon(z, m, n_clients, rounds, delta, sampling):
  if sampling == 'poisson':
    accountant = dp_accounting.rdp.RdpAccountant()
    event = dp_accounting.PoissonSampledDpEvent(m / n_clients, dp_accounting.GaussianDpEvent(z))
  else:  # Replace-one: the clipped sum moves by up to 2C, the multiplier per unit is z / 2.
    accountant = dp_accounting.rdp.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE
    )
    event = dp_accounting.SampledWithoutReplacementDpEvent(
        n_clients, m, dp_accounting.GaussianDpEvent(z / 2)
    )
  accountant.compose(event, rounds)
  return accountant.get_epsilon(delta)


@pytest.mark.parametrize('sampling', ['fixed_size', 'poisson'])
@pytest.mark.parametrize('z, m, n_clients, rounds, delta', [
    (1.0, 10, 3400, 50, 1e-5),
    (0.7, 20, 500, 30, 1e-6),
    (2.0, 5, 50, 10, 1e-3),
])
def test_epsilon_is_dp_accountings_for_the_runs_sampling(z, m, n_clients, rounds, delta,
                                                         sampling):
  got = aggregation.epsilon(noise_multiplier=z, clients_per_round=m, num_clients=n_clients,
                            rounds=rounds, target_delta=delta, sampling=sampling)
  assert got == pytest.approx(_dp_accounting_epsilon(z, m, n_clients, rounds, delta, sampling),
                              rel=1e-9)


def test_everyone_every_round_is_the_gaussian_mechanism_of_sensitivity_2c():
  """m = N: no amplification; the RDP of n Gaussian rounds with sensitivity 2C and noise
  z C is `n alpha (2C)^2 / (2 (z C)^2) = 2 n alpha / z^2`."""
  z, rounds, delta = 3.0, 20, 1e-5
  orders = np.array([1.5, 2, 3, 4, 8, 16, 32, 64, 128])
  by_hand = dp_accounting.rdp.compute_epsilon(orders, 2 * rounds * orders / z**2, delta)[0]
  got = aggregation.epsilon(noise_multiplier=z, clients_per_round=7, num_clients=7,
                            rounds=rounds, target_delta=delta)
  assert got <= by_hand + 1e-9  # dp_accounting's orders include these: its min is lower,
  assert got >= 0.9 * by_hand  # but not by much.


def test_epsilon_grows_with_the_rounds_from_zero_and_is_infinite_without_noise():
  common = dict(clients_per_round=10, num_clients=100, target_delta=1e-5)
  assert aggregation.epsilon(noise_multiplier=1.0, rounds=0, **common) == 0.0
  assert aggregation.epsilon(noise_multiplier=0.0, rounds=1, **common) == math.inf
  eps = [aggregation.epsilon(noise_multiplier=1.0, rounds=n, **common) for n in (1, 10, 100)]
  assert 0 < eps[0] < eps[1] < eps[2] < math.inf


@pytest.mark.parametrize('values, message', [
    (dict(noise_multiplier=-1.0), 'noise_multiplier must be >= 0, got -1.0'),
    (dict(target_delta=0.0), 'target_delta must be in (0, 1), got 0.0'),
    (dict(target_delta=1.0), 'target_delta must be in (0, 1), got 1.0'),
    (dict(clients_per_round=101), 'clients_per_round (101) must be at most num_clients'),
    (dict(rounds=-1), 'rounds must be an integer >= 0, got -1'),
    (dict(sampling='shuffled'), "sampling must be one of ['fixed_size', 'poisson']"),
])
def test_epsilon_refuses_a_bad_value_in_one_line(values, message):
  arguments = dict(noise_multiplier=1.0, clients_per_round=10, num_clients=100, rounds=5,
                   target_delta=1e-5)
  with pytest.raises(ValueError) as raised:
    aggregation.epsilon(**{**arguments, **values})
  assert message in str(raised.value) and '\n' not in str(raised.value)


# Bytes, from the rounds' types, against the parameter count.


@pytest.fixture(scope='module')
def emnist(small_task):
  return small_task('emnist')


@pytest.fixture(scope='module')
def emnist_bytes(emnist):
  return {
      name: aggregation.client_bytes(registry.build(name, emnist.model_fn, num_clients=8))
      for name in ('fedavg', 'fedzmg', 'scaffold')
  }


def test_fedavg_and_fedzmg_send_the_model_each_way_scaffold_twice(emnist_bytes):
  model = FLOAT32 * EMNIST_PARAMETERS  # The CNN has no non-trainable weights.
  for name in ('fedavg', 'fedzmg'):
    assert emnist_bytes[name].broadcast.tensor_bytes == model, name
    assert emnist_bytes[name].upload.tensor_bytes == model, name
  # SCAFFOLD: the model and c down, the update and c_i+ - c_i up.
  assert emnist_bytes['scaffold'].broadcast.tensor_bytes == 2 * model
  assert emnist_bytes['scaffold'].upload.tensor_bytes == 2 * model
  # Besides, scalars only: the client learning rate (and FedZMG's momentum and decay) or
  # the round index down; the update's weight and the metrics' sums up.
  assert emnist_bytes['fedavg'].broadcast.scalar_bytes == FLOAT32  # eta_l.
  for name, counted in emnist_bytes.items():
    assert 0 < counted.broadcast.scalar_bytes < 100, name
    assert 0 < counted.upload.scalar_bytes < 100, name
  assert emnist_bytes['fedzmg'].upload == emnist_bytes['fedavg'].upload


@pytest.fixture(scope='module')
def compressed_fedzmg(emnist):
  settings = aggregation.AggregatorSettings(kind='compressed')  # 8 bits above 20,000.
  return settings, registry.build(
      'fedzmg', emnist.model_fn, client_learning_rate=0.05, aggregator=settings
  )


def _count_compiles(monkeypatch) -> list:
  """The computations TFF's MapReduceForm compiler is called on from now on."""
  compiled = []
  compile_form = tff.backends.mapreduce.get_map_reduce_form_for_computation

  def counted(comp, *args, **kwargs):
    compiled.append(comp)
    return compile_form(comp, *args, **kwargs)

  monkeypatch.setattr(tff.backends.mapreduce, 'get_map_reduce_form_for_computation', counted)
  return compiled


def test_a_round_compiles_to_mapreduceform_once_for_its_bytes_and_its_run(
    emnist, monkeypatch, tmp_path):
  # TFF's compiler is seconds a round: launch.train counts the bytes and then runs the same
  # round in process, so the second must reuse the first's form.
  monkeypatch.setenv('TFF_ZMG_FORM_CACHE', str(tmp_path / 'forms'))  # None yet on disk.
  compiled = _count_compiles(monkeypatch)
  process = registry.build('fedavg', emnist.model_fn, num_clients=8)
  bytes_before = aggregation.client_bytes(process)
  assert compiled == [process.next]
  preprocess = emnist.train_preprocess_fn_for_seed(None)
  data = [preprocess(emnist.datasets.train_data.create_tf_dataset_for_client(c))
          for c in emnist.datasets.train_data.client_ids[:2]]
  with tff_zmg.in_process_context():
    output = process.next(process.initialize(), data)
  assert output.metrics['client_work']['train']['num_examples'] > 0
  assert compiled == [process.next]
  assert aggregation.client_bytes(process) == bytes_before and len(compiled) == 1


def test_a_form_compiled_in_one_process_is_read_from_disk_by_the_next(
    emnist, monkeypatch, tmp_path):
  """The disk keeps a round's form for the next process that builds the same round (a
  resumed run, a grid's cells); a damaged file is compiled again; '' turns the disk off."""
  folder = tmp_path / 'forms'
  monkeypatch.setenv('TFF_ZMG_FORM_CACHE', str(folder))
  compiled = _count_compiles(monkeypatch)
  process = registry.build('fedavg', emnist.model_fn, num_clients=8)
  first = forms.map_reduce_form(process.next)
  saved, = os.listdir(folder)
  monkeypatch.setattr(forms, '_forms', collections.OrderedDict())  # As in a new process.
  read = forms.map_reduce_form(process.next)
  assert compiled == [process.next] and read is not first
  assert read.type_signature == first.type_signature
  for name in forms._PIECES:  # pylint: disable=protected-access
    a, b = getattr(first, name), getattr(read, name)
    assert a.type_signature == b.type_signature, name
    assert (tff.framework.ConcreteComputation.get_proto(a) ==
            tff.framework.ConcreteComputation.get_proto(b)), name
  (folder / saved).write_text('{"prepare": "not a computation"')
  monkeypatch.setattr(forms, '_forms', collections.OrderedDict())
  forms.map_reduce_form(process.next)
  assert compiled == [process.next] * 2 and os.listdir(folder) == [saved]
  json.loads((folder / saved).read_text())  # Whole again.
  monkeypatch.setenv('TFF_ZMG_FORM_CACHE', '')
  monkeypatch.setattr(forms, '_forms', collections.OrderedDict())
  (folder / saved).unlink()
  forms.map_reduce_form(process.next)
  assert len(compiled) == 3 and os.listdir(folder) == []


def _quantized_bytes(num_elements, bits):
  """TFF's uniform quantization: `b` bits per element packed into the low 28 bits of int32
  words (TF Model Optimization's bit packing, so that each word serializes as a 4-byte
  varint), and the tensor's [min, max] as two float32."""
  return FLOAT32 * math.ceil(num_elements * bits / 28) + 2 * FLOAT32


def test_compression_drops_the_upload_by_the_quantizers_factor(emnist, emnist_bytes,
                                                               compressed_fedzmg):
  settings, process = compressed_fedzmg
  with tf.Graph().as_default():
    sizes = [int(np.prod(v.shape)) for v in emnist.model_fn().trainable_variables]
  quantized = [n for n in sizes if n > settings.compression_threshold]
  assert len(quantized) == 3  # The second conv and both dense kernels.
  expected = sum(_quantized_bytes(n, settings.compression_bits) for n in quantized) + sum(
      FLOAT32 * n for n in sizes if n <= settings.compression_threshold)
  counted = aggregation.client_bytes(process)
  assert counted.upload.tensor_bytes == expected
  assert counted.broadcast.tensor_bytes == FLOAT32 * EMNIST_PARAMETERS  # Downloads as is.
  # The quantized tensors shrink 28 / b times (3.5 at 8 bits), up to their [min, max].
  raw = FLOAT32 * sum(quantized)
  packed = counted.upload.tensor_bytes - FLOAT32 * (sum(sizes) - sum(quantized))
  assert raw / packed == pytest.approx(28 / settings.compression_bits, rel=1e-3)
  assert emnist_bytes['fedzmg'].upload.tensor_bytes / counted.upload.tensor_bytes > 3.4


def test_training_learns_under_compression_on_synthetic_emnist(tff_context, small_task,
                                                               compressed_fedzmg):
  del tff_context
  _, process = compressed_fedzmg
  emnist = small_task('emnist', num_epochs=3)  # README's quick run: 3 epochs, eta_l 0.05.
  clients = emnist.datasets.train_data.client_ids[:4]
  preprocess = emnist.train_preprocess_fn_for_seed(None)
  data = [preprocess(emnist.datasets.train_data.create_tf_dataset_for_client(c))
          for c in clients]
  state = process.initialize()
  losses = []
  for _ in range(5):
    state, metrics = process.next(state, data)
    losses.append(float(metrics['client_work']['train']['loss']))
  # Measured: 4.07, 3.93, 3.74, 3.53, ... with the quantized means as without them.
  assert all(later < earlier for earlier, later in zip(losses, losses[1:])), losses
  assert losses[-1] < losses[0] * 0.9, losses
