"""LocalGC, GlobalGC, GC-Fed: gradient centralization on clients and/or server.

Seo et al., "GC-Fed: Gradient Centralized Federated Learning with Partial Client
Participation" (arXiv 2503.13180); specification.md sections 1-4. `P` centres every output
column of a weight matrix (biases as is); the layers are split by the borderline
`gc_lambda` into feature layers (the first `floor(gc_lambda * L)`) and classifier layers
(the rest), default: every layer but the last is a feature layer.

    LocalGC (client, section 3.3, Definition 1, the authors' order):
               d = M(P(g)) + lambda_wd w_k      (M: `local_gc_layers`, coupled L2)
               v <- mu v + d ;  w_k <- w_k - eta_l v
    GlobalGC (server, Definition 2):
               u = mean_k (w^t - w_k)            (uniform: Algorithm 1, line 13)
               w^{t+1} = w^t - eta_g * M'(P(u))  (M': `global_gc_layers`)

    local_gc:  LocalGC on every layer, server SGD
    global_gc: client SGDM with coupled L2 (`fedavg.client_sgd`: LocalGC's step without
               the projection), GlobalGC on every layer
    gcfed:     LocalGC on the feature layers, GlobalGC on the classifier layers
               (Algorithm 1; the authors' code projects every layer on the server:
               `global_gc_layers='all'`)

The masks are computed once per build, from one throwaway model's variables.
"""

import dataclasses
from typing import Optional

import tensorflow_federated as tff

from tff_zmg import optimizers
from tff_zmg.transforms import projection
from tff_zmg.algorithms import fedavg
from tff_zmg.templates import compose
from tff_zmg.templates import hparams as hp

_UNIFORM = tff.learning.ClientWeighting.UNIFORM


@dataclasses.dataclass(frozen=True)
class _GcHparams(hp.Hparams):
  """What the three share: the paper's training setup (section 4.1).

  Client SGD with `eta_l = 0.01`, momentum 0.9 and weight decay 1e-5, coupled as the
  authors' SGD has it (5 local epochs, batch 50: task settings, not algorithm ones), and
  `eta_g = 1` (Algorithm 1, line 15: `w^{t+1} = w^t + P(Delta)`).
  """

  client_learning_rate: float = hp.client_learning_rate(0.01)
  server_learning_rate: float = hp.server_learning_rate(1.0)
  client_momentum: float = hp.client_momentum(0.9)
  weight_decay: float = hp.weight_decay(1e-5)
  gc_lambda: Optional[float] = hp.gc_lambda(None)
  center_vectors: bool = hp.center_vectors(False)


@dataclasses.dataclass(frozen=True)
class LocalGcHparams(_GcHparams):
  """LocalGC's: every layer projected."""

  local_gc_layers: str = hp.local_gc_layers('all')


@dataclasses.dataclass(frozen=True)
class GlobalGcHparams(_GcHparams):
  """GlobalGC's: every layer projected on the server; its clients' SGDM takes the
  paper's weight decay, coupled (`fedavg.client_sgd`)."""

  global_gc_layers: str = hp.global_gc_layers('all')


@dataclasses.dataclass(frozen=True)
class GcFedHparams(LocalGcHparams, GlobalGcHparams):
  """GC-Fed's: LocalGC's and GlobalGC's, split at the borderline (`gc_lambda = None`
  puts the last layer on the classifier side, as the paper does for its CNNs)."""

  local_gc_layers: str = hp.local_gc_layers('feature')
  global_gc_layers: str = hp.global_gc_layers('classifier')


# The client step of LocalGC and the server step of GlobalGC (GlobalGC's client step is
# `fedavg.client_sgd`).


def local_gc(hparams, variables) -> compose.Optimizer:
  """LocalGC SGDM, coupled L2, on the weight matrices of `local_gc_layers`."""
  return optimizers.build_local_gc_sgdm(
      hparams.client_learning_rate,
      momentum=hparams.client_momentum,
      weight_decay=hparams.weight_decay,
      mask=projection.projection_mask(
          variables, hparams.local_gc_layers, hparams.gc_lambda, hparams.center_vectors
      ),
      center_vectors=hparams.center_vectors,
  )


def global_gc(hparams, variables) -> compose.Optimizer:
  """`w <- w - eta_g * M'(P(u))`, `M'`: the weight matrices of `global_gc_layers`."""
  return optimizers.build_global_gc_sgd(
      hparams.server_learning_rate,
      mask=projection.projection_mask(
          variables, hparams.global_gc_layers, hparams.gc_lambda, hparams.center_vectors
      ),
      center_vectors=hparams.center_vectors,
  )


# The builders.


def build_local_gc(
    model_fn: compose.ModelFn,
    hparams: Optional[LocalGcHparams] = None,
    *,
    loop_implementation: tff.learning.LoopImplementation = compose.DATASET_REDUCE,
    model_aggregator: Optional[compose.AggregationFactory] = None,
    **overrides,
) -> tff.learning.templates.LearningProcess:
  """LocalGC: projected client SGDM with coupled L2; server SGD; uniform mean.

  Args:
    model_fn: A no-arg function returning a new `tff.learning.models.VariableModel`.
    hparams: A `LocalGcHparams` (default: its defaults).
    loop_implementation: The client training loop.
    model_aggregator: Optional `tff.aggregators` factory aggregating the client updates
      (`tff_zmg.aggregation.model_aggregator`); default: the uniform mean.
    **overrides: Fields of `LocalGcHparams` to replace.

  Raises:
    ValueError: If a hyperparameter is unknown or out of range (checked before any model
      is built).
  """
  hparams = LocalGcHparams.create(hparams, **overrides)
  variables = compose.trainable_variables(model_fn)
  return compose.compose_process(
      model_fn, local_gc(hparams, variables), fedavg.server_sgd(hparams), _UNIFORM,
      loop_implementation=loop_implementation, model_aggregator=model_aggregator,
  )


def build_global_gc(
    model_fn: compose.ModelFn,
    hparams: Optional[GlobalGcHparams] = None,
    *,
    loop_implementation: tff.learning.LoopImplementation = compose.DATASET_REDUCE,
    model_aggregator: Optional[compose.AggregationFactory] = None,
    **overrides,
) -> tff.learning.templates.LearningProcess:
  """GlobalGC: client SGDM with coupled L2; the server projects the uniform mean update.

  Args:
    model_fn: A no-arg function returning a new `tff.learning.models.VariableModel`.
    hparams: A `GlobalGcHparams` (default: its defaults).
    loop_implementation: The client training loop.
    model_aggregator: Optional `tff.aggregators` factory aggregating the client updates
      (`tff_zmg.aggregation.model_aggregator`); default: the uniform mean.
    **overrides: Fields of `GlobalGcHparams` to replace.

  Raises:
    ValueError: If a hyperparameter is unknown or out of range (checked before any model
      is built).
  """
  hparams = GlobalGcHparams.create(hparams, **overrides)
  variables = compose.trainable_variables(model_fn)
  return compose.compose_process(
      model_fn, fedavg.client_sgd(hparams), global_gc(hparams, variables), _UNIFORM,
      loop_implementation=loop_implementation, model_aggregator=model_aggregator,
  )


def build_gcfed(
    model_fn: compose.ModelFn,
    hparams: Optional[GcFedHparams] = None,
    *,
    loop_implementation: tff.learning.LoopImplementation = compose.DATASET_REDUCE,
    model_aggregator: Optional[compose.AggregationFactory] = None,
    **overrides,
) -> tff.learning.templates.LearningProcess:
  """GC-Fed: LocalGC on the feature layers, GlobalGC on the classifier layers.

  Args:
    model_fn: A no-arg function returning a new `tff.learning.models.VariableModel`.
    hparams: A `GcFedHparams` (default: its defaults).
    loop_implementation: The client training loop.
    model_aggregator: Optional `tff.aggregators` factory aggregating the client updates
      (`tff_zmg.aggregation.model_aggregator`); default: the uniform mean.
    **overrides: Fields of `GcFedHparams` to replace.

  Raises:
    ValueError: If a hyperparameter is unknown or out of range (checked before any model
      is built).
  """
  hparams = GcFedHparams.create(hparams, **overrides)
  variables = compose.trainable_variables(model_fn)
  return compose.compose_process(
      model_fn, local_gc(hparams, variables), global_gc(hparams, variables), _UNIFORM,
      loop_implementation=loop_implementation, model_aggregator=model_aggregator,
  )
