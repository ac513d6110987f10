"""Times one training step of the Shakespeare GRU: Keras's GRU against the package's time loop.

  .venv/bin/python scripts/benchmark_gru.py [--batch=4] [--repeats=10]

Both models have the same weights (`tasks.models.shakespeare_gru` and the same model built with
`tf.keras.layers.GRU`). For each it prints the seconds of a forward pass and of a forward and
backward pass, traced in a `tf.function` as TFF's client work is, the two interleaved repeat by
repeat so that both see the same machine; then the ratio of the medians. It also checks that the
two give the same loss and gradients (to 1e-4 of each gradient's largest entry).
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tasks import models  # pylint: disable=g-import-not-at-top,wrong-import-position


def _keras_model(sequence_length: int) -> tf.keras.Model:
  """`models.shakespeare_gru`'s layers with Keras's own GRU."""
  return tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(sequence_length,), dtype=tf.int64),
      tf.keras.layers.Embedding(models.SHAKESPEARE_VOCAB_SIZE, 256),
      tf.keras.layers.GRU(1024, return_sequences=True),
      tf.keras.layers.Dense(models.SHAKESPEARE_VOCAB_SIZE),
  ])


def _steps(model, ids, targets):
  loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

  @tf.function
  def forward():
    return loss_fn(targets, model(ids))

  @tf.function
  def forward_backward():
    with tf.GradientTape() as tape:
      loss = loss_fn(targets, model(ids))
    return loss, [tf.convert_to_tensor(g) for g in tape.gradient(loss, model.trainable_variables)]

  return forward, forward_backward


def _seconds(fn) -> float:
  start = time.perf_counter()
  tf.nest.map_structure(lambda t: t.numpy(), fn())
  return time.perf_counter() - start


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--batch', type=int, default=4)
  parser.add_argument('--repeats', type=int, default=10)
  parser.add_argument('--sequence_length', type=int, default=80)
  args = parser.parse_args()
  ours = models.shakespeare_gru(sequence_length=args.sequence_length)
  keras = _keras_model(args.sequence_length)
  keras.set_weights(ours.get_weights())
  rng = np.random.default_rng(0)
  ids, targets = (
      tf.constant(rng.integers(0, models.SHAKESPEARE_VOCAB_SIZE, (args.batch, args.sequence_length)))
      for _ in range(2)
  )
  contenders = {'keras': _steps(keras, ids, targets), 'time_loop': _steps(ours, ids, targets)}
  (keras_loss, keras_grads), (loss, grads) = (c[1]() for c in contenders.values())
  np.testing.assert_allclose(loss, keras_loss, rtol=1e-5)
  for g, k in zip(grads, keras_grads, strict=True):
    np.testing.assert_allclose(g, k, rtol=0, atol=1e-4 * np.abs(k).max())
  times = {(name, kind): [] for name in contenders for kind in ('forward', 'forward+backward')}
  for _ in range(args.repeats):
    for name, (forward, forward_backward) in contenders.items():
      times[name, 'forward'].append(_seconds(forward))
      times[name, 'forward+backward'].append(_seconds(forward_backward))
  print(f'batch {args.batch}, sequence {args.sequence_length}, {args.repeats} repeats (median s):')
  for (name, kind), seconds in times.items():
    print(f'  {name:10s} {kind:17s} {statistics.median(seconds):.4f}')
  for kind in ('forward', 'forward+backward'):
    ratio = statistics.median(times['time_loop', kind]) / statistics.median(times['keras', kind])
    print(f'time_loop / keras, {kind}: {ratio:.2f}')


if __name__ == '__main__':
  main()
