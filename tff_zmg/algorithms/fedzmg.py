"""FedZMG, FedZMG-Adam and FedZMG-Yogi: zero-mean-gradient client momentum SGD.

specification.md section 2 (ZMG-SGDM) and section 4; the FedZMG paper (Zantalis, Zervas and
Koulouras, arXiv:2602.18384), eqs. 5-8:

    client k:  g~ = P(g)                   (every weight matrix; biases as is)
               v  <- mu v + g~             (v = 0 at the start of a round)
               w_k <- w_k - eta_l v - eta_l lambda_wd w_k
    server:    u = sum_k n_k (w^t - w_k) / sum_k n_k
      FedZMG:      w^{t+1} = w^t - eta_g * u
      FedZMG-Adam: FedAdam's server Adam on u (the hybrid the paper suggests as future
                   work, in its discussion)
      FedZMG-Yogi: FedYogi's server Yogi on u (the same hybrid with Reddi et al.'s Yogi)

with `P(G) = G - mean(G, all axes but the last)`. The decay never enters `g~` or `v`;
nothing extra is stored across rounds or sent.
"""

import dataclasses
from typing import Optional

import tensorflow_federated as tff

from tff_zmg import optimizers
from tff_zmg.transforms import projection
from tff_zmg.algorithms import fedavg
from tff_zmg.templates import compose
from tff_zmg.templates import hparams as hp


@dataclasses.dataclass(frozen=True)
class FedZmgHparams(hp.Hparams):
  """FedZMG's hyperparameters.

  `mu = 0.9`, `lambda_wd = 1e-4` (specification.md section 2), `eta_g = 1` (the paper's
  plain weighted average). `eta_l = 0.01` is our choice: its effective step
  `eta_l / (1 - mu) = 0.1` matches FedAvg's default (the paper tunes both rates per
  task; its values were lost in conversion).
  """

  DECOUPLED_WEIGHT_DECAY = True  # Eq. 6.

  client_learning_rate: float = hp.client_learning_rate(0.01)
  server_learning_rate: float = hp.server_learning_rate(1.0)
  client_momentum: float = hp.client_momentum(0.9)
  weight_decay: float = hp.weight_decay(1e-4)
  center_vectors: bool = hp.center_vectors(False)


@dataclasses.dataclass(frozen=True)
class FedZmgAdamHparams(fedavg.ServerAdamHparams, FedZmgHparams):
  """FedZMG-Adam's: the client's of FedZMG, the server's of FedAdam."""


@dataclasses.dataclass(frozen=True)
class FedZmgYogiHparams(fedavg.ServerYogiHparams, FedZmgHparams):
  """FedZMG-Yogi's: the client's of FedZMG, the server's of FedYogi."""


def zmg_sgdm(hparams, variables) -> compose.Optimizer:
  """The client step: ZMG-SGDM with decoupled decay on every weight matrix.

  Args:
    hparams: `client_learning_rate`, `client_momentum`, `weight_decay`, `center_vectors`.
    variables: The model's trainable variables (for the mask of weight matrices).
  """
  return optimizers.build_zmg_sgdm(
      hparams.client_learning_rate,
      momentum=hparams.client_momentum,
      weight_decay=hparams.weight_decay,
      mask=projection.projection_mask(
          variables, 'all', center_vectors=hparams.center_vectors
      ),
      center_vectors=hparams.center_vectors,
  )


def _zmg_process(model_fn, hparams, server_step, loop_implementation, model_aggregator):
  """ZMG-SGDM clients, `server_step(hparams)` on the example-weighted mean update."""
  variables = compose.trainable_variables(model_fn)
  return compose.compose_process(
      model_fn, zmg_sgdm(hparams, variables), server_step(hparams),
      tff.learning.ClientWeighting.NUM_EXAMPLES,
      loop_implementation=loop_implementation, model_aggregator=model_aggregator,
  )


def build_fedzmg(
    model_fn: compose.ModelFn,
    hparams: Optional[FedZmgHparams] = None,
    *,
    loop_implementation: tff.learning.LoopImplementation = compose.DATASET_REDUCE,
    model_aggregator: Optional[compose.AggregationFactory] = None,
    **overrides,
) -> tff.learning.templates.LearningProcess:
  """FedZMG: ZMG-SGDM clients, server SGD, example weights.

  Args:
    model_fn: A no-arg function returning a new `tff.learning.models.VariableModel`.
    hparams: A `FedZmgHparams` (default: its defaults).
    loop_implementation: The client training loop.
    model_aggregator: Optional `tff.aggregators` factory aggregating the client updates
      (`tff_zmg.aggregation.model_aggregator`); default: the example-weighted mean.
    **overrides: Fields of `FedZmgHparams` to replace, e.g. `client_learning_rate=0.03`.

  Raises:
    ValueError: If a hyperparameter is unknown or out of range (checked before any model
      is built).
  """
  hparams = FedZmgHparams.create(hparams, **overrides)
  return _zmg_process(
      model_fn, hparams, fedavg.server_sgd, loop_implementation, model_aggregator
  )


def build_fedzmg_adam(
    model_fn: compose.ModelFn,
    hparams: Optional[FedZmgAdamHparams] = None,
    *,
    loop_implementation: tff.learning.LoopImplementation = compose.DATASET_REDUCE,
    model_aggregator: Optional[compose.AggregationFactory] = None,
    **overrides,
) -> tff.learning.templates.LearningProcess:
  """FedZMG-Adam: FedZMG's clients with FedAdam's server, weighted by examples.

  Args:
    model_fn: A no-arg function returning a new `tff.learning.models.VariableModel`.
    hparams: A `FedZmgAdamHparams` (default: its defaults).
    loop_implementation: The client training loop.
    model_aggregator: Optional `tff.aggregators` factory aggregating the client updates
      (`tff_zmg.aggregation.model_aggregator`); default: the example-weighted mean.
    **overrides: Fields of `FedZmgAdamHparams` to replace.

  Raises:
    ValueError: If a hyperparameter is unknown or out of range (checked before any model
      is built).
  """
  hparams = FedZmgAdamHparams.create(hparams, **overrides)
  return _zmg_process(
      model_fn, hparams, fedavg.server_adam, loop_implementation, model_aggregator
  )


def build_fedzmg_yogi(
    model_fn: compose.ModelFn,
    hparams: Optional[FedZmgYogiHparams] = None,
    *,
    loop_implementation: tff.learning.LoopImplementation = compose.DATASET_REDUCE,
    model_aggregator: Optional[compose.AggregationFactory] = None,
    **overrides,
) -> tff.learning.templates.LearningProcess:
  """FedZMG-Yogi: FedZMG's clients with FedYogi's server, weighted by examples.

  Args:
    model_fn: A no-arg function returning a new `tff.learning.models.VariableModel`.
    hparams: A `FedZmgYogiHparams` (default: its defaults).
    loop_implementation: The client training loop.
    model_aggregator: Optional `tff.aggregators` factory aggregating the client updates
      (`tff_zmg.aggregation.model_aggregator`); default: the example-weighted mean.
    **overrides: Fields of `FedZmgYogiHparams` to replace.

  Raises:
    ValueError: If a hyperparameter is unknown or out of range (checked before any model
      is built).
  """
  hparams = FedZmgYogiHparams.create(hparams, **overrides)
  return _zmg_process(
      model_fn, hparams, fedavg.server_yogi, loop_implementation, model_aggregator
  )
