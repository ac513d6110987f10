"""FedRKMGC: relaxed Krasnosel'skii-Mann gradient correction, and its ablations.

Client rule: SGD(M) on the corrected gradient `g - D_n`, then the correction update
(`tff_zmg.transforms.correction`), with `D_n`, `Dt_n` kept by each client across the rounds it
takes part in. Server rule: the relaxation `w <- (1 - rho) w + rho * mean_n w_n`,
which is server SGD with learning rate `rho` on the uniform mean of the client
updates `u_n = w^t - w_n` (specification.md sections 2-4; the FedRKMGC paper, by anonymous
authors under double-blind review).

The ablations of the FedRKMGC paper (Table 9) differ in the correction update (how
`D_new` follows from the raw correction `Dt_new`) and in the default `rho`:

    --algo              correction_update  rho
    fedrkmgc_raw        raw                1.0
    fedrkmgc_re         raw                1.5
    fedrkmgc_km         km                 1.0
    fedrkmgc_fast_km    fast_km            1.0
    fedrkmgc_re_km      km                 1.5
    fedrkmgc            fast_km            1.5   (re_fast_km, the full method)

`correction` is the tensor `D_n` (the client state's `correction`); `correction_update`
names the ablation's kind.
"""

import collections
from collections.abc import Mapping
import dataclasses
import functools
from typing import NamedTuple, Optional
import warnings

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_zmg import validation
from tff_zmg.algorithms import fedavg
from tff_zmg.templates import compose
from tff_zmg.templates import hparams as hp
from tff_zmg.templates import stateful_clients
from tff_zmg.transforms import correction as correction_lib

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
      " 'participation' (the client's own count of rounds taken part, not dropped).",
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


# The client step: SGD(M) on corrected gradients, then the correction update. What
# becomes of a client whose result is not finite is `stateful_clients`' one policy.


class _Round(NamedTuple):
  """What a client's local steps read, fixed for the round (`init`'s context)."""

  client_state: Mapping[str, object]  # D_n (`correction`), Dt_n, participations.
  round_num: tf.Tensor


def _corrected_sgdm_rule(
    model_fn, hparams: FedRkmgcHparams, *, correction_update: str
) -> stateful_clients.ClientRule:
  """FedRKMGC's client on a new `model_fn()`; the round input is the round index."""
  model = model_fn()
  weights = tff.learning.models.ModelWeights.from_model(model)
  trainable = tuple(weights.trainable)
  optimizer = fedavg.client_sgdm(hparams)

  def init(client_state, round_num):
    specs = tuple(tf.TensorSpec(v.shape, v.dtype) for v in trainable)
    return _Round(client_state, round_num), optimizer.initialize(specs)

  def step(context, optimizer_state, batch):
    return stateful_clients.optimizer_step(
        model, trainable, optimizer, optimizer_state, batch,
        lambda gradients: tuple(
            correction_lib.corrected_gradient(g, d)
            for g, d in zip(gradients, context.client_state['correction'])
        ),
    )

  def final(context, optimizer_state, delta):
    del optimizer_state
    client_state, round_num = context.client_state, context.round_num
    participations = client_state['participations']
    t = tf.cast(
        round_num if hparams.km_clock == 'global' else participations, tf.float32
    )
    raw_new = tuple(
        correction_lib.raw_correction(d, dl, hparams.beta)
        for d, dl in zip(client_state['correction'], delta)
    )
    new_correction = tuple(
        correction_lib.next_correction(correction_update, rn, d, r, t, hparams.gamma)
        for rn, d, r in zip(raw_new, client_state['correction'], client_state['raw_correction'])
    )
    return stateful_clients.ClientFinal(
        state=collections.OrderedDict(
            correction=new_correction,
            raw_correction=raw_new,
            participations=participations + 1,
        ),
        upload=(),
        metrics=model.report_local_unfinalized_metrics(),
    )

  return stateful_clients.ClientRule(weights=weights, init=init, step=step, final=final)


def build_corrected_sgdm_client_work(
    model_fn,
    hparams: FedRkmgcHparams,
    *,
    correction_update: str,
    loop_implementation: tff.learning.LoopImplementation = (
        tff.learning.LoopImplementation.DATASET_REDUCE
    ),
) -> stateful_clients.StatefulClientWork:
  """FedRKMGC's stateful client work.

  Args:
    model_fn: A no-arg function returning a new `tff.learning.models.VariableModel`.
    hparams: The `FedRkmgcHparams`: `eta_l`, the momentum (0: plain SGD), the
      correction rate `beta`, the KM parameter `gamma` and the KM clock ('global':
      `t` is the round index; 'participation': the number of earlier rounds this
      client took part in and was not dropped in). `rho` is the server's.
    correction_update: One of `tff_zmg.transforms.correction.CORRECTION_UPDATES`: 'raw'
      (`D_new = Dt_new`), 'km' (standard KM) or 'fast_km'.
    loop_implementation: The client training loop.

  Returns:
    A `StatefulClientWork` whose client state is `OrderedDict(correction=D_n,
    raw_correction=Dt_n, participations=int32)`.
  """
  types = stateful_clients.model_types(model_fn)

  @tff.tensorflow.computation
  def initial_client_state():
    zeros = stateful_clients.trainable_zeros(types.weights_type.trainable)
    return collections.OrderedDict(
        correction=zeros,
        raw_correction=zeros,
        participations=tf.constant(0, tf.int32),
    )

  return stateful_clients.build_stateful_client_work(
      functools.partial(
          _corrected_sgdm_rule,
          model_fn,
          hparams,
          correction_update=correction_update,
      ),
      weights_type=types.weights_type,
      data_type=types.data_type,
      round_input_type=tff.TensorType(np.int32),
      initial_client_state=initial_client_state,
      metrics_aggregation_fn=types.metrics_aggregation_fn,
      loop_implementation=loop_implementation,
  )


# The server step.


def relaxation(hparams) -> compose.Optimizer:
  """The server step `w <- (1 - rho) w + rho * mean_n w_n`: SGD at rate `rho`."""
  return tff.learning.optimizers.build_sgdm(hparams.rho)


def build_fedrkmgc(
    model_fn: compose.ModelFn,
    hparams: Optional[FedRkmgcHparams] = None,
    *,
    correction_update: str = 'fast_km',
    loop_implementation: tff.learning.LoopImplementation = compose.DATASET_REDUCE,
    model_aggregator: Optional[compose.AggregationFactory] = None,
    **overrides,
) -> stateful_clients.StatefulClientsLearningProcess:
  """Builds FedRKMGC (or an ablation, by `correction_update` and `rho`).

  Args:
    model_fn: A no-arg function returning a new `tff.learning.models.VariableModel`.
    hparams: A `FedRkmgcHparams` (default: its defaults).
    correction_update: 'fast_km' (the method), 'km' (standard KM) or 'raw' (no KM):
      which ablation, part of the algorithm's name, not a hyperparameter.
    loop_implementation: The client training loop.
    model_aggregator: Optional `tff.aggregators` factory aggregating the client updates
      (`tff_zmg.aggregation.model_aggregator`); default: the uniform mean.
    **overrides: Fields of `FedRkmgcHparams` to replace.

  Returns:
    A `StatefulClientsLearningProcess`; each client's state is
    `OrderedDict(correction=D_n, raw_correction=Dt_n, participations=...)`.

  Raises:
    ValueError: If a hyperparameter is unknown or out of its range.
  """
  if correction_update not in correction_lib.CORRECTION_UPDATES:
    raise ValueError(
        f'correction_update must be one of {list(correction_lib.CORRECTION_UPDATES)},'
        f' got {correction_update!r}'
    )
  hparams = FedRkmgcHparams.create(hparams, **overrides)
  client_work = build_corrected_sgdm_client_work(
      model_fn, hparams, correction_update=correction_update,
      loop_implementation=loop_implementation,
  )
  return compose.compose_stateful_process(
      model_fn, client_work, relaxation(hparams), tff.learning.ClientWeighting.UNIFORM,
      model_aggregator=model_aggregator,
  )


def build_fed_rkmgc(model_fn, hparams=None, *, correction='fast_km', **kwargs):
  """Deprecated name of `build_fedrkmgc`, kept for a while (its `correction_update` was
  called `correction` here)."""
  return build_fedrkmgc(model_fn, hparams, correction_update=correction, **kwargs)
