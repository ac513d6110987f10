"""Tests for the zero-mean projection and layer masks (specification.md s. 1)."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import models
from tff_zmg.transforms import projection

# Keras-layout shapes of the papers' rank >= 2 weights.
KERNEL_SHAPES = {
    'dense': (3136, 512),
    'conv2d': (5, 5, 32, 64),
    'gru_kernel': (256, 3072),
    'gru_recurrent_kernel': (1024, 3072),
    'embedding': (66, 256),
}


def _random(shape, seed=0):
  return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def _numpy_projection(g):
  return g - g.mean(axis=tuple(range(g.ndim - 1)), keepdims=True)


@pytest.mark.parametrize('shape', KERNEL_SHAPES.values(), ids=KERNEL_SHAPES)
def test_projected_columns_have_zero_mean(shape):
  (projected,) = projection.zero_mean_projection([tf.constant(_random(shape))])
  means = projected.numpy().mean(axis=tuple(range(len(shape) - 1)))
  assert means.shape == (shape[-1],)
  np.testing.assert_allclose(means, 0.0, atol=1e-6)


@pytest.mark.parametrize('shape', KERNEL_SHAPES.values(), ids=KERNEL_SHAPES)
def test_projection_matches_numpy(shape):
  g = _random(shape, seed=1)
  (projected,) = projection.zero_mean_projection([tf.constant(g)])
  np.testing.assert_allclose(
      projected.numpy(), _numpy_projection(g.astype(np.float64)), atol=1e-5
  )


@pytest.mark.parametrize('shape', KERNEL_SHAPES.values(), ids=KERNEL_SHAPES)
def test_projection_is_idempotent(shape):
  g = tf.constant(_random(shape, seed=2))
  once = projection.zero_mean_projection(g)
  twice = projection.zero_mean_projection(once)
  np.testing.assert_allclose(twice.numpy(), once.numpy(), atol=1e-6)


def test_indexed_slices_embedding_gradient_is_densified_and_projected():
  table = tf.Variable(_random((66, 8), seed=3))
  ids = tf.constant([3, 7, 7, 20])
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(tf.gather(table, ids) ** 2)
  grad = tape.gradient(loss, table)
  assert isinstance(grad, tf.IndexedSlices)
  dense = np.zeros((66, 8), np.float64)
  for i in ids.numpy():
    dense[i] += 2.0 * table.numpy()[i]
  (projected,) = projection.zero_mean_projection([grad])
  assert isinstance(projected, tf.Tensor)
  np.testing.assert_allclose(projected.numpy(), _numpy_projection(dense),
                             atol=1e-5)
  np.testing.assert_allclose(projected.numpy().mean(axis=0), 0.0, atol=1e-6)


def test_biases_are_unchanged_by_default():
  bias = _random((64,), seed=4)
  scalar = np.float32(2.5)
  out_bias, out_scalar = projection.zero_mean_projection(
      (tf.constant(bias), tf.constant(scalar))
  )
  np.testing.assert_array_equal(out_bias.numpy(), bias)
  assert out_scalar.numpy() == scalar


def test_biases_are_centred_with_center_vectors():
  bias = _random((64,), seed=5)
  (out,) = projection.zero_mean_projection(
      [tf.constant(bias)], center_vectors=True
  )
  np.testing.assert_allclose(out.numpy(), bias - bias.mean(), atol=1e-6)
  assert abs(bias.mean()) > 1e-3  # Otherwise the test could not fail.


def test_mask_false_leaves_tensor_untouched():
  kernel, conv = _random((4, 3), seed=6), _random((3, 3, 2, 4), seed=7)
  out_kernel, out_conv = projection.zero_mean_projection(
      [tf.constant(kernel), tf.constant(conv)], mask=(False, True)
  )
  np.testing.assert_array_equal(out_kernel.numpy(), kernel)
  np.testing.assert_allclose(out_conv.numpy(), _numpy_projection(conv),
                             atol=1e-6)


def test_projection_keeps_nested_structure():
  tree = {'a': [tf.constant(_random((4, 3)))], 'b': tf.constant([1.0, 2.0])}
  out = projection.zero_mean_projection(tree)
  tf.nest.assert_same_structure(tree, out)
  np.testing.assert_allclose(out['a'][0].numpy().mean(axis=0), 0.0, atol=1e-6)


def test_mask_length_mismatch_raises():
  with pytest.raises(ValueError, match='mask'):
    projection.zero_mean_projection(
        [tf.zeros([2, 2]), tf.zeros([2])], mask=(True,)
    )


def test_non_bool_mask_entry_raises():
  with pytest.raises(ValueError, match=r'mask\[1\]'):
    projection.zero_mean_projection(
        [tf.zeros([2, 2]), tf.zeros([2])], mask=(True, 1)
    )


# Layer masks on the task models' trainable variables.


@pytest.fixture(scope='module')
def emnist():
  return models.emnist_cnn().trainable_variables


@pytest.fixture(scope='module')
def cifar100():
  return models.cifar100_cnn().trainable_variables


@pytest.fixture(scope='module')
def shakespeare():
  return models.shakespeare_gru().trainable_variables


def test_emnist_trainable_variables_are_as_documented(emnist):
  shapes = [tuple(v.shape) for v in emnist]
  assert shapes == [(5, 5, 1, 32), (32,), (5, 5, 32, 64), (64,),
                    (3136, 512), (512,), (512, 62), (62,)]


def test_default_mask_is_every_layer_but_the_last(emnist):
  assert projection.layer_borderline_mask(emnist) == (
      True, True, True, True, True, True, False, False)
  assert projection.classifier_layer_mask(emnist) == (
      False, False, False, False, False, False, True, True)


def test_half_borderline_on_emnist_selects_first_two_layers(emnist):
  assert projection.layer_borderline_mask(emnist, gc_lambda=0.5) == (
      True, True, True, True, False, False, False, False)
  assert projection.classifier_layer_mask(emnist, gc_lambda=0.5) == (
      False, False, False, False, True, True, True, True)


@pytest.mark.parametrize('gc_lambda, expected', [(0.0, False), (1.0, True)])
def test_borderline_zero_selects_none_and_one_selects_all(
    emnist, cifar100, shakespeare, gc_lambda, expected):
  for variables in (emnist, cifar100, shakespeare):
    mask = projection.layer_borderline_mask(variables, gc_lambda=gc_lambda)
    assert mask == (expected,) * len(variables)


def test_cifar100_default_mask_covers_five_of_six_layers(cifar100):
  assert len(cifar100) == 12
  assert projection.layer_borderline_mask(cifar100) == (True,) * 10 + (
      False,) * 2
  # floor(0.5 * 6) = 3 layers: the first three convolutions.
  assert projection.layer_borderline_mask(cifar100, gc_lambda=0.5) == (
      True,) * 6 + (False,) * 6


def test_gru_tensors_share_one_mask_value(shakespeare):
  shapes = [tuple(v.shape) for v in shakespeare]
  assert shapes == [(66, 256), (256, 3072), (1024, 3072), (2, 3072),
                    (1024, 66), (66,)]
  # L = 3: floor(0.5 * 3) = 1 (the embedding), floor(0.7 * 3) = 2.
  assert projection.layer_borderline_mask(shakespeare) == (
      True, True, True, True, False, False)
  assert projection.layer_borderline_mask(shakespeare, gc_lambda=0.5) == (
      True, False, False, False, False, False)
  assert projection.layer_borderline_mask(shakespeare, gc_lambda=0.7) == (
      True, True, True, True, False, False)


def test_weight_matrix_mask_selects_kernels_not_biases(emnist, shakespeare):
  assert projection.weight_matrix_mask(emnist) == (True, False) * 4
  # The GRU's rank-2 bias [2, 3072] is a bias: not projected.
  assert projection.weight_matrix_mask(shakespeare) == (
      True, True, True, False, True, False)


def test_projection_masks_select_the_spec_layers(emnist, cifar100, shakespeare):
  assert projection.projection_mask(emnist, 'all') == (True, False) * 4
  assert projection.projection_mask(emnist, 'feature') == (
      True, False) * 3 + (False, False)
  assert projection.projection_mask(emnist, 'classifier') == (
      False,) * 6 + (True, False)
  assert projection.projection_mask(cifar100, 'classifier') == (
      False,) * 10 + (True, False)
  assert projection.projection_mask(shakespeare, 'feature') == (
      True, True, True, False, False, False)
  assert projection.projection_mask(shakespeare, 'classifier') == (
      False, False, False, False, True, False)


@pytest.mark.parametrize(
    'keras_model_fn',
    [models.emnist_cnn, models.cifar100_cnn, models.shakespeare_gru],
    ids=['emnist', 'cifar100', 'shakespeare'])
def test_tff_model_variables_give_the_keras_model_masks(keras_model_fn):
  eager_variables = keras_model_fn().trainable_variables
  with tf.Graph().as_default():  # As the algorithm builders do.
    keras_model = keras_model_fn()
    tff_model = tff.learning.models.from_keras_model(
        keras_model,
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=(tf.TensorSpec([None, *keras_model.input_shape[1:]],
                                  keras_model.input.dtype),
                    tf.TensorSpec([None], tf.int32)))
    graph_variables = tff_model.trainable_variables
  for layers in ('all', 'feature', 'classifier'):
    assert (projection.projection_mask(graph_variables, layers)
            == projection.projection_mask(eager_variables, layers))
  assert (projection.layer_borderline_mask(graph_variables, 0.5)
          == projection.layer_borderline_mask(eager_variables, 0.5))


def test_layers_are_consecutive_variables_of_one_name_scope():
  variables = [
      tf.Variable(tf.zeros([3, 2]), name='block/conv/kernel'),
      tf.Variable(tf.zeros([2]), name='block/conv/bias'),
      tf.Variable(tf.zeros([2, 2]), name='block/dense/kernel'),
      tf.Variable(tf.zeros([2]), name='scale'),  # No scope: its own layer.
      tf.Variable(tf.zeros([2]), name='offset'),  # Its own layer, too.
      tf.Variable(tf.zeros([2, 2]), name='head/kernel'),
  ]
  # Five layers: floor(0.6 * 5) = 3 feature layers.
  assert projection.layer_borderline_mask(variables, gc_lambda=0.6) == (
      True, True, True, True, False, False)
  assert projection.layer_borderline_mask(variables) == (True,) * 5 + (
      False,)


def test_a_model_instead_of_its_variables_raises():
  with pytest.raises(ValueError, match='trainable_variables'):
    projection.layer_borderline_mask(models.emnist_cnn())


def test_no_variables_raises():
  with pytest.raises(ValueError, match='empty'):
    projection.layer_borderline_mask([])


@pytest.mark.parametrize('gc_lambda', [-0.1, 1.5])
def test_out_of_range_borderline_raises(emnist, gc_lambda):
  with pytest.raises(ValueError, match='gc_lambda'):
    projection.layer_borderline_mask(emnist, gc_lambda=gc_lambda)
