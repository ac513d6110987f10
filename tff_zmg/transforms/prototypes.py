"""Class prototypes in a model's feature space (FedGPS, specification.md section 2).

A model `theta = h o psi` is split into the feature extractor `psi` (every layer but
the last Dense) and the classifier `h` (the last Dense). The prototype of class `c`
is the mean feature of the examples of class `c`:

    P_c = sum_{i: y_i = c} psi(x_i) / n_c          (n_c = #{i: y_i = c})

Distances between two sets of prototypes are mean squared errors over the classes
both have; the server merges clients' prototypes weighted by their counts.
"""

import tensorflow as tf


def split_model(keras_model: tf.keras.Model):
  """`(psi, h)`: the feature extractor and the classifier of `keras_model`.

  `psi` is a Keras model from the model's input to the input of its last layer
  (sharing its variables), `h` the last layer, so `keras_model(x) == h(psi(x))`.

  Raises:
    ValueError: If the last layer is not a `Dense` layer on rank-2 features.
  """
  classifier = keras_model.layers[-1] if keras_model.layers else None
  if not isinstance(classifier, tf.keras.layers.Dense):
    raise ValueError(
        'the model must end in a Dense classifier layer, got'
        f' {type(classifier).__name__} as the last layer of {keras_model.name}'
    )
  features = classifier.input
  if features.shape.rank != 2:
    raise ValueError(
        'the classifier must act on a feature vector per example, got features'
        f' of shape {features.shape} in {keras_model.name}'
    )
  return tf.keras.Model(keras_model.inputs, features), classifier


def class_prototypes(features, labels, num_classes: int):
  """`(P, n)`: per-class mean features `[C, F]` and counts `[C]` (float32).

  `P_c = sum_{y_i = c} f_i / n_c`, and `P_c = 0` for a class with `n_c = 0`.
  """
  labels = tf.cast(labels, tf.int32)
  sums = tf.math.unsorted_segment_sum(features, labels, num_classes)
  counts = tf.math.unsorted_segment_sum(
      tf.ones_like(labels, tf.float32), labels, num_classes
  )
  return tf.math.divide_no_nan(sums, counts[:, tf.newaxis]), counts


def prototype_distance(a, b, mask):
  """Mean squared error between prototypes `a`, `b` `[C, F]` over masked classes.

      d(a, b) = sum_{c in M} sum_f (a_cf - b_cf)^2 / (|M| * F),   0 if M is empty,

  with `M = {c: mask_c}`.
  """
  mask = tf.cast(mask, a.dtype)
  per_class = tf.reduce_mean(tf.square(a - b), axis=1)
  return tf.math.divide_no_nan(
      tf.reduce_sum(mask * per_class), tf.reduce_sum(mask)
  )


def merge_prototypes(weighted_sums, counts, previous, previous_counts):
  """The count-weighted mean of clients' prototypes, `(P, n)`.

  With `weighted_sums = sum_k n_kc P_kc` and `counts = sum_k n_kc` over this
  round's clients:

      P_c = weighted_sums_c / counts_c,  n_c = counts_c      if counts_c > 0
      P_c = previous_c,                  n_c = previous_n_c  otherwise

  (a class no client saw this round keeps its last prototype).
  """
  seen = counts > 0
  merged = tf.where(
      seen[:, tf.newaxis],
      tf.math.divide_no_nan(weighted_sums, counts[:, tf.newaxis]),
      previous,
  )
  return merged, tf.where(seen, counts, previous_counts)
