"""Batched cells: K cells of one composed process trained as one computation.

The cells of a learning-rate grid share the model, the data and each round's clients, and
differ only in what their states hold (the rates: `state_hparams`). `build_cells_process`
turns a process `compose_process` made into one whose state is K of its states and whose
round trains all K on the same clients in one pass over each client's data:

  - each client reads its dataset once; for each batch, every cell takes the step the
    process's own client work would take (its own model copy, gradient and optimizer state,
    its rates from its own state), so a cell computes what it would compute alone;
  - each cell's update is checked on its own: a non-finite one is zeroed, its weight and
    metrics dropped, as TFF's client work does for a whole client, so a diverging cell never
    changes the others;
  - the server parts the process was composed of (distributor, aggregator, finalizer) run
    once per cell on that cell's values, and each cell's metrics have the structure of the
    process's own.

So cell k of `next(states, data)` equals `process.next(states[k], data)`, to the float32
round-off of a computation arranged differently. What is saved is what cells share: the
clients' datasets and their graph calls, the round's selection and the runtime's work.

Processes whose clients keep state (`compose_stateful_process`) are not batched:
`unbatchable_reason` says why.
"""

import collections
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.learning import loop_builder
from tensorflow_federated.python.learning import tensor_utils
from tensorflow_federated.python.learning.templates import client_works

from tff_zmg.templates import compose
from tff_zmg.templates import stateful_clients


def unbatchable_reason(process) -> Optional[str]:
  """Why `process` cannot be batched (None: it can)."""
  if isinstance(process, stateful_clients.StatefulClientsLearningProcess):
    return ('its clients keep state from round to round (each cell would need its own'
            ' copy of every client\'s state)')
  if compose.composition_of(process) is None:
    return 'it is not composed by tff_zmg.templates.compose_process'
  return None


def build_cells_process(process, num_cells: int) -> tff.templates.IterativeProcess:
  """The process over `num_cells` cells of `process` (made by `compose_process`).

  Its state is a tuple of `num_cells` states of `process`, each set as that cell's run would
  set it (its rates, e.g. by `state_hparams.set_in_state`, or its checkpoint); `next(states,
  client_data)` returns the tuple of the cells' next states and the tuple of their metrics.

  Raises:
    ValueError: `process` cannot be batched (`unbatchable_reason`), or `num_cells` < 1.
  """
  reason = unbatchable_reason(process)
  if reason is not None:
    raise ValueError(f'this process cannot train cells batched: {reason}')
  if num_cells < 1:
    raise ValueError(f'num_cells must be at least 1, got {num_cells}')
  parts = compose.composition_of(process)
  state_type = process.initialize.type_signature.result
  data_type = process.next.type_signature.parameter[1]
  cell_type = state_type.member
  client_update = _client_update_computation(
      parts, num_cells, cell_type.client_work, cell_type.global_model_weights,
      data_type.member)
  with tf.Graph().as_default():
    metric_finalizers = parts.model_fn().metric_finalizers()

  @tff.federated_computation
  def init_fn():
    return tff.federated_zip(tuple(process.initialize() for _ in range(num_cells)))

  @tff.federated_computation(init_fn.type_signature.result, data_type)
  def next_fn(states, client_data):
    cells = [states[k] for k in range(num_cells)]
    distributed = [parts.distributor.next(c.distributor, c.global_model_weights)
                   for c in cells]
    rates = tff.federated_broadcast(tff.federated_zip(tuple(c.client_work for c in cells)))
    weights = tff.federated_zip(tuple(d.result for d in distributed))
    results = tff.federated_map(client_update, (rates, weights, client_data))
    new_states, metrics = [], []
    for k, cell in enumerate(cells):
      result, unfinalized = results[k][0], results[k][1]
      train = tff.learning.metrics.sum_then_finalize(metric_finalizers)(unfinalized)
      aggregated = parts.aggregator.next(cell.aggregator, result.update,
                                         result.update_weight)
      finalized = parts.finalizer.next(cell.finalizer, cell.global_model_weights,
                                       aggregated.result)
      new_states.append(tff.federated_zip(tff.learning.templates.LearningAlgorithmState(
          finalized.result, distributed[k].state, cell.client_work, aggregated.state,
          finalized.state)))
      metrics.append(tff.federated_zip(collections.OrderedDict(
          distributor=distributed[k].measurements,
          client_work=tff.federated_zip(collections.OrderedDict(train=train)),
          aggregator=aggregated.measurements,
          finalizer=finalized.measurements)))
    return tff.learning.templates.LearningProcessOutput(
        tff.federated_zip(tuple(new_states)), tff.federated_zip(tuple(metrics)))

  return tff.templates.IterativeProcess(init_fn, next_fn)


def _client_update_computation(parts: compose.Composition, num_cells: int, rates_type,
                               weights_type, data_type) -> tff.Computation:
  """`(rates, initial weights, dataset) -> ((ClientResult, unfinalized metrics), ...)`, a
  pair per cell: every cell's local training in one pass over the client's data."""

  @tff.tensorflow.computation(
      tff.StructWithPythonType([rates_type] * num_cells, tuple),
      tff.StructWithPythonType([weights_type] * num_cells, tuple),
      data_type)
  def client_update(rates, initial_weights, dataset):
    update = _cells_client_update(parts, num_cells)
    return update(rates, initial_weights, dataset)

  return client_update


def _cells_client_update(parts: compose.Composition, num_cells: int):
  """The `tf.function` of `_client_update_computation`: for each cell, the steps of TFF's
  `build_model_delta_client_work` (tensorflow_federated/python/learning/templates/
  model_delta_client_work.py at v0.87.0) on its own model copy, the batches read once."""
  models = [parts.model_fn() for _ in range(num_cells)]
  optimizer = parts.client_optimizer
  reduce_dataset = loop_builder.build_training_loop(
      loop_implementation=parts.loop_implementation)

  @tf.function
  def client_update(rates, initial_weights, data):
    weights = [tff.learning.models.ModelWeights.from_model(m) for m in models]
    for cell_weights, initial in zip(weights, initial_weights):
      tf.nest.map_structure(lambda a, b: a.assign(b), cell_weights, initial)

    def reduce_fn(state, batch):
      num_examples, optimizer_states = state
      new_num_examples, new_optimizer_states = [], []
      for model, cell_weights, count, optimizer_state in zip(
          models, weights, num_examples, optimizer_states):
        with tf.GradientTape() as tape:
          output = model.forward_pass(batch, training=True)
        gradients = tape.gradient(output.loss, cell_weights.trainable)
        optimizer_state, updated = optimizer.next(
            optimizer_state, tuple(tf.nest.flatten(cell_weights.trainable)),
            tuple(tf.nest.flatten(gradients)))
        updated = tf.nest.pack_sequence_as(cell_weights.trainable, updated)
        tf.nest.map_structure(lambda a, b: a.assign(b), cell_weights.trainable, updated)
        if output.num_examples is None:
          count += tf.shape(output.predictions, out_type=tf.int64)[0]
        else:
          count += tf.cast(output.num_examples, tf.int64)
        new_num_examples.append(count)
        new_optimizer_states.append(optimizer_state)
      return tuple(new_num_examples), tuple(new_optimizer_states)

    def initial_state():
      optimizer_states = []
      for cell_weights, cell_rates in zip(weights, rates):
        specs = tf.nest.map_structure(lambda v: tf.TensorSpec(v.shape, v.dtype),
                                      tuple(tf.nest.flatten(cell_weights.trainable)))
        optimizer_states.append(optimizer.set_hparams(optimizer.initialize(specs),
                                                      cell_rates))
      counts = tuple(tf.zeros(shape=[], dtype=tf.int64) for _ in range(num_cells))
      return counts, tuple(optimizer_states)

    num_examples, _ = reduce_dataset(reduce_fn, data, initial_state)
    results = []
    for model, cell_weights, initial, count in zip(models, weights, initial_weights,
                                                    num_examples):
      update = tf.nest.map_structure(tf.subtract, initial.trainable, cell_weights.trainable)
      update, non_finite = tensor_utils.zero_all_if_any_non_finite(update)
      weight = _client_weight(parts.client_weighting, non_finite, count)
      if non_finite > 0:  # This cell's metrics are dropped, as TFF drops a client's.
        model.reset_metrics()
      results.append((client_works.ClientResult(update=update, update_weight=weight),
                      model.report_local_unfinalized_metrics()))
    return tuple(results)

  return client_update


def _client_weight(weighting: tff.learning.ClientWeighting, non_finite, num_examples):
  """TFF's client weight: 0 for a non-finite update, else the examples or 1."""
  if non_finite > 0:
    return tf.constant(0.0, tf.float32)
  if weighting == tff.learning.ClientWeighting.NUM_EXAMPLES:
    return tf.cast(num_examples, tf.float32)
  return tf.constant(1.0, tf.float32)
