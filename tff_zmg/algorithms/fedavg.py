"""FedAvg and FedAdam: client SGD, server SGD or Adam (the FedOpt family).

ALGORITHMS.md sections 2-4. Both weight client updates by their number of examples.

    client k:  w_k <- w_k - eta_l * g                  (local steps from w^t)
    server:    u = sum_k n_k (w^t - w_k) / sum_k n_k
      FedAvg:  w^{t+1} = w^t - eta_g * u
      FedAdam: m <- b1 m + (1 - b1) u ;  v <- b2 v + (1 - b2) u^2
               w^{t+1} = w^t - eta_g * m / (sqrt(v) + eps)

McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized
Data" (AISTATS 2017); Reddi et al., "Adaptive Federated Optimization" (ICLR 2021).
FedAvg is the process of `tff.learning.algorithms.build_weighted_fed_avg` with SGD on
both sides. Client learning rates, epochs and batch sizes are per task and tuned by the
grid search of section 6; the defaults below are a starting point.
"""

import dataclasses
from typing import Optional

import tensorflow_federated as tff

from tff_zmg import optimizers
from tff_zmg.templates import compose
from tff_zmg.templates import hparams as hp


@dataclasses.dataclass(frozen=True)
class FedAvgHparams(hp.Hparams):
  """FedAvg's hyperparameters.

  `eta_g = 1` is the original FedAvg; `eta_l = 0.1` is our choice, a point of the
  10^-3..10^1 half-decade grid (the FedZMG paper tunes both rates per task; its values
  were lost in conversion).
  """

  client_learning_rate: float = hp.client_learning_rate(0.1)
  server_learning_rate: float = hp.server_learning_rate(1.0)


@dataclasses.dataclass(frozen=True)
class ServerAdamHparams(hp.Hparams):
  """FedAdam's server: Adam and its rate (ALGORITHMS.md section 3, after Reddi et al.).

  `eta_g = 0.01` is our choice on the grid: with `eps = 1e-3` the first server step is
  `eta_g * u / (|u| + 0.01)`, i.e. server SGD with rate `100 * eta_g = 1` for small
  updates, capped at `eta_g` per coordinate.
  """

  server_learning_rate: float = hp.server_learning_rate(0.01)
  adam_beta_1: float = hp.hparam(
      0.9, hp.UNIT_INTERVAL_HALF_OPEN, 'Server Adam first-moment decay b1.'
  )
  adam_beta_2: float = hp.hparam(
      0.99, hp.UNIT_INTERVAL_HALF_OPEN, 'Server Adam second-moment decay b2.'
  )
  adam_epsilon: float = hp.hparam(1e-3, hp.POSITIVE, 'Server Adam epsilon.')
  adam_bias_correction: bool = hp.hparam(
      False, hp.BOOL, 'Server Adam bias correction (m / (1 - b1^t), v / (1 - b2^t)).'
  )


@dataclasses.dataclass(frozen=True)
class FedAdamHparams(ServerAdamHparams, FedAvgHparams):
  """FedAdam's: FedAvg's client rate, the server's of `ServerAdamHparams`."""


# The client step and the server steps.


def client_sgd(hparams) -> compose.Optimizer:
  """`w <- w - eta_l * g` (TFF's `build_sgdm` without momentum)."""
  return tff.learning.optimizers.build_sgdm(hparams.client_learning_rate)


def server_sgd(hparams) -> compose.Optimizer:
  """`w <- w - eta_g * u`."""
  return tff.learning.optimizers.build_sgdm(hparams.server_learning_rate)


def server_adam(hparams) -> compose.Optimizer:
  """FedAdam's server Adam on the aggregated update (`tff_zmg.optimizers.server_adam`)."""
  return optimizers.build_server_adam(
      hparams.server_learning_rate,
      beta_1=hparams.adam_beta_1,
      beta_2=hparams.adam_beta_2,
      epsilon=hparams.adam_epsilon,
      bias_correction=hparams.adam_bias_correction,
  )


# The builders.


def build_fedavg(
    model_fn: compose.ModelFn,
    hparams: Optional[FedAvgHparams] = None,
    *,
    loop_implementation: tff.learning.LoopImplementation = compose.DATASET_REDUCE,
    **overrides,
) -> tff.learning.templates.LearningProcess:
  """FedAvg: local SGD, server SGD on the example-weighted mean update.

  Args:
    model_fn: A no-arg function returning a new `tff.learning.models.VariableModel`.
    hparams: A `FedAvgHparams` (default: its defaults).
    loop_implementation: The client training loop.
    **overrides: Fields of `FedAvgHparams` to replace, e.g. `client_learning_rate=0.03`.

  Raises:
    ValueError: If a hyperparameter is unknown or out of range (checked before any model
      is built).
  """
  hparams = FedAvgHparams.create(hparams, **overrides)
  return compose.compose_process(
      model_fn, client_sgd(hparams), server_sgd(hparams),
      tff.learning.ClientWeighting.NUM_EXAMPLES,
      loop_implementation=loop_implementation,
  )


def build_fedadam(
    model_fn: compose.ModelFn,
    hparams: Optional[FedAdamHparams] = None,
    *,
    loop_implementation: tff.learning.LoopImplementation = compose.DATASET_REDUCE,
    **overrides,
) -> tff.learning.templates.LearningProcess:
  """FedAdam: local SGD, server Adam on the example-weighted mean update.

  Args:
    model_fn: A no-arg function returning a new `tff.learning.models.VariableModel`.
    hparams: A `FedAdamHparams` (default: its defaults).
    loop_implementation: The client training loop.
    **overrides: Fields of `FedAdamHparams` to replace.

  Raises:
    ValueError: If a hyperparameter is unknown or out of range (checked before any model
      is built).
  """
  hparams = FedAdamHparams.create(hparams, **overrides)
  return compose.compose_process(
      model_fn, client_sgd(hparams), server_adam(hparams),
      tff.learning.ClientWeighting.NUM_EXAMPLES,
      loop_implementation=loop_implementation,
  )
