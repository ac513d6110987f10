"""FedRKMGC: relaxed Krasnosel'skii-Mann gradient correction, and its ablations.

Client rule: SGD(M) on the corrected gradient `g - D_n`, then the correction update
(`tff_zmg.correction`), with `D_n`, `Dt_n` kept by each client across the rounds it
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

import warnings

import tensorflow_federated as tff

from tff_zmg import correction as correction_lib
from tff_zmg import validation
from tff_zmg.algorithms import compose
from tff_zmg.algorithms import stateful_clients
from tff_zmg.client_work import corrected_sgdm

# rho beyond 2 makes the relaxation expansive (the paper's analysis needs rho <= 2).
MAX_SAFE_RHO = 2.0
# Below this gamma the fast KM coefficients leave the paper's analysed range.
MIN_RECOMMENDED_GAMMA = 2.0


def check_relaxation(rho: float, allow_unsafe_relaxation: bool) -> float:
  """`0 < rho <= 2`, or any `rho > 0` with `allow_unsafe_relaxation`."""
  validation.check_bool('allow_unsafe_relaxation', allow_unsafe_relaxation)
  if allow_unsafe_relaxation:
    return validation.check_positive('rho', rho)
  return validation.check_in_range(
      'rho', rho, 0.0, MAX_SAFE_RHO, low_inclusive=False
  )


def check_gamma(gamma: float) -> float:
  """`gamma > 0`; a warning below 2."""
  gamma = validation.check_positive('gamma', gamma)
  if gamma < MIN_RECOMMENDED_GAMMA:
    warnings.warn(
        f'gamma={gamma} is below {MIN_RECOMMENDED_GAMMA}, outside the range the'
        ' FedRKMGC paper analyses; the KM steps may not contract.',
        stacklevel=3,
    )
  return gamma


def build_fed_rkmgc(
    model_fn: compose.ModelFn,
    *,
    correction: str = 'fast_km',
    client_learning_rate: float = 0.01,
    client_momentum: float = 0.8,
    beta: float = 0.03,
    gamma: float = 500.0,
    rho: float = 1.5,
    km_clock: str = 'global',
    allow_unsafe_relaxation: bool = False,
    loop_implementation: tff.learning.LoopImplementation = (
        tff.learning.LoopImplementation.DATASET_REDUCE
    ),
) -> stateful_clients.StatefulClientsLearningProcess:
  """Builds FedRKMGC (or an ablation, by `correction` and `rho`).

  Args:
    model_fn: A no-arg function returning a new `tff.learning.models.VariableModel`.
    correction: 'fast_km' (the method), 'km' (standard KM) or 'raw' (no KM).
    client_learning_rate: `eta_l`, > 0.
    client_momentum: Local momentum `mu` in [0, 1) (the paper uses 0.8).
    beta: Correction rate, > 0.
    gamma: KM parameter, > 0 (a warning below 2).
    rho: Relaxation, in (0, 2] (any > 0 with `allow_unsafe_relaxation`).
    km_clock: 'global' (the global round index, the paper's Algorithm 1) or
      'participation' (the number of rounds the client took part in before).
    allow_unsafe_relaxation: Accept `rho > 2`.
    loop_implementation: The client training loop.

  Returns:
    A `StatefulClientsLearningProcess`; each client's state is
    `OrderedDict(correction=D_n, raw_correction=Dt_n, participations=...)`.

  Raises:
    ValueError: If a hyperparameter is out of its range.
  """
  if correction not in correction_lib.CORRECTIONS:
    raise ValueError(
        f'correction must be one of {list(correction_lib.CORRECTIONS)}, got'
        f' {correction!r}'
    )
  client_learning_rate = validation.check_positive(
      'client_learning_rate', client_learning_rate
  )
  client_momentum = validation.check_in_range(
      'client_momentum', client_momentum, 0.0, 1.0, high_inclusive=False
  )
  beta = validation.check_positive('beta', beta)
  gamma = check_gamma(gamma)
  rho = check_relaxation(rho, allow_unsafe_relaxation)
  if km_clock not in corrected_sgdm.KM_CLOCKS:
    raise ValueError(
        f'km_clock must be one of {list(corrected_sgdm.KM_CLOCKS)}, got {km_clock!r}'
    )

  variables = compose.trainable_variables(model_fn)
  initial_model_weights_fn = compose.initial_model_weights_computation(model_fn)
  client_work = corrected_sgdm.build_corrected_sgdm_client_work(
      model_fn,
      learning_rate=client_learning_rate,
      momentum=client_momentum,
      beta=beta,
      gamma=gamma,
      correction=correction,
      km_clock=km_clock,
      loop_implementation=loop_implementation,
  )
  relaxation = compose.SERVER_RULES['sgd'].build(rho, variables)
  distributor, aggregator, finalizer = compose.build_server_parts(
      initial_model_weights_fn, relaxation, tff.learning.ClientWeighting.UNIFORM
  )
  return stateful_clients.compose_stateful_clients_process(
      initial_model_weights_fn, distributor, client_work, aggregator, finalizer
  )
