"""FedProx, and FedZMG with FedProx's proximal term.

specification.md notation; Li et al., "Federated Optimization in Heterogeneous Networks"
(MLSys 2020). Each client minimizes its loss plus `(mu / 2) ||w - w^t||^2`, so the
gradient a local step hands its optimizer is

    g_prox = g + mu (w_k - w^t)                     (mu >= 0; mu = 0 is FedAvg)
    FedProx:      w_k <- w_k - eta_l g_prox      (FedAvg's client SGD: momentum and
                                                   coupled weight decay when set)
    FedZMG-Prox:  g~ = P(g_prox) ; v <- mu_m v + g~ ; w_k <- w_k - eta_l v - eta_l lambda_wd w_k
    server:       u = sum_k n_k (w^t - w_k) / sum_k n_k ;  w^{t+1} = w^t - eta_g u

The proximal term wraps the client optimizer (`tff_zmg.optimizers.build_proximal`), so
FedZMG-Prox projects `g + mu (w_k - w^t)`: the whole direction the optimizer steps along
is zero-mean, as FedZMG's is, and the proximal pull is centred too (its mean part would
shift every output unit of a layer alike, which the projection removes from the gradient
as well). The decay stays decoupled: it never enters the projection or the momentum.

Not TFF's `build_weighted_fed_prox`: TFF 0.87 adds `mu (w^t - w_k)`, the opposite sign
of the proximal gradient (see `tff_zmg/optimizers/proximal.py`); ours follows the paper.
"""

import dataclasses
from typing import Optional

import tensorflow_federated as tff

from tff_zmg import optimizers
from tff_zmg.algorithms import fedavg
from tff_zmg.algorithms import fedzmg
from tff_zmg.templates import compose
from tff_zmg.templates import hparams as hp


@dataclasses.dataclass(frozen=True)
class ProximalHparams(hp.Hparams):
  """The proximal term's strength. `mu = 0.01`: one of the FedProx paper's grid
  {0.001, 0.01, 0.1, 1} (it tunes mu per dataset; `launch.grid_search --hparam_grid`
  covers it)."""

  proximal_strength: float = hp.hparam(
      0.01, hp.NON_NEGATIVE,
      'FedProx proximal strength mu: local steps add mu (w - w^t) to the gradient'
      ' (0: none).',
  )


@dataclasses.dataclass(frozen=True)
class FedProxHparams(ProximalHparams, fedavg.FedAvgHparams):
  """FedProx's: FedAvg's rates and the proximal strength."""


@dataclasses.dataclass(frozen=True)
class FedZmgProxHparams(ProximalHparams, fedzmg.FedZmgHparams):
  """FedZMG-Prox's: FedZMG's client and server settings and the proximal strength."""


# The client steps: a client rule on the proximal gradient; the server step is FedAvg's.


def prox_sgd(hparams) -> compose.Optimizer:
  """FedProx's client step: `w <- w - eta_l (g + mu (w - w^t))` (FedAvg's client SGD on
  the proximal gradient)."""
  return optimizers.build_proximal(fedavg.client_sgd(hparams), hparams.proximal_strength)


def prox_zmg_sgdm(hparams, variables) -> compose.Optimizer:
  """FedZMG-Prox's client step: ZMG-SGDM on `g + mu (w - w^t)`."""
  return optimizers.build_proximal(
      fedzmg.zmg_sgdm(hparams, variables), hparams.proximal_strength
  )


def _prox_process(model_fn, client_optimizer, hparams, loop_implementation, model_aggregator):
  return compose.compose_process(
      model_fn, client_optimizer, fedavg.server_sgd(hparams),
      tff.learning.ClientWeighting.NUM_EXAMPLES, loop_implementation=loop_implementation,
      model_aggregator=model_aggregator,
  )


def build_fedprox(
    model_fn: compose.ModelFn,
    hparams: Optional[FedProxHparams] = None,
    *,
    loop_implementation: tff.learning.LoopImplementation = compose.DATASET_REDUCE,
    model_aggregator: Optional[compose.AggregationFactory] = None,
    **overrides,
) -> tff.learning.templates.LearningProcess:
  """FedProx: local SGD on the proximal objective, server SGD, example weights.

  Args:
    model_fn: A no-arg function returning a new `tff.learning.models.VariableModel`.
    hparams: A `FedProxHparams` (default: its defaults).
    loop_implementation: The client training loop.
    model_aggregator: Optional `tff.aggregators` factory aggregating the client updates
      (`tff_zmg.aggregation.model_aggregator`); default: the example-weighted mean.
    **overrides: Fields of `FedProxHparams` to replace, e.g. `proximal_strength=0.1`.

  Raises:
    ValueError: If a hyperparameter is unknown or out of range (checked before any model
      is built).
  """
  hparams = FedProxHparams.create(hparams, **overrides)
  return _prox_process(
      model_fn, prox_sgd(hparams), hparams, loop_implementation, model_aggregator
  )


def build_fedzmg_prox(
    model_fn: compose.ModelFn,
    hparams: Optional[FedZmgProxHparams] = None,
    *,
    loop_implementation: tff.learning.LoopImplementation = compose.DATASET_REDUCE,
    model_aggregator: Optional[compose.AggregationFactory] = None,
    **overrides,
) -> tff.learning.templates.LearningProcess:
  """FedZMG-Prox: FedZMG's client step on the proximal gradient, server SGD.

  Args:
    model_fn: A no-arg function returning a new `tff.learning.models.VariableModel`.
    hparams: A `FedZmgProxHparams` (default: its defaults).
    loop_implementation: The client training loop.
    model_aggregator: Optional `tff.aggregators` factory aggregating the client updates
      (`tff_zmg.aggregation.model_aggregator`); default: the example-weighted mean.
    **overrides: Fields of `FedZmgProxHparams` to replace.

  Raises:
    ValueError: If a hyperparameter is unknown or out of range (checked before any model
      is built).
  """
  hparams = FedZmgProxHparams.create(hparams, **overrides)
  variables = compose.trainable_variables(model_fn)
  return _prox_process(
      model_fn, prox_zmg_sgdm(hparams, variables), hparams, loop_implementation,
      model_aggregator,
  )
