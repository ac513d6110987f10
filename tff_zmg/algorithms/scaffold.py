"""SCAFFOLD and FedZMG-SCAFFOLD: control variates against client drift.

Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated Learning"
(ICML 2020), Algorithm 1, option II (`tff_zmg.transforms.control_variates`):

    client i:  d = g(y) - c_i + c                     (c_i its own, c the server's)
      SCAFFOLD:        y <- y - eta_l d
      FedZMG-SCAFFOLD: d~ = P(d) ; v <- mu v + d~ ; y <- y - eta_l v - eta_l lambda_wd y
               after K_i steps: c_i+ = c_i - c + (x - y) / (K_i eta_l) ; upload c_i+ - c_i
    server:    x <- x + eta_g mean_S(y_i - x)         (uniform weights, as the paper)
               c <- c + (|S| / N) mean_S(c_i+ - c_i)

Each client keeps `c_i` across the rounds it takes part in (the package's client-state
stores; a client absent from a round keeps its `c_i`); `c` is server state broadcast with
the model. `N` is the task's number of training clients.

FedZMG-SCAFFOLD projects the corrected direction `g - c_i + c`, not `g` alone: the step
the optimizer takes is then zero-mean over each weight matrix's inputs, as FedZMG's is,
whatever the control variates hold. `c_i` stays option II's estimate from the model
difference `(x - y) / (K eta_l)`, which with FedZMG's momentum and decoupled decay
includes their effect: it is the client's mean step direction, the quantity the control
variates exist to cancel.
"""

import collections
import dataclasses
import functools
from typing import Any, NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_zmg.algorithms import fedavg
from tff_zmg.algorithms import fedzmg
from tff_zmg.templates import compose
from tff_zmg.templates import hparams as hp
from tff_zmg.templates import stateful_clients
from tff_zmg.transforms import control_variates


@dataclasses.dataclass(frozen=True)
class ScaffoldHparams(hp.Hparams):
  """SCAFFOLD's: `eta_g = 1` (the paper's experiments); `eta_l = 0.1`, FedAvg's default
  (the paper tunes it per task)."""

  client_learning_rate: float = hp.client_learning_rate(0.1)
  server_learning_rate: float = hp.server_learning_rate(1.0)


@dataclasses.dataclass(frozen=True)
class FedZmgScaffoldHparams(fedzmg.FedZmgHparams):
  """FedZMG-SCAFFOLD's: FedZMG's client and server settings."""


# The client step: a client optimizer on the controlled gradient, then option II.


class _Controls(NamedTuple):
  """The control variates a client's local steps read, fixed for the round."""

  client: tuple[tf.Tensor, ...]  # c_i, its own.
  server: tuple[tf.Tensor, ...]  # c, broadcast.


class _LoopState(NamedTuple):
  """What the local steps carry from batch to batch."""

  optimizer_state: Any
  steps: tf.Tensor  # K_i so far.


def _scaffold_rule(model_fn, hparams, build_optimizer) -> stateful_clients.ClientRule:
  """SCAFFOLD's client on a new `model_fn()`; the round input is `<round_num, shared>`."""
  model = model_fn()
  weights = tff.learning.models.ModelWeights.from_model(model)
  trainable = tuple(weights.trainable)
  optimizer = build_optimizer(trainable)
  learning_rate = hparams.client_learning_rate

  def init(client_state, round_input):
    specs = tuple(tf.TensorSpec(v.shape, v.dtype) for v in trainable)
    context = _Controls(
        client=tuple(client_state['control']), server=tuple(round_input['shared']['control'])
    )
    return context, _LoopState(optimizer.initialize(specs), tf.constant(0, tf.int32))

  def step(context, loop_state, batch):
    optimizer_state = stateful_clients.optimizer_step(
        model, trainable, optimizer, loop_state.optimizer_state, batch,
        lambda gradients: tuple(
            control_variates.controlled_gradient(g, ci, c)
            for g, ci, c in zip(gradients, context.client, context.server)
        ),
    )
    return _LoopState(optimizer_state, loop_state.steps + 1)

  def final(context, loop_state, delta):
    client_control, server_control = context.client, context.server
    steps = tf.cast(loop_state.steps, tf.float32)
    new_control = tf.cond(
        steps > 0,
        lambda: tuple(
            control_variates.next_client_control(ci, c, d, steps, learning_rate)
            for ci, c, d in zip(client_control, server_control, delta)
        ),
        lambda: tuple(tf.identity(ci) for ci in client_control),  # No step: c_i kept.
    )
    return stateful_clients.ClientFinal(
        state=collections.OrderedDict(control=new_control),
        upload=collections.OrderedDict(
            control_delta=tuple(n - o for n, o in zip(new_control, client_control))
        ),
        metrics=model.report_local_unfinalized_metrics(),
    )

  return stateful_clients.ClientRule(weights=weights, init=init, step=step, final=final)


def sgd_optimizer(hparams):
  """SCAFFOLD's local step: plain SGD on the controlled gradient (its Hparams take no
  momentum or decay, which `fedavg.client_sgd` reads)."""
  return lambda variables: tff.learning.optimizers.build_sgdm(hparams.client_learning_rate)


def zmg_sgdm_optimizer(hparams):
  """FedZMG-SCAFFOLD's local step: ZMG-SGDM on the controlled gradient."""
  return lambda variables: fedzmg.zmg_sgdm(hparams, variables)


# The server step on `c`.


def _zero_control(weights_type) -> tff.Computation:
  """`( -> <control=0>)`: the server's `c` and a new client's `c_i` at the start."""

  @tff.tensorflow.computation
  def initial():
    return collections.OrderedDict(
        control=stateful_clients.trainable_zeros(weights_type.trainable)
    )

  return initial


def _shared_control(initial, upload_type, aggregated_type, num_clients: int):
  """`c` as shared server state: `c + sum_S(c_i+ - c_i) / N` after each round."""
  shared_type = initial.type_signature.result

  @tff.tensorflow.computation(upload_type)
  def control_delta(upload):
    return upload['control_delta']

  @tff.tensorflow.computation(
      shared_type, control_delta.type_signature.result, aggregated_type
  )
  def server_update(shared, control_delta_sum, aggregated):
    del aggregated  # `c` reads the clients' uploads only.
    return collections.OrderedDict(control=tuple(
        control_variates.next_server_control(c, s, float(num_clients))
        for c, s in zip(shared['control'], control_delta_sum)
    ))

  return stateful_clients.build_shared_state(
      initial, upload_type, aggregated_type, control_delta, server_update
  )


# The builders.


# What SCAFFOLD's clients upload besides their update (no model_aggregator covers it).
CONTROL_DELTAS = 'their control-variate deltas c_i+ - c_i'


def _build(model_fn, hparams, build_optimizer, num_clients, loop_implementation):
  num_clients = _check_num_clients(num_clients)
  types = stateful_clients.model_types(model_fn)
  weights_type = types.weights_type
  initial_shared = _zero_control(weights_type)
  client_work = stateful_clients.build_stateful_client_work(
      functools.partial(_scaffold_rule, model_fn, hparams, build_optimizer),
      weights_type=weights_type,
      data_type=types.data_type,
      round_input_type=tff.StructWithPythonType(
          [('round_num', np.int32), ('shared', initial_shared.type_signature.result)],
          collections.OrderedDict,
      ),
      initial_client_state=initial_shared,
      metrics_aggregation_fn=types.metrics_aggregation_fn,
      loop_implementation=loop_implementation,
  )
  shared = _shared_control(
      initial_shared, client_work.upload_type, weights_type.trainable, num_clients
  )
  return compose.compose_stateful_process(
      model_fn, client_work, fedavg.server_sgd(hparams),
      tff.learning.ClientWeighting.UNIFORM, shared_state=shared,
  )


def _check_num_clients(num_clients) -> int:
  if isinstance(num_clients, bool) or not isinstance(num_clients, (int, np.integer)) or (
      num_clients < 1):
    raise ValueError(
        'SCAFFOLD needs the number of training clients N (num_clients, an integer >= 1,'
        f' e.g. len(task.datasets.train_data.client_ids)), got {num_clients!r}'
    )
  return int(num_clients)


def build_scaffold(
    model_fn: compose.ModelFn,
    hparams: Optional[ScaffoldHparams] = None,
    *,
    num_clients: Optional[int] = None,
    loop_implementation: tff.learning.LoopImplementation = compose.DATASET_REDUCE,
    model_aggregator: Optional[compose.AggregationFactory] = None,
    **overrides,
) -> stateful_clients.StatefulClientsLearningProcess:
  """SCAFFOLD (option II): SGD on `g - c_i + c`, server SGD on the uniform mean update.

  Args:
    model_fn: A no-arg function returning a new `tff.learning.models.VariableModel`.
    hparams: A `ScaffoldHparams` (default: its defaults).
    num_clients: `N`, the number of training clients (the server's `c` is their mean
      `c_i`).
    loop_implementation: The client training loop.
    model_aggregator: Refused unless None (its uniform mean): the clients also upload
      their control-variate deltas, which the aggregator would not cover.
    **overrides: Fields of `ScaffoldHparams` to replace.

  Returns:
    A `StatefulClientsLearningProcess`; each client's state is `OrderedDict(control=c_i)`
    and the server state's `shared` is `OrderedDict(control=c)`.

  Raises:
    ValueError: If a hyperparameter is unknown or out of range, `num_clients` is
      missing, or a `model_aggregator` is given (checked before any model is built).
  """
  compose.refuse_model_aggregator(model_aggregator, 'scaffold', CONTROL_DELTAS)
  hparams = ScaffoldHparams.create(hparams, **overrides)
  return _build(model_fn, hparams, sgd_optimizer(hparams), num_clients, loop_implementation)


def build_fedzmg_scaffold(
    model_fn: compose.ModelFn,
    hparams: Optional[FedZmgScaffoldHparams] = None,
    *,
    num_clients: Optional[int] = None,
    loop_implementation: tff.learning.LoopImplementation = compose.DATASET_REDUCE,
    model_aggregator: Optional[compose.AggregationFactory] = None,
    **overrides,
) -> stateful_clients.StatefulClientsLearningProcess:
  """FedZMG-SCAFFOLD: ZMG-SGDM on `g - c_i + c`; otherwise SCAFFOLD.

  Args and returns as `build_scaffold`, with `FedZmgScaffoldHparams`.
  """
  compose.refuse_model_aggregator(model_aggregator, 'fedzmg_scaffold', CONTROL_DELTAS)
  hparams = FedZmgScaffoldHparams.create(hparams, **overrides)
  return _build(
      model_fn, hparams, zmg_sgdm_optimizer(hparams), num_clients, loop_implementation
  )
