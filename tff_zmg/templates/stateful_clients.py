"""Learning processes whose clients keep state across the rounds they take part in.

Why one file of ~640 lines: it is the whole template for stateful clients, in the order a
round runs (the process's types; one client's `ClientRule` and the non-finite policy of
`local_update_fn`; the client work mapping it over the clients; the composed process and
its state-file round), and its parts share the round's types; an algorithm reads only
`ClientRule`, `build_stateful_client_work` and `build_shared_state`.

`tff.learning.templates.LearningProcess.next` takes `(state, client_data)` only, so a
client rule that remembers something between rounds (FedRKMGC's corrections, FedGPS's
last update) needs one more argument. Following TFF's stateful-clients example, the
sampled clients' states go in CLIENTS-placed beside their data and their new states come
out beside the metrics:

    next: <S@SERVER, {D*}@CLIENTS, {C}@CLIENTS> -> <state=S@SERVER, metrics=M@SERVER,
                                                   client_states={C}@CLIENTS>

Where the states live between rounds is the training loop's business (see
`tff_zmg.client_states`). The process is composed from the same four parts as TFF's
`compose_learning_process`: distributor, client work (here a `StatefulClientWork`),
aggregator and finalizer, so every server rule of the package composes with it. An
optional `SharedState` adds server state that is broadcast to the clients and updated
from what they upload (FedGPS's mean update and prototypes).

An algorithm gives its client as a `ClientRule` (init / step / final: what a client
keeps, one local step, what it keeps and sends at the end) and
`build_stateful_client_work` makes the client work of it; that one place decides what
happens to a client whose result is not finite (`local_update_fn`).
"""

import collections
from collections.abc import Callable
import dataclasses
from typing import Any, NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
# TFF's own choice of training loop (dataset reduce or iterator); the same helper
# runs TFF's built-in client works.
from tensorflow_federated.python.learning import loop_builder

from tff_zmg.client_states import state_file


class StatefulClientsOutput(NamedTuple):
  """The result of `StatefulClientsLearningProcess.next`.

  Attributes:
    state: The new server state.
    metrics: The round's metrics (same layout as TFF's composed processes:
      `distributor`, `client_work`, `aggregator`, `finalizer`).
    client_states: The sampled clients' new states, in the order of the input.
  """

  state: Any
  metrics: Any
  client_states: Any


@dataclasses.dataclass(frozen=True)
class StatefulClientWork:
  """Client work whose clients read and write their own state.

  Attributes:
    initialize: `( -> S@SERVER)`.
    next: `(<S@SERVER, W@CLIENTS, {D*}@CLIENTS, C@CLIENTS, R@CLIENTS> ->
      MeasuredProcessOutput(state=S@SERVER, result=<client_result=ClientResult@CLIENTS,
      client_states=C@CLIENTS[, uploads=U@CLIENTS]>, measurements=M@SERVER))`; `R` is
      the global round index (int32, from 0) or, with a `SharedState`, the broadcast
      `<round_num, shared>`; `uploads` is there when the clients upload something.
    initial_client_state: `( -> C)`, the state of a client that has never taken
      part (a `tff.tensorflow.computation`).
    data_type: `D*`, one client's data.
    upload_type: `U`, what a client uploads for the `SharedState` (None: nothing).
    build_local_update: Optional: `() -> tf.function`, a new copy (own model
      variables) of the function one client runs inside `next`, `(weights, data,
      client_state, round_input) -> ClientOutput`: one client's arithmetic in plain
      TensorFlow, without federation (benchmarks, debugging in a notebook).
  """

  initialize: tff.Computation
  next: tff.Computation
  initial_client_state: tff.Computation
  data_type: tff.Type
  upload_type: Optional[tff.Type] = None
  build_local_update: Optional[Callable[[], Callable[..., Any]]] = None

  @property
  def client_state_type(self) -> tff.Type:
    return self.initial_client_state.type_signature.result


@dataclasses.dataclass(frozen=True)
class SharedState:
  """Server state besides the model that every client reads and helps update.

  FedGPS's is last round's mean update and the global surrogate prototypes. The
  server broadcasts it with the round index; each client uploads something `U`
  beside its update; the server then computes the next shared state from the
  uploads and the aggregated update.

  Attributes:
    initialize: `( -> X@SERVER)`.
    next: `(<X@SERVER, {U}@CLIENTS, A@SERVER> -> X@SERVER)`, `A` the aggregated
      client update (the aggregator's result).
  """

  initialize: tff.Computation
  next: tff.Computation


def build_shared_state(
    initial: tff.Computation,
    upload_type: tff.Type,
    aggregated_type: tff.Type,
    summarize: tff.Computation,
    update: tff.Computation,
) -> SharedState:
  """The `SharedState` that sums what each client uploads, then updates the server's.

  Args:
    initial: `( -> X)`, the shared state's first value (a `tff.tensorflow.computation`).
    upload_type: `U`, one client's upload (the client work's `upload_type`).
    aggregated_type: `A`, the aggregated client update.
    summarize: `(U -> V)`: what of a client's upload is summed over the round's clients.
    update: `(<X, V, A> -> X)`: the next shared state from the sum and the update.
  """

  @tff.federated_computation
  def initialize():
    return tff.federated_eval(initial, tff.SERVER)

  @tff.federated_computation(
      tff.FederatedType(initial.type_signature.result, tff.SERVER),
      tff.FederatedType(upload_type, tff.CLIENTS),
      tff.FederatedType(aggregated_type, tff.SERVER),
  )
  def next_fn(shared, uploads, aggregated):
    sums = tff.federated_sum(tff.federated_map(summarize, uploads))
    return tff.federated_map(update, (shared, sums, aggregated))

  return SharedState(initialize=initialize, next=next_fn)


class StatefulClientsLearningProcess(tff.templates.IterativeProcess):
  """A `LearningProcess`-shaped process whose `next` also maps client states.

  It has `initialize`, `next(state, client_data, client_states)`,
  `get_model_weights`, `set_model_weights`, and `initial_client_state()` (the
  state a new client starts from, as NumPy values).

  `next_with_state_files(state, client_inputs)` is the same round with the clients'
  states in files instead of in the call: each client's input is
  `OrderedDict(data=dataset, state_files=OrderedDict(read=path, write=path))`, the
  round reads the state from `read` and writes the new one to `write` (format:
  `client_states.state_file`), and returns `(state, OrderedDict(metrics=...,
  client_state_bytes=...))`, the bytes written by all clients. The states then never
  travel between Python and the runtime (TFF's worker, which must see the same file
  system, or this process), and the round has the two arguments and two SERVER-placed
  results of TFF's MapReduceForm, which the in-process runtime needs.

  `build_local_update`, when the client work gives one, builds the `tf.function` one
  client runs (see `StatefulClientWork`); `round_input(state)` is what the server
  broadcasts to it as its last argument.
  """

  def __init__(
      self,
      initialize_fn: tff.Computation,
      next_fn: tff.Computation,
      get_model_weights: tff.Computation,
      set_model_weights: tff.Computation,
      initial_client_state_fn: tff.Computation,
      next_with_state_files_fn: tff.Computation,
      build_local_update: Optional[Callable[[], Callable[..., Any]]] = None,
  ):
    super().__init__(initialize_fn, next_fn, next_is_multi_arg=True)
    self._get_model_weights = get_model_weights
    self._set_model_weights = set_model_weights
    self._initial_client_state_fn = initial_client_state_fn
    self._next_with_state_files = next_with_state_files_fn
    self._build_local_update = build_local_update

  @property
  def build_local_update(self) -> Optional[Callable[[], Callable[..., Any]]]:
    return self._build_local_update

  @staticmethod
  def round_input(state) -> Any:
    """The client work's last argument in the round that starts from server `state`."""
    if 'shared' in state:
      return collections.OrderedDict(round_num=state['round_num'], shared=state['shared'])
    return state['round_num']

  @property
  def next_with_state_files(self) -> tff.Computation:
    return self._next_with_state_files

  @property
  def get_model_weights(self) -> tff.Computation:
    return self._get_model_weights

  @property
  def set_model_weights(self) -> tff.Computation:
    return self._set_model_weights

  @property
  def client_state_type(self) -> tff.Type:
    return self._initial_client_state_fn.type_signature.result

  def initial_client_state(self):
    """The state of a client that has never taken part (NumPy values)."""
    return self._initial_client_state_fn()


# One stateful client, in plain TensorFlow: an algorithm gives its math as a `ClientRule`
# (what happens before, during and after the local steps); `local_update_fn` runs it and
# alone decides what becomes of a client whose result is not finite.


class ClientFinal(NamedTuple):
  """What a `ClientRule` keeps and sends after its local steps.

  Attributes:
    state: The client's new state (the structure of its old one).
    upload: What it uploads for the `SharedState` (`()`: nothing).
    metrics: Its local metrics, unfinalized (summed over clients, then finalized).
  """

  state: Any
  upload: Any
  metrics: Any


class ClientOutput(NamedTuple):
  """One client's round: what the local update returns.

  Attributes:
    result: `ClientResult(update=u = w^t - w_k, update_weight)`; weight 0 exactly
      when the client was dropped as not finite.
    state: The client's new state (its old one when dropped).
    upload: What it uploads (zeros when dropped).
    metrics: Its local metrics (reset, i.e. zeros, when dropped).
  """

  result: tff.learning.templates.ClientResult
  state: Any
  upload: Any
  metrics: Any


@dataclasses.dataclass(frozen=True)
class ClientRule:
  """One client's math on one copy of the model's variables.

  The local update assigns the global weights to `weights`, then runs

      context, loop_state = init(client_state, round_input)
      loop_state = step(context, loop_state, batch)      for every batch
      final = final(context, loop_state, delta)          delta = w_k - w^t

  Attributes:
    weights: The `tff.learning.models.ModelWeights` of variables the steps train.
    init: `(client_state, round_input) -> (context, loop_state)`: what the steps
      read (`context`, anything) and the training loop's initial state.
    step: `(context, loop_state, batch) -> loop_state`: one local step.
    final: `(context, loop_state, delta) -> ClientFinal`.
  """

  weights: tff.learning.models.ModelWeights
  init: Callable[[Any, Any], tuple[Any, Any]]
  step: Callable[[Any, Any, Any], Any]
  final: Callable[[Any, Any, Any], ClientFinal]


def _all_finite(structure) -> tf.Tensor:
  floats = [t for t in tf.nest.flatten(structure) if t.dtype.is_floating]
  if not floats:
    return tf.constant(True)
  return tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in floats])


def local_update_fn(
    rule: ClientRule, loop_implementation: tff.learning.LoopImplementation
) -> Callable[..., ClientOutput]:
  """The `tf.function` one client runs: `(weights, data, state, round_input) -> ClientOutput`.

  The non-finite policy of every stateful client work: a client whose update, new
  state or upload holds a non-finite value is dropped. It sends a zero update with
  weight 0 (TFF's convention), uploads zeros, keeps its old state (so one bad round
  cannot poison what it carries into the next), and its metrics are reset, so the
  round's loss stays finite and the run's divergence check counts the client in
  `non_finite_clients` instead.
  """
  training_loop = loop_builder.build_training_loop(loop_implementation)

  @tf.function
  def local_update(initial_weights, data, client_state, round_input):
    tf.nest.map_structure(lambda v, t: v.assign(t), rule.weights, initial_weights)
    context, loop_state = rule.init(client_state, round_input)
    loop_state = training_loop(
        lambda loop_state, batch: rule.step(context, loop_state, batch),
        data,
        lambda: loop_state,
    )
    delta = tuple(w - w0 for w, w0 in zip(rule.weights.trainable, initial_weights.trainable))
    final = rule.final(context, loop_state, delta)
    update = tuple(-d for d in delta)
    finite = _all_finite((update, final.state, final.upload))
    kept = ClientOutput(
        tff.learning.templates.ClientResult(update=update, update_weight=tf.constant(1.0)),
        final.state,
        final.upload,
        final.metrics,
    )
    dropped = ClientOutput(
        tff.learning.templates.ClientResult(
            update=tuple(tf.zeros_like(u) for u in update), update_weight=tf.constant(0.0)
        ),
        # The old state, in the structure of the new one (TFF may hand lists for tuples).
        tf.nest.map_structure(
            lambda new, old: tf.identity(old), final.state, client_state, check_types=False
        ),
        tf.nest.map_structure(tf.zeros_like, final.upload),
        tf.nest.map_structure(tf.zeros_like, final.metrics),
    )
    # A branch, not an elementwise select: no extra pass over model-sized tensors.
    return tf.cond(finite, lambda: kept, lambda: dropped)

  return local_update


def build_stateful_client_work(
    build_client_rule: Callable[[], ClientRule],
    *,
    weights_type: tff.Type,
    data_type: tff.Type,
    round_input_type: tff.Type,
    initial_client_state: tff.Computation,
    metrics_aggregation_fn: Any,
    loop_implementation: tff.learning.LoopImplementation,
) -> StatefulClientWork:
  """The `StatefulClientWork` that runs a `ClientRule` on every client (empty server state).

  Args:
    build_client_rule: `() -> ClientRule` on a new copy of the model, called once in
      the graph of each computation or `tf.function` that runs clients.
    weights_type: `W`, the model weights the server broadcasts.
    data_type: `D*`, one client's data.
    round_input_type: `R`: `np.int32` (the round index) or, with a `SharedState`, the
      broadcast `<round_num, shared>`.
    initial_client_state: `( -> C)`, a `tff.tensorflow.computation`.
    metrics_aggregation_fn: Aggregates the clients' unfinalized metrics (e.g.
      `tff.learning.metrics.sum_then_finalize`).
    loop_implementation: The client training loop.

  Returns:
    A `StatefulClientWork` whose `next` runs `local_update_fn` on every client (so
    its non-finite policy) and measures `train` (the aggregated metrics), `clients`
    (the round's) and `non_finite_clients` (those dropped as not finite, which the
    run's divergence check reads).
  """

  def build_local_update():
    return local_update_fn(build_client_rule(), loop_implementation)

  client_state_type = initial_client_state.type_signature.result

  @tff.tensorflow.computation(weights_type, data_type, client_state_type, round_input_type)
  def client_update(weights, data, client_state, round_input):
    return build_local_update()(weights, data, client_state, round_input)

  output_type = client_update.type_signature.result
  has_upload = len(output_type.upload) > 0  # pytype: disable=wrong-arg-types

  @tff.federated_computation
  def init_fn():
    return tff.federated_value((), tff.SERVER)

  @tff.tensorflow.computation(output_type.result)
  def counts(client_result):
    dropped = tf.cast(tf.equal(client_result.update_weight, 0.0), tf.int32)
    return collections.OrderedDict(clients=tf.constant(1, tf.int32), non_finite_clients=dropped)

  @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(weights_type, tff.CLIENTS),
      tff.FederatedType(data_type, tff.CLIENTS),
      tff.FederatedType(client_state_type, tff.CLIENTS),
      tff.FederatedType(round_input_type, tff.CLIENTS),
  )
  def next_fn(state, weights, data, client_states, round_input):
    outputs = tff.federated_map(client_update, (weights, data, client_states, round_input))
    client_counts = tff.federated_sum(tff.federated_map(counts, outputs.result))
    result = collections.OrderedDict(
        client_result=outputs.result, client_states=outputs.state
    )
    if has_upload:
      result['uploads'] = outputs.upload
    measurements = tff.federated_zip(
        collections.OrderedDict(
            train=metrics_aggregation_fn(outputs.metrics),
            clients=client_counts.clients,
            non_finite_clients=client_counts.non_finite_clients,
        )
    )
    return tff.templates.MeasuredProcessOutput(
        state=state, result=result, measurements=measurements
    )

  return StatefulClientWork(
      initialize=init_fn,
      next=next_fn,
      initial_client_state=initial_client_state,
      data_type=data_type,
      upload_type=output_type.upload if has_upload else None,
      build_local_update=build_local_update,
  )


def compose_stateful_clients_process(
    initial_model_weights_fn: tff.Computation,
    distributor: tff.templates.MeasuredProcess,
    client_work: StatefulClientWork,
    aggregator: tff.templates.AggregationProcess,
    finalizer: tff.templates.MeasuredProcess,
    shared_state: Optional[SharedState] = None,
) -> StatefulClientsLearningProcess:
  """Composes the four parts, as `tff.learning.templates.compose_learning_process`.

  The server state is an `OrderedDict` of `global_model_weights`, the four parts'
  states, and `round_num` (the global round index `t`, from 0), which is
  broadcast to the clients.

  With a `shared_state`, the server state also has `shared` (its value `X`), the
  client work's last argument is `<round_num=int32, shared=X>@CLIENTS` instead of
  the round index, its result is `<ClientResult, C, U>@CLIENTS` (`U`: the
  uploads `shared_state.next` reads), and `shared` is updated after aggregation.
  """

  @tff.federated_computation()
  def init_fn():
    parts = collections.OrderedDict(
        global_model_weights=tff.federated_eval(
            initial_model_weights_fn, tff.SERVER
        ),
        distributor=distributor.initialize(),
        client_work=client_work.initialize(),
        aggregator=aggregator.initialize(),
        finalizer=finalizer.initialize(),
        round_num=tff.federated_value(np.int32(0), tff.SERVER),
    )
    if shared_state is not None:
      parts['shared'] = shared_state.initialize()
    return tff.federated_zip(parts)

  state_type = init_fn.type_signature.result
  data_type = tff.FederatedType(client_work.data_type, tff.CLIENTS)
  client_states_type = tff.FederatedType(client_work.client_state_type, tff.CLIENTS)

  @tff.tensorflow.computation(np.int32)
  def increment(round_num):
    return round_num + 1

  def round_fn(state, client_data, client_states):
    weights = state.global_model_weights
    distributor_output = distributor.next(state.distributor, weights)
    if shared_state is None:
      broadcast = tff.federated_broadcast(state.round_num)
    else:
      broadcast = tff.federated_broadcast(
          tff.federated_zip(
              collections.OrderedDict(
                  round_num=state.round_num, shared=state.shared
              )
          )
      )
    work_output = client_work.next(
        state.client_work,
        distributor_output.result,
        client_data,
        client_states,
        broadcast,
    )
    client_result = work_output.result.client_result
    aggregator_output = aggregator.next(
        state.aggregator, client_result.update, client_result.update_weight
    )
    finalizer_output = finalizer.next(
        state.finalizer, weights, aggregator_output.result
    )
    new_parts = collections.OrderedDict(
        global_model_weights=finalizer_output.result,
        distributor=distributor_output.state,
        client_work=work_output.state,
        aggregator=aggregator_output.state,
        finalizer=finalizer_output.state,
        round_num=tff.federated_map(increment, state.round_num),
    )
    if shared_state is not None:
      new_parts['shared'] = shared_state.next(
          state.shared, work_output.result.uploads, aggregator_output.result
      )
    new_state = tff.federated_zip(new_parts)
    metrics = tff.federated_zip(
        collections.OrderedDict(
            distributor=distributor_output.measurements,
            client_work=work_output.measurements,
            aggregator=aggregator_output.measurements,
            finalizer=finalizer_output.measurements,
        )
    )
    return StatefulClientsOutput(
        state=new_state, metrics=metrics, client_states=work_output.result.client_states
    )

  @tff.federated_computation(state_type, data_type, client_states_type)
  def next_fn(state, client_data, client_states):
    return round_fn(state, client_data, client_states)

  read_state, write_state = _state_file_computations(client_work.client_state_type)
  client_inputs_type = tff.FederatedType(
      tff.StructWithPythonType(
          [('data', data_type.member), ('state_files', _STATE_FILES_TYPE)],
          collections.OrderedDict,
      ),
      tff.CLIENTS,
  )

  # Two arguments and two SERVER-placed results, the shape of TFF's MapReduceForm, so
  # the in-process runtime compiles it as it does every other round.
  @tff.federated_computation(state_type, client_inputs_type)
  def next_with_state_files_fn(state, client_inputs):
    output = round_fn(
        state, client_inputs.data, tff.federated_map(read_state, client_inputs.state_files)
    )
    written = tff.federated_map(write_state, (client_inputs.state_files, output.client_states))
    return (
        output.state,
        tff.federated_zip(
            collections.OrderedDict(
                metrics=output.metrics, client_state_bytes=tff.federated_sum(written)
            )
        ),
    )

  @tff.tensorflow.computation(state_type.member)
  def get_model_weights(state):
    return state['global_model_weights']

  weights_type = get_model_weights.type_signature.result

  @tff.tensorflow.computation(state_type.member, weights_type)
  def set_model_weights(state, weights):
    updated = collections.OrderedDict(state)
    updated['global_model_weights'] = weights
    return updated

  return StatefulClientsLearningProcess(
      init_fn,
      next_fn,
      get_model_weights,
      set_model_weights,
      client_work.initial_client_state,
      next_with_state_files_fn,
      client_work.build_local_update,
  )


_STATE_FILES_TYPE = tff.StructWithPythonType(
    [('read', np.str_), ('write', np.str_)], collections.OrderedDict
)


def _state_file_computations(client_state_type: tff.Type):
  """`(read_state, write_state)`: TF computations moving one client state to and from a file.

  `read_state(<read, write>) -> C` and `write_state(<<read, write>, C>) -> int64` (the
  number of bytes written), both run by TFF's worker.
  """
  types = state_file.tensor_types(client_state_type)

  @tff.tensorflow.computation(_STATE_FILES_TYPE)
  def read_state(files):
    return state_file.pack(
        state_file.parse(tf.io.read_file(files['read']), types), client_state_type
    )

  @tff.tensorflow.computation(_STATE_FILES_TYPE, client_state_type)
  def write_state(files, client_state):
    serialized = state_file.serialize(state_file.flatten(client_state, client_state_type))
    with tf.control_dependencies([tf.io.write_file(files['write'], serialized)]):
      return tf.cast(tf.strings.length(serialized), tf.int64)

  return read_state, write_state


class ModelTypes(NamedTuple):
  """What a client work needs of a `VariableModel` outside any computation."""

  weights_type: tff.Type  # The model weights the server broadcasts.
  data_type: tff.Type  # One client's data, a sequence of the model's input spec.
  metrics_aggregation_fn: Any  # Sums the clients' unfinalized metrics, then finalizes.


def model_types(model_fn: Callable[[], tff.learning.models.VariableModel]) -> ModelTypes:
  """The types and metric aggregation of `model_fn()`, from one model in a spare graph."""
  with tf.Graph().as_default():
    model = model_fn()
    return ModelTypes(
        weights_type=tff.learning.models.weights_type_from_model(model),
        data_type=tff.SequenceType(tff.types.tensorflow_to_type(model.input_spec)),
        metrics_aggregation_fn=tff.learning.metrics.sum_then_finalize(
            model.metric_finalizers()
        ),
    )


def optimizer_step(model, trainable, optimizer, optimizer_state, batch, directions):
  """One local step along `directions(gradients)` of the model's loss on `batch`.

  Args:
    model: The `VariableModel` whose `forward_pass` gives the loss.
    trainable: Its trainable variables, updated in place.
    optimizer: A `tff.learning.optimizers.Optimizer`.
    optimizer_state: Its state before the step.
    batch: One batch of the client's data.
    directions: `(gradients) -> directions`, per trainable tensor; the gradients are
      dense (an embedding's `IndexedSlices` converted).

  Returns:
    The optimizer's state after the step.
  """
  with tf.GradientTape() as tape:
    output = model.forward_pass(batch, training=True)
  gradients = tuple(tf.convert_to_tensor(g) for g in tape.gradient(output.loss, trainable))
  optimizer_state, updated = optimizer.next(optimizer_state, trainable, directions(gradients))
  for variable, value in zip(trainable, updated):
    variable.assign(value)
  return optimizer_state


def trainable_zeros(trainable_type: tff.Type) -> tuple[tf.Tensor, ...]:
  """Zero tensors shaped like a model's trainable weights (inside TF graphs)."""
  return tuple(tf.zeros(t.shape, t.dtype) for t in trainable_type)  # pytype: disable=attribute-error
