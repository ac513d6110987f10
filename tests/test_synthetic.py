"""Tests for tasks/synthetic.py: files load through TFF's real loaders.

No federated computation is run here (only TF/numpy code and TFF's dataset
loaders), so no TFF worker process is started.
"""

import collections
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import synthetic
import worker_processes

_LOADERS = {
    'emnist': lambda d: tff.simulation.datasets.emnist.load_data(
        only_digits=False, cache_dir=d
    ),
    'cifar100': lambda d: tff.simulation.datasets.cifar100.load_data(
        cache_dir=d
    ),
    'shakespeare': lambda d: tff.simulation.datasets.shakespeare.load_data(
        cache_dir=d
    ),
}

# Settings of the module-wide datasets: EMNIST and Shakespeare use the defaults
# (so the defaults are what is checked), CIFAR-100 a smaller set because the
# writer serializes ~5 ms per CIFAR image with the pure-Python protobuf.
_SETTINGS = {
    'emnist': {},
    'cifar100': dict(
        num_train_clients=20, num_test_clients=5, mean_examples_per_client=30
    ),
    'shakespeare': {},
}

_TINY = dict(
    num_train_clients=3, num_test_clients=2, mean_examples_per_client=4
)

_ELEMENT_SPECS = {
    'emnist': collections.OrderedDict(
        label=tf.TensorSpec((), tf.int32),
        pixels=tf.TensorSpec((28, 28), tf.float32),
    ),
    'cifar100': collections.OrderedDict(
        coarse_label=tf.TensorSpec((), tf.int64),
        image=tf.TensorSpec((32, 32, 3), tf.uint8),
        label=tf.TensorSpec((), tf.int64),
    ),
    'shakespeare': collections.OrderedDict(
        snippets=tf.TensorSpec((), tf.string)
    ),
}


def _read_all(client_data):
  """Returns {client_id: {feature: stacked numpy array}}."""
  result = {}
  for client_id in client_data.client_ids:
    examples = list(
        client_data.create_tf_dataset_for_client(client_id).as_numpy_iterator()
    )
    keys = examples[0].keys() if examples else ()
    result[client_id] = {
        key: np.stack([e[key] for e in examples]) for key in keys
    }
  return result


@pytest.fixture(scope='module')
def loaded(tmp_path_factory):
  """get(task) -> (dir, train, test, train arrays, test arrays), made once."""
  root = str(tmp_path_factory.mktemp('synthetic_cache'))
  cache = {}

  def get(task):
    if task not in cache:
      directory = synthetic.ensure_synthetic_cache_dir(
          task, root, **_SETTINGS[task]
      )
      train, test = _LOADERS[task](directory)
      cache[task] = (directory, train, test, _read_all(train), _read_all(test))
    return cache[task]

  return get


def _expected_counts(task):
  settings = dict(synthetic.DEFAULT_SETTINGS[task], **_SETTINGS[task])
  return settings['num_train_clients'], settings['num_test_clients']


@pytest.mark.parametrize('task', sorted(synthetic.SQLITE_FILENAMES))
def test_loads_through_tff_loader(loaded, task):
  directory, train, test, train_data, test_data = loaded(task)
  assert os.path.basename(directory).startswith(f'{task}-')
  assert os.path.isfile(
      os.path.join(directory, synthetic.SQLITE_FILENAMES[task])
  )
  num_train, num_test = _expected_counts(task)
  assert len(train.client_ids) == num_train
  assert len(test.client_ids) == num_test
  assert not set(train.client_ids) & set(test.client_ids)
  for client_data in (train, test):
    assert client_data.element_type_structure == _ELEMENT_SPECS[task]
    first_client = client_data.client_ids[0]
    dataset = client_data.create_tf_dataset_for_client(first_client)
    assert dataset.element_spec == _ELEMENT_SPECS[task]
  for data in (train_data, test_data):
    assert all(data.values()), 'every client must have at least one example'
    pooled = {
        key: np.concatenate([c[key] for c in data.values()])
        for key in _ELEMENT_SPECS[task]
    }
    if task == 'emnist':
      pixels, labels = pooled['pixels'], pooled['label']
      assert pixels.min() >= 0.0 and pixels.max() <= 1.0
      assert labels.min() >= 0 and labels.max() <= 61
      # TFF's convention: background 1.0 (most pixels), ink dark.
      assert np.median(pixels) > 0.8
      assert np.mean(pixels < 0.3) > 0.02
    elif task == 'cifar100':
      labels = pooled['label']
      assert labels.min() >= 0 and labels.max() <= 99
      np.testing.assert_array_equal(pooled['coarse_label'], labels // 5)
      assert pooled['image'].dtype == np.uint8
      assert pooled['image'].std() > 20  # Not a constant image.
    else:
      assert all(len(s) > 0 for s in pooled['snippets'])


@pytest.mark.parametrize('task', sorted(synthetic.SQLITE_FILENAMES))
def test_deterministic_per_seed(tmp_path, task):
  def generate(root, seed):
    directory = synthetic.ensure_synthetic_cache_dir(
        task, str(tmp_path / root), seed=seed, **_TINY
    )
    train, test = _LOADERS[task](directory)
    return directory, _read_all(train), _read_all(test)

  dir_a, train_a, test_a = generate('a', seed=3)
  dir_b, train_b, test_b = generate('b', seed=3)
  dir_c, train_c, test_c = generate('c', seed=4)
  assert os.path.basename(dir_a) == os.path.basename(dir_b)
  assert os.path.basename(dir_a) != os.path.basename(dir_c)
  for data_a, data_b in ((train_a, train_b), (test_a, test_b)):
    assert list(data_a) == list(data_b)
    for client_id, features in data_a.items():
      for key, value in features.items():
        np.testing.assert_array_equal(value, data_b[client_id][key])

  def differs(data_a, data_c):
    for client_id, features in data_a.items():
      other = data_c[client_id]
      for key, value in features.items():
        if value.shape != other[key].shape or np.any(value != other[key]):
          return True
    return False

  assert differs(train_a, train_c) and differs(test_a, test_c)


def test_cache_dir_reused_without_rewriting(tmp_path, monkeypatch):
  root = str(tmp_path)
  first = synthetic.ensure_synthetic_cache_dir('shakespeare', root, **_TINY)
  path = os.path.join(first, synthetic.SQLITE_FILENAMES['shakespeare'])
  stat = os.stat(path)
  assert sorted(os.listdir(first)) == ['settings.json', 'shakespeare.sqlite']

  def fail(*args, **kwargs):
    raise AssertionError('cached data was regenerated')

  monkeypatch.setattr(synthetic, 'write_synthetic_sqlite', fail)
  second = synthetic.ensure_synthetic_cache_dir('shakespeare', root, **_TINY)
  assert second == first
  assert os.stat(path).st_mtime_ns == stat.st_mtime_ns
  assert os.stat(path).st_ino == stat.st_ino
  assert first.startswith(os.path.join(root, 'synthetic', 'shakespeare-'))
  # Other settings go to another directory (and need generation).
  with pytest.raises(AssertionError, match='regenerated'):
    synthetic.ensure_synthetic_cache_dir(
        'shakespeare', root, **dict(_TINY, num_test_clients=3)
    )
  with pytest.raises(AssertionError, match='regenerated'):
    synthetic.ensure_synthetic_cache_dir(
        'shakespeare', root, dirichlet_alpha=0.2, **_TINY
    )
  with pytest.raises(AssertionError, match='regenerated'):
    synthetic.ensure_synthetic_cache_dir('shakespeare', root, volume_skew='shakespeare', **_TINY)
  # The default skew named is the data (and folder) from before the setting.
  assert synthetic.ensure_synthetic_cache_dir(
      'shakespeare', root, volume_skew='lognormal', **_TINY) == first


def test_write_synthetic_sqlite_leaves_only_the_file(tmp_path):
  path = tmp_path / 'sub' / 'cifar100.sqlite'
  synthetic.write_synthetic_sqlite(
      'cifar100',
      str(path),
      num_train_clients=2,
      num_test_clients=1,
      mean_examples_per_client=2,
  )
  assert os.listdir(tmp_path / 'sub') == ['cifar100.sqlite']
  train, test = _LOADERS['cifar100'](str(tmp_path / 'sub'))
  assert train.client_ids == ['train_00000', 'train_00001']
  assert test.client_ids == ['test_00000']


@pytest.mark.parametrize('task_name', sorted(synthetic.SQLITE_FILENAMES))
def test_the_file_holds_what_tffs_own_writer_writes_of_the_same_clients(task_name, tmp_path):
  """The writer is ours (a stop in the tf.data loop of TFF's `save_to_sql_client_data` was
  once lost, issue 47): TFF's loader reads from its file every example, in order, that TFF's
  own writer stores of the same generated clients."""
  filename = synthetic.SQLITE_FILENAMES[task_name]
  synthetic.write_synthetic_sqlite(task_name, str(tmp_path / 'ours' / filename), **_TINY)
  make_client = synthetic._client_generator(task_name, 0)
  examples, splits = {}, {}
  for split, (prefix, count) in enumerate((('train', 3), ('test', 2))):
    for index in range(count):
      client_id = f'{prefix}_{index:05d}'
      rng = synthetic._rng(0, task_name, synthetic._PURPOSE_CLIENTS[split], index)
      examples[client_id] = make_client(
          rng, synthetic.Volume.of(_TINY['mean_examples_per_client']), 0.5)
      splits[client_id] = synthetic.SPLIT_NAMES[task_name][split]
  tff.simulation.datasets.save_to_sql_client_data(
      list(examples), lambda c: tf.data.Dataset.from_tensor_slices(examples[c]),
      str(tmp_path / 'tffs' / filename), split_names_by_client_id=splits,
  )
  ours = _LOADERS[task_name](str(tmp_path / 'ours'))
  tffs = _LOADERS[task_name](str(tmp_path / 'tffs'))
  for mine, theirs in zip(ours, tffs):
    assert mine.client_ids == theirs.client_ids
    mine_arrays, their_arrays = _read_all(mine), _read_all(theirs)
    for client_id, arrays in their_arrays.items():
      assert sorted(mine_arrays[client_id]) == sorted(arrays)
      for key, values in arrays.items():
        np.testing.assert_array_equal(mine_arrays[client_id][key], values)


def _mean_tv_to_global(label_lists, num_classes):
  pooled = np.concatenate(label_lists)
  global_hist = np.bincount(pooled, minlength=num_classes) / len(pooled)
  histograms = [
      np.bincount(y, minlength=num_classes) / len(y) for y in label_lists
  ]
  return np.mean([0.5 * np.abs(h - global_hist).sum() for h in histograms])


def test_label_skew_and_volume_skew(tmp_path):
  directory = synthetic.ensure_synthetic_cache_dir(
      'emnist',
      str(tmp_path),
      num_train_clients=12,
      num_test_clients=1,
      mean_examples_per_client=60,
      dirichlet_alpha=0.1,
  )
  train, _ = _LOADERS['emnist'](directory)
  data = _read_all(train)
  labels = [c['label'] for c in data.values()]
  sizes = np.array([len(y) for y in labels])
  # IID baseline: the same pooled labels dealt out to clients of the same sizes.
  shuffled = np.random.default_rng(0).permutation(np.concatenate(labels))
  iid = np.split(shuffled, np.cumsum(sizes)[:-1])
  tv, tv_iid = _mean_tv_to_global(labels, 62), _mean_tv_to_global(iid, 62)
  assert tv > tv_iid + 0.2, (tv, tv_iid)  # Measured 0.75 vs 0.38.
  assert sizes.max() >= 2 * sizes.min(), sizes
  assert sizes.std() / sizes.mean() > 0.2, sizes
  # Per-client brightness/contrast: mean background level (pixels > 0.5)
  # differs across clients. Measured std 0.034 (0.002 without the shifts).
  backgrounds = [c['pixels'][c['pixels'] > 0.5].mean() for c in data.values()]
  assert np.std(backgrounds) > 0.015, backgrounds


def test_volume_skews_draw_their_laws():
  """The default law is the generator's from before the setting, draw for draw; the
  'shakespeare' law has real Shakespeare's median/mean (21 / 58.9) and its largest clients
  16 times the median."""

  def draws(volume, count=20000):
    rng = np.random.default_rng(0)
    return np.array([synthetic._client_volume(rng, volume) for _ in range(count)])

  z = np.random.default_rng(0).standard_normal(20000)
  np.testing.assert_array_equal(draws(synthetic.Volume.of(40)),
                                np.maximum(1, np.round(40 * np.exp(0.6 * z - 0.6**2 / 2))))
  sizes = draws(synthetic.Volume.of(1000, 'shakespeare'))
  assert sizes.mean() == pytest.approx(1000, rel=0.03)
  assert np.median(sizes) / sizes.mean() == pytest.approx(21 / 58.9, abs=0.015)
  cap = sizes.max()
  assert cap == pytest.approx(16 * np.median(sizes), rel=0.02)
  assert (sizes == cap).mean() == pytest.approx(0.0464, abs=0.005)  # P(1.65 Z > ln 16).


def _fit_and_evaluate(train_data, test_data, key, num_classes, scale):
  def pool(data):
    x = np.concatenate([c[key] for c in data.values()]).astype(np.float32)
    y = np.concatenate([c['label'] for c in data.values()])
    return x.reshape(len(x), -1) / scale - 0.5, y

  x_train, y_train = pool(train_data)
  x_test, y_test = pool(test_data)
  tf.keras.utils.set_random_seed(0)
  model = tf.keras.Sequential([tf.keras.layers.Dense(num_classes)])
  model.compile(
      optimizer=tf.keras.optimizers.SGD(0.05),
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      metrics=['accuracy'],
  )
  batch_size, steps = 32, 300
  epochs = int(np.ceil(steps * batch_size / len(x_train)))
  model.fit(x_train, y_train, batch_size=batch_size, epochs=epochs, verbose=0)
  return model.evaluate(x_test, y_test, verbose=0)[1]


def test_emnist_learnable(loaded):
  _, _, _, train_data, test_data = loaded('emnist')
  # Softmax regression, 300 SGD steps; measured 0.67 on test clients.
  accuracy = _fit_and_evaluate(train_data, test_data, 'pixels', 62, 1.0)
  assert accuracy > 0.4, accuracy  # Chance is 1/62 ~= 0.016.


def test_cifar100_learnable(loaded):
  _, _, _, train_data, test_data = loaded('cifar100')
  # Softmax regression, 300 SGD steps; measured 0.53 on test clients.
  accuracy = _fit_and_evaluate(train_data, test_data, 'image', 100, 255.0)
  assert accuracy > 0.25, accuracy  # Chance is 0.01.


def _texts(data):
  return {
      client_id: [s.decode('utf-8') for s in features['snippets']]
      for client_id, features in data.items()
  }


def _char_freq(text, vocab):
  counts = collections.Counter(text)
  return np.array([counts[c] for c in vocab], np.float64) / len(text)


def test_shakespeare_text_statistics(loaded):
  _, _, _, train_data, test_data = loaded('shakespeare')
  train_texts, test_texts = _texts(train_data), _texts(test_data)
  source_data = tff.simulation.datasets.shakespeare.get_synthetic()
  source = ''.join(
      e['snippets'].numpy().decode('utf-8')
      for client_id in source_data.client_ids
      for e in source_data.create_tf_dataset_for_client(client_id)
  )
  generated = ''.join(
      ''.join(s) for t in (train_texts, test_texts) for s in t.values()
  )
  vocab = sorted(set(source))
  assert set(generated) <= set(vocab)
  tv = 0.5 * np.abs(
      _char_freq(generated, vocab) - _char_freq(source, vocab)
  ).sum()
  assert tv < 0.15, tv  # Measured 0.05.
  chars_per_client = [sum(map(len, s)) for s in train_texts.values()]
  assert 200 <= np.median(chars_per_client) <= 5000, chars_per_client
  # Per-client snippet lengths differ (heterogeneous style).
  mean_lengths = [np.mean([len(x) for x in s]) for s in train_texts.values()]
  assert np.std(mean_lengths) / np.mean(mean_lengths) > 0.2, mean_lengths


def test_shakespeare_bigram_beats_uniform(loaded):
  _, _, _, train_data, test_data = loaded('shakespeare')
  train = [s for v in _texts(train_data).values() for s in v]
  test = [s for v in _texts(test_data).values() for s in v]
  vocab = sorted(set(''.join(train + test)))
  index = {c: i for i, c in enumerate(vocab)}
  bigram = np.ones((len(vocab), len(vocab)))  # Add-one smoothing.
  unigram = np.ones(len(vocab))
  for snippet in train:
    for prev, nxt in zip(snippet, snippet[1:]):
      bigram[index[prev], index[nxt]] += 1
      unigram[index[nxt]] += 1
  bigram /= bigram.sum(axis=1, keepdims=True)
  unigram /= unigram.sum()
  pairs = [(index[a], index[b]) for s in test for a, b in zip(s, s[1:])]
  bigram_ce = -np.mean([np.log(bigram[a, b]) for a, b in pairs])
  unigram_ce = -np.mean([np.log(unigram[b]) for _, b in pairs])
  uniform_ce = np.log(len(vocab))
  # Measured: uniform 3.64, unigram 3.15, bigram 2.27 nats per character.
  assert bigram_ce < 0.75 * uniform_ce, (bigram_ce, uniform_ce)
  assert bigram_ce < unigram_ce - 0.4, (bigram_ce, unigram_ce)


@pytest.mark.parametrize(
    'kwargs, message',
    [
        (dict(task_name='mnist'), 'cifar100'),
        (dict(num_train_clients=0),
         'num_train_clients must be an integer >= 1, got 0'),
        (dict(num_test_clients=-1),
         'num_test_clients must be an integer >= 1, got -1'),
        (dict(mean_examples_per_client=0),
         'mean_examples_per_client must be an integer >= 1, got 0'),
        (dict(mean_examples_per_client=2.5),
         'mean_examples_per_client must be an integer >= 1, got 2.5'),
        (dict(dirichlet_alpha=0.0), 'dirichlet_alpha must be > 0, got 0.0'),
        (dict(dirichlet_alpha=float('inf')),
         'dirichlet_alpha must be > 0, got inf'),
        (dict(seed=-1), 'seed must be an integer >= 0, got -1'),
        (dict(volume_skew='zipf'),
         r"volume_skew must be one of \['lognormal', 'shakespeare'\], got 'zipf'"),
    ],
)
def test_bad_arguments_raise(tmp_path, kwargs, message):
  args = dict(task_name='emnist', **_TINY)
  args.update(kwargs)
  task_name = args.pop('task_name')
  with pytest.raises(ValueError, match=message):
    synthetic.ensure_synthetic_cache_dir(task_name, str(tmp_path), **args)
  with pytest.raises(ValueError, match=message):
    synthetic.write_synthetic_sqlite(
        task_name, str(tmp_path / 'x.sqlite'), **args
    )
  assert not os.listdir(tmp_path)


def test_generating_and_loading_starts_no_tff_worker(tmp_path):
  # Other tests in the session may hold a managed worker; none may be added here.
  before = worker_processes.worker_pids(live=False)
  directory = synthetic.ensure_synthetic_cache_dir(
      'emnist', str(tmp_path), num_train_clients=2, num_test_clients=1,
      mean_examples_per_client=3,
  )
  train, _ = tff.simulation.datasets.emnist.load_data(only_digits=False, cache_dir=directory)
  list(train.create_tf_dataset_for_client(train.client_ids[0]))
  assert worker_processes.worker_pids(live=False) <= before
