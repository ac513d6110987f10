"""FedRKMGC's client work: SGD(M) on corrected gradients, then the correction update.

Client `n` keeps `D_n` (`correction`) and `Dt_n` (`raw_correction`), both zero before
its first round (ALGORITHMS.md, "FedRKMGC corrected SGD(M)"):

    every local step:  g~ = g - D_n ;  v <- mu v + g~ ;  w <- w - eta_l v
    after the epochs:  delta_n = w_n - w^t
                       Dt_new = D_n - beta * delta_n
                       D_new  = KM step of (Dt_new, D_n, Dt_n) at clock t

The client reports `u_n = w^t - w_n` like every TFF client work. A client whose
update is not finite keeps its old state and contributes a zero update with weight
0 (TFF's convention), so one bad client cannot poison the corrections.
"""

import collections
import functools

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
# TFF's own choice of training loop (dataset reduce or iterator); the same helper
# runs TFF's built-in client works.
from tensorflow_federated.python.learning import loop_builder

from tff_zmg import correction as correction_lib
from tff_zmg.algorithms import stateful_clients

KM_CLOCKS = ('global', 'participation')


def _all_finite(tensors) -> tf.Tensor:
  return tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in tensors])


def _build_client_update(
    model_fn, *, learning_rate, momentum, beta, gamma, correction, km_clock,
    loop_implementation,
):
  """The `tf.function` one client runs: `(weights, data, state, t) -> outputs`."""
  model = model_fn()
  optimizer = tff.learning.optimizers.build_sgdm(learning_rate, momentum=momentum)
  training_loop = loop_builder.build_training_loop(loop_implementation)

  @tf.function
  def client_update(initial_weights, data, client_state, round_num):
    weights = tff.learning.models.ModelWeights.from_model(model)
    tf.nest.map_structure(lambda v, t: v.assign(t), weights, initial_weights)
    trainable = tuple(weights.trainable)
    applied = tuple(client_state['correction'])

    def reduce_fn(loop_state, batch):
      num_examples, optimizer_state = loop_state
      with tf.GradientTape() as tape:
        output = model.forward_pass(batch, training=True)
      gradients = tape.gradient(output.loss, trainable)
      # Embedding gradients arrive as IndexedSlices; the correction is dense.
      corrected = tuple(
          correction_lib.corrected_gradient(tf.convert_to_tensor(g), d)
          for g, d in zip(gradients, applied)
      )
      optimizer_state, updated = optimizer.next(
          optimizer_state, trainable, corrected
      )
      for variable, value in zip(trainable, updated):
        variable.assign(value)
      return num_examples + tf.cast(output.num_examples, tf.int64), optimizer_state

    def initial_loop_state():
      specs = tuple(tf.TensorSpec(v.shape, v.dtype) for v in trainable)
      return tf.constant(0, tf.int64), optimizer.initialize(specs)

    training_loop(reduce_fn, data, initial_loop_state)

    delta = tuple(w - w0 for w, w0 in zip(trainable, initial_weights.trainable))
    participations = client_state['participations']
    clock = round_num if km_clock == 'global' else participations
    t = tf.cast(clock, tf.float32)
    raw_new = tuple(
        correction_lib.raw_correction(d, dl, beta) for d, dl in zip(applied, delta)
    )
    new_correction = tuple(
        correction_lib.next_correction(correction, rn, d, r, t, gamma)
        for rn, d, r in zip(raw_new, applied, client_state['raw_correction'])
    )
    update = tuple(-d for d in delta)
    finite = tf.logical_and(_all_finite(update), _all_finite(new_correction))
    # A branch, not an elementwise select: no extra pass over model-sized tensors.
    update, new_correction, raw_new = tf.cond(
        finite,
        lambda: (update, new_correction, raw_new),
        lambda: (
            tuple(tf.zeros_like(u) for u in update),
            applied,
            tuple(client_state['raw_correction']),
        ),
    )
    new_state = collections.OrderedDict(
        correction=new_correction,
        raw_correction=raw_new,
        participations=participations + 1,
    )
    if not finite:
      model.reset_metrics()
    result = tff.learning.templates.ClientResult(
        update=update, update_weight=tf.where(finite, 1.0, 0.0)
    )
    return result, new_state, model.report_local_unfinalized_metrics()

  return client_update


def build_corrected_sgdm_client_work(
    model_fn,
    *,
    learning_rate: float,
    momentum: float,
    beta: float,
    gamma: float,
    correction: str,
    km_clock: str,
    loop_implementation: tff.learning.LoopImplementation = (
        tff.learning.LoopImplementation.DATASET_REDUCE
    ),
) -> stateful_clients.StatefulClientWork:
  """FedRKMGC's stateful client work (arguments are validated by the builder).

  Args:
    model_fn: A no-arg function returning a new `tff.learning.models.VariableModel`.
    learning_rate: `eta_l`.
    momentum: `mu` of the local SGD(M); 0 for plain SGD.
    beta: The correction rate.
    gamma: The KM parameter.
    correction: One of `tff_zmg.correction.CORRECTIONS`: 'raw' (`D_new = Dt_new`),
      'km' (standard KM) or 'fast_km'.
    km_clock: 'global' (`t` = the global round index) or 'participation' (`t` = the
      number of earlier rounds this client took part in).
    loop_implementation: The client training loop.

  Returns:
    A `StatefulClientWork` whose client state is `OrderedDict(correction=D_n,
    raw_correction=Dt_n, participations=int32)`.
  """
  build_local_update = functools.partial(
      _build_client_update,
      model_fn,
      learning_rate=learning_rate,
      momentum=momentum,
      beta=beta,
      gamma=gamma,
      correction=correction,
      km_clock=km_clock,
      loop_implementation=loop_implementation,
  )
  with tf.Graph().as_default():
    model = model_fn()
    metrics_aggregation_fn = tff.learning.metrics.sum_then_finalize(
        model.metric_finalizers()
    )
    data_type = tff.SequenceType(tff.types.tensorflow_to_type(model.input_spec))
    weights_type = tff.learning.models.weights_type_from_model(model)

  @tff.tensorflow.computation
  def initial_client_state():
    zeros = stateful_clients.trainable_zeros(weights_type.trainable)
    return collections.OrderedDict(
        correction=zeros,
        raw_correction=zeros,
        participations=tf.constant(0, tf.int32),
    )

  client_state_type = initial_client_state.type_signature.result

  @tff.tensorflow.computation(weights_type, data_type, client_state_type, np.int32)
  def client_update(weights, data, client_state, round_num):
    return build_local_update()(weights, data, client_state, round_num)

  return stateful_clients.build_stateful_client_work(
      client_update, initial_client_state, metrics_aggregation_fn, build_local_update
  )
