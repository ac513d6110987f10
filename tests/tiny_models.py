"""A TFF model from a small Keras image classifier, shared by the tests that need one."""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


def image_model_fn(keras_model_fn, image_shape):
  """`model_fn` of `keras_model_fn()` on `{x: float32 images, y: int32 labels}` batches."""

  def model_fn():
    return tff.learning.models.from_keras_model(
        keras_model_fn(),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=collections.OrderedDict(
            x=tf.TensorSpec((None,) + tuple(image_shape), tf.float32),
            y=tf.TensorSpec([None], tf.int32),
        ),
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy()],
    )

  return model_fn


def softmax_regression_model_fn(features: int, classes: int):
  """`model_fn` of `x @ W + b` (seeded), mean softmax cross-entropy, accuracy metric."""

  def model_fn():
    keras_model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(features,)),
        tf.keras.layers.Dense(
            classes, kernel_initializer=tf.keras.initializers.RandomNormal(seed=1),
            bias_initializer=tf.keras.initializers.RandomNormal(seed=2),
        ),
    ])
    return tff.learning.models.from_keras_model(
        keras_model,
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=collections.OrderedDict(
            x=tf.TensorSpec([None, features], tf.float32), y=tf.TensorSpec([None], tf.int32)
        ),
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy()],
    )

  return model_fn


def np_softmax_regression_gradient(weights, x, y):
  """The gradient of the mean softmax cross-entropy of `x @ W + b`, by hand: [dW, db]."""
  kernel, bias = weights
  logits = x @ kernel + bias
  p = np.exp(logits - logits.max(axis=1, keepdims=True))
  p /= p.sum(axis=1, keepdims=True)
  p[np.arange(len(y)), y] -= 1.0
  return [x.T @ p / len(y), p.mean(axis=0)]


def np_project(g):
  """The zero-mean projection (specification.md section 1), float64: centre over all axes
  but the last."""
  g = np.asarray(g, np.float64)
  return g - g.mean(axis=tuple(range(g.ndim - 1)), keepdims=True)
