"""Clients' examples held in memory: read from their `ClientData` once, then reused.

A round's client datasets are made from these (`preprocessing.Preprocess.from_tensors`):
reading a client through TFF's loader costs a dataset, a traced parse function and an
iteration each time, which a run whose clients come back round after round pays once. The
memory is bounded: past `max_bytes`, the clients read longest ago are dropped (read again
when they come back), so full EMNIST (about 2 GiB of float32 pixels) never needs it all.
"""

import collections
import threading

import tensorflow as tf

from tasks import preprocessing

# Bytes of examples kept: all of CIFAR-100's and Shakespeare's training clients, and half of
# EMNIST's; a run's sampled clients come back at random, so a partial store still pays.
DEFAULT_MAX_BYTES = 1 << 30
# Examples read at a time: tf.data allocates a batch's whole buffer before it fills it.
_READ_BATCH = 1024


def read_client(dataset: tf.data.Dataset) -> preprocessing.ClientTensors:
  """All examples of one client's `dataset`, in its order, as tensors with a leading
  example axis."""
  parts = list(dataset.batch(_READ_BATCH))
  if not parts:  # No examples: empty tensors of the element's shapes.
    return {k: tf.zeros([0, *spec.shape], spec.dtype)
            for k, spec in dataset.element_spec.items()}
  return {k: tf.concat([p[k] for p in parts], 0) for k in parts[0]}


class ClientTensors:
  """`store(client_id)`: that client's examples (`read_client`), kept while they fit."""

  def __init__(self, client_data, max_bytes: int = DEFAULT_MAX_BYTES):
    self._client_data = client_data
    self._max_bytes = max_bytes
    # client id -> (its examples, their bytes), the client read longest ago first.
    self._kept: collections.OrderedDict = collections.OrderedDict()
    self._bytes = 0
    self._lock = threading.Lock()  # A warm slot's batched runs share one store.

  def __call__(self, client_id: str) -> preprocessing.ClientTensors:
    with self._lock:
      if client_id in self._kept:
        self._kept.move_to_end(client_id)
        return self._kept[client_id][0]
    client = read_client(self._client_data.create_tf_dataset_for_client(client_id))
    size = _nbytes(client)
    with self._lock:
      if size <= self._max_bytes and client_id not in self._kept:
        self._kept[client_id] = client, size
        self._bytes += size
        while self._bytes > self._max_bytes:
          _, (_, dropped_size) = self._kept.popitem(last=False)
          self._bytes -= dropped_size
    return client


def _nbytes(client: preprocessing.ClientTensors) -> int:
  return sum(int(tf.reduce_sum(tf.strings.length(t))) if t.dtype == tf.string
             else t.numpy().nbytes for t in client.values())
