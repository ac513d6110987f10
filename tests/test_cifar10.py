"""CIFAR-10 from tensorflow_datasets, its Dirichlet split, the CNN and ResNet-18, protocols.

The tfds data is a tiny CIFAR-10 in tfds' own on-disk format (`small_runs.write_tiny_cifar10`),
which `tfds.load('cifar10', data_dir=...)` reads like the prepared download.
"""

import csv
import hashlib
import json
import os

from absl import flags
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from launch import papers
from launch.run import settings as run_settings
from launch.sweeps import runner
from launch import train
import tasks
from tff_zmg.algorithms import registry
from tff_zmg import client_states
import small_runs


@pytest.fixture(scope='module')
def tfds_dir(tmp_path_factory):
  data_dir = str(tmp_path_factory.mktemp('tensorflow_datasets'))
  small_runs.write_tiny_cifar10(data_dir)
  return data_dir


def _fingerprint(example) -> tuple:
  return (hashlib.sha1(np.asarray(example['image']).tobytes()).hexdigest(),
          int(example['label']))


def _tfds_examples(data_dir, split):
  dataset = tfds.load('cifar10', data_dir=data_dir, split=split, download=False,
                      shuffle_files=False)
  return [_fingerprint(e) for e in dataset.as_numpy_iterator()]


def _clients(client_data):
  return {
      c: [_fingerprint(e) for e in client_data.create_tf_dataset_for_client(c)
          .as_numpy_iterator()]
      for c in client_data.client_ids
  }


def _cifar10(data_dir, **kwargs):
  settings = dict(partition='dirichlet', dirichlet_alpha=0.3, num_clients=6,
                  partition_seed=0)
  settings.update(kwargs)
  return tasks.get('cifar10', cache_dir=data_dir, **settings)


def test_tfds_split_is_dealt_once_and_the_test_split_kept_in_order(tfds_dir):
  task = _cifar10(tfds_dir)
  train_clients = _clients(task.datasets.train_data)
  assert len(train_clients) == 6
  assert sorted(map(len, train_clients.values())) == [10] * 6
  dealt = [e for examples in train_clients.values() for e in examples]
  assert sorted(dealt) == sorted(_tfds_examples(tfds_dir, 'train'))  # Each exactly once.
  test_clients = _clients(task.datasets.test_data)
  assert list(test_clients) == [f'test_{k:02d}' for k in range(10)]
  assert [e for c in sorted(test_clients) for e in test_clients[c]] == _tfds_examples(
      tfds_dir, 'test'
  )
  x = next(iter(task.datasets.eval_preprocess_fn(
      task.datasets.test_data.create_tf_dataset_for_client('test_00')
  )))['x']
  assert x.shape == (2, 32, 32, 3) and 0.0 <= float(tf.reduce_min(x))
  assert float(tf.reduce_max(x)) <= 1.0


def test_partition_is_a_function_of_its_seed(tfds_dir):
  first = _clients(_cifar10(tfds_dir).datasets.train_data)
  assert _clients(_cifar10(tfds_dir).datasets.train_data) == first
  other = _clients(_cifar10(tfds_dir, partition_seed=1).datasets.train_data)
  assert other != first
  assert sorted(sum(other.values(), [])) == sorted(sum(first.values(), []))


def test_missing_tfds_data_names_the_call_the_directory_and_the_remedy(tmp_path):
  with pytest.raises(tasks.MissingDataError) as raised:
    _cifar10(str(tmp_path))
  message = str(raised.value)
  assert f"tfds.load('cifar10', data_dir='{tmp_path}')" in message
  assert str(tmp_path / 'cifar10') in message
  assert 'import tensorflow_datasets as tfds' in message
  assert not os.path.exists(tmp_path / 'tff_sqlite')


@pytest.mark.parametrize('kwargs, message', [
    (dict(partition=None, dirichlet_alpha=None, num_clients=None, partition_seed=None),
     'centralized dataset'),
    (dict(data_source='synthetic'), 'no \'synthetic\' source'),
    (dict(model='gru'), "choose one of ['cnn', 'resnet18_gn']"),
])
def test_bad_cifar10_settings_say_what_is_allowed(tfds_dir, kwargs, message):
  with pytest.raises(ValueError, match=None) as raised:
    _cifar10(tfds_dir, **kwargs)
  assert message in str(raised.value)


def test_model_parameter_counts():
  built = {}
  for task_name, choices in tasks.MODELS.items():
    for model_name, choice in choices.items():
      model = built[task_name, model_name] = choice.keras_model_fn(0)
      assert model.count_params() == choice.num_parameters, (task_name, model_name)
    # The first model is the task's own.
    assert tasks.SPECS[task_name].num_parameters == next(iter(choices.values())).num_parameters
  assert tasks.MODELS['cifar10']['cnn'].num_parameters == 2_156_490
  assert tasks.MODELS['cifar10']['resnet18_gn'].num_parameters == 11_173_962
  assert tasks.MODELS['cifar100_tfds']['resnet18_gn'].num_parameters == 11_220_132
  resnet = built['cifar10', 'resnet18_gn']  # Built above by the same keras_model_fn(0).
  assert len(resnet.trainable_variables) == 62  # As GC-Fed section 4.3.2 counts.
  assert not any('batch_norm' in v.name for v in resnet.variables)


def test_protocol_fills_only_unset_flags():
  flags.FLAGS.unparse_flags()
  try:
    flags.FLAGS(['train', '--task=cifar10', '--algo=gcfed', '--protocol=fedrkmgc',
                 '--client_batch_size=7'])
    settings, applied = run_settings.apply_protocol(run_settings.settings_from_flags())
    config = run_settings.experiment_config(settings)
  finally:
    flags.FLAGS.unparse_flags()
  # beta/gamma/rho are FedRKMGC's own, not gcfed's; its SGD is every method's: FedRKMGC
  # section 5 gives momentum 0.8 and no weight decay (gcfed's own default is 1e-5).
  assert 'beta' not in applied and 'client_batch_size' not in applied
  assert config.client_batch_size == 7
  assert (config.partition, config.num_clients, config.dirichlet_alpha) == (
      'dirichlet', 100, 0.3)
  assert (config.clients_per_round, config.client_epochs_per_round) == (10, 5)
  assert config.hparams == {'client_learning_rate': 0.01, 'client_momentum': 0.8,
                            'weight_decay': 0.0}
  for protocol in papers.PROTOCOLS.values():
    assert set(protocol.sources) == set(protocol.flag_values()) - {'partition'} | {
        'dirichlet_alphas', 'client_optimizer', *protocol.method_hparams}
    assert protocol.dirichlet_alpha in protocol.dirichlet_alphas


@pytest.mark.parametrize('args, message', [
    # SCAFFOLD's clients step plain SGD: no momentum to take GC-Fed's 0.9.
    (['--algo=scaffold', '--protocol=gcfed'],
     "--protocol=gcfed trains every method's clients with momentum 0.9 (GC-Fed section 4"),
    (['--algo=fedrkmgc', '--protocol=fedgps'], '--algo=fedrkmgc has no weight decay'),
    # FedZMG decays decoupled (its eq. 6), the papers' SGD coupled.
    (['--algo=fedzmg', '--protocol=gcfed'],
     '--algo=fedzmg decays its weights decoupled: give --weight_decay to train it with its'
     ' own decay'),
])
def test_a_protocol_setting_an_algorithm_cannot_take_is_refused_in_one_line(args, message):
  flags.FLAGS.unparse_flags()
  try:
    flags.FLAGS(['train', '--task=cifar10', *args])
    with pytest.raises(ValueError) as error:
      run_settings.apply_protocol(run_settings.settings_from_flags())
    # Given on the command line, the decay is the run's own, and nothing is refused.
    flags.FLAGS(['train', '--task=cifar10', '--weight_decay=1e-4', *args])
    if 'decoupled' in message:
      _, applied = run_settings.apply_protocol(run_settings.settings_from_flags())
      assert 'weight_decay' not in applied and applied['client_momentum'] == 0.9
  finally:
    flags.FLAGS.unparse_flags()
  assert message in str(error.value) and '\n' not in str(error.value), error.value


def test_an_ablation_keeps_the_value_its_name_stands_for():
  """FedRKMGC's protocol gives its method rho = 1.5; the ablations without relaxation
  (FedRKMGC Table 9: raw, km, fast_km) keep rho = 1, the others take the protocol's."""
  protocol = papers.get_protocol('fedrkmgc')
  for name in ('fedrkmgc_raw', 'fedrkmgc_km', 'fedrkmgc_fast_km'):
    hparams = protocol.hparams_for(registry.get(name))
    assert 'rho' not in hparams and registry.resolve(name, hparams)['rho'] == 1.0
    assert (hparams['beta'], hparams['gamma']) == (0.03, 500.0)
  for name in ('fedrkmgc', 'fedrkmgc_re', 'fedrkmgc_re_km'):
    assert protocol.hparams_for(registry.get(name))['rho'] == 1.5


def test_cifar10_from_the_command_line_is_always_partitioned():
  flags.FLAGS.unparse_flags()
  try:
    flags.FLAGS(['train', '--task=cifar10', '--algo=gcfed', '--dirichlet_alpha=0.05'])
    config = run_settings.config_of(run_settings.settings_from_flags())
  finally:
    flags.FLAGS.unparse_flags()
  assert (config.partition, config.dirichlet_alpha, config.num_clients) == (
      'dirichlet', 0.05, 100)
  assert config.hparams == {} and config.model is None


def test_runs_of_a_grid_get_the_protocol_for_their_algorithm():
  flags.FLAGS.unparse_flags()
  try:
    flags.FLAGS(['train', '--task=cifar10', '--algo=fedavg', '--protocol=fedrkmgc'])
    run = runner.train_run(run_settings.settings_from_flags(), 'cell',
                           {'algo': 'gcfed', 'client_learning_rate': 0.05})
    assert flags.FLAGS.client_momentum is None and flags.FLAGS.num_clients == 100
    assert flags.FLAGS.partition is None  # The program's own flags are left as given.
    other = runner.train_run(run_settings.settings_from_flags(), 'cell',
                             {'algo': 'gcfed', 'overwrite': True, 'workers': []})
    # The run's command line, parsed as launch.train parses it, is the same run.
    flags.FLAGS.unparse_flags()
    flags.FLAGS(['train', *other.args])
    assert run_settings.config_of(run_settings.settings_from_flags()) == other.config
    assert '--overwrite' in other.args
    flags.FLAGS.unparse_flags()
    flags.FLAGS(['train', '--task=cifar10', '--algo=fedavg', '--protocol=fedrkmgc'])
    other = runner.train_run(run_settings.settings_from_flags(), 'cell', {'algo': 'fedrkmgc'})
  finally:
    flags.FLAGS.unparse_flags()
  assert run.config.hparams == {'client_learning_rate': 0.05, 'client_momentum': 0.8,
                                'weight_decay': 0.0}
  assert '--protocol=fedrkmgc' in run.args and '--client_learning_rate=0.05' in run.args
  assert (run.config.partition, run.config.dirichlet_alpha) == ('dirichlet', 0.3)
  assert other.config.hparams == dict(client_learning_rate=0.01, client_momentum=0.8,
                                      beta=0.03, gamma=500.0, rho=1.5)


@pytest.fixture
def run_main(run_program, tfds_dir, tmp_path):
  """`launch.train` in this process (conftest's `run_program`) on two CIFAR-10 clients of 4
  examples read from the tfds folder, 2 rounds; returns (rc, out, err)."""

  def run(*args):
    return run_program(
        train, '--task=cifar10', f'--cache_dir={tfds_dir}', f'--root_output_dir={tmp_path}',
        '--num_clients=2', '--clients_per_round=2', '--client_epochs_per_round=1',
        '--client_batch_size=2', '--max_elements_per_client=4', '--total_rounds=2',
        '--rounds_per_eval=2', '--rounds_per_checkpoint=2', *args)

  return run


# ResNet-18 (11M parameters) costs ~50 s to build and ~50 s for its first round on two
# cores: FedRKMGC's runs as a bare process, GC-Fed's is the guarantees' matrix's run (built
# once for every test that reads it); the CNN goes through launch.train.
@pytest.mark.parametrize('algo', ['gcfed', 'fedrkmgc'])
def test_two_rounds_on_cifar10_with_the_cnn(run_main, tmp_path, algo):
  rc, out, err = run_main(f'--algo={algo}', f'--protocol={algo}', '--model=cnn',
                          f'--experiment_name={algo}')
  assert rc == 0, err
  assert f'protocol {algo}:' in out
  output = tmp_path / algo
  recorded = json.loads((output / 'flags.json').read_text())
  expected = papers.get_protocol(algo)
  assert recorded['model'] == 'cnn' and recorded['client_batch_size'] == 2
  assert recorded['dirichlet_alpha'] == expected.dirichlet_alpha
  # The protocol's values, and every other hyperparameter at its default: all recorded.
  others = {
      'gcfed': {'center_vectors': False, 'gc_lambda': None, 'global_gc_layers': 'classifier',
                'local_gc_layers': 'feature', 'server_learning_rate': 1.0},
      'fedrkmgc': {'allow_unsafe_relaxation': False, 'km_clock': 'global'},
  }[algo]
  assert recorded['hparams'] == {**others, **expected.hparams_for(registry.get(algo))}
  # The protocol's line says every hyperparameter it set, its client optimizer's too.
  line = next(l for l in out.splitlines() if l.startswith(f'protocol {algo}: '))
  logged = json.loads(line.removeprefix(f'protocol {algo}: '))
  assert expected.hparams_for(registry.get(algo)).items() <= logged.items()
  with open(output / 'metrics.csv', newline='') as f:
    rows = list(csv.DictReader(f))
  trained = [r for r in rows if r.get('client_work/train/loss')]
  assert [int(r['key']) for r in trained] == [1, 2]
  assert all(np.isfinite(float(r['client_work/train/loss'])) for r in trained)
  evaluated = [r for r in rows if r.get('evaluation/sparse_categorical_accuracy')]
  assert int(evaluated[-1]['key']) == 2
  assert 0.0 <= float(evaluated[-1]['evaluation/sparse_categorical_accuracy']) <= 1.0


def test_two_rounds_of_gcfed_with_resnet18():
  """GC-Fed on ResNet-18-GN: every tensor trains, and global GC on the classifier centers
  its update. The run is `small_runs.RESNET18_GN_GCFED` (`launch.train` of two rounds of
  two clients of two examples, trained once in the session)."""
  run = small_runs.reference_run('resnet18_gn-gcfed')
  assert json.loads(open(os.path.join(run, 'flags.json')).read())['model'] == 'resnet18_gn'
  initial, final = (
      [np.asarray(w) for w in small_runs.checkpoint(run, version).global_model_weights.trainable]
      for version in (0, 2))
  for row in small_runs.metric_rows(run)[1:]:
    assert row['client_work/train/num_examples'] == '4'
    assert np.isfinite(float(row['client_work/train/loss']))
  assert len(final) == 62
  assert all(np.all(np.isfinite(w)) for w in final)
  assert all(not np.array_equal(a, b) for a, b in zip(initial, final))
  # Global GC on the classifier: its kernel's update has zero-mean columns per output.
  update = final[-2] - initial[-2]
  np.testing.assert_allclose(update.mean(axis=0), 0.0, atol=1e-6)


def test_two_rounds_of_fedrkmgc_with_resnet18(tfds_dir, tff_context):
  """FedRKMGC's stateful clients on ResNet-18: every tensor trains and is corrected."""
  del tff_context
  task = _cifar10(tfds_dir, num_clients=2, dirichlet_alpha=0.5, model='resnet18_gn',
                  batch_size=2, max_elements=4)
  trainer = client_states.StatefulClientsTrainer(
      registry.build('fedrkmgc', task.model_fn), client_states.InMemoryClientStateStore()
  )
  state = trainer.initialize()
  initial = trainer.get_model_weights(state).trainable
  ids = list(task.datasets.train_data.client_ids)
  data = [
      task.datasets.train_preprocess_fn(task.datasets.train_data.create_tf_dataset_for_client(c))
      for c in ids
  ]
  for round_num in range(2):
    output = trainer.next(state, client_states.ClientSelection(round_num, ids, data))
    state = output.state
    assert np.isfinite(output.metrics['client_work']['train']['loss'])
  final = trainer.get_model_weights(state).trainable
  assert len(final) == 62
  assert all(np.all(np.isfinite(w)) for w in final)
  assert all(not np.array_equal(a, b) for a, b in zip(initial, final))
  for client in ids:
    client_state = trainer.client_state(client)
    assert int(client_state['participations']) == 2
    assert all(np.all(np.isfinite(d)) and np.any(d) for d in client_state['correction'])
