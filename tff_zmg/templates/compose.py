"""Composes a client optimizer and a server optimizer into a TFF learning process.

Every stateless algorithm of the package is the four-part composition of TFF's
`tff.learning.algorithms.build_weighted_fed_avg` (specification.md sections 2-4):

  1. distributor: `tff.learning.templates.build_broadcast_process`;
  2. client work: `tff.learning.templates.build_model_delta_client_work` running the
     client optimizer, which reports `u_k = w^t - w_k`;
  3. aggregator: the example-weighted mean (`tff.aggregators.MeanFactory`) or the
     uniform mean (`tff.aggregators.UnweightedMeanFactory`) of `u_k`, or a
     `model_aggregator` factory in its place (`tff_zmg.aggregation`: DP, compression,
     robust), as `tff.learning.algorithms.build_weighted_fed_avg` takes one;
  4. finalizer: `tff.learning.templates.build_apply_optimizer_finalizer` running the
     server optimizer on the aggregated `u`.

Example:

    process = compose_process(
        task.model_fn, optimizers.build_zmg_sgdm(0.01, momentum=0.9, weight_decay=1e-4),
        tff.learning.optimizers.build_sgdm(1.0), tff.learning.ClientWeighting.NUM_EXAMPLES)

`compose_stateful_process` is the same composition around a `StatefulClientWork` (clients
that keep state across rounds, `tff_zmg.templates.stateful_clients`), with an optional
`SharedState`: how SCAFFOLD, FedRKMGC and FedGPS end.
"""

from collections.abc import Callable
import dataclasses
from typing import Optional
import weakref

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_zmg.templates import stateful_clients

ModelFn = Callable[[], tff.learning.models.VariableModel]
Optimizer = tff.learning.optimizers.Optimizer
AggregationFactory = tff.aggregators.AggregationFactory
DATASET_REDUCE = tff.learning.LoopImplementation.DATASET_REDUCE


def trainable_variables(model_fn: ModelFn) -> tuple[tf.Variable, ...]:
  """The trainable variables of a new `model_fn()`, built in a spare graph (for masks)."""
  with tf.Graph().as_default():
    return tuple(model_fn().trainable_variables)


def initial_model_weights_computation(model_fn: ModelFn) -> tff.Computation:
  """`( -> ModelWeights)`: the weights of a new `model_fn()`."""

  @tff.tensorflow.computation
  def initial_model_weights_fn():
    return tff.learning.models.ModelWeights.from_model(model_fn())

  return initial_model_weights_fn


def check_arguments(
    model_fn: ModelFn,
    client_weighting: tff.learning.ClientWeighting,
    loop_implementation: tff.learning.LoopImplementation,
) -> None:
  """Raises `ValueError` for a `model_fn`, weighting or loop of the wrong kind."""
  if not isinstance(client_weighting, tff.learning.ClientWeighting):
    raise ValueError(
        'client_weighting must be a tff.learning.ClientWeighting, got '
        f'{client_weighting!r}'
    )
  if not isinstance(loop_implementation, tff.learning.LoopImplementation):
    raise ValueError(
        'loop_implementation must be a tff.learning.LoopImplementation, got '
        f'{loop_implementation!r}'
    )
  if not callable(model_fn):
    raise ValueError(f'model_fn must be a no-arg callable, got {model_fn!r}')


def compose_process(
    model_fn: ModelFn,
    client_optimizer: Optimizer,
    server_optimizer: Optimizer,
    client_weighting: tff.learning.ClientWeighting,
    *,
    loop_implementation: tff.learning.LoopImplementation = DATASET_REDUCE,
    model_aggregator: Optional[AggregationFactory] = None,
) -> tff.learning.templates.LearningProcess:
  """The process whose clients run `client_optimizer` and server `server_optimizer`.

  Args:
    model_fn: A no-arg function returning a new `tff.learning.models.VariableModel`.
    client_optimizer: The `tff.learning.optimizers.Optimizer` of the local steps.
    server_optimizer: The optimizer the server applies to the aggregated update.
    client_weighting: `tff.learning.ClientWeighting.NUM_EXAMPLES` (the
      example-weighted mean of client updates) or `UNIFORM` (their mean).
    loop_implementation: The client training loop.
    model_aggregator: Optional factory of the aggregator of client updates (default:
      the mean `client_weighting` says); an unweighted one averages uniformly.

  Returns:
    A `tff.learning.templates.LearningProcess`.
  """
  check_arguments(model_fn, client_weighting, loop_implementation)
  initial_model_weights_fn = initial_model_weights_computation(model_fn)
  client_work = tff.learning.templates.build_model_delta_client_work(
      model_fn,
      client_optimizer,
      client_weighting,
      loop_implementation=loop_implementation,
  )
  distributor, aggregator, finalizer = build_server_parts(
      initial_model_weights_fn, server_optimizer, client_weighting, model_aggregator
  )
  process = tff.learning.templates.compose_learning_process(
      initial_model_weights_fn, distributor, client_work, aggregator, finalizer
  )
  _COMPOSITIONS[process] = Composition(
      model_fn, client_optimizer, client_weighting, loop_implementation, distributor,
      aggregator, finalizer)
  return process


@dataclasses.dataclass(frozen=True)
class Composition:
  """What `compose_process` made a process of: the client work's model, optimizer,
  weighting and loop, and the three server parts it composed around it. Batched cells
  (`tff_zmg.templates.cells`) run these parts once per cell around one client work."""

  model_fn: ModelFn
  client_optimizer: Optimizer
  client_weighting: tff.learning.ClientWeighting
  loop_implementation: tff.learning.LoopImplementation
  distributor: tff.templates.MeasuredProcess
  aggregator: tff.templates.AggregationProcess
  finalizer: tff.templates.MeasuredProcess


# Kept beside the process rather than on it: TFF's templates are not ours to extend.
_COMPOSITIONS: 'weakref.WeakKeyDictionary' = weakref.WeakKeyDictionary()


def composition_of(process) -> Optional[Composition]:
  """The parts `compose_process` made `process` of; None for any other process."""
  try:
    return _COMPOSITIONS.get(process)
  except TypeError:  # Not weakly referenceable: not one of ours.
    return None


def compose_stateful_process(
    model_fn: ModelFn,
    client_work: stateful_clients.StatefulClientWork,
    server_optimizer: Optimizer,
    client_weighting: tff.learning.ClientWeighting,
    *,
    shared_state: Optional[stateful_clients.SharedState] = None,
    model_aggregator: Optional[AggregationFactory] = None,
) -> stateful_clients.StatefulClientsLearningProcess:
  """`compose_process` for clients that keep state: `client_work` on the clients.

  Args:
    model_fn: A no-arg function returning a new `tff.learning.models.VariableModel`
      (the process's initial model weights).
    client_work: The `StatefulClientWork` the clients run (its client rule, loop and
      non-finite policy).
    server_optimizer: The optimizer the server applies to the aggregated update.
    client_weighting: How client updates are averaged (`NUM_EXAMPLES` or `UNIFORM`).
    shared_state: Optional server state broadcast to the clients and updated from
      their uploads (`stateful_clients.build_shared_state`).
    model_aggregator: Optional factory of the aggregator of client updates (as
      `compose_process`'s). It aggregates the updates only: the builder of a client
      work that uploads more refuses one.

  Returns:
    A `stateful_clients.StatefulClientsLearningProcess`.
  """
  initial_model_weights_fn = initial_model_weights_computation(model_fn)
  distributor, aggregator, finalizer = build_server_parts(
      initial_model_weights_fn, server_optimizer, client_weighting, model_aggregator
  )
  return stateful_clients.compose_stateful_clients_process(
      initial_model_weights_fn, distributor, client_work, aggregator, finalizer,
      shared_state=shared_state,
  )


def build_server_parts(
    initial_model_weights_fn: tff.Computation,
    server_optimizer: Optimizer,
    client_weighting: tff.learning.ClientWeighting,
    model_aggregator: Optional[AggregationFactory] = None,
) -> tuple[
    tff.templates.MeasuredProcess,
    tff.templates.AggregationProcess,
    tff.templates.MeasuredProcess,
]:
  """The parts around the client work: (distributor, aggregator, finalizer).

  The distributor broadcasts the model weights; the aggregator is
  `model_aggregator`'s or, without one, the example-weighted or the uniform mean of
  client updates; the finalizer applies `server_optimizer` to the aggregated update.
  Stateful-client processes (`compose_stateful_process`) compose the same parts.
  """
  model_weights_type = initial_model_weights_fn.type_signature.result
  distributor = tff.learning.templates.build_broadcast_process(
      model_weights_type
  )
  aggregator_factory = weighted_factory(client_weighting, model_aggregator)
  aggregator = aggregator_factory.create(
      model_weights_type.trainable, tff.TensorType(np.float32)
  )
  finalizer = tff.learning.templates.build_apply_optimizer_finalizer(
      server_optimizer, model_weights_type
  )
  return distributor, aggregator, finalizer


def weighted_factory(
    client_weighting: tff.learning.ClientWeighting,
    model_aggregator: Optional[AggregationFactory] = None,
) -> tff.aggregators.WeightedAggregationFactory:
  """The weighted factory the composed process calls with `(update, weight)`.

  `model_aggregator` if weighted; an unweighted one wrapped to ignore the weights (its
  mean is uniform whatever `client_weighting` says, as TFF's
  `build_unweighted_fed_avg` does); without one, the mean `client_weighting` says.
  """
  if model_aggregator is None:
    if client_weighting == tff.learning.ClientWeighting.UNIFORM:
      model_aggregator = tff.aggregators.UnweightedMeanFactory()
    else:
      return tff.aggregators.MeanFactory()
  if isinstance(model_aggregator, tff.aggregators.UnweightedAggregationFactory):
    return tff.aggregators.as_weighted_aggregator(model_aggregator)
  if not isinstance(model_aggregator, tff.aggregators.WeightedAggregationFactory):
    raise ValueError(
        'model_aggregator must be a tff.aggregators factory (weighted or unweighted), got'
        f' {model_aggregator!r}'
    )
  return model_aggregator


def refuse_model_aggregator(
    model_aggregator: Optional[AggregationFactory], algorithm: str, other_uploads: str
) -> None:
  """Raises `ValueError` (one line) if a `model_aggregator` is given to an algorithm whose
  clients upload `other_uploads` besides their update: the aggregator would see the update
  only, and what else they send would escape it (a DP aggregator's noise, a compression's
  encoding, a robust aggregator's clipping)."""
  if model_aggregator is not None:
    raise ValueError(
        f'{algorithm} takes no model_aggregator: its clients also upload {other_uploads},'
        ' which would escape it (it aggregates the model updates only)'
    )
