"""FedGPS: surrogate-distribution objective and non-self gradient rectification.

Why one file of ~580 lines: one algorithm, one file, read top to bottom (hyperparameters,
client step, server step, builder), as every family of `algorithms/`; its client step is
the package's longest (surrogate batches, the look-ahead, the objective, prototype sums),
and its mechanisms already live in `tff_zmg.transforms` (`surrogate`, `prototypes`,
`rectification`).

specification.md section 2 ("FedGPS client") and section 4; the FedGPS paper (Yang et
al., NeurIPS 2025, arXiv:2510.20250; eqs. 6-8). Client rule: SGD(M) on

    F_k = CE(local) + CE(surrogate) + lambda1 d(P_k, P_k^s) + lambda2 d(P^s, P_k^s)
          + lambda3 ||w||^2,

each gradient taken at the look-ahead point `w + lambda_g d / ||d||`, `d` the mean
update of last round's *other* clients. Server step:

    w      <- w - eta_g * mean_k u_k          (uniform mean; eta_g = 1: FedAvg)
    Dbar   <- -mean_k u_k = mean_k delta_k    (broadcast next round, with K = |S_t|)
    P^s_c  <- sum_k n_kc P_kc / sum_k n_kc    (count-weighted surrogate prototypes)

`fedgps` keeps each client's own last delta as client state and leaves it out of `d`
when the client took part last round; `fedgps_cf` keeps none and uses `d = Dbar`.
Image tasks only: the surrogate data are images (`tff_zmg.transforms.surrogate`).

The client step, in detail. At the start of round `t` the client receives the
global weights, the round index, last round's mean update `Dbar` with its number of
clients `K`, and the global surrogate prototypes `P^s` (with their counts; none yet
in round 0). It computes the non-self direction `d` once (`tff_zmg.transforms.rectification`);
then every local step, on a local batch `(x, y)` and a surrogate batch `(x^s, y^s)`
(`tff_zmg.transforms.surrogate`), is

    p  = lambda_g * d / ||d||                            (0 in round 0)
    g  = grad F_k(w + p)                                  (F_k: `fedgps_objective`)
    w <- SGD(M) step from w with g

It uploads its update `u_k = w^t - w_k` (as every TFF client work) and the per-class
means and counts of the surrogate features seen during its steps. With
`exclude_own_update`, its state is its own last positive delta `w_k - w^t` and the
round it was computed in, so that next round it can tell whether it took part in the
round `Dbar` comes from.

A client whose update is not finite is dropped as every stateful client is
(`stateful_clients.local_update_fn`): a zero update with weight 0, no prototypes
(counts 0), its old state kept and its metrics reset.
"""

import collections
from collections.abc import Mapping
import dataclasses
import functools
from typing import Callable, NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import keyed_randomness
from tff_zmg import validation
from tff_zmg.algorithms import fedavg
from tff_zmg.templates import compose
from tff_zmg.templates import hparams as hp
from tff_zmg.templates import stateful_clients
from tff_zmg.transforms import prototypes
from tff_zmg.transforms import rectification
from tff_zmg.transforms import surrogate

KerasModelFn = Callable[[], tf.keras.Model]


@dataclasses.dataclass(frozen=True)
class FedGpsHparams(hp.Hparams):
  """FedGPS's hyperparameters (the paper's: momentum 0.9 (Table 7), `lambda1 = 0.1`,
  `lambda2 = 0.2`, `lambda3 = 1e-5`, `lambda_g = 0.5`, `n_s = 100`; `eta_g = 1`: the new
  model is the clients' mean)."""

  # Section 5: "1e-5 weight decay (also denoted as lambda3)", coupled: a term of eq. 6.
  WEIGHT_DECAY_NAME = 'lambda3'

  client_learning_rate: float = hp.client_learning_rate(0.01)
  client_momentum: float = hp.client_momentum(0.9)
  server_learning_rate: float = hp.server_learning_rate(1.0)
  lambda1: float = hp.hparam(
      0.1, hp.NON_NEGATIVE, 'FedGPS weight of the local-to-surrogate prototype alignment.'
  )
  lambda2: float = hp.hparam(
      0.2, hp.NON_NEGATIVE,
      'FedGPS weight of the surrogate-to-global prototype alignment.',
  )
  lambda3: float = hp.hparam(1e-5, hp.NON_NEGATIVE, 'FedGPS weight of ||w||^2.')
  lambda_g: float = hp.hparam(
      0.5, hp.NON_NEGATIVE,
      "FedGPS look-ahead length along the other clients' update (0: no look-ahead).",
  )
  surrogate_samples_per_class: int = hp.hparam(
      100, hp.integer(1), 'FedGPS surrogate samples per class n_s.'
  )
  surrogate_seed: int = hp.hparam(
      0, hp.integer(0), 'FedGPS seed of the surrogate data, the same on every client.'
  )


# The client step: the objective, and SGD(M) with gradients at the look-ahead point.


# Metrics reported as means over the client's examples: `[sum, count]` each.
MEAN_METRICS = (
    'loss',  # Cross-entropy on the local data, comparable with other algorithms.
    'sparse_categorical_accuracy',
    'surrogate_loss',
    'local_alignment',
    'global_alignment',
    'objective',  # F_k, everything included.
)


def fedgps_objective(
    *,
    local_logits,
    local_labels,
    local_features,
    surrogate_logits,
    surrogate_labels,
    surrogate_features,
    global_prototypes,
    global_counts,
    weights,
    num_classes: int,
    lambda1: float,
    lambda2: float,
    lambda3: float,
):
  """FedGPS's client objective (paper eq. 6) on one local and one surrogate batch.

      F_k = CE(local) + CE(surrogate) + lambda1 * d(P_k, P_k^s)
            + lambda2 * d(P^s, P_k^s) + lambda3 * ||w||^2

  `P_k`, `P_k^s`: the batch's local and surrogate class prototypes; `P^s`: the
  global surrogate prototypes; `d`: `prototypes.prototype_distance` over the
  classes both sides have (classes of the batch; for `P^s`, the classes with a
  global prototype, none in round 0, where the term is 0). `||w||^2` sums the
  squares of every tensor of `weights`.

  Returns:
    `OrderedDict(objective, loss, surrogate_loss, local_alignment,
    global_alignment, l2)`: `F_k` and its unweighted terms.
  """

  def cross_entropy(labels, logits):
    return tf.reduce_mean(
        tf.keras.losses.sparse_categorical_crossentropy(
            labels, logits, from_logits=True
        )
    )

  local_prototypes, local_counts = prototypes.class_prototypes(
      local_features, local_labels, num_classes
  )
  surrogate_prototypes, surrogate_counts = prototypes.class_prototypes(
      surrogate_features, surrogate_labels, num_classes
  )
  in_batch = surrogate_counts > 0
  terms = collections.OrderedDict(
      loss=cross_entropy(local_labels, local_logits),
      surrogate_loss=cross_entropy(surrogate_labels, surrogate_logits),
      local_alignment=prototypes.prototype_distance(
          local_prototypes,
          surrogate_prototypes,
          tf.logical_and(local_counts > 0, in_batch),
      ),
      global_alignment=prototypes.prototype_distance(
          global_prototypes,
          surrogate_prototypes,
          tf.logical_and(global_counts > 0, in_batch),
      ),
      l2=tf.add_n([tf.reduce_sum(tf.square(w)) for w in weights]),
  )
  objective = (
      terms['loss']
      + terms['surrogate_loss']
      + lambda1 * terms['local_alignment']
      + lambda2 * terms['global_alignment']
      + lambda3 * terms['l2']
  )
  return collections.OrderedDict(objective=objective, **terms)


def _xy(batch):
  if isinstance(batch, Mapping):
    return batch['x'], batch['y']
  return batch


def _key(batch):
  """The batch's keys for a keyed model's random layers (`tasks.keyed_randomness`)."""
  return batch.get(keyed_randomness.KEY) if isinstance(batch, Mapping) else None


def _metric_finalizers():
  finalizers = collections.OrderedDict(
      (name, lambda v: tf.math.divide_no_nan(v[0], v[1])) for name in MEAN_METRICS
  )
  finalizers['num_examples'] = tf.identity
  finalizers['num_batches'] = tf.identity
  return finalizers


class _Round(NamedTuple):
  """What a client's local steps read, fixed for the round (`init`'s context)."""

  round_num: tf.Tensor
  shared: Mapping[str, tf.Tensor]  # The broadcast shared state.
  offset: tuple[tf.Tensor, ...]  # The look-ahead offset p = lambda_g d / ||d||.
  low_resolution: tf.Tensor  # The surrogate samples, before upsampling.
  surrogate_labels: tf.Tensor


class _LoopState(NamedTuple):
  """What the local steps carry from batch to batch."""

  step: tf.Tensor
  optimizer_state: object
  sums: Mapping[str, tf.Tensor]  # `[sum, count]` of each of MEAN_METRICS.
  prototype_sums: tf.Tensor  # [C, F]: the surrogate features seen, per class.
  prototype_counts: tf.Tensor  # [C].


def _fedgps_rule(
    keras_model_fn, hparams: FedGpsHparams, *, image_shape, num_classes, exclude_own_update,
) -> stateful_clients.ClientRule:
  """FedGPS's client on a new `keras_model_fn()`; the round input is `<round_num, shared>`."""
  samples_per_class = hparams.surrogate_samples_per_class
  surrogate_seed = hparams.surrogate_seed
  keras_model = keras_model_fn()
  feature_extractor, classifier = prototypes.split_model(keras_model)
  weights = tff.learning.models.ModelWeights(
      trainable=keras_model.trainable_variables,
      non_trainable=keras_model.non_trainable_variables,
  )
  trainable = tuple(weights.trainable)
  optimizer = fedavg.client_sgdm(hparams)
  low_shape = surrogate.low_resolution_shape(image_shape)
  num_surrogate = num_classes * samples_per_class
  feature_dim = classifier.input.shape[-1]

  def look_ahead_offset(client_state, round_num, shared):
    """`p = lambda_g d / ||d||`, `d` the mean update of last round's other clients."""
    mean_update = tuple(shared['last_update'])
    if exclude_own_update:
      own_update = tuple(client_state['own_update'])
      last_round = client_state['last_round']
      # `==` on tensors is not elementwise in every graph TFF traces.
      took_part = tf.logical_and(last_round >= 0, tf.equal(last_round, round_num - 1))
    else:  # The CF variant keeps no update of its own: d = Dbar.
      own_update = tuple(tf.zeros_like(t) for t in mean_update)
      took_part = tf.constant(False)
    direction = rectification.non_self_direction(
        mean_update, own_update, shared['num_clients'], took_part
    )
    return rectification.look_ahead_offset(direction, hparams.lambda_g)

  def init(client_state, broadcast):
    round_num, shared = broadcast['round_num'], broadcast['shared']
    context = _Round(
        round_num=round_num,
        shared=shared,
        offset=look_ahead_offset(client_state, round_num, shared),
        low_resolution=surrogate.low_resolution_samples(
            num_classes, samples_per_class, low_shape, surrogate_seed
        ),
        surrogate_labels=surrogate.labels(num_classes, samples_per_class),
    )
    specs = tuple(tf.TensorSpec(v.shape, v.dtype) for v in trainable)
    loop_state = _LoopState(
        step=tf.constant(0, tf.int32),
        optimizer_state=optimizer.initialize(specs),
        sums=collections.OrderedDict(
            (name, tf.zeros([2], tf.float32)) for name in MEAN_METRICS
        ),
        prototype_sums=tf.zeros([num_classes, feature_dim], tf.float32),
        prototype_counts=tf.zeros([num_classes], tf.float32),
    )
    return context, loop_state

  def surrogate_batch(context, step, batch_size):
    """This step's surrogate batch `(x^s, y^s)`, as large as the local one."""
    indices = surrogate.batch_indices(
        surrogate_seed, context.round_num, step, batch_size, num_surrogate
    )
    x_s = surrogate.to_images(tf.gather(context.low_resolution, indices), image_shape)
    return x_s, tf.gather(context.surrogate_labels, indices)

  def objective_terms(context, x, y, x_s, y_s):
    """`(features, logits, fedgps_objective's terms)` on the local and surrogate batch."""
    batch_size = tf.shape(y)[0]
    features = feature_extractor(
        tf.concat([tf.cast(x, tf.float32), x_s], axis=0), training=True
    )
    logits = classifier(features)
    terms = fedgps_objective(
        local_logits=logits[:batch_size],
        local_labels=y,
        local_features=features[:batch_size],
        surrogate_logits=logits[batch_size:],
        surrogate_labels=y_s,
        surrogate_features=features[batch_size:],
        global_prototypes=context.shared['prototypes'],
        global_counts=context.shared['prototype_counts'],
        weights=trainable,
        num_classes=num_classes,
        lambda1=hparams.lambda1,
        lambda2=hparams.lambda2,
        lambda3=hparams.lambda3,
    )
    return features, logits, terms

  def metric_sums(sums, terms, local_logits, y):
    """`sums` plus this batch's `[sum, count]` of each of MEAN_METRICS."""
    n = tf.cast(tf.shape(y)[0], tf.float32)
    correct = tf.reduce_sum(tf.cast(
        tf.equal(tf.argmax(local_logits, axis=-1, output_type=tf.int32), y), tf.float32
    ))
    batch_sums = dict(sparse_categorical_accuracy=correct)
    for name in MEAN_METRICS:
      if name != 'sparse_categorical_accuracy':
        batch_sums[name] = terms[name] * n
    return collections.OrderedDict(
        (name, sums[name] + tf.stack([batch_sums[name], n])) for name in MEAN_METRICS
    )

  def step(context, loop_state, batch):
    """One local step: the gradient at the look-ahead point `w + p` moves `w`."""
    x, y = _xy(batch)
    y = tf.reshape(tf.cast(y, tf.int32), [-1])
    batch_size = tf.shape(y)[0]
    x_s, y_s = surrogate_batch(context, loop_state.step, batch_size)
    current = tuple(v.read_value() for v in trainable)
    for variable, value, shift in zip(trainable, current, context.offset):
      variable.assign(value + shift)
    with tf.GradientTape() as tape, keyed_randomness.key(_key(batch)):
      features, logits, terms = objective_terms(context, x, y, x_s, y_s)
    gradients = tape.gradient(terms['objective'], trainable)
    gradients = tuple(tf.convert_to_tensor(g) for g in gradients)
    optimizer_state, updated = optimizer.next(loop_state.optimizer_state, current, gradients)
    for variable, value in zip(trainable, updated):
      variable.assign(value)
    surrogate_features = tf.stop_gradient(features[batch_size:])
    return _LoopState(
        step=loop_state.step + 1,
        optimizer_state=optimizer_state,
        sums=metric_sums(loop_state.sums, terms, logits[:batch_size], y),
        prototype_sums=loop_state.prototype_sums + tf.math.unsorted_segment_sum(
            surrogate_features, y_s, num_classes
        ),
        prototype_counts=loop_state.prototype_counts + tf.math.unsorted_segment_sum(
            tf.ones_like(y_s, tf.float32), y_s, num_classes
        ),
    )

  def final(context, loop_state, delta):
    """Keeps the round (and its delta); uploads the surrogate prototypes it saw."""
    state = collections.OrderedDict(last_round=context.round_num)
    if exclude_own_update:
      state['own_update'] = delta
    counts = loop_state.prototype_counts
    upload = collections.OrderedDict(
        prototypes=tf.math.divide_no_nan(loop_state.prototype_sums, counts[:, tf.newaxis]),
        counts=counts,
    )
    metrics = collections.OrderedDict(loop_state.sums)
    metrics['num_examples'] = tf.cast(loop_state.sums['loss'][1], tf.int64)
    metrics['num_batches'] = tf.cast(loop_state.step, tf.int64)
    return stateful_clients.ClientFinal(state=state, upload=upload, metrics=metrics)

  return stateful_clients.ClientRule(weights=weights, init=init, step=step, final=final)


def build_fedgps_client_work(
    keras_model_fn,
    hparams: FedGpsHparams,
    *,
    weights_type: tff.Type,
    data_type: tff.Type,
    shared_type: tff.Type,
    image_shape,
    num_classes: int,
    exclude_own_update: bool,
    loop_implementation: tff.learning.LoopImplementation = (
        tff.learning.LoopImplementation.DATASET_REDUCE
    ),
) -> stateful_clients.StatefulClientWork:
  """FedGPS's stateful client work.

  Args:
    keras_model_fn: A no-arg function returning the task's model as a bare Keras
      model, ending in a Dense classifier.
    hparams: The `FedGpsHparams` (rates, momentum, the lambdas, `n_s`, the seed).
    weights_type: The model weights' type (the task's `VariableModel`'s).
    data_type: One client's data (the `VariableModel`'s input spec, a sequence).
    shared_type: The type of the broadcast shared state: `OrderedDict(
      last_update, num_clients, prototypes, prototype_counts)`.
    image_shape: The model's input `(height, width, channels)`.
    num_classes: `C`, the classifier's outputs.
    exclude_own_update: FedGPS (True: a client that took part last round leaves
      its own update out of `d`) or FedGPS-CF (False: `d = Dbar`).
    loop_implementation: The client training loop.

  Returns:
    A `StatefulClientWork` for `compose.compose_stateful_process` with a shared
    state; the client state is `OrderedDict(last_round=int32)` (-1: never), plus
    `own_update` with `exclude_own_update`; the upload is
    `OrderedDict(prototypes=[C, F], counts=[C])`.
  """

  @tff.tensorflow.computation
  def initial_client_state():
    state = collections.OrderedDict(last_round=tf.constant(-1, tf.int32))
    if exclude_own_update:
      state['own_update'] = stateful_clients.trainable_zeros(weights_type.trainable)
    return state

  return stateful_clients.build_stateful_client_work(
      functools.partial(
          _fedgps_rule,
          keras_model_fn,
          hparams,
          image_shape=image_shape,
          num_classes=num_classes,
          exclude_own_update=exclude_own_update,
      ),
      weights_type=weights_type,
      data_type=data_type,
      round_input_type=tff.StructWithPythonType(
          [('round_num', np.int32), ('shared', shared_type)], collections.OrderedDict
      ),
      initial_client_state=initial_client_state,
      metrics_aggregation_fn=tff.learning.metrics.sum_then_finalize(_metric_finalizers()),
      loop_implementation=loop_implementation,
  )


# The server step on the shared state, and the builder.


class _ModelLayout(NamedTuple):
  weights_type: tff.Type  # The model weights the server broadcasts.
  image_shape: tuple[int, ...]  # (height, width, channels)
  num_classes: int
  feature_dim: int  # The classifier's input.
  data_type: tff.Type  # One client's data: the `VariableModel`'s input spec.


def _inspect_model(model_fn, keras_model_fn) -> _ModelLayout:
  """The task's model, checked: both functions built once, in a spare graph."""
  with tf.Graph().as_default():
    keras_model = keras_model_fn()
    input_shape = tuple(keras_model.input_shape)
    input_dtype = keras_model.inputs[0].dtype
    if len(input_shape) != 4 or not input_dtype.is_floating:
      raise ValueError(
          'FedGPS needs an image task (float input of shape (height, width,'
          f' channels)); {keras_model.name} takes {input_dtype.name} input of'
          f' shape {input_shape[1:]}. Shakespeare is not supported: its surrogate'
          ' data would have to be drawn in embedding space.'
      )
    _, classifier = prototypes.split_model(keras_model)
    keras_shapes = [tuple(v.shape) for v in keras_model.trainable_variables]
    model = model_fn()
    model_shapes = [tuple(v.shape) for v in model.trainable_variables]
    weights_type = tff.learning.models.weights_type_from_model(model)
    data_type = tff.SequenceType(tff.types.tensorflow_to_type(model.input_spec))
  if keras_shapes != model_shapes:
    raise ValueError(
        'keras_model_fn and model_fn build different models (trainable shapes'
        f' {keras_shapes} vs {model_shapes})'
    )
  return _ModelLayout(
      weights_type=weights_type,
      image_shape=input_shape[1:],
      num_classes=int(classifier.units),
      feature_dim=int(classifier.input.shape[-1]),
      data_type=data_type,
  )


def _initial_shared_state(weights_type, num_classes, feature_dim):
  """`( -> X)`: no last update (`K = 0`), no prototypes (counts 0)."""

  @tff.tensorflow.computation
  def initial():
    return collections.OrderedDict(
        last_update=stateful_clients.trainable_zeros(weights_type.trainable),
        num_clients=tf.constant(0, tf.int32),
        prototypes=tf.zeros([num_classes, feature_dim], tf.float32),
        prototype_counts=tf.zeros([num_classes], tf.float32),
    )

  return initial


def _shared_state(initial, upload_type, aggregated_type):
  """The server step on the shared state: `Dbar`, `K` and `P^s` of this round."""
  shared_type = initial.type_signature.result

  @tff.tensorflow.computation(upload_type)
  def weighted(upload):
    return collections.OrderedDict(
        weighted_sums=upload['prototypes'] * upload['counts'][:, tf.newaxis],
        counts=upload['counts'],
        clients=tf.constant(1, tf.int32),
    )

  sums_type = weighted.type_signature.result

  @tff.tensorflow.computation(shared_type, sums_type, aggregated_type)
  def server_update(shared, sums, aggregated):
    merged, counts = prototypes.merge_prototypes(
        sums['weighted_sums'], sums['counts'], shared['prototypes'],
        shared['prototype_counts'],
    )
    # A tuple, as `initial`'s: a checkpoint is read into the initial state's containers.
    return collections.OrderedDict(
        last_update=tuple(tf.negative(t) for t in aggregated),
        num_clients=sums['clients'],
        prototypes=merged,
        prototype_counts=counts,
    )

  return stateful_clients.build_shared_state(
      initial, upload_type, aggregated_type, weighted, server_update
  )


def build_fedgps(
    model_fn: compose.ModelFn,
    hparams: Optional[FedGpsHparams] = None,
    *,
    keras_model_fn: Optional[KerasModelFn] = None,
    exclude_own_update: bool = True,
    loop_implementation: tff.learning.LoopImplementation = compose.DATASET_REDUCE,
    model_aggregator: Optional[compose.AggregationFactory] = None,
    **overrides,
) -> stateful_clients.StatefulClientsLearningProcess:
  """Builds FedGPS (`exclude_own_update=True`) or FedGPS-CF (False).

  Args:
    model_fn: A no-arg function returning the task's
      `tff.learning.models.VariableModel` (e.g. `task.model_fn`).
    hparams: A `FedGpsHparams` (default: its defaults).
    keras_model_fn: A no-arg function returning the same model as a bare Keras
      model (e.g. `task.keras_model_fn`): FedGPS needs its features.
    exclude_own_update: Whether a client that took part last round leaves its
      own update out of the non-self direction (FedGPS; clients keep their last
      update as state) or always uses `Dbar` (FedGPS-CF): which variant, part of
      the algorithm's name, not a hyperparameter.
    loop_implementation: The client training loop.
    model_aggregator: Refused unless None (its uniform mean): the clients also upload
      their surrogate prototypes and counts, which the aggregator would not cover.
    **overrides: Fields of `FedGpsHparams` to replace.

  Returns:
    A `StatefulClientsLearningProcess` whose server state has `shared` (last
    round's mean update `last_update`, its number of clients `num_clients`, the
    global surrogate `prototypes` and their `prototype_counts`).

  Raises:
    ValueError: If a hyperparameter is out of range, `keras_model_fn` is missing,
      a `model_aggregator` is given, or the task is not an image task (Shakespeare).
  """
  compose.refuse_model_aggregator(
      model_aggregator, 'fedgps' if exclude_own_update else 'fedgps_cf',
      'their surrogate prototypes and per-class counts',
  )
  if keras_model_fn is None or not callable(keras_model_fn):
    raise ValueError(
        'FedGPS needs the task\'s Keras model: pass keras_model_fn (e.g.'
        f' task.keras_model_fn), got {keras_model_fn!r}'
    )
  exclude_own_update = validation.check_bool('exclude_own_update', exclude_own_update)
  hparams = FedGpsHparams.create(hparams, **overrides)

  layout = _inspect_model(model_fn, keras_model_fn)
  weights_type = layout.weights_type
  initial_shared = _initial_shared_state(weights_type, layout.num_classes, layout.feature_dim)
  client_work = build_fedgps_client_work(
      keras_model_fn,
      hparams,
      weights_type=weights_type,
      data_type=layout.data_type,
      shared_type=initial_shared.type_signature.result,
      image_shape=layout.image_shape,
      num_classes=layout.num_classes,
      exclude_own_update=exclude_own_update,
      loop_implementation=loop_implementation,
  )
  # The aggregated update is the mean of the clients' updates: trainable-shaped.
  shared = _shared_state(initial_shared, client_work.upload_type, weights_type.trainable)
  return compose.compose_stateful_process(
      model_fn, client_work, fedavg.server_sgd(hparams),
      tff.learning.ClientWeighting.UNIFORM, shared_state=shared,
  )
