"""The in-process runtime on computations of every shape a notebook composes.

A researcher building an algorithm calls its parts on their own: a client work's `next`
(three arguments, results at CLIENTS), a finalizer's (SERVER only), a distributor's (a
broadcast), an evaluation on clients given as lists of elements, a personalization
evaluation (one SERVER value). Each of TFF 0.87's own building blocks runs under
`in_process_context()` and under TFF's C++ worker, and every output agrees to 1e-6; so
does a stateful algorithm's `next`, whose clients' states come back CLIENTS-placed.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.learning.algorithms import mime
from tensorflow_federated.python.learning.templates import proximal_client_work

from tff_zmg.algorithms import registry
from tff_zmg.runtime import in_process
from tff_zmg.runtime import interpreter
from test_in_process import assert_all_close
from test_in_process import client_dataset
from test_in_process import HPARAMS
from test_in_process import tiny_model_fn

NUM_EXAMPLES = tff.learning.ClientWeighting.NUM_EXAMPLES
CLIENTS = (0, 1, 2)


def in_both_contexts(run):
  """(run() in TFF's worker, run() in process); the caller holds the worker's context."""
  expected = run()
  with in_process.in_process_context() as context:
    actual = run()
  return expected, actual, context


def initial_weights():
  return tff.learning.models.ModelWeights.from_model(tiny_model_fn())


def client_work_round(client_work):
  """A client work's `next` on three clients, each from the initial weights."""
  def run():
    weights = initial_weights()
    output = client_work.next(
        client_work.initialize(), [weights] * len(CLIENTS), [client_dataset(c) for c in CLIENTS]
    )
    return output.state, output.result, output.measurements
  return run


@pytest.mark.parametrize('name, client_work', [
    ('model delta', lambda: tff.learning.templates.build_model_delta_client_work(
        tiny_model_fn, tff.learning.optimizers.build_sgdm(0.1), NUM_EXAMPLES)),
    ('proximal', lambda: proximal_client_work.build_model_delta_client_work(
        tiny_model_fn, tff.learning.optimizers.build_sgdm(0.1), NUM_EXAMPLES,
        delta_l2_regularizer=0.5,
        loop_implementation=tff.learning.LoopImplementation.DATASET_REDUCE)),
    # pylint: disable-next=protected-access
    ('mime', lambda: mime._build_mime_lite_client_work(
        tiny_model_fn, tff.learning.optimizers.build_sgdm(0.1, momentum=0.9), NUM_EXAMPLES)),
])
def test_tff_client_works_next_equals_the_worker(name, client_work, tff_context):
  del tff_context
  expected, actual, context = in_both_contexts(client_work_round(client_work()))
  assert_all_close(actual, expected)
  assert len(actual[1]) == len(CLIENTS), name  # One result per client, in their order.
  assert context.rounds_run == 1 and len(context.last_client_devices) == len(CLIENTS)


def test_a_finalizer_and_a_distributor_on_their_own_equal_the_worker(tff_context):
  """SERVER-only computations (an optimizer's step on the server) and a broadcast.

  TFF's worker returns a broadcast only where the call gives the number of clients (here
  by their data); the in-process runtime also returns it alone, as one all-equal value.
  """
  del tff_context
  weights_type = tff.learning.models.weights_type_from_model(tiny_model_fn)
  finalizer = tff.learning.templates.build_apply_optimizer_finalizer(
      tff.learning.optimizers.build_adam(0.01), weights_type
  )
  distributor = tff.learning.templates.build_broadcast_process(weights_type)
  client_data_type = tff.FederatedType(
      tff.SequenceType(tff.types.tensorflow_to_type(tiny_model_fn().input_spec)), tff.CLIENTS)

  @tff.tensorflow.computation(weights_type, client_data_type.member)
  def weights_and_data_size(weights, data):
    return weights, data.reduce(np.int32(0), lambda n, _: n + 1)

  @tff.federated_computation(
      distributor.initialize.type_signature.result,
      tff.FederatedType(weights_type, tff.SERVER), client_data_type)
  def broadcast_to_clients_with_data(state, weights, data):
    broadcast = distributor.next(state, weights).result
    return tff.federated_map(weights_and_data_size, (broadcast, data))

  def run():
    weights = initial_weights()
    update = tf.nest.map_structure(lambda w: np.full_like(w, 0.5), weights.trainable)
    state = finalizer.initialize()
    outputs = []
    for _ in range(2):
      output = finalizer.next(state, weights, update)
      state, weights = output.state, output.result
      outputs.append((output.result, output.measurements))
    received = broadcast_to_clients_with_data(
        distributor.initialize(), weights, [client_dataset(c) for c in CLIENTS])
    return state, outputs, received
  expected, actual, _ = in_both_contexts(run)
  assert_all_close(actual, expected)
  # Adam's first step moves every weight by the learning rate, against the update's sign.
  first, start = actual[1][0][0].trainable, initial_weights().trainable
  np.testing.assert_allclose(first[-1], start[-1] - 0.01, atol=1e-6)
  with in_process.in_process_context():
    alone = distributor.next(distributor.initialize(), initial_weights()).result
  assert_all_close(alone, initial_weights())


def test_evaluation_of_clients_given_as_lists_of_elements_equals_the_worker(tff_context):
  """TFF's contexts make datasets of lists of elements; so does the in-process one."""
  del tff_context
  evaluation = tff.learning.algorithms.build_fed_eval(tiny_model_fn)

  def as_elements(client):
    return [collections.OrderedDict(x=x.numpy(), y=y.numpy())
            for batch in client_dataset(client) for x, y in [(batch['x'], batch['y'])]]

  def run():
    return evaluation.next(evaluation.initialize(), [as_elements(c) for c in CLIENTS]).metrics
  expected, actual, _ = in_both_contexts(run)
  assert_all_close(actual, expected)
  assert actual['client_work']['eval']['current_round_metrics']['num_batches'] == 6


def _personalization_evaluation():
  """TFF's personalization evaluation of the tiny model, without finetuning."""

  @tf.function
  def evaluate(model, dataset):
    total = tf.constant(0.0)
    for batch in dataset.batch(2):  # Personalization's datasets are of single examples.
      total += model.forward_pass(batch, training=False).loss
    return collections.OrderedDict(loss_sum=total)

  def build_no_finetuning():
    @tf.function
    def finetune_and_evaluate(model, train_data, test_data):
      del train_data
      return evaluate(model, test_data)
    return finetune_and_evaluate

  return tff.learning.algorithms.build_personalization_eval_computation(
      tiny_model_fn, collections.OrderedDict(none=build_no_finetuning), evaluate,
      max_num_clients=10,
  )


def test_personalization_evaluation_equals_the_worker(tff_context):
  """One SERVER value of per-strategy metrics, sampled by a federated aggregate."""
  del tff_context
  computation = _personalization_evaluation()

  def run():
    inputs = [collections.OrderedDict(train_data=client_dataset(c).unbatch(),
                                      test_data=client_dataset(c).unbatch()) for c in CLIENTS]
    return computation(initial_weights(), inputs)
  expected, actual, _ = in_both_contexts(run)
  assert_all_close(actual, expected)
  assert len(actual['baseline_metrics']['loss_sum']) == len(CLIENTS)


def test_batched_datasets_where_single_examples_are_taken_raise_tffs_type_error(tff_context):
  """TFF 0.87's personalization_eval_test.test_failure_with_batched_datasets (issue 47):
  TFF's context raises TypeError at the call; in process the call ran, and TensorFlow
  failed inside it on incompatible shapes."""
  del tff_context
  computation = _personalization_evaluation()
  batched = [collections.OrderedDict(train_data=client_dataset(c), test_data=client_dataset(c))
             for c in CLIENTS]
  with pytest.raises(TypeError):
    computation(initial_weights(), batched)
  with in_process.in_process_context() as context:
    with pytest.raises(TypeError, match='a dataset of .* cannot be passed as one'):
      computation(initial_weights(), batched)
  assert context.rounds_run == 0


def test_a_stateful_round_with_client_states_in_the_call_equals_the_worker(tff_context):
  """FedRKMGC's `next` returns the clients' new states at CLIENTS: once refused."""
  del tff_context
  process = registry.build('fedrkmgc', tiny_model_fn, **HPARAMS)

  def run():
    state = process.initialize()
    states = [process.initial_client_state()] * len(CLIENTS)
    outputs = []
    for _ in range(2):
      output = process.next(state, [client_dataset(c) for c in CLIENTS], states)
      state, states = output.state, output.client_states
      outputs.append((output.metrics, output.client_states))
    return process.get_model_weights(state), outputs
  expected, actual, _ = in_both_contexts(run)
  assert_all_close(actual, expected)
  assert len(actual[1][-1][1]) == len(CLIENTS)


@tff.federated_computation()
def _sum_of_a_value_at_every_client():
  return tff.federated_sum(tff.federated_value(np.int32(1), tff.CLIENTS))


def test_what_it_cannot_run_is_refused_with_its_own_error():
  """Not a TypeError (which TFF's type checks raise), and nothing runs elsewhere."""
  assert not issubclass(in_process.InProcessUnsupportedError, TypeError)
  assert in_process.InProcessUnsupportedError is interpreter.InProcessUnsupportedError
  with in_process.in_process_context():
    with pytest.raises(in_process.InProcessUnsupportedError, match='needs the number of clients'):
      _sum_of_a_value_at_every_client()
