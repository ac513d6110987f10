"""The work a round asks of a federation, known before training: each training client's
local steps (batches), and a round's over its sampled cohort.

A client's round is `num_epochs` passes over its n examples in a shuffled order, cut at
`max_elements` examples, made into the model's inputs (one per image; for Shakespeare,
`preprocessing.shakespeare_sequences` per snippet) and batched by `batch_size`, the last
batch partial: ceil(inputs / B) steps (`client_steps`). A round trains a cohort of K of
the N clients drawn uniformly without replacement (`launch.run.experiment`), so its steps
are a sum whose mean and spread follow from the clients' steps alone (`round_steps`).
"""

import contextlib
import math
import sqlite3
from typing import Optional

import numpy as np
import tensorflow as tf

from tasks import preprocessing


def client_steps(examples, inputs, num_epochs: int, batch_size: int,
                 max_elements: Optional[int] = None) -> np.ndarray:
  """Each client's steps a round: ceil(T / B), T the inputs of the examples it takes.

  A client of n examples and P inputs takes all E passes, T = E P, unless `max_elements`
  M < E n cuts them: it then takes q = M // n whole passes and r = M % n examples of the
  next, T = q P + r P / n. Where every example makes one input (images), that is exact;
  where examples make unequal numbers (Shakespeare's snippets), r P / n is the mean over
  the shuffles of what r examples make, and a step is a mean, to within one.

  Args:
    examples: n of each client.
    inputs: P of each client (= n where every example makes one input).
    num_epochs: E, local passes a round.
    batch_size: B.
    max_elements: M, the cap on examples a round (after repeating); None: no cap.

  Returns:
    A float array of each client's steps.
  """
  n = np.asarray(examples, dtype=np.float64)
  p = np.asarray(inputs, dtype=np.float64)
  taken = num_epochs * p
  if max_elements is not None:
    passes, rest = np.divmod(float(max_elements), np.maximum(n, 1.0))
    capped = passes * p + rest * p / np.maximum(n, 1.0)
    taken = np.where(max_elements < num_epochs * n, capped, taken)
  return np.ceil(taken / batch_size)


def round_steps(steps, clients_per_round: int) -> tuple[float, float]:
  """The mean and standard deviation of a round's steps, the sum of the steps of K
  clients drawn uniformly without replacement from the N whose `steps` are given.

  For a sum of K draws without replacement from values s_1..s_N of mean mu and variance
  sigma^2 = mean((s - mu)^2): mean K mu, variance K sigma^2 (N - K) / (N - 1) (0 when
  K >= N: every client trains every round).
  """
  s = np.asarray(steps, dtype=np.float64)
  count = len(s)
  k = min(clients_per_round, count)
  if k == 0:
    return 0.0, 0.0
  variance = 0.0 if k >= count else k * s.var() * (count - k) / (count - 1)
  return float(k * s.mean()), math.sqrt(variance)


def client_volumes(task_name: str, database_path: str,
                   split: str) -> tuple[np.ndarray, np.ndarray]:
  """(n, P) of each client of `split` in a TFF SQLite file (`client_steps`'s examples and
  inputs), in the order of the client ids: the examples from `client_metadata`, and for
  Shakespeare the sequences its snippets make."""
  uri = f'file:{database_path}?mode=ro'
  with contextlib.closing(sqlite3.connect(uri, uri=True)) as con:
    rows = con.execute('SELECT client_id, num_examples FROM client_metadata'
                       ' WHERE split_name = ? ORDER BY client_id', (split,)).fetchall()
    examples = np.array([n for _, n in rows], dtype=np.int64)
    if task_name != 'shakespeare':
      return examples, examples
    index = {client_id: i for i, (client_id, _) in enumerate(rows)}
    inputs = np.zeros(len(rows), dtype=np.int64)
    for client_id, proto in con.execute(
        'SELECT client_id, serialized_example_proto FROM examples WHERE split_name = ?',
        (split,)):
      snippet = tf.train.Example.FromString(proto).features.feature['snippets']
      inputs[index[client_id]] += preprocessing.shakespeare_sequences(
          len(snippet.bytes_list.value[0]))
  return examples, inputs
