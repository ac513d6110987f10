"""The task registry: `tasks.get(name, ...)` for 'emnist', 'cifar100', 'shakespeare' (TFF's
federated datasets) and 'cifar10', 'cifar100_tfds' (tfds' centralized ones, dealt out to
clients by a Dirichlet partition)."""

import dataclasses
import functools
import inspect
from typing import Callable, Optional

import attrs
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import checks
from tasks import client_tensors
from tasks import client_work
from tasks import keyed_randomness
from tasks import models
from tasks import preprocessing
from tasks import sources
from tasks import synthetic
from tasks import tfds_source


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """What defines a task: its model, preprocessing, defaults and the papers' thresholds."""

  name: str
  keras_model_fn: Callable[..., tf.keras.Model]
  preprocess_fn: Callable[..., preprocessing.DatasetFn]
  loss_fn: Callable[[], tf.keras.losses.Loss]
  metrics_fn: Callable[[], list]
  num_parameters: int
  batch_size: int
  eval_batch_size: int
  accuracy_thresholds: tuple[float, ...]  # specification.md section 6.
  # The paper those thresholds are from (`launch.papers`' key): a reproduction of another
  # paper's table draws none.
  thresholds_from: str


def _image_metrics():
  return [tf.keras.metrics.SparseCategoricalAccuracy()]


SPECS = {
    'emnist': TaskSpec(
        name='emnist',
        keras_model_fn=models.emnist_cnn,
        preprocess_fn=preprocessing.emnist_preprocess_fn,
        loss_fn=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics_fn=_image_metrics,
        num_parameters=1_690_046,
        batch_size=20,
        eval_batch_size=100,
        accuracy_thresholds=(0.75, 0.85),
        thresholds_from='fedzmg',  # Its section 5.3.
    ),
    'cifar100': TaskSpec(
        name='cifar100',
        keras_model_fn=models.cifar100_cnn,
        preprocess_fn=preprocessing.cifar100_preprocess_fn,
        loss_fn=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics_fn=_image_metrics,
        num_parameters=2_214_532,
        batch_size=20,
        eval_batch_size=100,
        accuracy_thresholds=(0.20, 0.33),
        thresholds_from='fedzmg',  # Its section 5.3.
    ),
    'shakespeare': TaskSpec(
        name='shakespeare',
        keras_model_fn=models.shakespeare_gru,
        preprocess_fn=preprocessing.shakespeare_preprocess_fn,
        loss_fn=lambda: tf.keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, ignore_class=preprocessing.SHAKESPEARE_PAD_LABEL
        ),
        metrics_fn=lambda: [models.MaskedSparseCategoricalAccuracy()],
        num_parameters=4_022_850,
        batch_size=4,
        eval_batch_size=16,
        accuracy_thresholds=(0.35, 0.45),
        thresholds_from='fedzmg',  # Its section 5.3.
    ),
}
# The centralized tfds datasets (tasks.tfds_source); GC-Fed's Table 3 CNN by default.
_CIFAR10_CNN = functools.partial(models.cifar_cnn, num_classes=models.CIFAR10_NUM_CLASSES)
_CIFAR100_CNN = functools.partial(models.cifar_cnn, num_classes=models.CIFAR100_NUM_CLASSES)
SPECS['cifar10'] = TaskSpec(
    name='cifar10',
    keras_model_fn=_CIFAR10_CNN,
    preprocess_fn=preprocessing.cifar100_preprocess_fn,  # Same layout: uint8 image / 255.
    loss_fn=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics_fn=_image_metrics,
    num_parameters=2_156_490,
    batch_size=50,  # GC-Fed's.
    eval_batch_size=100,
    accuracy_thresholds=(0.55, 0.60),  # GC-Fed section 4.4's CIFAR-10 CNN targets.
    thresholds_from='gcfed',
)
SPECS['cifar100_tfds'] = dataclasses.replace(
    SPECS['cifar10'],
    name='cifar100_tfds',
    keras_model_fn=_CIFAR100_CNN,
    num_parameters=2_202_660,
    accuracy_thresholds=(0.25, 0.30),  # GC-Fed section 4.4's CIFAR-100 targets.
)
TASK_NAMES = tuple(SPECS)
# The tasks read from TFF's SQLite files (data_source 'tff' or 'synthetic').
TFF_TASK_NAMES = ('emnist', 'cifar100', 'shakespeare')
# The centralized tfds datasets, which are always Dirichlet-partitioned.
CENTRALIZED_TASK_NAMES = tuple(tfds_source.TFDS_DATASETS)


@dataclasses.dataclass(frozen=True)
class ModelChoice:
  """A model a task can train (`--model`): its builder `(seed) -> Model` and size."""

  keras_model_fn: Callable[..., tf.keras.Model]
  num_parameters: int


# Per task, the models `tasks.get(model=...)` accepts; the first is the task's default
# (its TaskSpec's). Parameter counts are tested.
MODELS = {
    'emnist': {'cnn': ModelChoice(models.emnist_cnn, 1_690_046)},
    'cifar100': {'cnn': ModelChoice(models.cifar100_cnn, 2_214_532)},
    'shakespeare': {'gru': ModelChoice(models.shakespeare_gru, 4_022_850)},
    'cifar10': {
        'cnn': ModelChoice(_CIFAR10_CNN, 2_156_490),
        'resnet18_gn': ModelChoice(
            functools.partial(models.resnet18_gn, num_classes=models.CIFAR10_NUM_CLASSES),
            11_173_962,
        ),
    },
    'cifar100_tfds': {
        'cnn': ModelChoice(_CIFAR100_CNN, 2_202_660),
        'resnet18_gn': ModelChoice(
            functools.partial(models.resnet18_gn, num_classes=models.CIFAR100_NUM_CLASSES),
            11_220_132,
        ),
    },
}
MODEL_NAMES = tuple(sorted({m for choices in MODELS.values() for m in choices}))


def spec_with_model(name: str, model: Optional[str] = None) -> TaskSpec:
  """The task's spec with `model` (a name in `MODELS[name]`; None: the default)."""
  spec = SPECS[name]
  if model is None:
    return spec
  if model not in MODELS[name]:
    raise ValueError(
        f'Unknown model {model!r} for task {name!r}; choose one of {list(MODELS[name])}.'
    )
  choice = MODELS[name][model]
  return dataclasses.replace(
      spec, keras_model_fn=choice.keras_model_fn, num_parameters=choice.num_parameters
  )


@attrs.define(frozen=True)
class Task(tff.simulation.baselines.BaselineTask):
  """A `tff.simulation.baselines.BaselineTask` plus what the package's programs need.

  Attributes (beyond `datasets` and `model_fn`):
    spec: The `TaskSpec` (thresholds, default batch sizes, parameter count).
    keras_model_fn: Builds the bare Keras model (for masks and centralized baselines).
    train_preprocess_fn_for_seed: `seed -> preprocess_fn`, the training preprocessing with
      another shuffle seed (the training loop uses one seed per client and round).
    train_client_tensors: `client id -> its examples`, the training clients held in
      memory once read (`client_tensors.ClientTensors`), for `Preprocess.from_tensors`.
  """

  spec: TaskSpec = attrs.field(kw_only=True)
  keras_model_fn: Callable[[], tf.keras.Model] = attrs.field(kw_only=True)
  train_preprocess_fn_for_seed: Callable[[int], preprocessing.Preprocess] = attrs.field(
      kw_only=True
  )
  train_client_tensors: client_tensors.ClientTensors = attrs.field(kw_only=True)

  @property
  def name(self) -> str:
    return self.spec.name


def get(
    name: str,
    *,
    data_source: str = 'tff',
    cache_dir: Optional[str] = None,
    batch_size: Optional[int] = None,
    num_epochs: int = 1,
    shuffle_seed: int = 0,
    eval_batch_size: Optional[int] = None,
    max_elements: Optional[int] = None,
    model_seed: int = 0,
    synthetic_settings: Optional[dict] = None,
    partition: Optional[str] = None,
    dirichlet_alpha: Optional[float] = None,
    num_clients: Optional[int] = None,
    partition_seed: Optional[int] = None,
    model: Optional[str] = None,
    gpu_kernels: bool = False,
) -> Task:
  """Builds a task: its federated train/test data, preprocessing and TFF model.

  Args:
    name: One of `TASK_NAMES`.
    data_source: 'tff' (TFF's published SQLite files; for the tfds tasks, the prepared
      tfds dataset) or 'synthetic' (see `tasks.synthetic`; TFF tasks only).
    cache_dir: Directory holding `<file>.sqlite` (TFF's default `~/.tff` when None); for
      the tfds tasks, the tfds data_dir (default `~/tensorflow_datasets`).
    batch_size: Client batch size; the task's default (the paper's) when None.
    num_epochs: Local epochs per round.
    shuffle_seed: Seed of the default training shuffle.
    eval_batch_size: Batch size for evaluation; the task's default when None.
    max_elements: Optional cap on examples per client and round (after repeating).
    model_seed: Seed of the Keras initializers.
    synthetic_settings: Generator settings for data_source='synthetic'.
    partition: None (the dataset's own clients) or 'dirichlet': the training examples
      pooled and dealt out to `num_clients` new clients with Dirichlet(`dirichlet_alpha`)
      label distributions (`tasks.partition`; image tasks only). The test split is kept.
    dirichlet_alpha: The Dirichlet concentration (> 0), with partition='dirichlet'.
    num_clients: The number of new training clients, with partition='dirichlet'.
    partition_seed: Seed of the partition (default 0), separate from the training seeds
      so that runs with different seeds share one split.
    model: One of `MODELS[name]`; None is the task's default model.
    gpu_kernels: Whether the model may be traced with GPU-only fused kernels where a GPU is
      visible (Shakespeare's GRU as cuDNN's: `gru_implementation='auto'`): only for runs
      whose clients run on GPUs, as such a graph has no CPU kernel.

  Returns:
    A `Task`, usable wherever TFF takes a `tff.simulation.baselines.BaselineTask`.
  """
  if name not in SPECS:
    raise ValueError(f'Unknown task {name!r}; choose one of {list(TASK_NAMES)}.')
  spec = spec_with_model(name, model)
  batch_size = batch_size or spec.batch_size
  eval_batch_size = eval_batch_size or spec.eval_batch_size
  checks.check_positive('batch_size', batch_size)
  checks.check_positive('eval_batch_size', eval_batch_size)
  checks.check_positive('num_epochs', num_epochs)
  keras_model_fn = _keras_model_fn(spec, model_seed, gpu_kernels)
  keyed = _keyed(keras_model_fn)
  train_data, test_data = _load_client_data(
      name, data_source, cache_dir, synthetic_settings,
      _partition_settings(partition, dirichlet_alpha, num_clients, partition_seed),
  )
  train_preprocess_fn_for_seed = _train_preprocess_fn_for_seed(
      spec, batch_size, num_epochs, max_elements, keyed
  )
  datasets = tff.simulation.baselines.BaselineTaskDatasets(
      train_data=train_data,
      test_data=test_data,
      train_preprocess_fn=train_preprocess_fn_for_seed(shuffle_seed),
      eval_preprocess_fn=spec.preprocess_fn(eval_batch_size, keyed=keyed),
  )
  return Task(
      datasets=datasets,
      model_fn=_tff_model_fn(spec, keras_model_fn, datasets.element_type_structure, keyed),
      spec=spec,
      keras_model_fn=keras_model_fn,
      train_preprocess_fn_for_seed=train_preprocess_fn_for_seed,
      train_client_tensors=client_tensors.ClientTensors(train_data),
  )


def _partition_settings(partition, dirichlet_alpha, num_clients, partition_seed):
  """`get`'s partition arguments as the loaders take them; None: the dataset's own clients."""
  if partition is not None:
    return dict(
        partition=partition, dirichlet_alpha=dirichlet_alpha, num_clients=num_clients,
        partition_seed=partition_seed,
    )
  if (dirichlet_alpha, num_clients, partition_seed) != (None, None, None):
    raise ValueError(
        'dirichlet_alpha, num_clients and partition_seed only apply with'
        " partition='dirichlet'."
    )
  return None


def _check_tfds_source(name, data_source, synthetic_settings) -> None:
  if data_source != 'tff' or synthetic_settings:
    raise ValueError(
        f'{name} reads the prepared tfds dataset (data_source="tff"); it has no'
        f' {data_source!r} source.'
    )


def _load_client_data(name, data_source, cache_dir, synthetic_settings, partition_settings):
  """The task's (train, test) client data, from tfds for the centralized tasks, else TFF's."""
  if name in tfds_source.TFDS_DATASETS:
    _check_tfds_source(name, data_source, synthetic_settings)
    return tfds_source.load_client_data(name, cache_dir, partition_settings)
  return sources.load_client_data(
      name, data_source, cache_dir, synthetic_settings, partition_settings
  )


def training_volumes(
    name: str,
    *,
    data_source: str = 'tff',
    cache_dir: Optional[str] = None,
    synthetic_settings: Optional[dict] = None,
    partition: Optional[str] = None,
    dirichlet_alpha: Optional[float] = None,
    num_clients: Optional[int] = None,
    partition_seed: Optional[int] = None,
) -> tuple[np.ndarray, np.ndarray]:
  """The examples and inputs of each training client (`client_work.client_volumes`) of the
  data `get` reads with the same arguments, read from its file without building a task."""
  if name not in SPECS:
    raise ValueError(f'Unknown task {name!r}; choose one of {list(TASK_NAMES)}.')
  partition_settings = _partition_settings(partition, dirichlet_alpha, num_clients,
                                           partition_seed)
  if name in tfds_source.TFDS_DATASETS:
    _check_tfds_source(name, data_source, synthetic_settings)
    path = tfds_source.database_path(name, cache_dir, partition_settings)
    split = tfds_source.SPLITS[0]
  else:
    path = sources.database_path(name, data_source, cache_dir, synthetic_settings,
                                 partition_settings)
    split = synthetic.SPLIT_NAMES[name][0]
  return client_work.client_volumes(name, path, split)


def _train_preprocess_fn_for_seed(spec, batch_size, num_epochs, max_elements, keyed):
  """`seed -> preprocess_fn`: the training preprocessing with that shuffle seed."""

  def for_seed(seed: Optional[int]) -> preprocessing.Preprocess:
    return spec.preprocess_fn(batch_size, num_epochs, shuffle_seed=seed,
                              max_elements=max_elements, keyed=keyed)

  return for_seed


def _keras_model_fn(spec, model_seed, gpu_kernels) -> Callable[[], tf.keras.Model]:
  """The bare Keras model's builder, seeded; with GPU-only fused kernels where allowed."""
  keras_model_fn = functools.partial(spec.keras_model_fn, model_seed)
  if gpu_kernels and 'gru_implementation' in inspect.signature(spec.keras_model_fn).parameters:
    keras_model_fn = functools.partial(keras_model_fn, gru_implementation='auto')
  return keras_model_fn


def _keyed(keras_model_fn) -> bool:
  """Whether the model draws keyed random numbers; refuses one that draws them from a
  generator's state (`keyed_randomness.check_keyed`). Built eagerly, not in a spare graph:
  a Keras model made in a graph invalidates the models made outside one before it."""
  keras_model = keras_model_fn()
  keyed_randomness.check_keyed(keras_model)
  return keyed_randomness.is_keyed(keras_model)


def _tff_model_fn(spec, keras_model_fn, input_spec, keyed):
  """The TFF model builder: a fresh Keras model with the task's loss and metrics; where
  the model is keyed, one whose forward pass gives its layers the batch's keys."""

  def model_fn() -> tff.learning.models.VariableModel:
    if keyed:
      # TFF's from_keras_model with one loss, as it builds its own model.
      return keyed_randomness.KeyedKerasModel(
          keras_model_fn(), input_spec=input_spec, loss_fns=[spec.loss_fn()],
          loss_weights=[1.0], metrics=spec.metrics_fn())
    return tff.learning.models.from_keras_model(
        keras_model_fn(),
        loss=spec.loss_fn(),
        input_spec=input_spec,
        metrics=spec.metrics_fn(),
    )

  return model_fn
