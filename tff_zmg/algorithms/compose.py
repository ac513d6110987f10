"""Composes a client rule and a server rule into a TFF learning process.

Every algorithm of the package is the four-part composition of TFF's
`tff.learning.algorithms.build_weighted_fed_avg` (ALGORITHMS.md sections 2-4):

  1. distributor: `tff.learning.templates.build_broadcast_process`;
  2. client work: `tff.learning.templates.build_model_delta_client_work`
     running the *client rule*, which reports `u_k = w^t - w_k`;
  3. aggregator: the example-weighted mean (`tff.aggregators.MeanFactory`)
     or the uniform mean (`tff.aggregators.UnweightedMeanFactory`) of `u_k`;
  4. finalizer: `tff.learning.templates.build_apply_optimizer_finalizer`
     running the *server rule* on the aggregated `u`.

Rules are looked up by name in `CLIENT_RULES` and `SERVER_RULES`, so any
client rule composes with any server rule. A rule names the hyperparameters
it takes, with their defaults; `build_process` rejects hyperparameters that
neither chosen rule takes. The masks of projected rules are computed once,
from the variables of a `model_fn()` built in a throwaway graph.

Example:

    process = build_process(
        task.model_fn, 'zmg_sgdm', 'adam',
        client_weighting=tff.learning.ClientWeighting.NUM_EXAMPLES,
        client_learning_rate=0.01, server_learning_rate=0.01)
"""

from collections.abc import Callable, Mapping, Sequence
import dataclasses
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_zmg import optimizers
from tff_zmg import projection
from tff_zmg import validation

ModelFn = Callable[[], tff.learning.models.VariableModel]
Optimizer = tff.learning.optimizers.Optimizer

LOCAL_GC_LAYERS = ('all', 'feature')
GLOBAL_GC_LAYERS = ('classifier', 'all')


@dataclasses.dataclass(frozen=True)
class Rule:
  """A named update rule: how to build its optimizer, its hyperparameters.

  Attributes:
    build: `(learning_rate, variables, **hparams) -> Optimizer`, where
      `variables` are the model's trainable variables (for masks) and `hparams`
      holds one value for each key of `hparams`.
    hparams: The hyperparameters `build` takes, mapped to their defaults.
  """

  build: Callable[..., Optimizer]
  hparams: Mapping[str, Any]


def _projected_tensors(
    variables: Sequence[tf.Variable],
    layers: str,
    gc_lambda: Optional[float],
    center_vectors: bool,
) -> tuple[bool, ...]:
  """A projected rule's mask: the weight matrices of `layers` (+ their biases).

  `projection.projection_mask` leaves biases out; with `center_vectors` (the
  GC-Fed authors' bias centring) the rank-1 biases of the same layers are in.
  """
  mask = projection.projection_mask(variables, layers, gc_lambda)
  if not center_vectors:
    return mask
  in_layers = {
      'all': (True,) * len(variables),
      'feature': projection.layer_borderline_mask(variables, gc_lambda),
      'classifier': projection.classifier_layer_mask(variables, gc_lambda),
  }[layers]
  return tuple(
      selected or (in_layer and v.shape.rank == 1)
      for selected, in_layer, v in zip(mask, in_layers, variables)
  )


# Client rules: the optimizer every client runs for its local steps.


def _sgd(learning_rate, variables):
  """SGD: `w <- w - lr * g` (TFF's `build_sgdm` without momentum)."""
  del variables  # Unmasked.
  return tff.learning.optimizers.build_sgdm(learning_rate)


def _sgdm(learning_rate, variables, client_momentum):
  """SGD with momentum: `v <- mu v + g; w <- w - lr v` (TFF's `build_sgdm`)."""
  del variables  # Unmasked.
  return tff.learning.optimizers.build_sgdm(
      learning_rate, momentum=client_momentum
  )


def _zmg_sgdm(
    learning_rate, variables, client_momentum, weight_decay, center_vectors
):
  """ZMG-SGDM with decoupled weight decay on every weight matrix (FedZMG)."""
  return optimizers.build_zmg_sgdm(
      learning_rate,
      momentum=client_momentum,
      weight_decay=weight_decay,
      mask=_projected_tensors(variables, 'all', None, center_vectors),
      center_vectors=center_vectors,
  )


def _local_gc(
    learning_rate,
    variables,
    client_momentum,
    weight_decay,
    local_gc_layers,
    gc_lambda,
    center_vectors,
):
  """LocalGC SGDM, coupled L2, on the kernels of `local_gc_layers` (GC-Fed)."""
  return optimizers.build_local_gc_sgdm(
      learning_rate,
      momentum=client_momentum,
      weight_decay=weight_decay,
      mask=_projected_tensors(
          variables, local_gc_layers, gc_lambda, center_vectors
      ),
      center_vectors=center_vectors,
  )


CLIENT_RULES: Mapping[str, Rule] = {
    'sgd': Rule(_sgd, {}),
    'sgdm': Rule(_sgdm, {'client_momentum': 0.9}),
    'zmg_sgdm': Rule(
        _zmg_sgdm,
        {'client_momentum': 0.9, 'weight_decay': 1e-4, 'center_vectors': False},
    ),
    'local_gc': Rule(
        _local_gc,
        {
            'client_momentum': 0.9,
            'weight_decay': 1e-5,
            'local_gc_layers': 'all',
            'gc_lambda': None,
            'center_vectors': False,
        },
    ),
}


# Server rules: the optimizer the server applies to the aggregated update `u`.


def _adam(
    learning_rate,
    variables,
    adam_beta_1,
    adam_beta_2,
    adam_epsilon,
    adam_bias_correction,
):
  """FedAdam's server Adam (ALGORITHMS.md section 3)."""
  del variables  # Unmasked.
  return optimizers.build_server_adam(
      learning_rate,
      beta_1=adam_beta_1,
      beta_2=adam_beta_2,
      epsilon=adam_epsilon,
      bias_correction=adam_bias_correction,
  )


def _global_gc(
    learning_rate, variables, global_gc_layers, gc_lambda, center_vectors
):
  """Global GC: `w <- w - lr * M'(P(u))`, M': kernels of `global_gc_layers`."""
  return optimizers.build_global_gc_sgd(
      learning_rate,
      mask=_projected_tensors(
          variables, global_gc_layers, gc_lambda, center_vectors
      ),
      center_vectors=center_vectors,
  )


SERVER_RULES: Mapping[str, Rule] = {
    'sgd': Rule(_sgd, {}),
    'adam': Rule(
        _adam,
        {
            'adam_beta_1': 0.9,
            'adam_beta_2': 0.99,
            'adam_epsilon': 1e-3,
            'adam_bias_correction': False,
        },
    ),
    'global_gc': Rule(
        _global_gc,
        {
            'global_gc_layers': 'classifier',
            'gc_lambda': None,
            'center_vectors': False,
        },
    ),
}


# Argument checks, one per hyperparameter name (flag names of the training CLI).


def _check_choice(choices):
  def check(name, value):
    if value not in choices:
      raise ValueError(
          f'{name} must be one of {list(choices)}, got {value!r}'
      )
    return value

  return check


def _check_optional_in_unit_interval(name, value):
  if value is None:
    return None
  return validation.check_in_range(name, value, 0.0, 1.0)


def _check_in_half_open_unit_interval(name, value):
  return validation.check_in_range(name, value, 0.0, 1.0, high_inclusive=False)


HPARAM_CHECKS: Mapping[str, Callable[[str, Any], Any]] = {
    'client_learning_rate': validation.check_positive,
    'server_learning_rate': validation.check_positive,
    'client_momentum': _check_in_half_open_unit_interval,
    'weight_decay': validation.check_non_negative,
    'gc_lambda': _check_optional_in_unit_interval,
    'local_gc_layers': _check_choice(LOCAL_GC_LAYERS),
    'global_gc_layers': _check_choice(GLOBAL_GC_LAYERS),
    'adam_beta_1': _check_in_half_open_unit_interval,
    'adam_beta_2': _check_in_half_open_unit_interval,
    'adam_epsilon': validation.check_positive,
    'adam_bias_correction': validation.check_bool,
    'center_vectors': validation.check_bool,
}


def _get_rule(kind: str, rules: Mapping[str, Rule], name: Any) -> Rule:
  if not isinstance(name, str) or name not in rules:
    raise ValueError(f'{kind} must be one of {sorted(rules)}, got {name!r}')
  return rules[name]


def trainable_variables(model_fn: ModelFn) -> tuple[tf.Variable, ...]:
  """The trainable variables of a new `model_fn()`, built in a spare graph."""
  with tf.Graph().as_default():
    return tuple(model_fn().trainable_variables)


def initial_model_weights_computation(model_fn: ModelFn) -> tff.Computation:
  """`( -> ModelWeights)`: the weights of a new `model_fn()`."""

  @tff.tensorflow.computation
  def initial_model_weights_fn():
    return tff.learning.models.ModelWeights.from_model(model_fn())

  return initial_model_weights_fn


def build_process(
    model_fn: ModelFn,
    client_rule: str,
    server_rule: str,
    *,
    client_weighting: tff.learning.ClientWeighting,
    client_learning_rate: float,
    server_learning_rate: float,
    client_momentum: Optional[float] = None,
    weight_decay: Optional[float] = None,
    gc_lambda: Optional[float] = None,
    local_gc_layers: Optional[str] = None,
    global_gc_layers: Optional[str] = None,
    adam_beta_1: Optional[float] = None,
    adam_beta_2: Optional[float] = None,
    adam_epsilon: Optional[float] = None,
    adam_bias_correction: Optional[bool] = None,
    center_vectors: Optional[bool] = None,
    loop_implementation: tff.learning.LoopImplementation = (
        tff.learning.LoopImplementation.DATASET_REDUCE
    ),
) -> tff.learning.templates.LearningProcess:
  """Builds the process of `client_rule` x `server_rule` (see module docstring).

  Hyperparameters left `None` take the chosen rule's default (see
  `CLIENT_RULES`, `SERVER_RULES`); `gc_lambda` and `center_vectors` are shared
  by a client and a server rule that both take them.

  Args:
    model_fn: A no-arg function returning a new
      `tff.learning.models.VariableModel` (e.g. `task.model_fn`).
    client_rule: A key of `CLIENT_RULES`: 'sgd', 'sgdm', 'zmg_sgdm' or
      'local_gc'.
    server_rule: A key of `SERVER_RULES`: 'sgd', 'adam' or 'global_gc'.
    client_weighting: `tff.learning.ClientWeighting.NUM_EXAMPLES` (the
      example-weighted mean of client updates) or `UNIFORM` (their mean).
    client_learning_rate: Client learning rate `eta_l`, > 0.
    server_learning_rate: Server learning rate `eta_g`, > 0.
    client_momentum: Client momentum `mu` in [0, 1) ('sgdm', 'zmg_sgdm',
      'local_gc').
    weight_decay: Weight decay, >= 0: decoupled for 'zmg_sgdm', coupled L2
      for 'local_gc'.
    gc_lambda: GC-Fed's layer borderline in [0, 1] ('feature'/'classifier'
      layers); `None`: every layer but the last is a feature layer.
    local_gc_layers: 'all' or 'feature': the layers 'local_gc' projects.
    global_gc_layers: 'classifier' or 'all': the layers 'global_gc' projects.
    adam_beta_1: Adam's first-moment decay in [0, 1).
    adam_beta_2: Adam's second-moment decay in [0, 1).
    adam_epsilon: Adam's epsilon, > 0.
    adam_bias_correction: Whether server Adam corrects the moments' bias.
    center_vectors: Whether projected layers' rank-1 biases are centred too.
    loop_implementation: The client training loop, a
      `tff.learning.LoopImplementation`.

  Returns:
    A `tff.learning.templates.LearningProcess`.

  Raises:
    ValueError: If a rule name or hyperparameter value is invalid, or a
      hyperparameter is given that neither rule takes.
  """
  client = _get_rule('client_rule', CLIENT_RULES, client_rule)
  server = _get_rule('server_rule', SERVER_RULES, server_rule)
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
  client_learning_rate = validation.check_positive(
      'client_learning_rate', client_learning_rate
  )
  server_learning_rate = validation.check_positive(
      'server_learning_rate', server_learning_rate
  )
  given = {
      name: value
      for name, value in dict(
          client_momentum=client_momentum,
          weight_decay=weight_decay,
          gc_lambda=gc_lambda,
          local_gc_layers=local_gc_layers,
          global_gc_layers=global_gc_layers,
          adam_beta_1=adam_beta_1,
          adam_beta_2=adam_beta_2,
          adam_epsilon=adam_epsilon,
          adam_bias_correction=adam_bias_correction,
          center_vectors=center_vectors,
      ).items()
      if value is not None
  }
  unused = sorted(set(given) - set(client.hparams) - set(server.hparams))
  if unused:
    raise ValueError(
        f'{unused} not used by client rule {client_rule!r} (takes '
        f'{sorted(client.hparams)}) or server rule {server_rule!r} (takes '
        f'{sorted(server.hparams)})'
    )
  given = {name: HPARAM_CHECKS[name](name, v) for name, v in given.items()}

  def hparams_of(rule):
    return {name: given.get(name, d) for name, d in rule.hparams.items()}

  variables = trainable_variables(model_fn)
  client_optimizer = client.build(
      client_learning_rate, variables, **hparams_of(client)
  )
  server_optimizer = server.build(
      server_learning_rate, variables, **hparams_of(server)
  )

  initial_model_weights_fn = initial_model_weights_computation(model_fn)
  client_work = tff.learning.templates.build_model_delta_client_work(
      model_fn,
      client_optimizer,
      client_weighting,
      loop_implementation=loop_implementation,
  )
  distributor, aggregator, finalizer = build_server_parts(
      initial_model_weights_fn, server_optimizer, client_weighting
  )
  return tff.learning.templates.compose_learning_process(
      initial_model_weights_fn, distributor, client_work, aggregator, finalizer
  )


def build_server_parts(
    initial_model_weights_fn: tff.Computation,
    server_optimizer: Optimizer,
    client_weighting: tff.learning.ClientWeighting,
) -> tuple[
    tff.templates.MeasuredProcess,
    tff.templates.AggregationProcess,
    tff.templates.MeasuredProcess,
]:
  """The parts around the client work: (distributor, aggregator, finalizer).

  The distributor broadcasts the model weights; the aggregator is the
  example-weighted or the uniform mean of client updates; the finalizer applies
  `server_optimizer` to the aggregated update. Stateful-client processes
  (`stateful_clients`) compose the same parts.
  """
  model_weights_type = initial_model_weights_fn.type_signature.result
  distributor = tff.learning.templates.build_broadcast_process(
      model_weights_type
  )
  if client_weighting == tff.learning.ClientWeighting.UNIFORM:
    aggregator_factory = tff.aggregators.as_weighted_aggregator(
        tff.aggregators.UnweightedMeanFactory()
    )
  else:
    aggregator_factory = tff.aggregators.MeanFactory()
  aggregator = aggregator_factory.create(
      model_weights_type.trainable, tff.TensorType(np.float32)
  )
  finalizer = tff.learning.templates.build_apply_optimizer_finalizer(
      server_optimizer, model_weights_type
  )
  return distributor, aggregator, finalizer
