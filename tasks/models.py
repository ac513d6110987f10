"""The papers' Keras models for each task (specification.md section 5).

Every builder returns an uncompiled `tf.keras.Model` whose trainable variables are listed in
layer order, which is the order TFF's `from_keras_model` uses for model weights and the order
the package's layer masks follow. Parameter counts are part of the specification and tested.
"""

from keras.src import backend as keras_backend
from keras.src.layers.rnn import gru as keras_gru
import tensorflow as tf

from tasks import gru_sequence
from tasks import keyed_randomness

EMNIST_NUM_CLASSES = 62
CIFAR100_NUM_CLASSES = 100
SHAKESPEARE_VOCAB_SIZE = 66  # 65 characters plus one out-of-vocabulary id.


def fedavg_cnn(
    input_shape: tuple[int, int, int], num_classes: int, *, name: str, seed: int = 0
) -> tf.keras.Model:
  """The CNN of FedAvg (McMahan et al. 2017: "two 5x5 convolution layers ... a fully
  connected layer with 512 units ... a final softmax output layer"), logits out.

  Conv2D(32, 5x5, same, relu) - MaxPool 2 - Conv2D(64, 5x5, same, relu) - MaxPool 2 -
  Flatten - Dense(512, relu) - Dense(num_classes). `emnist_cnn` and `cifar_cnn` are it on
  their tasks' inputs.

  Args:
    input_shape: `(height, width, channels)` of the float inputs in [0, 1].
    num_classes: The logits' size.
    name: The Keras model's name.
    seed: Seed of the initializers (one per weighted layer: `seed`, ..., `seed + 3`).
  """
  init = tf.keras.initializers.GlorotUniform
  return tf.keras.Sequential(
      [
          tf.keras.layers.InputLayer(input_shape=input_shape),
          tf.keras.layers.Conv2D(
              32, 5, padding='same', activation='relu', kernel_initializer=init(seed)
          ),
          tf.keras.layers.MaxPool2D(2),
          tf.keras.layers.Conv2D(
              64, 5, padding='same', activation='relu', kernel_initializer=init(seed + 1)
          ),
          tf.keras.layers.MaxPool2D(2),
          tf.keras.layers.Flatten(),
          tf.keras.layers.Dense(512, activation='relu', kernel_initializer=init(seed + 2)),
          tf.keras.layers.Dense(num_classes, kernel_initializer=init(seed + 3)),
      ],
      name=name,
  )


def emnist_cnn(seed: int = 0) -> tf.keras.Model:
  """EMNIST-62 CNN: 1,690,046 parameters.

  `fedavg_cnn` on (28, 28, 1) inputs in [0, 1] with 62 classes: Conv2D(32, 5x5, same,
  relu) - MaxPool 2 - Conv2D(64, 5x5, same, relu) - MaxPool 2 - Flatten - Dense(512, relu)
  - Dense(62) (logits).
  """
  return fedavg_cnn((28, 28, 1), EMNIST_NUM_CLASSES, name='emnist_cnn', seed=seed)


def cifar100_cnn(seed: int = 0) -> tf.keras.Model:
  """CIFAR-100 CNN: 2,214,532 parameters.

  [Conv2D(32, 3x3, same, relu) x2 - MaxPool 2 - Dropout .25] -
  [Conv2D(64, 3x3, same, relu) x2 - MaxPool 2 - Dropout .25] -
  Flatten - Dense(512, relu) - Dropout .5 - Dense(100) (logits). Input: (32, 32, 3) in [0, 1].
  The dropouts are `KeyedDropout`s (salts 0, 1, 2): their masks are keyed by the batch, so
  the model trains on batches that carry keys (`keyed_randomness`).
  """
  init = tf.keras.initializers.GlorotUniform
  layers = [tf.keras.layers.InputLayer(input_shape=(32, 32, 3))]
  for block, filters in enumerate((32, 64)):
    for i in range(2):
      layers.append(
          tf.keras.layers.Conv2D(
              filters,
              3,
              padding='same',
              activation='relu',
              kernel_initializer=init(seed + 2 * block + i),
          )
      )
    layers += [
        tf.keras.layers.MaxPool2D(2),
        keyed_randomness.KeyedDropout(0.25, salt=block),
    ]
  layers += [
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(512, activation='relu', kernel_initializer=init(seed + 4)),
      keyed_randomness.KeyedDropout(0.5, salt=2),
      tf.keras.layers.Dense(CIFAR100_NUM_CLASSES, kernel_initializer=init(seed + 5)),
  ]
  return tf.keras.Sequential(layers, name='cifar100_cnn')


GRU_IMPLEMENTATIONS = ('auto', 'cudnn', 'standard')


class TraceTimeGRU(tf.keras.layers.GRU):
  """A Keras GRU that picks the fused cuDNN kernel when it is traced, not when it is run.

  Keras's GRU leaves the choice to Grappler's implementation selector at run time, and TFF's
  tracing never reaches it (the model is built in a graph, so Keras takes its generic
  while-loop path and no `api_implements` function is left for the selector to swap), so on a
  GPU this layer calls Keras's own `gpu_gru` (a `CudnnRNN` op) itself. Variables, initializers
  and default names ('gru', 'gru_1', ...) are those of `tf.keras.layers.GRU`. The standard path
  computes Keras's standard GRU with `gru_sequence`, whose backward pass sums the weight
  gradients after the time loop (a training step of the Shakespeare GRU in 0.17x Keras's time
  on a CPU); calls it does not compute (masks, dropout, other activations, `go_backwards`) are
  `tf.keras.layers.GRU.call`.

  Args:
    units: Positive integer, dimensionality of the output space.
    gru_implementation: 'auto' (cuDNN when `tf.config.list_logical_devices('GPU')` is not empty
      at trace time and the call is one cuDNN computes: no mask, dense inputs), 'cudnn' (always;
      the traced graph then runs only on a GPU, `CudnnRNN` has no CPU kernel) or 'standard'
      (never cuDNN: Keras's GRU math on any device).
    **kwargs: The arguments of `tf.keras.layers.GRU`.
  """

  def __init__(self, units: int, gru_implementation: str = 'auto', **kwargs):
    if gru_implementation not in GRU_IMPLEMENTATIONS:
      raise ValueError(
          f'gru_implementation must be one of {GRU_IMPLEMENTATIONS}, got {gru_implementation!r}'
      )
    if kwargs.get('name') is None:
      # Keras's own GRU's unique names, so that variable names do not change.
      kwargs['name'] = keras_backend.unique_object_name('gru', zero_based=True)
    super().__init__(units, **kwargs)
    self.gru_implementation = gru_implementation

  def _cudnn_computes(self, inputs, mask) -> bool:
    """Whether cuDNN's GRU computes this call exactly as Keras's standard GRU does."""
    return (
        self.activation is tf.keras.activations.tanh
        and self.recurrent_activation is tf.keras.activations.sigmoid
        and self.dropout == 0
        and self.recurrent_dropout == 0
        and not self.unroll
        and not self.stateful
        and self.use_bias
        and self.reset_after
        and mask is None
        and not isinstance(inputs, tf.RaggedTensor)
    )

  def uses_cudnn(self, inputs=None, mask=None) -> bool:
    """Whether a call traced now runs the fused cuDNN kernel."""
    if self.gru_implementation == 'standard':
      return False
    computes = self._cudnn_computes(inputs, mask)
    if self.gru_implementation == 'cudnn':
      if not computes:
        raise ValueError(f'{self.name}: cuDNN cannot compute this GRU call (see _cudnn_computes)')
      return True
    return computes and bool(tf.config.list_logical_devices('GPU'))

  def call(self, inputs, mask=None, training=None, initial_state=None):
    if self.uses_cudnn(inputs, mask):
      return self._cudnn_call(inputs, initial_state)
    if self._cudnn_computes(inputs, mask) and not self.go_backwards:
      return self._time_loop_call(inputs, initial_state)
    return super().call(inputs, mask=mask, training=training, initial_state=initial_state)

  def _time_loop_call(self, inputs, initial_state):
    """Keras's standard GRU math, its weight gradients summed after the loop (see gru_sequence)."""
    inputs, initial_state, _ = self._process_inputs(inputs, initial_state, None)
    if not self.time_major:
      inputs = tf.transpose(inputs, [1, 0, 2])
    weights = [tf.convert_to_tensor(w) for w in (self.cell.kernel, self.cell.recurrent_kernel,
                                                 self.cell.bias)]
    states = gru_sequence.gru_sequence(inputs, initial_state[0], *weights)
    state = states[-1]
    if self.return_sequences:
      output = states if self.time_major else tf.transpose(states, [1, 0, 2])
    else:
      output = state
    return [output, state] if self.return_state else output

  def _cudnn_call(self, inputs, initial_state):
    inputs, initial_state, _ = self._process_inputs(inputs, initial_state, None)
    last_output, outputs, state, _ = keras_gru.gpu_gru(
        inputs=inputs,
        init_h=initial_state[0],
        kernel=self.cell.kernel,
        recurrent_kernel=self.cell.recurrent_kernel,
        bias=self.cell.bias,
        mask=None,
        time_major=self.time_major,
        go_backwards=self.go_backwards,
        sequence_lengths=None,
        return_sequences=self.return_sequences,
    )
    output = outputs if self.return_sequences else last_output
    return [output, state] if self.return_state else output

  def get_config(self):
    return dict(super().get_config(), gru_implementation=self.gru_implementation)


def shakespeare_gru(
    seed: int = 0, sequence_length: int = 80, gru_implementation: str = 'standard'
) -> tf.keras.Model:
  """Shakespeare next-character model: 4,022,850 parameters.

  Embedding(66, 256) - GRU(1024, return_sequences) - Dense(66) (logits per position).
  Input: int64 character ids of shape (sequence_length,). The GRU is a `TraceTimeGRU`: the fused
  cuDNN kernel on a GPU, Keras's GRU math in `gru_sequence`'s time loop otherwise, with the
  same variables either way.

  Args:
    seed: Seed of the initializers.
    sequence_length: Length of the input sequences.
    gru_implementation: 'auto', 'cudnn' or 'standard' (see `TraceTimeGRU`). 'standard' by
      default: a graph traced with the cuDNN kernel runs only on a GPU, and a GPU machine may
      still run its clients on the CPU (TFF's worker, `--executor=cpu`);
      `tasks.get(..., gpu_kernels=True)` asks for 'auto'.
  """
  return tf.keras.Sequential(
      [
          tf.keras.layers.InputLayer(input_shape=(sequence_length,), dtype=tf.int64),
          tf.keras.layers.Embedding(
              SHAKESPEARE_VOCAB_SIZE,
              256,
              embeddings_initializer=tf.keras.initializers.RandomUniform(
                  -0.05, 0.05, seed=seed
              ),
          ),
          TraceTimeGRU(
              1024,
              gru_implementation=gru_implementation,
              return_sequences=True,
              kernel_initializer=tf.keras.initializers.GlorotUniform(seed + 1),
              recurrent_initializer=tf.keras.initializers.Orthogonal(seed=seed + 2),
          ),
          tf.keras.layers.Dense(
              SHAKESPEARE_VOCAB_SIZE,
              kernel_initializer=tf.keras.initializers.GlorotUniform(seed + 3),
          ),
      ],
      name='shakespeare_gru',
  )


class MaskedSparseCategoricalAccuracy(tf.keras.metrics.SparseCategoricalAccuracy):
  """Accuracy over the targets that are real characters; padding targets (< 0) are ignored."""

  def __init__(self, name='sparse_categorical_accuracy', dtype=None):
    super().__init__(name=name, dtype=dtype)

  def update_state(self, y_true, y_pred, sample_weight=None):
    mask = tf.cast(y_true >= 0, tf.float32)
    if sample_weight is not None:
      mask *= tf.cast(sample_weight, tf.float32)
    return super().update_state(tf.maximum(y_true, 0), y_pred, sample_weight=mask)


CIFAR10_NUM_CLASSES = 10
# GroupNorm groups in `resnet18_gn`: our choice (GC-Fed states GroupNorm, not the groups).
RESNET_GROUPS = 2


def cifar_cnn(seed: int = 0, num_classes: int = CIFAR10_NUM_CLASSES) -> tf.keras.Model:
  """The FedAvg CNN that GC-Fed's Table 3 cites ("two convolution layers and two fully
  connected layers used in [3]", McMahan et al. 2017), on 32x32x3 inputs.

  `fedavg_cnn` on (32, 32, 3) inputs in [0, 1]: Conv2D(32, 5x5, same, relu) - MaxPool 2 -
  Conv2D(64, 5x5, same, relu) - MaxPool 2 - Flatten - Dense(512, relu) - Dense(num_classes)
  (logits): 2,156,490 parameters for 10 classes (2,202,660 for 100).
  """
  return fedavg_cnn((32, 32, 3), num_classes, name='cifar_cnn', seed=seed)


def resnet18_gn(seed: int = 0, num_classes: int = CIFAR10_NUM_CLASSES) -> tf.keras.Model:
  """ResNet-18 for 32x32 inputs as in GC-Fed's Table 3, GroupNorm instead of BatchNorm.

  Conv(64, 3x3, stride 1) - GN - relu (no max-pool), then four stages of two basic blocks
  (64, 128, 256, 512 filters; stride 2 at the first block of stages 2-4), each block
  x -> relu(GN(conv3x3(relu(GN(conv3x3(x))))) + shortcut(x)), the shortcut a 1x1 conv
  with GN where the shape changes, then global average pooling - Dense(num_classes)
  (logits). Convolutions have no bias (the normalization's beta plays its part), as in
  torchvision; GroupNorm uses `RESNET_GROUPS` = 2 groups (our choice). 62 trainable
  tensors (GC-Fed section 4.3.2 counts 62 too); 11,173,962 parameters for 10 classes
  (11,220,132 for 100). Input: (32, 32, 3) floats in [0, 1].
  """
  counter = iter(range(seed, seed + 1000))

  def conv(filters, kernel, strides=1):
    return tf.keras.layers.Conv2D(
        filters, kernel, strides=strides, padding='same', use_bias=False,
        kernel_initializer=tf.keras.initializers.HeNormal(next(counter)),
    )

  def norm():
    return tf.keras.layers.GroupNormalization(groups=RESNET_GROUPS, epsilon=1e-5)

  inputs = tf.keras.Input(shape=(32, 32, 3))
  x = tf.nn.relu(norm()(conv(64, 3)(inputs)))
  for stage, filters in enumerate((64, 128, 256, 512)):
    for block in range(2):
      strides = 2 if stage > 0 and block == 0 else 1
      y = tf.nn.relu(norm()(conv(filters, 3, strides)(x)))
      y = norm()(conv(filters, 3)(y))
      if strides != 1 or x.shape[-1] != filters:
        x = norm()(conv(filters, 1, strides)(x))
      x = tf.nn.relu(y + x)
  x = tf.keras.layers.GlobalAveragePooling2D()(x)
  outputs = tf.keras.layers.Dense(
      num_classes, kernel_initializer=tf.keras.initializers.GlorotUniform(next(counter))
  )(x)
  return tf.keras.Model(inputs, outputs, name='resnet18_gn')
