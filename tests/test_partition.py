"""Dirichlet re-partitioning: the pure split, the re-written TFF files, the flags."""

from absl import flags
import numpy as np
import pytest

from launch.run import settings as run_settings
import tasks
from tasks import partition
from tff_zmg import analysis


def _labels(n=3000, classes=20, seed=0):
  return np.random.default_rng(seed).integers(0, classes, size=n)


def test_every_example_is_used_exactly_once_and_no_client_is_empty():
  labels = _labels(n=1003)
  parts = partition.dirichlet_partition(labels, num_clients=10, alpha=0.1, seed=0)
  assert len(parts) == 10
  np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(1003))
  assert sorted(len(p) for p in parts) == [100] * 7 + [101] * 3  # 1003 = 10 * 100 + 3.
  assert [len(p) for p in parts[:3]] == [101] * 3


def test_partition_is_deterministic_per_seed():
  labels = _labels()
  a = partition.dirichlet_partition(labels, 30, 0.5, seed=7)
  b = partition.dirichlet_partition(labels, 30, 0.5, seed=7)
  c = partition.dirichlet_partition(labels, 30, 0.5, seed=8)
  assert all(np.array_equal(x, y) for x, y in zip(a, b))
  assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def _mean_skew(labels, alpha, classes=20):
  parts = partition.dirichlet_partition(labels, 30, alpha, seed=0)
  global_counts = np.bincount(labels, minlength=classes)
  counts = [np.bincount(labels[p], minlength=classes) for p in parts]
  return (
      np.mean([analysis.normalized_entropy(c) for c in counts]),
      np.mean([analysis.kl_divergence(c, global_counts) for c in counts]),
  )


def test_smaller_alpha_gives_more_skewed_clients():
  labels = _labels()
  entropy, kl = zip(*[_mean_skew(labels, alpha) for alpha in (100.0, 1.0, 0.1, 0.01)])
  assert all(np.diff(entropy) < 0), entropy
  assert all(np.diff(kl) > 0), kl
  assert entropy[0] > 0.95 and entropy[-1] < 0.5


def test_classes_absent_from_the_labels_get_no_weight():
  labels = np.repeat([3, 7], [40, 60])
  parts = partition.dirichlet_partition(labels, 4, 1.0, seed=1)
  assert sorted(np.concatenate(parts).tolist()) == list(range(100))
  assert set(labels[np.concatenate(parts)]) == {3, 7}
  np.testing.assert_array_equal(partition.dirichlet_partition(labels, 1, 0.1)[0], np.arange(100))


@pytest.mark.parametrize(
    'kwargs, message',
    [
        (dict(num_clients=11), 'num_clients must be <='),
        (dict(num_clients=0), 'num_clients'),
        (dict(alpha=0.0), 'alpha must be > 0'),
        (dict(labels=[0.5, 1.5]), 'integers'),
    ],
)
def test_bad_partition_arguments(kwargs, message):
  args = dict(labels=np.arange(10), num_clients=2, alpha=1.0)
  args.update(kwargs)
  with pytest.raises(ValueError, match=message):
    partition.dirichlet_partition(**args)


def _pooled(client_data):
  """Every example of every client, as a sorted list of (label, pixel bytes)."""
  return sorted(
      (int(e['label']), e['pixels'].numpy().tobytes())
      for cid in client_data.client_ids
      for e in client_data.create_tf_dataset_for_client(cid)
  )


def _by_client(client_data):
  return {
      cid: [int(e['label']) for e in client_data.create_tf_dataset_for_client(cid)]
      for cid in client_data.client_ids
  }


def test_repartitioned_task_keeps_every_example_and_the_test_split(small_task, tmp_path):
  original = small_task('emnist')
  split = small_task('emnist', partition='dirichlet', dirichlet_alpha=0.3, num_clients=5)
  train = split.datasets.train_data
  assert train.client_ids == [f'client_{k:05d}' for k in range(5)]
  assert _pooled(train) == _pooled(original.datasets.train_data)
  sizes = [len(v) for v in _by_client(train).values()]
  assert sum(sizes) == len(_pooled(train)) and max(sizes) - min(sizes) <= 1
  assert split.datasets.test_data.client_ids == original.datasets.test_data.client_ids
  assert _pooled(split.datasets.test_data) == _pooled(original.datasets.test_data)
  # Another seed deals differently; the same settings built elsewhere deal the same.
  other = small_task('emnist', partition='dirichlet', dirichlet_alpha=0.3, num_clients=5,
                     partition_seed=1)
  assert _by_client(other.datasets.train_data) != _by_client(train)
  settings = dict(num_train_clients=8, num_test_clients=3, mean_examples_per_client=20)
  rebuilt = tasks.get('emnist', data_source='synthetic', cache_dir=str(tmp_path),
                      synthetic_settings=settings, partition='dirichlet',
                      dirichlet_alpha=0.3, num_clients=5)
  assert _by_client(rebuilt.datasets.train_data) == _by_client(train)


def test_partition_requests_that_cannot_work(small_task):
  with pytest.raises(ValueError, match='image'):
    small_task('shakespeare', partition='dirichlet', dirichlet_alpha=0.1, num_clients=3)
  with pytest.raises(ValueError, match='only apply'):
    small_task('emnist', dirichlet_alpha=0.1)
  with pytest.raises(ValueError, match='needs dirichlet_alpha'):
    small_task('emnist', partition='dirichlet', num_clients=3)
  with pytest.raises(ValueError, match='Unknown partition'):
    small_task('emnist', partition='iid', dirichlet_alpha=0.1, num_clients=3)


@pytest.fixture
def parse_train_flags():
  def parse(*args):
    flags.FLAGS.unparse_flags()
    flags.FLAGS(['train', '--task=emnist', '--algo=fedavg', *args])
    return run_settings.config_of(run_settings.settings_from_flags())

  yield parse
  flags.FLAGS.unparse_flags()


def test_training_flags_reach_the_config(parse_train_flags):
  config = parse_train_flags()
  assert (config.partition, config.dirichlet_alpha, config.num_clients,
          config.partition_seed) == (None, None, None, None)
  config = parse_train_flags('--partition=dirichlet', '--num_clients=50', '--seed=3')
  assert (config.partition, config.dirichlet_alpha, config.num_clients,
          config.partition_seed, config.seed) == ('dirichlet', 0.1, 50, 0, 3)
  with pytest.raises(ValueError, match='--dirichlet_alpha only applies'):
    parse_train_flags('--dirichlet_alpha=0.5')
