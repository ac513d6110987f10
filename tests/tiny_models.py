"""A TFF model from a small Keras image classifier, shared by the tests that need one."""

import collections

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
