"""The class labels of a task's raw examples, for heterogeneity statistics.

EMNIST and CIFAR-100 examples carry one class label each (`label`: 62 and 100 fine
classes). A Shakespeare example is a snippet whose characters are the next-character
targets: its labels are the ids of its characters in the 66-id vocabulary (65 characters
plus the out-of-vocabulary id), so a client's volume is its number of characters.
"""

from typing import Iterator, Sequence

import numpy as np
import tensorflow as tf

from tasks import preprocessing

NUM_CLASSES = {
    'emnist': 62,
    'cifar100': 100,
    'shakespeare': preprocessing.SHAKESPEARE_OOV_ID + 1,
}


def example_labels(task_name: str, dataset: tf.data.Dataset) -> tf.data.Dataset:
  """Maps each raw example to the int64 vector of its labels (length 1 for images)."""
  if task_name not in NUM_CLASSES:
    raise ValueError(f'Unknown task {task_name!r}; choose one of {sorted(NUM_CLASSES)}.')
  if task_name == 'shakespeare':
    return dataset.map(lambda e: preprocessing.shakespeare_char_ids(e['snippets']))
  return dataset.map(lambda e: tf.reshape(tf.cast(e['label'], tf.int64), [1]))


def _counter(task_name: str):
  """dataset -> (class counts, number of raw examples), as one TF reduction."""
  num_classes = NUM_CLASSES[task_name]

  def add(state, labels):
    counts, n = state
    labels = tf.cast(labels, tf.int32)
    return counts + tf.math.bincount(
        labels, minlength=num_classes, maxlength=num_classes, dtype=tf.int64
    ), n + 1

  def count(dataset):
    return example_labels(task_name, dataset).reduce(
        (tf.zeros([num_classes], tf.int64), tf.constant(0, tf.int64)), add
    )

  return count


def count_labels(task_name: str, dataset: tf.data.Dataset) -> tuple[np.ndarray, int]:
  """(class counts of length NUM_CLASSES[task_name], number of raw examples)."""
  counts, n = _counter(task_name)(dataset)
  return counts.numpy(), int(n)


def client_label_counts(
    task_name: str, client_data, client_ids: Sequence[str]
) -> Iterator[tuple[np.ndarray, int]]:
  """`count_labels` of each client's dataset, in order, traced once for all clients."""
  count = _counter(task_name)
  per_client = tf.data.Dataset.from_tensor_slices(list(client_ids)).map(
      lambda cid: count(client_data.serializable_dataset_fn(cid))
  )
  for counts, n in per_client:
    yield counts.numpy(), int(n)
