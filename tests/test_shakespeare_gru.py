"""The Shakespeare GRU picks cuDNN when traced (issue 19): same variables, same numbers.

No test here needs a GPU: the cuDNN graphs are traced, never run, and the cuDNN parameters are
checked by running cuDNN's GRU equations in NumPy. The one test that runs cuDNN is skipped
without a GPU.
"""

import functools

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.tensorflow_libs import serialization_utils

from tasks import models

SEQUENCE_LENGTH = 80
UNITS = 1024
EMBEDDING = 256
HAS_GPU = bool(tf.config.list_physical_devices('GPU'))  # Leaves TF's runtime uninitialized.


def _old_shakespeare_gru(seed=0, sequence_length=SEQUENCE_LENGTH):
  """The model as `models.shakespeare_gru` built it before issue 19: a plain Keras GRU."""
  return tf.keras.Sequential(
      [
          tf.keras.layers.InputLayer(input_shape=(sequence_length,), dtype=tf.int64),
          tf.keras.layers.Embedding(
              models.SHAKESPEARE_VOCAB_SIZE,
              EMBEDDING,
              embeddings_initializer=tf.keras.initializers.RandomUniform(
                  -0.05, 0.05, seed=seed
              ),
          ),
          tf.keras.layers.GRU(
              UNITS,
              return_sequences=True,
              kernel_initializer=tf.keras.initializers.GlorotUniform(seed + 1),
              recurrent_initializer=tf.keras.initializers.Orthogonal(seed=seed + 2),
          ),
          tf.keras.layers.Dense(
              models.SHAKESPEARE_VOCAB_SIZE,
              kernel_initializer=tf.keras.initializers.GlorotUniform(seed + 3),
          ),
      ],
      name='shakespeare_gru',
  )


def _fresh(build, **kwargs):
  """`build(**kwargs)` with Keras's layer-name counters reset, as in a new process."""
  tf.keras.backend.clear_session()
  return build(**kwargs)


def _ids(batch=2, seed=0):
  rng = np.random.default_rng(seed)
  return rng.integers(0, models.SHAKESPEARE_VOCAB_SIZE, size=(batch, SEQUENCE_LENGTH))


def _outputs_and_gradients(model, ids):
  ids = tf.constant(ids, tf.int64)
  with tf.GradientTape() as tape:
    logits = model(ids, training=True)
    loss = tf.reduce_mean(
        tf.keras.losses.sparse_categorical_crossentropy(
            tf.roll(ids, -1, axis=1), logits, from_logits=True
        )
    )
  grads = tape.gradient(loss, model.trainable_variables)
  return logits.numpy(), [tf.convert_to_tensor(g).numpy() for g in grads]


def _reached_op_types(graph_def):
  """Op types the graph runs: its nodes and those of the functions they call, transitively.

  Functions in the library that nothing calls are left out: Keras's GRU registers its cuDNN
  alternative there for Grappler's implementation selector, which may or may not swap it in.
  """
  library = {f.signature.name: f for f in graph_def.library.function}
  ops, seen = set(), set()

  def visit(nodes):
    for node in nodes:
      ops.add(node.op)
      called = [node.op] if node.op in library else []
      for attr in node.attr.values():
        called += [attr.func.name] if attr.HasField('func') else []
        called += [f.name for f in attr.list.func]
      for name in called:
        if name in library and name not in seen:
          seen.add(name)
          visit(library[name].node_def)

  visit(graph_def.node)
  return ops


def _swappable_functions(graph_def):
  """Names of the library's functions that Grappler's implementation selector may swap."""
  return [f.signature.name for f in graph_def.library.function if 'api_implements' in f.attr]


def _cudnn_ops(ops):
  return sorted(op for op in ops if op.startswith('Cudnn'))


def _traced_graph_def(model):
  """GraphDef of a traced forward and backward pass (the graph is built, never run)."""

  @tf.function
  def step(ids):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(model(ids, training=True))
    return tape.gradient(loss, model.trainable_variables)

  concrete = step.get_concrete_function(tf.TensorSpec([2, SEQUENCE_LENGTH], tf.int64))
  return concrete.graph.as_graph_def()


def _tff_graph_defs(computation):
  """GraphDefs of every TensorFlow block in a TFF computation, nested ones included."""
  graph_defs = []

  def walk(message):
    if message.DESCRIPTOR.full_name == 'tensorflow_federated.v0.Computation':
      if message.WhichOneof('computation') == 'tensorflow':
        graph_defs.append(serialization_utils.unpack_graph_def(message.tensorflow.graph_def))
    for field, value in message.ListFields():
      if field.type != field.TYPE_MESSAGE:
        continue
      for item in value if field.label == field.LABEL_REPEATED else [value]:
        walk(item)

  walk(tff.framework.ConcreteComputation.get_proto(computation))
  assert graph_defs
  return graph_defs


def test_variables_are_those_of_the_plain_keras_model():
  old = _fresh(_old_shakespeare_gru, seed=5)
  new = _fresh(models.shakespeare_gru, seed=5)
  assert new.count_params() == old.count_params() == 4_022_850
  assert sum(int(np.prod(v.shape)) for v in new.trainable_variables) == 4_022_850
  assert [(v.name, tuple(v.shape)) for v in new.trainable_variables] == [
      ('embedding/embeddings:0', (66, 256)),
      ('gru/gru_cell/kernel:0', (256, 3072)),
      ('gru/gru_cell/recurrent_kernel:0', (1024, 3072)),
      ('gru/gru_cell/bias:0', (2, 3072)),
      ('dense/kernel:0', (1024, 66)),
      ('dense/bias:0', (66,)),
  ]
  assert [(v.name, v.shape) for v in new.variables] == [(v.name, v.shape) for v in old.variables]
  for a, b in zip(new.trainable_variables, old.trainable_variables):
    np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.name)


def test_gru_keeps_keras_unique_layer_names():
  tf.keras.backend.clear_session()
  first, second = models.shakespeare_gru(), models.shakespeare_gru()
  assert [first.layers[1].name, second.layers[1].name] == ['gru', 'gru_1']
  assert second.layers[1].cell.kernel.name == 'gru_1/gru_cell/kernel:0'


@pytest.mark.parametrize(
    'implementation',
    [
        pytest.param(
            'auto',
            marks=pytest.mark.skipif(HAS_GPU, reason='on a GPU the automatic choice is cuDNN'),
        ),
        'standard',
    ],
)
def test_cpu_outputs_and_gradients_equal_the_plain_keras_model(implementation):
  ids = _ids()
  old_logits, old_grads = _outputs_and_gradients(_fresh(_old_shakespeare_gru, seed=1), ids)
  new = _fresh(models.shakespeare_gru, seed=1, gru_implementation=implementation)
  new_logits, new_grads = _outputs_and_gradients(new, ids)
  assert new_logits.shape == (2, SEQUENCE_LENGTH, models.SHAKESPEARE_VOCAB_SIZE)
  np.testing.assert_allclose(new_logits, old_logits, rtol=0, atol=1e-5)
  assert len(new_grads) == len(old_grads) == 6
  for new_grad, old_grad in zip(new_grads, old_grads):
    assert np.abs(old_grad).max() > 0
    np.testing.assert_allclose(new_grad, old_grad, rtol=0, atol=1e-5)


@pytest.mark.parametrize('return_sequences, return_state, time_major', [
    (True, False, False), (False, True, False), (True, True, True),
])
def test_the_time_loop_and_its_gradient_are_kerass_gru(return_sequences, return_state, time_major):
  # Every output form, an initial state and gradients of the inputs, the initial state and
  # every weight, against Keras's GRU with the same weights (standard normal, larger than the
  # initializers', so that gates saturate).
  kwargs = dict(return_sequences=return_sequences, return_state=return_state,
                time_major=time_major)
  ours = models.TraceTimeGRU(16, gru_implementation='standard', **kwargs)
  keras = tf.keras.layers.GRU(16, **kwargs)
  inputs = tf.random.stateless_normal([7, 3, 5] if time_major else [3, 7, 5], seed=[0, 1])
  initial = tf.random.stateless_normal([3, 16], seed=[0, 2])
  ours(inputs)
  keras(inputs)
  rng = np.random.default_rng(3)
  keras.set_weights([rng.standard_normal(w.shape) for w in ours.get_weights()])
  ours.set_weights(keras.get_weights())

  @tf.function
  def outputs_and_gradients(layer):
    with tf.GradientTape() as tape:
      tape.watch([inputs, initial])
      outputs = tf.nest.flatten(layer(inputs, initial_state=initial))
      loss = tf.add_n([tf.reduce_sum(tf.sin(3 * o)) for o in outputs])
    return outputs, tape.gradient(loss, [inputs, initial, *layer.trainable_variables])

  ours_out, ours_grads = outputs_and_gradients(ours)
  keras_out, keras_grads = outputs_and_gradients(keras)
  assert len(ours_out) == len(keras_out) == 1 + return_state
  for a, b in zip(ours_out + ours_grads, keras_out + keras_grads, strict=True):
    scale = np.abs(b).max()
    assert scale > 0
    # float32 sums over 7 steps in another order: ~1e-6 of the largest entry.
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * scale)


def test_traced_graph_reaches_cudnn_ops_exactly_when_cudnn_is_chosen():
  cudnn = _reached_op_types(_traced_graph_def(models.shakespeare_gru(gru_implementation='cudnn')))
  assert _cudnn_ops(cudnn) == ['CudnnRNN', 'CudnnRNNBackprop']
  standard_graph = _traced_graph_def(models.shakespeare_gru(gru_implementation='standard'))
  standard = _reached_op_types(standard_graph)
  assert _cudnn_ops(standard) == []
  assert {'While', 'StatelessWhile'} & standard  # The walk does follow function calls.
  # Keras's own GRU, built eagerly, registers a cuDNN alternative for Grappler to swap in;
  # the standard path's time loop (tasks/gru_sequence.py) registers none.
  assert _swappable_functions(_traced_graph_def(_fresh(_old_shakespeare_gru)))
  assert not _swappable_functions(standard_graph)
  auto = _reached_op_types(_traced_graph_def(models.shakespeare_gru(gru_implementation='auto')))
  assert _cudnn_ops(auto) == (['CudnnRNN', 'CudnnRNNBackprop'] if HAS_GPU else [])


def test_cudnn_is_refused_where_it_would_compute_something_else():
  with pytest.raises(ValueError, match='gru_implementation'):
    models.TraceTimeGRU(4, gru_implementation='fused')
  with pytest.raises(ValueError, match='cuDNN cannot compute'):  # Raised when Keras builds it.
    tf.keras.Sequential(
        [
            tf.keras.layers.Embedding(10, 3, mask_zero=True),
            models.TraceTimeGRU(4, gru_implementation='cudnn', return_sequences=True),
        ]
    )
  dropout = models.TraceTimeGRU(4, gru_implementation='cudnn', dropout=0.1)
  with pytest.raises(ValueError, match='cuDNN cannot compute'):
    dropout(tf.zeros([1, 3, 2]))
  # The automatic choice keeps Keras's GRU for them, on any device.
  auto = models.TraceTimeGRU(4, dropout=0.1)
  assert not auto.uses_cudnn(tf.zeros([1, 3, 2]))
  assert not models.TraceTimeGRU(4).uses_cudnn(tf.zeros([1, 3, 2]), mask=tf.ones([1, 3], bool))


def test_tff_fed_avg_trace_reaches_cudnn_only_when_chosen():
  input_spec = (
      tf.TensorSpec([None, SEQUENCE_LENGTH], tf.int64),
      tf.TensorSpec([None, SEQUENCE_LENGTH], tf.int64),
  )

  def model_fn(implementation):
    return tff.learning.models.from_keras_model(
        models.shakespeare_gru(gru_implementation=implementation),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=input_spec,
    )

  def next_graph_defs(implementation):
    process = tff.learning.algorithms.build_weighted_fed_avg(
        functools.partial(model_fn, implementation),
        client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
    )
    return _tff_graph_defs(process.next)

  cudnn = set().union(*map(_reached_op_types, next_graph_defs('cudnn')))
  assert _cudnn_ops(cudnn) == ['CudnnRNN', 'CudnnRNNBackprop']
  standard_graph_defs = next_graph_defs('standard')
  standard = set().union(*map(_reached_op_types, standard_graph_defs))
  assert _cudnn_ops(standard) == []
  assert {'While', 'StatelessWhile'} & standard  # Keras's generic while loop.
  # Issue 19's finding: TFF's trace of Keras's GRU leaves no function for Grappler to swap.
  assert [_swappable_functions(g) for g in standard_graph_defs] == [[]] * len(standard_graph_defs)
  library_ops = {n.op for g in standard_graph_defs for f in g.library.function for n in f.node_def}
  assert _cudnn_ops(library_ops) == []
  auto = set().union(*map(_reached_op_types, next_graph_defs('auto')))
  assert _cudnn_ops(auto) == (['CudnnRNN', 'CudnnRNNBackprop'] if HAS_GPU else [])


def _sigmoid(x):
  return 1 / (1 + np.exp(-x))


def _numpy_cudnn_gru(params, inputs, init_h):
  """cuDNN's GRU (CUDNN_GRU) from its opaque parameters, time-major, in float64.

  Layout (TF's canonical cuDNN form): input matrices W_r, W_z, W_h of shape [units, input], then
  recurrent R_r, R_z, R_h of shape [units, units], then biases bW_r, bW_z, bW_h, bR_r, bR_z,
  bR_h. r = s(W_r x + bW_r + R_r h + bR_r), z likewise, n = tanh(W_h x + bW_h + r (R_h h + bR_h)),
  h' = (1 - z) n + z h.
  """
  units, input_size = init_h.shape[-1], inputs.shape[-1]
  sizes = [units * input_size] * 3 + [units * units] * 3 + [units] * 6
  assert params.size == sum(sizes)
  pieces = np.split(params.astype(np.float64), np.cumsum(sizes)[:-1])
  w_r, w_z, w_h = (p.reshape(units, input_size) for p in pieces[0:3])
  r_r, r_z, r_h = (p.reshape(units, units) for p in pieces[3:6])
  bw_r, bw_z, bw_h, br_r, br_z, br_h = pieces[6:]
  h = init_h[0].astype(np.float64)
  outputs = []
  for x in inputs.astype(np.float64):
    r = _sigmoid(x @ w_r.T + bw_r + h @ r_r.T + br_r)
    z = _sigmoid(x @ w_z.T + bw_z + h @ r_z.T + br_z)
    n = np.tanh(x @ w_h.T + bw_h + r * (h @ r_h.T + br_h))
    h = (1 - z) * n + z * h
    outputs.append(h)
  return np.stack(outputs)


def test_cudnn_parameters_compute_the_keras_gru():
  """The weights the traced cuDNN op receives, run by cuDNN's equations, give Keras's GRU.

  Runs only the part of the graph that feeds `CudnnRNN` (its inputs and opaque parameters,
  built from the Keras variables by Keras's `gpu_gru`) in a graph of its own, since a session
  places every node of its graph and `CudnnRNN` has no CPU kernel. Fails if the conversion
  (gate order, transposes, bias order) does not match the standard GRU.
  """
  ids = _ids(seed=7)
  # Random biases: the zero-initialized ones could not tell the bias order apart.
  random_bias = np.random.default_rng(3).normal(scale=0.5, size=(2, 3 * UNITS))
  graph = tf.Graph()
  with graph.as_default():
    model = models.shakespeare_gru(seed=2, gru_implementation='cudnn')
    ids = tf.constant(ids, tf.int64)
    built = set(graph.get_operations())  # Building the Sequential model traced it once.
    model(ids)
    (cudnn,) = [op for op in graph.get_operations() if op.type == 'CudnnRNN' and op not in built]
    assert [arg.name for arg in cudnn.op_def.input_arg] == [
        'input',
        'input_h',
        'input_c',
        'params',
    ]
    cell = model.layers[1].cell
    initialize = [v.initializer.name for v in model.variables]
    set_bias = cell.bias.assign(random_bias.astype(np.float32)).op.name
    fetches = [
        cudnn.inputs[0],
        cudnn.inputs[1],
        cudnn.inputs[3],
        model.layers[0](ids),
        cell.kernel.read_value(),
        cell.recurrent_kernel.read_value(),
        cell.bias.read_value(),
    ]
  feeding_cudnn = tf.compat.v1.graph_util.extract_sub_graph(
      graph.as_graph_def(), initialize + [set_bias] + [t.op.name for t in fetches]
  )
  assert 'CudnnRNN' not in {node.op for node in feeding_cudnn.node}
  with tf.Graph().as_default() as cpu_graph:
    tf.graph_util.import_graph_def(feeding_cudnn, name='')
    with tf.compat.v1.Session(graph=cpu_graph) as session:
      session.run(initialize)
      session.run(set_bias)
      inputs, init_h, params, embedded, kernel, recurrent_kernel, bias = session.run(
          [t.name for t in fetches]
      )
  np.testing.assert_array_equal(bias, random_bias.astype(np.float32))
  assert inputs.shape == (SEQUENCE_LENGTH, 2, EMBEDDING)  # Time-major, as cuDNN takes it.
  np.testing.assert_array_equal(inputs, np.transpose(embedded, (1, 0, 2)))
  np.testing.assert_array_equal(init_h, np.zeros((1, 2, UNITS), np.float32))
  cudnn_outputs = _numpy_cudnn_gru(params, inputs, init_h)

  standard = tf.keras.layers.GRU(UNITS, return_sequences=True)
  standard.build((None, SEQUENCE_LENGTH, EMBEDDING))
  standard.set_weights([kernel, recurrent_kernel, bias])
  keras_outputs = standard(tf.constant(embedded)).numpy()
  assert np.abs(keras_outputs).max() > 0.05
  np.testing.assert_allclose(
      np.transpose(cudnn_outputs, (1, 0, 2)), keras_outputs, rtol=0, atol=1e-5
  )


@pytest.mark.skipif(not HAS_GPU, reason='runs cuDNN: needs a GPU')
def test_gpu_cudnn_outputs_and_gradients_equal_keras_standard_gru():
  tf.config.experimental.enable_tensor_float_32_execution(False)  # Full float32 matmuls.
  ids = _ids(seed=4)
  standard = _fresh(models.shakespeare_gru, seed=6, gru_implementation='standard')
  cudnn = _fresh(models.shakespeare_gru, seed=6, gru_implementation='cudnn')
  assert cudnn.layers[1].uses_cudnn(tf.zeros([1, 1, EMBEDDING]))
  for step in (_outputs_and_gradients, tf.function(_outputs_and_gradients)):
    standard_logits, standard_grads = _outputs_and_gradients(standard, ids)
    cudnn_logits, cudnn_grads = step(cudnn, ids)
    np.testing.assert_allclose(cudnn_logits, standard_logits, rtol=0, atol=1e-5)
    for cudnn_grad, standard_grad in zip(cudnn_grads, standard_grads):
      np.testing.assert_allclose(cudnn_grad, standard_grad, rtol=0, atol=1e-5)
