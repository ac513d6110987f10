"""FedGPS: surrogate-distribution objective and non-self gradient rectification.

ALGORITHMS.md section 2 ("FedGPS client") and section 4; the FedGPS paper (Wu et
al., eqs. 6-8). Client rule (`tff_zmg.client_work.fedgps_client`): SGD(M) on

    F_k = CE(local) + CE(surrogate) + lambda1 d(P_k, P_k^s) + lambda2 d(P^s, P_k^s)
          + lambda3 ||w||^2,

each gradient taken at the look-ahead point `w + lambda_g d / ||d||`, `d` the mean
update of last round's *other* clients. Server step:

    w      <- w - eta_g * mean_k u_k          (uniform mean; eta_g = 1: FedAvg)
    Dbar   <- -mean_k u_k = mean_k delta_k    (broadcast next round, with K = |S_t|)
    P^s_c  <- sum_k n_kc P_kc / sum_k n_kc    (count-weighted surrogate prototypes)

`fedgps` keeps each client's own last delta as client state and leaves it out of `d`
when the client took part last round; `fedgps_cf` keeps none and uses `d = Dbar`.
Image tasks only: the surrogate data are images (`tff_zmg.surrogate`).
"""

import collections
from typing import Callable, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_zmg import prototypes
from tff_zmg import validation
from tff_zmg.algorithms import compose
from tff_zmg.algorithms import stateful_clients
from tff_zmg.client_work import fedgps_client

KerasModelFn = Callable[[], tf.keras.Model]


def _inspect_model(model_fn, keras_model_fn):
  """`(image_shape, num_classes, feature_dim)` of the task's model, checked."""
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
    model_shapes = [tuple(v.shape) for v in model_fn().trainable_variables]
  if keras_shapes != model_shapes:
    raise ValueError(
        'keras_model_fn and model_fn build different models (trainable shapes'
        f' {keras_shapes} vs {model_shapes})'
    )
  return input_shape[1:], int(classifier.units), int(classifier.input.shape[-1])


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
    return collections.OrderedDict(
        last_update=tf.nest.map_structure(tf.negative, aggregated),
        num_clients=sums['clients'],
        prototypes=merged,
        prototype_counts=counts,
    )

  @tff.federated_computation
  def initialize():
    return tff.federated_eval(initial, tff.SERVER)

  @tff.federated_computation(
      tff.FederatedType(shared_type, tff.SERVER),
      tff.FederatedType(upload_type, tff.CLIENTS),
      tff.FederatedType(aggregated_type, tff.SERVER),
  )
  def next_fn(shared, uploads, aggregated):
    sums = tff.federated_sum(tff.federated_map(weighted, uploads))
    return tff.federated_map(server_update, (shared, sums, aggregated))

  return stateful_clients.SharedState(initialize=initialize, next=next_fn)


def build_fedgps(
    model_fn: compose.ModelFn,
    *,
    keras_model_fn: Optional[KerasModelFn] = None,
    exclude_own_update: bool = True,
    client_learning_rate: float = 0.01,
    client_momentum: float = 0.9,
    server_learning_rate: float = 1.0,
    lambda1: float = 0.1,
    lambda2: float = 0.2,
    lambda3: float = 1e-5,
    lambda_g: float = 0.5,
    surrogate_samples_per_class: int = 100,
    surrogate_seed: int = 0,
    loop_implementation: tff.learning.LoopImplementation = (
        tff.learning.LoopImplementation.DATASET_REDUCE
    ),
) -> stateful_clients.StatefulClientsLearningProcess:
  """Builds FedGPS (`exclude_own_update=True`) or FedGPS-CF (False).

  Args:
    model_fn: A no-arg function returning the task's
      `tff.learning.models.VariableModel` (e.g. `task.model_fn`).
    keras_model_fn: A no-arg function returning the same model as a bare Keras
      model (e.g. `task.keras_model_fn`): FedGPS needs its features.
    exclude_own_update: Whether a client that took part last round leaves its
      own update out of the non-self direction (FedGPS; clients keep their last
      update as state) or always uses `Dbar` (FedGPS-CF).
    client_learning_rate: `eta_l`, > 0.
    client_momentum: Local momentum in [0, 1) (paper's Table 7: 0.9).
    server_learning_rate: `eta_g`, > 0 (1: the new model is the clients' mean).
    lambda1: Weight of the local-to-surrogate prototype alignment, >= 0.
    lambda2: Weight of the surrogate-to-global prototype alignment, >= 0.
    lambda3: Weight of `||w||^2`, >= 0.
    lambda_g: Length of the look-ahead offset, >= 0 (0: no look-ahead).
    surrogate_samples_per_class: `n_s`, an integer >= 1.
    surrogate_seed: Seed of the surrogate data (the same on every client), an
      integer >= 0.
    loop_implementation: The client training loop.

  Returns:
    A `StatefulClientsLearningProcess` whose server state has `shared` (last
    round's mean update `last_update`, its number of clients `num_clients`, the
    global surrogate `prototypes` and their `prototype_counts`).

  Raises:
    ValueError: If a hyperparameter is out of range, `keras_model_fn` is missing,
      or the task is not an image task (Shakespeare).
  """
  if keras_model_fn is None or not callable(keras_model_fn):
    raise ValueError(
        'FedGPS needs the task\'s Keras model: pass keras_model_fn (e.g.'
        f' task.keras_model_fn), got {keras_model_fn!r}'
    )
  exclude_own_update = validation.check_bool('exclude_own_update', exclude_own_update)
  client_learning_rate = validation.check_positive(
      'client_learning_rate', client_learning_rate
  )
  client_momentum = validation.check_in_range(
      'client_momentum', client_momentum, 0.0, 1.0, high_inclusive=False
  )
  server_learning_rate = validation.check_positive(
      'server_learning_rate', server_learning_rate
  )
  lambda1 = validation.check_non_negative('lambda1', lambda1)
  lambda2 = validation.check_non_negative('lambda2', lambda2)
  lambda3 = validation.check_non_negative('lambda3', lambda3)
  lambda_g = validation.check_non_negative('lambda_g', lambda_g)
  surrogate_samples_per_class = validation.check_integer(
      'surrogate_samples_per_class', surrogate_samples_per_class, 1
  )
  surrogate_seed = validation.check_integer('surrogate_seed', surrogate_seed, 0)

  image_shape, num_classes, feature_dim = _inspect_model(model_fn, keras_model_fn)
  initial_model_weights_fn = compose.initial_model_weights_computation(model_fn)
  weights_type = initial_model_weights_fn.type_signature.result
  initial_shared = _initial_shared_state(weights_type, num_classes, feature_dim)
  client_work = fedgps_client.build_fedgps_client_work(
      model_fn,
      keras_model_fn,
      shared_type=initial_shared.type_signature.result,
      image_shape=image_shape,
      num_classes=num_classes,
      samples_per_class=surrogate_samples_per_class,
      surrogate_seed=surrogate_seed,
      learning_rate=client_learning_rate,
      momentum=client_momentum,
      lambda1=lambda1,
      lambda2=lambda2,
      lambda3=lambda3,
      lambda_g=lambda_g,
      exclude_own_update=exclude_own_update,
      loop_implementation=loop_implementation,
  )
  server_sgd = compose.SERVER_RULES['sgd'].build(
      server_learning_rate, compose.trainable_variables(model_fn)
  )
  distributor, aggregator, finalizer = compose.build_server_parts(
      initial_model_weights_fn, server_sgd, tff.learning.ClientWeighting.UNIFORM
  )
  upload_type = client_work.next.type_signature.result.result[2].member
  aggregated_type = aggregator.next.type_signature.result.result.member
  shared = _shared_state(initial_shared, upload_type, aggregated_type)
  return stateful_clients.compose_stateful_clients_process(
      initial_model_weights_fn, distributor, client_work, aggregator, finalizer,
      shared_state=shared,
  )
