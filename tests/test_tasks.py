"""Tasks: the papers' models, preprocessing, and both data sources through TFF's loaders."""

import math
import os
import sqlite3

import numpy as np
import pytest
import tensorflow as tf

from conftest import SMALL_SYNTHETIC
import tasks
from tasks import client_work
from tasks import keyed_randomness
from tasks import models
from tasks import preprocessing
from tasks import sources
from tasks import synthetic


@pytest.mark.parametrize(
    'build, expected',
    [
        (models.emnist_cnn, 1_690_046),
        (models.cifar100_cnn, 2_214_532),
        (models.shakespeare_gru, 4_022_850),
    ],
)
def test_model_parameter_count(build, expected):
  model = build()
  assert model.count_params() == expected
  assert sum(int(np.prod(v.shape)) for v in model.trainable_variables) == expected


def test_shakespeare_vocabulary_is_65_characters_plus_oov():
  chars = preprocessing.SHAKESPEARE_CHARS
  assert len(chars) == 65 == len(set(chars))
  assert chars[:13] == "\n !$&',-.3:;?"
  assert preprocessing.SHAKESPEARE_OOV_ID == 65
  assert models.SHAKESPEARE_VOCAB_SIZE == 66


@pytest.mark.parametrize(
    'name, x_shape, x_dtype, y_shape, y_dtype',
    [
        ('emnist', (20, 28, 28, 1), tf.float32, (20,), tf.int32),
        ('cifar100', (20, 32, 32, 3), tf.float32, (20,), tf.int32),
        ('shakespeare', (4, 80), tf.int64, (4, 80), tf.int64),
    ],
)
def test_preprocessed_batches_have_model_shapes(
    small_task, name, x_shape, x_dtype, y_shape, y_dtype
):
  task = small_task(name, num_epochs=3)
  data = task.datasets.train_data
  client = max(data.client_ids, key=lambda c: len(list(data.create_tf_dataset_for_client(c))))
  batch = next(iter(task.datasets.train_preprocess_fn(data.create_tf_dataset_for_client(client))))
  assert tuple(batch['x'].shape) == x_shape and batch['x'].dtype == x_dtype
  assert tuple(batch['y'].shape) == y_shape and batch['y'].dtype == y_dtype
  if name != 'shakespeare':
    assert 0.0 <= float(tf.reduce_min(batch['x'])) and float(tf.reduce_max(batch['x'])) <= 1.0
  # Only the model with dropout trains on keyed batches: (shuffle seed 0, example j).
  assert ('key' in batch) == (name == 'cifar100')
  if name == 'cifar100':
    np.testing.assert_array_equal(batch['key'], [[0, j] for j in range(20)])


@pytest.mark.parametrize('name', ['emnist', 'cifar100', 'shakespeare'])
def test_preprocessed_datasets_have_tf_data_autotuning_off(small_task, name):
  # Its thread's sleep held up the end of each client's pass in TFF's worker (issue 8).
  task = small_task(name)
  data = task.datasets
  raw = data.train_data.create_tf_dataset_for_client(data.train_data.client_ids[0])
  for preprocess in (
      data.train_preprocess_fn, data.eval_preprocess_fn, task.train_preprocess_fn_for_seed(3)
  ):
    assert preprocess(raw).options().autotune.enabled is False


def test_image_preprocessing_repeats_epochs_and_keeps_every_example(small_task):
  task = small_task('emnist')
  data = task.datasets.train_data
  raw = data.create_tf_dataset_for_client(data.client_ids[0])
  n = len(list(raw))
  for epochs in (1, 3):
    out = preprocessing.emnist_preprocess_fn(batch_size=7, num_epochs=epochs, shuffle_seed=1)(raw)
    assert sum(int(b['y'].shape[0]) for b in out) == epochs * n


def test_a_clients_steps_and_a_rounds_by_hand():
  """tasks.client_work on four clients of (examples, inputs) (5, 5), (3, 7), (1, 0), (4, 9)."""
  # 2 epochs, batch 4: 10, 14, 0 and 18 inputs.
  steps = client_work.client_steps([5, 3, 1, 4], [5, 7, 0, 9], num_epochs=2, batch_size=4)
  np.testing.assert_array_equal(steps, [3, 4, 0, 5])
  # At most 7 examples: the first client takes one pass and 2 of its 5 examples (7 inputs),
  # the last one pass and 3 of its 4 examples (9 + 3 * 9 / 4 = 15.75 inputs on average).
  capped = client_work.client_steps([5, 3, 1, 4], [5, 7, 0, 9], 2, 4, max_elements=7)
  np.testing.assert_array_equal(capped, [2, 4, 0, 4])
  # Two of clients of 1, 2, 3 and 6 steps a round: the six cohorts train 3, 4, 7, 5, 8 and
  # 9 steps, mean 6, variance (9 + 4 + 1 + 1 + 4 + 9) / 6.
  mean, std = client_work.round_steps([1, 2, 3, 6], 2)
  assert mean == pytest.approx(6.0) and std == pytest.approx(math.sqrt(28 / 6))
  assert client_work.round_steps([1, 2, 3, 6], 10) == (12.0, 0.0)  # All, every round.


@pytest.mark.parametrize('name, epochs, batch_size, cap', [
    ('shakespeare', 2, 3, None), ('emnist', 2, 7, 25)])
def test_client_steps_are_the_batches_the_preprocessing_makes(
    synthetic_cache_dir, name, epochs, batch_size, cap):
  """Each training client's steps from its file alone (`tasks.training_volumes`) are the
  batches its training dataset holds, on clients of Shakespeare's skew."""
  settings = dict(SMALL_SYNTHETIC[name], volume_skew='shakespeare')
  task = tasks.get(name, data_source='synthetic', cache_dir=synthetic_cache_dir,
                   synthetic_settings=settings, num_epochs=epochs, batch_size=batch_size,
                   max_elements=cap)
  examples, inputs = tasks.training_volumes(
      name, data_source='synthetic', cache_dir=synthetic_cache_dir,
      synthetic_settings=settings)
  preprocess = task.train_preprocess_fn_for_seed(5)
  batches = [len(list(preprocess.from_tensors(task.train_client_tensors(client_id))))
             for client_id in task.datasets.train_data.client_ids]
  np.testing.assert_array_equal(
      client_work.client_steps(examples, inputs, epochs, batch_size, cap), batches)
  assert len(set(batches)) > 2, batches


def test_training_shuffle_is_reproducible_per_seed(small_task):
  task = small_task('emnist')
  data = task.datasets.train_data
  raw = data.create_tf_dataset_for_client(data.client_ids[0])

  def labels(seed):
    ds = task.train_preprocess_fn_for_seed(seed)(raw)
    return np.concatenate([b['y'].numpy() for b in ds])

  np.testing.assert_array_equal(labels(3), labels(3))
  assert not np.array_equal(labels(3), labels(4))
  # TF's global seed (a notebook's tf.random.set_seed) must not change a run's batches:
  # with Dataset.shuffle it did, and a run in such a process drifted from the CLI's.
  reference = labels(3)
  try:
    for global_seed in (0, 123):
      tf.random.set_seed(global_seed)
      np.testing.assert_array_equal(labels(3), reference)
  finally:
    tf.random.set_seed(None)


def test_seeded_shuffle_permutes_each_block_and_each_epoch_anew():
  n, block = 10, 4
  dataset = tf.data.Dataset.from_tensor_slices({'i': tf.range(n), 'x': tf.range(n) * 10})
  out = list(preprocessing.seeded_shuffle(dataset, seed=7, num_epochs=3, block_size=block))
  order = np.array([int(e['i']) for e in out]).reshape(3, n)
  np.testing.assert_array_equal([int(e['x']) for e in out], order.reshape(-1) * 10)
  for epoch in order:
    for start in range(0, n, block):  # Elements stay in their block, each exactly once.
      assert sorted(epoch[start:start + block]) == list(range(start, min(n, start + block)))
  assert len({tuple(epoch) for epoch in order}) == 3
  again = list(preprocessing.seeded_shuffle(dataset, seed=7, num_epochs=3, block_size=block))
  np.testing.assert_array_equal([int(e['i']) for e in again], order.reshape(-1))


def test_shakespeare_sequences_shift_by_one_and_pad_targets():
  ds = tf.data.Dataset.from_tensor_slices({'snippets': [b'Hark! ~', b'No']})
  batch = next(iter(preprocessing.shakespeare_preprocess_fn(batch_size=8)(ds)))
  chars = preprocessing.SHAKESPEARE_CHARS
  ids = lambda s: [chars.index(c) if c in chars else 65 for c in s]
  x, y = batch['x'].numpy(), batch['y'].numpy()
  assert x.shape == y.shape == (2, 80)
  np.testing.assert_array_equal(y[0, :6], ids('ark! ~'))  # '~' is out of vocabulary.
  np.testing.assert_array_equal(x[0, :7], ids('Hark! ~'))
  assert (y[0, 6:] == -1).all() and (y[1, 1:] == -1).all()
  assert (x[1, 2:] == 0).all()


def test_shakespeare_accuracy_ignores_padding():
  metric = models.MaskedSparseCategoricalAccuracy()
  y_true = tf.constant([[1, 2, -1, -1]], tf.int64)
  logits = tf.one_hot([[1, 0, 0, 0]], 3)  # Right, wrong, then two padded positions.
  metric.update_state(y_true, logits)
  assert float(metric.result()) == pytest.approx(0.5)


@pytest.mark.parametrize('name', tasks.TFF_TASK_NAMES)
def test_tff_source_reads_a_file_through_tffs_loader(small_task, synthetic_cache_dir, name):
  # A file in TFF's schema, placed where TFF's loader looks, read with data_source='tff'.
  generated = synthetic.ensure_synthetic_cache_dir(
      name, synthetic_cache_dir, **SMALL_SYNTHETIC[name]
  )
  task = tasks.get(name, data_source='tff', cache_dir=generated)
  assert len(task.datasets.train_data.client_ids) == 8
  assert len(task.datasets.test_data.client_ids) == 3
  expected = small_task(name).datasets.element_type_structure
  assert task.datasets.element_type_structure == expected


def test_missing_real_data_names_file_directory_and_remedy(tmp_path):
  with pytest.raises(tasks.MissingDataError) as raised:
    tasks.get('emnist', data_source='tff', cache_dir=str(tmp_path))
  message = str(raised.value)
  assert str(tmp_path / 'emnist_all.sqlite') in message
  assert 'emnist_all.sqlite.lzma' in message and '--data_source=synthetic' in message
  assert os.listdir(tmp_path) == []  # Nothing half-written is left behind.


def test_corrupt_data_file_is_reported(tmp_path):
  (tmp_path / 'shakespeare.sqlite').write_bytes(b'not a database at all' * 100)
  with pytest.raises(tasks.CorruptDataError, match='shakespeare.sqlite'):
    tasks.get('shakespeare', data_source='tff', cache_dir=str(tmp_path))


def test_database_without_the_tasks_splits_is_reported(tmp_path):
  path = tmp_path / 'cifar100.sqlite'
  with sqlite3.connect(path) as con:
    con.execute('CREATE TABLE examples (split_name TEXT, client_id TEXT, serialized_example_proto BLOB)')
    con.execute('CREATE TABLE client_metadata (client_id TEXT, split_name TEXT, num_examples INTEGER)')
    con.execute("INSERT INTO client_metadata VALUES ('a', 'validation', 1)")
  with pytest.raises(tasks.CorruptDataError, match='splits'):
    sources.load_client_data('cifar100', 'tff', str(tmp_path))


@pytest.mark.parametrize(
    'kwargs, match',
    [
        (dict(name='mnist'), 'Unknown task'),
        (dict(name='emnist', data_source='web'), 'Unknown data_source'),
        (dict(name='emnist', batch_size=-1), 'batch_size'),
        (dict(name='emnist', num_epochs=0), 'num_epochs'),
    ],
)
def test_bad_task_arguments_raise(kwargs, match, tmp_path):
  with pytest.raises(ValueError, match=match):
    tasks.get(cache_dir=str(tmp_path), **kwargs)


def test_task_is_a_tff_baseline_task_whose_model_matches_its_data(small_task):
  import tensorflow_federated as tff

  task = small_task('cifar100')
  assert isinstance(task, tff.simulation.baselines.BaselineTask)
  with tf.Graph().as_default():
    model = task.model_fn()
  assert model.input_spec == task.datasets.element_type_structure
  assert sum(int(np.prod(v.shape)) for v in model.trainable_variables) == 2_214_532


def test_keyed_dropout_masks_are_a_function_of_the_key_and_the_layer():
  x = tf.ones([64, 100])
  layer = keyed_randomness.KeyedDropout(0.25, salt=1)

  def mask(batch_key, salt_layer=layer):
    with keyed_randomness.key(tf.constant(batch_key, tf.int64)):
      return salt_layer(x, training=True).numpy()

  first = mask([[7, 0]])
  np.testing.assert_array_equal(first, mask([[7, 0]]))
  assert not np.array_equal(first, mask([[7, 20]]))  # The next step's batch.
  assert not np.array_equal(first, mask([[8, 0]]))  # Another client or round.
  assert not np.array_equal(first, mask([[7, 0]], keyed_randomness.KeyedDropout(0.25, salt=2)))
  # Kept units scaled by 1 / (1 - rate), as Keras's Dropout; about a quarter dropped.
  assert set(np.unique(first)) == {0.0, np.float32(1 / 0.75)}
  assert 0.2 < np.mean(first == 0) < 0.3
  np.testing.assert_array_equal(layer(x, training=False), x)
  with pytest.raises(ValueError, match='outside a key scope'):
    layer(x, training=True)


@pytest.mark.parametrize('layer, refused', [
    (lambda: tf.keras.layers.Dropout(0.5), 'Dropout'),
    (lambda: tf.keras.layers.GaussianNoise(0.1), 'GaussianNoise'),
    (lambda: tf.keras.layers.GRU(4, dropout=0.1), 'GRU'),
    (lambda: tf.keras.layers.GRU(4), None),  # Random in Keras's class tree; draws nothing.
    (lambda: keyed_randomness.KeyedDropout(0.5, salt=0), None),
])
def test_a_model_drawing_from_a_generators_state_is_refused(layer, refused):
  model = tf.keras.Sequential([tf.keras.layers.InputLayer(input_shape=(3, 2)), layer()])
  if refused is None:
    keyed_randomness.check_keyed(model)
  else:
    with pytest.raises(ValueError, match=f"generator's state .*{refused}"):
      keyed_randomness.check_keyed(model)
