"""The papers' Keras models for each task (ALGORITHMS.md section 5).

Every builder returns an uncompiled `tf.keras.Model` whose trainable variables are listed in
layer order, which is the order TFF's `from_keras_model` uses for model weights and the order
the package's layer masks follow. Parameter counts are part of the specification and tested.
"""

import tensorflow as tf

EMNIST_NUM_CLASSES = 62
CIFAR100_NUM_CLASSES = 100
SHAKESPEARE_VOCAB_SIZE = 66  # 65 characters plus one out-of-vocabulary id.


def emnist_cnn(seed: int = 0) -> tf.keras.Model:
  """EMNIST-62 CNN: 1,690,046 parameters.

  Conv2D(32, 5x5, same, relu) - MaxPool 2 - Conv2D(64, 5x5, same, relu) - MaxPool 2 -
  Flatten - Dense(512, relu) - Dense(62) (logits). Input: (28, 28, 1) floats in [0, 1].
  """
  init = tf.keras.initializers.GlorotUniform
  return tf.keras.Sequential(
      [
          tf.keras.layers.InputLayer(input_shape=(28, 28, 1)),
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
          tf.keras.layers.Dense(EMNIST_NUM_CLASSES, kernel_initializer=init(seed + 3)),
      ],
      name='emnist_cnn',
  )


def cifar100_cnn(seed: int = 0) -> tf.keras.Model:
  """CIFAR-100 CNN: 2,214,532 parameters.

  [Conv2D(32, 3x3, same, relu) x2 - MaxPool 2 - Dropout .25] -
  [Conv2D(64, 3x3, same, relu) x2 - MaxPool 2 - Dropout .25] -
  Flatten - Dense(512, relu) - Dropout .5 - Dense(100) (logits). Input: (32, 32, 3) in [0, 1].
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
        tf.keras.layers.Dropout(0.25, seed=seed + block),
    ]
  layers += [
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(512, activation='relu', kernel_initializer=init(seed + 4)),
      tf.keras.layers.Dropout(0.5, seed=seed + 2),
      tf.keras.layers.Dense(CIFAR100_NUM_CLASSES, kernel_initializer=init(seed + 5)),
  ]
  return tf.keras.Sequential(layers, name='cifar100_cnn')


def shakespeare_gru(seed: int = 0, sequence_length: int = 80) -> tf.keras.Model:
  """Shakespeare next-character model: 4,022,850 parameters.

  Embedding(66, 256) - GRU(1024, return_sequences) - Dense(66) (logits per position).
  Input: int64 character ids of shape (sequence_length,).
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
          tf.keras.layers.GRU(
              1024,
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

  Conv2D(32, 5x5, same, relu) - MaxPool 2 - Conv2D(64, 5x5, same, relu) - MaxPool 2 -
  Flatten - Dense(512, relu) - Dense(num_classes) (logits): 2,156,490 parameters for 10
  classes (2,202,660 for 100). Input: (32, 32, 3) floats in [0, 1].
  """
  init = tf.keras.initializers.GlorotUniform
  return tf.keras.Sequential(
      [
          tf.keras.layers.InputLayer(input_shape=(32, 32, 3)),
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
      name='cifar_cnn',
  )


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
