"""Mime-Lite with SGDM: TFF's `build_weighted_mime_lite`.

Karimireddy et al., "Breaking the centralized barrier for cross-device federated learning"
(NeurIPS 2021), Mime-Lite. The server keeps the base optimizer's state (the momentum
`m`); clients step with it frozen and send back their full-batch gradient at `w^t`:

    client k:  d = g(w_k) ;  w_k <- w_k - eta_l ((1 - beta) d + beta m)   (m not updated)
               grad_k = mean over its data of g(w^t)
    server:    u = sum_k n_k (w^t - w_k) / sum_k n_k ;  w^{t+1} = w^t - eta_g u
               m <- (1 - beta) sum_k n_k grad_k / sum_k n_k + beta m

written with TFF's SGDM, whose momentum is `m <- beta m + g` and step `eta_l m`: the
client steps `w <- w - eta_l (beta m + d)` and the server updates `m <- beta m + grad`
(the paper's form up to the scale `1 / (1 - beta)` of `eta_l`).
"""

import dataclasses
from typing import Optional

import tensorflow_federated as tff

from tff_zmg.algorithms import fedavg
from tff_zmg.templates import compose
from tff_zmg.templates import hparams as hp


@dataclasses.dataclass(frozen=True)
class MimeLiteHparams(hp.Hparams):
  """Mime-Lite's: the base SGDM's rate and momentum, the server's rate.

  `beta = 0.9` is the paper's momentum; `eta_l = 0.01` keeps the effective step
  `eta_l / (1 - beta) = 0.1` of FedAvg's default (our choice, as for FedZMG); `eta_g = 1`
  is the paper's server (plain averaging).
  """

  client_learning_rate: float = hp.client_learning_rate(0.01)
  client_momentum: float = hp.client_momentum(0.9)
  server_learning_rate: float = hp.server_learning_rate(1.0)


def build_mime_lite(
    model_fn: compose.ModelFn,
    hparams: Optional[MimeLiteHparams] = None,
    *,
    loop_implementation: tff.learning.LoopImplementation = compose.DATASET_REDUCE,
    model_aggregator: Optional[compose.AggregationFactory] = None,
    **overrides,
) -> tff.learning.templates.LearningProcess:
  """Mime-Lite: clients step with the server's SGDM state, server SGD, example weights.

  Args:
    model_fn: A no-arg function returning a new `tff.learning.models.VariableModel`.
    hparams: A `MimeLiteHparams` (default: its defaults).
    loop_implementation: The client training loop.
    model_aggregator: Refused unless None (its example-weighted mean): the clients also
      upload their full-batch gradients, which the aggregator would not cover.
    **overrides: Fields of `MimeLiteHparams` to replace.

  Raises:
    ValueError: If a hyperparameter is unknown or out of range, or a `model_aggregator`
      is given (checked before any model is built).
  """
  # TFF's builder would aggregate the gradients with its own `full_gradient_aggregator`:
  # a second release per round, which neither the DP aggregator nor its accounting covers.
  compose.refuse_model_aggregator(
      model_aggregator, 'mime_lite', 'their full-batch gradients at the round\'s model'
  )
  hparams = MimeLiteHparams.create(hparams, **overrides)
  compose.check_arguments(
      model_fn, tff.learning.ClientWeighting.NUM_EXAMPLES, loop_implementation
  )
  return tff.learning.algorithms.build_weighted_mime_lite(
      model_fn,
      base_optimizer=fedavg.client_sgdm(hparams),  # Its state the server keeps.
      server_optimizer=fedavg.server_sgd(hparams),
      client_weighting=tff.learning.ClientWeighting.NUM_EXAMPLES,
      loop_implementation=loop_implementation,
  )
