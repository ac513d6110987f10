"""A round's client datasets made from the clients held in memory
(`tasks/client_tensors.py`, `Preprocess.from_tensors`) are the tf.data pipeline's batches:
the same order, values and types, for every task, shuffle seed, epoch count and cap."""

import numpy as np
import pytest
import tensorflow as tf

from tasks import client_tensors
from tasks import preprocessing


def _batches(dataset):
  return [{k: (v.dtype, v.numpy()) for k, v in batch.items()} for batch in dataset]


def _assert_same(ours, theirs):
  assert ours.element_spec == theirs.element_spec
  ours, theirs = _batches(ours), _batches(theirs)
  assert len(ours) == len(theirs) and ours
  for a, b in zip(ours, theirs):
    assert a.keys() == b.keys()
    for k in a:
      assert a[k][0] == b[k][0] and np.array_equal(a[k][1], b[k][1]), k


@pytest.mark.parametrize('name', ['emnist', 'cifar100', 'shakespeare'])
@pytest.mark.parametrize('num_epochs,max_elements', [(1, None), (3, None), (2, 5)])
def test_from_tensors_equals_the_pipeline(small_task, name, num_epochs, max_elements):
  task = small_task(name, num_epochs=num_epochs, max_elements=max_elements)
  data = task.datasets.train_data
  for client_id in data.client_ids[:3]:
    for seed in (None, 0, 12345):
      preprocess = task.train_preprocess_fn_for_seed(seed)
      _assert_same(preprocess.from_tensors(task.train_client_tensors(client_id)),
                   preprocess(data.create_tf_dataset_for_client(client_id)))


def test_pass_order_cuts_blocks_as_the_seeded_shuffle_does():
  values = tf.data.Dataset.range(23)
  shuffled = preprocessing.seeded_shuffle(values, seed=7, num_epochs=2, block_size=5)
  order = preprocessing.pass_order(23, 7, num_epochs=2, max_elements=None, block_size=5)
  assert list(shuffled.as_numpy_iterator()) == list(order.numpy())


def test_the_store_drops_the_client_read_longest_ago_past_its_bytes(small_task):
  data = small_task('emnist').datasets.train_data
  first, second, third = data.client_ids[:3]
  one, two = (client_tensors.read_client(data.create_tf_dataset_for_client(c))
              for c in (first, second))
  nbytes = lambda client: sum(t.numpy().nbytes for t in client.values())
  store = client_tensors.ClientTensors(data, max_bytes=nbytes(one) + nbytes(two))
  assert store(first) is store(first)  # Kept.
  kept_first = store(first)
  store(second)
  store(third)  # Past the bytes: the first read goes.
  again = store(first)
  assert again is not kept_first
  np.testing.assert_array_equal(again['pixels'].numpy(), one['pixels'].numpy())
