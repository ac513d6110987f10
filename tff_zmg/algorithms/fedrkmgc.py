"""FedRKMGC: relaxed Krasnosel'skii-Mann gradient correction, and its ablations.

Client rule: SGD(M) on the corrected gradient `g - D_n`, then the correction update
(`tff_zmg.transforms.correction`), with `D_n`, `Dt_n` kept by each client across the rounds it
takes part in. Server rule: the relaxation `w <- (1 - rho) w + rho * mean_n w_n`,
which is server SGD with learning rate `rho` on the uniform mean of the client
updates `u_n = w^t - w_n` (ALGORITHMS.md sections 2-4).

The ablations of the FedRKMGC paper (Table 9) differ in the correction step and in
the default `rho`:

    --algo              correction  rho
    fedrkmgc_raw        raw         1.0
    fedrkmgc_re         raw         1.5
    fedrkmgc_km         km          1.0
    fedrkmgc_fast_km    fast_km     1.0
    fedrkmgc_re_km      km          1.5
    fedrkmgc            fast_km     1.5   (re_fast_km, the full method)
"""

import collections
import dataclasses
import functools
from typing import Optional
import warnings

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
# TFF's own choice of training loop (dataset reduce or iterator); the same helper
# runs TFF's built-in client works.
from tensorflow_federated.python.learning import loop_builder

from tff_zmg.transforms import correction as correction_lib
from tff_zmg import validation
from tff_zmg.templates import compose
from tff_zmg.templates import hparams as hp
from tff_zmg.templates import stateful_clients

# rho beyond 2 makes the relaxation expansive (the paper's analysis needs rho <= 2).
MAX_SAFE_RHO = 2.0
# Below this gamma the fast KM coefficients leave the paper's analysed range.
MIN_RECOMMENDED_GAMMA = 2.0
# The ablations without relaxation: the new model is the clients' plain mean.
NO_RELAXATION = {'rho': 1.0}
KM_CLOCKS = ('global', 'participation')


@dataclasses.dataclass(frozen=True)
class FedRkmgcHparams(hp.Hparams):
  """FedRKMGC's hyperparameters (the paper's: `eta_l = 0.01`, momentum 0.8, `beta = 0.03`,
  `gamma = 500`, `rho = 1.5`; 5 epochs and batch 20 are task settings)."""

  client_learning_rate: float = hp.client_learning_rate(0.01)
  client_momentum: float = hp.client_momentum(0.8)
  beta: float = hp.hparam(0.03, hp.POSITIVE, 'FedRKMGC correction rate beta.')
  gamma: float = hp.hparam(
      500.0, hp.POSITIVE,
      f'FedRKMGC KM parameter gamma (a warning below {MIN_RECOMMENDED_GAMMA:g}).',
  )
  rho: float = hp.hparam(
      1.5,
      # Checked in `check_together`: the range depends on `allow_unsafe_relaxation`.
      hp.Valid(f'in (0, {MAX_SAFE_RHO:g}]; any > 0 with allow_unsafe_relaxation',
               lambda name, value: value),
      'FedRKMGC relaxation rho: server SGD rate on the uniform mean update.',
  )
  km_clock: str = hp.hparam(
      'global', hp.one_of(*KM_CLOCKS),
      "FedRKMGC KM clock: 'global' (the round index, the paper's Algorithm 1) or"
      " 'participation' (the client's own count of rounds taken part).",
  )
  allow_unsafe_relaxation: bool = hp.hparam(
      False, hp.BOOL, f'Accept rho > {MAX_SAFE_RHO:g}.'
  )

  def check_together(self):
    if self.allow_unsafe_relaxation:
      rho = validation.check_positive('rho', self.rho)
    else:
      rho = validation.check_in_range(
          'rho', self.rho, 0.0, MAX_SAFE_RHO, low_inclusive=False
      )
    object.__setattr__(self, 'rho', rho)
    if self.gamma < MIN_RECOMMENDED_GAMMA:
      warnings.warn(
          f'gamma={self.gamma} is below {MIN_RECOMMENDED_GAMMA}, outside the range the'
          ' FedRKMGC paper analyses; the KM steps may not contract.',
          stacklevel=4,
      )


# The client step: SGD(M) on corrected gradients, then the correction update. A client
# whose update is not finite keeps its old state and contributes a zero update with
# weight 0 (TFF's convention), so one bad client cannot poison the corrections.


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
  """FedRKMGC's stateful client work (the arguments are `FedRkmgcHparams`'s, checked).

  Args:
    model_fn: A no-arg function returning a new `tff.learning.models.VariableModel`.
    learning_rate: `eta_l`.
    momentum: `mu` of the local SGD(M); 0 for plain SGD.
    beta: The correction rate.
    gamma: The KM parameter.
    correction: One of `tff_zmg.transforms.correction.CORRECTIONS`: 'raw' (`D_new = Dt_new`),
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


# The server step.


def relaxation(hparams) -> compose.Optimizer:
  """The server step `w <- (1 - rho) w + rho * mean_n w_n`: SGD at rate `rho`."""
  return tff.learning.optimizers.build_sgdm(hparams.rho)


def build_fed_rkmgc(
    model_fn: compose.ModelFn,
    hparams: Optional[FedRkmgcHparams] = None,
    *,
    correction: str = 'fast_km',
    loop_implementation: tff.learning.LoopImplementation = compose.DATASET_REDUCE,
    **overrides,
) -> stateful_clients.StatefulClientsLearningProcess:
  """Builds FedRKMGC (or an ablation, by `correction` and `rho`).

  Args:
    model_fn: A no-arg function returning a new `tff.learning.models.VariableModel`.
    hparams: A `FedRkmgcHparams` (default: its defaults).
    correction: 'fast_km' (the method), 'km' (standard KM) or 'raw' (no KM): which
      ablation, part of the algorithm's name, not a hyperparameter.
    loop_implementation: The client training loop.
    **overrides: Fields of `FedRkmgcHparams` to replace.

  Returns:
    A `StatefulClientsLearningProcess`; each client's state is
    `OrderedDict(correction=D_n, raw_correction=Dt_n, participations=...)`.

  Raises:
    ValueError: If a hyperparameter is unknown or out of its range.
  """
  if correction not in correction_lib.CORRECTIONS:
    raise ValueError(
        f'correction must be one of {list(correction_lib.CORRECTIONS)}, got'
        f' {correction!r}'
    )
  hparams = FedRkmgcHparams.create(hparams, **overrides)
  initial_model_weights_fn = compose.initial_model_weights_computation(model_fn)
  client_work = build_corrected_sgdm_client_work(
      model_fn,
      learning_rate=hparams.client_learning_rate,
      momentum=hparams.client_momentum,
      beta=hparams.beta,
      gamma=hparams.gamma,
      correction=correction,
      km_clock=hparams.km_clock,
      loop_implementation=loop_implementation,
  )
  distributor, aggregator, finalizer = compose.build_server_parts(
      initial_model_weights_fn, relaxation(hparams), tff.learning.ClientWeighting.UNIFORM
  )
  return stateful_clients.compose_stateful_clients_process(
      initial_model_weights_fn, distributor, client_work, aggregator, finalizer
  )
