"""FedAvg and FedAdam: client SGD, server SGD or Adam (the FedOpt family).

ALGORITHMS.md sections 2-4. Both weight client updates by their number of
examples. Client learning rates, epochs and batch sizes are per task and tuned
by the grid search of section 6; the defaults below are a starting point.
"""

import tensorflow_federated as tff

from tff_zmg.algorithms import compose

_DATASET_REDUCE = tff.learning.LoopImplementation.DATASET_REDUCE


def build_fedavg(
    model_fn: compose.ModelFn,
    *,
    client_learning_rate: float = 0.1,
    server_learning_rate: float = 1.0,
    loop_implementation: tff.learning.LoopImplementation = _DATASET_REDUCE,
) -> tff.learning.templates.LearningProcess:
  """FedAvg: local SGD, server SGD on the example-weighted mean update.

      client k:  w_k <- w_k - eta_l * g              (local steps from w^t)
      server:    u = sum_k n_k (w^t - w_k) / sum_k n_k
                 w^{t+1} = w^t - eta_g * u

  McMahan et al., "Communication-Efficient Learning of Deep Networks from
  Decentralized Data" (AISTATS 2017); with `eta_g` as in Reddi et al.,
  "Adaptive Federated Optimization" (ICLR 2021). The same process as
  `tff.learning.algorithms.build_weighted_fed_avg` with SGD on both sides.

  Defaults: `eta_g = 1` (the original FedAvg); `eta_l = 0.1` is our choice, a
  point of the 10^-3..10^1 half-decade grid (the FedZMG paper tunes both rates
  per task; its values were lost in conversion).

  Args:
    model_fn: A no-arg function returning a new
      `tff.learning.models.VariableModel`.
    client_learning_rate: `eta_l`, > 0.
    server_learning_rate: `eta_g`, > 0.
    loop_implementation: The client training loop.

  Returns:
    A `tff.learning.templates.LearningProcess`.

  Raises:
    ValueError: If a learning rate is not > 0 (checked before any model is
      built).
  """
  return compose.build_process(
      model_fn,
      client_rule='sgd',
      server_rule='sgd',
      client_weighting=tff.learning.ClientWeighting.NUM_EXAMPLES,
      client_learning_rate=client_learning_rate,
      server_learning_rate=server_learning_rate,
      loop_implementation=loop_implementation,
  )


def build_fedadam(
    model_fn: compose.ModelFn,
    *,
    client_learning_rate: float = 0.1,
    server_learning_rate: float = 0.01,
    adam_beta_1: float = 0.9,
    adam_beta_2: float = 0.99,
    adam_epsilon: float = 1e-3,
    adam_bias_correction: bool = False,
    loop_implementation: tff.learning.LoopImplementation = _DATASET_REDUCE,
) -> tff.learning.templates.LearningProcess:
  """FedAdam: local SGD, server Adam on the example-weighted mean update.

      client k:  w_k <- w_k - eta_l * g
      server:    u = sum_k n_k (w^t - w_k) / sum_k n_k
                 m <- b1 m + (1 - b1) u
                 v <- b2 v + (1 - b2) u^2
                 w^{t+1} = w^t - eta_g * m / (sqrt(v) + eps)

  Reddi et al., "Adaptive Federated Optimization" (ICLR 2021).

  Defaults: `b1 = 0.9`, `b2 = 0.99`, `eps = 1e-3`, no bias correction
  (ALGORITHMS.md section 3, after Reddi et al.). `eta_l = 0.1` (as FedAvg) and
  `eta_g = 0.01` are our choice on the grid: with `eps = 1e-3` the first
  server step is `eta_g * u / (|u| + 0.01)`, i.e. server SGD with rate
  `100 * eta_g = 1` for small updates, capped at `eta_g` per coordinate.

  Args:
    model_fn: A no-arg function returning a new
      `tff.learning.models.VariableModel`.
    client_learning_rate: `eta_l`, > 0.
    server_learning_rate: `eta_g`, > 0.
    adam_beta_1: `b1` in [0, 1).
    adam_beta_2: `b2` in [0, 1).
    adam_epsilon: `eps`, > 0.
    adam_bias_correction: Whether to use `m / (1 - b1^t)`, `v / (1 - b2^t)`.
    loop_implementation: The client training loop.

  Returns:
    A `tff.learning.templates.LearningProcess`.

  Raises:
    ValueError: If a hyperparameter is out of range (checked before any model
      is built).
  """
  return compose.build_process(
      model_fn,
      client_rule='sgd',
      server_rule='adam',
      client_weighting=tff.learning.ClientWeighting.NUM_EXAMPLES,
      client_learning_rate=client_learning_rate,
      server_learning_rate=server_learning_rate,
      adam_beta_1=adam_beta_1,
      adam_beta_2=adam_beta_2,
      adam_epsilon=adam_epsilon,
      adam_bias_correction=adam_bias_correction,
      loop_implementation=loop_implementation,
  )
