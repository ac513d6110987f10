"""Any client rule with any server rule, by name: `build_process`.

The named algorithms (`registry`) are fixed pairings; this composes the same client and
server steps freely (specification.md section 4, last line):

    process = build_process(
        task.model_fn, 'zmg_sgdm', 'adam',
        client_weighting=tff.learning.ClientWeighting.NUM_EXAMPLES,
        client_learning_rate=0.01, server_learning_rate=0.01)

A rule's hyperparameters, their defaults and their ranges are fields of the `Hparams`
class of the algorithm it comes from (FedZMG's client rule takes FedZMG's defaults);
`build_process` refuses hyperparameters that neither chosen rule takes.
"""

from collections.abc import Callable, Mapping, Sequence
import dataclasses
import functools
import types
import typing
from typing import Any, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_zmg.algorithms import fedavg
from tff_zmg.algorithms import fedprox
from tff_zmg.algorithms import fedzmg
from tff_zmg.algorithms import gcfed
from tff_zmg.algorithms import mime_lite
from tff_zmg.templates import compose
from tff_zmg.templates import hparams as hp


@dataclasses.dataclass(frozen=True)
class Rule:
  """A client or server step, by name.

  Attributes:
    build: `(hparams, variables) -> Optimizer`: `hparams` has the learning rates and
      `names`; `variables` are the model's trainable variables (for masks).
    hparams_class: The algorithm's `Hparams` whose fields give `names` their defaults
      and ranges.
    names: The hyperparameters the rule takes besides the learning rate.
  """

  build: Callable[[Any, Sequence[tf.Variable]], compose.Optimizer]
  hparams_class: type[hp.Hparams]
  names: tuple[str, ...] = ()

  @property
  def hparams(self) -> Mapping[str, Any]:
    """The rule's hyperparameters and their defaults."""
    defaults = self.hparams_class().as_dict()
    return types.MappingProxyType({name: defaults[name] for name in self.names})

  def check(self, name: str, value: Any) -> Any:
    return self.hparams_class.__dataclass_fields__[name].metadata['valid'].check(
        name, value
    )


CLIENT_RULES: Mapping[str, Rule] = types.MappingProxyType({
    # SGD with momentum and coupled weight decay, at FedAvg's defaults (neither).
    'sgd': Rule(
        lambda h, v: fedavg.client_sgd(h), fedavg.FedAvgHparams,
        ('client_momentum', 'weight_decay'),
    ),
    # TFF's SGDM, no decay: Mime-Lite's base optimizer.
    'sgdm': Rule(
        lambda h, v: fedavg.client_sgdm(h), mime_lite.MimeLiteHparams, ('client_momentum',)
    ),
    'zmg_sgdm': Rule(
        fedzmg.zmg_sgdm, fedzmg.FedZmgHparams,
        ('client_momentum', 'weight_decay', 'center_vectors'),
    ),
    'prox_sgd': Rule(
        lambda h, v: fedprox.prox_sgd(h), fedprox.FedProxHparams, ('proximal_strength',)
    ),
    'prox_zmg_sgdm': Rule(
        fedprox.prox_zmg_sgdm, fedprox.FedZmgProxHparams,
        ('client_momentum', 'weight_decay', 'center_vectors', 'proximal_strength'),
    ),
    'local_gc': Rule(
        gcfed.local_gc, gcfed.LocalGcHparams,
        ('client_momentum', 'weight_decay', 'local_gc_layers', 'gc_lambda',
         'center_vectors'),
    ),
})
SERVER_RULES: Mapping[str, Rule] = types.MappingProxyType({
    'sgd': Rule(lambda h, v: fedavg.server_sgd(h), fedavg.FedAvgHparams),
    'adam': Rule(
        lambda h, v: fedavg.server_adam(h), fedavg.ServerAdamHparams,
        ('adam_beta_1', 'adam_beta_2', 'adam_epsilon', 'adam_bias_correction'),
    ),
    'yogi': Rule(
        lambda h, v: fedavg.server_yogi(h), fedavg.ServerYogiHparams,
        ('yogi_beta_1', 'yogi_beta_2', 'yogi_epsilon', 'yogi_initial_accumulator'),
    ),
    'adagrad': Rule(
        lambda h, v: fedavg.server_adagrad(h), fedavg.ServerAdagradHparams,
        ('adagrad_epsilon', 'adagrad_initial_accumulator'),
    ),
    'global_gc': Rule(
        gcfed.global_gc, gcfed.GcFedHparams,
        ('global_gc_layers', 'gc_lambda', 'center_vectors'),
    ),
})


def _get_rule(kind: str, rules: Mapping[str, Rule], name: Any) -> Rule:
  if not isinstance(name, str) or name not in rules:
    raise ValueError(f'{kind} must be one of {sorted(rules)}, got {name!r}')
  return rules[name]


@functools.cache
def pair_hparams(client_rule: str, server_rule: str) -> type[hp.Hparams]:
  """The hyperparameters of `client_rule` x `server_rule` as one `Hparams` dataclass:
  the client rule's learning rate and hyperparameters, then the server rule's, each
  field (default, range, help) its rule's family's; a name both rules take is the client
  rule's, as in `build_process`. The client's weight decay says how the papers'
  protocols set it (`Hparams.DECOUPLED_WEIGHT_DECAY`).

  Raises:
    ValueError: If a rule name is not one of `CLIENT_RULES` or `SERVER_RULES`.
  """
  client = _get_rule('client_rule', CLIENT_RULES, client_rule)
  server = _get_rule('server_rule', SERVER_RULES, server_rule)
  fields = {}
  for rule, names in ((client, ('client_learning_rate', *client.names)),
                      (server, ('server_learning_rate', *server.names))):
    hints = typing.get_type_hints(rule.hparams_class)
    source = {f.name: f for f in dataclasses.fields(rule.hparams_class)}
    for name in names:
      fields.setdefault(name, (name, hints[name], dataclasses.field(
          default=source[name].default, metadata=source[name].metadata)))
  return dataclasses.make_dataclass(
      f'Hparams[{client_rule}+{server_rule}]', list(fields.values()), bases=(hp.Hparams,),
      frozen=True, namespace={
          'DECOUPLED_WEIGHT_DECAY': client.hparams_class.DECOUPLED_WEIGHT_DECAY,
          'WEIGHT_DECAY_NAME': client.hparams_class.WEIGHT_DECAY_NAME,
      })


def build_process(
    model_fn: compose.ModelFn,
    client_rule: str,
    server_rule: str,
    *,
    client_weighting: tff.learning.ClientWeighting,
    client_learning_rate: float,
    server_learning_rate: float,
    loop_implementation: tff.learning.LoopImplementation = compose.DATASET_REDUCE,
    model_aggregator: Optional[compose.AggregationFactory] = None,
    **hyperparameters: Any,
) -> tff.learning.templates.LearningProcess:
  """Builds the process of `client_rule` x `server_rule`.

  Args:
    model_fn: A no-arg function returning a new `tff.learning.models.VariableModel`.
    client_rule: A key of `CLIENT_RULES`: 'sgd', 'sgdm', 'zmg_sgdm', 'prox_sgd',
      'prox_zmg_sgdm' or 'local_gc'.
    server_rule: A key of `SERVER_RULES`: 'sgd', 'adam', 'yogi', 'adagrad' or 'global_gc'.
    client_weighting: `tff.learning.ClientWeighting.NUM_EXAMPLES` or `UNIFORM`.
    client_learning_rate: Client learning rate `eta_l`, > 0.
    server_learning_rate: Server learning rate `eta_g`, > 0.
    loop_implementation: The client training loop.
    model_aggregator: Optional `tff.aggregators` factory aggregating the client updates
      (`tff_zmg.aggregation.model_aggregator`); default: the mean `client_weighting` says.
    **hyperparameters: Values for some of the rules' `hparams` (the others take their
      defaults); `gc_lambda` and `center_vectors` are shared by a client and a server
      rule that both take them.

  Raises:
    ValueError: If a rule name or hyperparameter value is invalid, or a hyperparameter
      is given that neither rule takes (checked before any model is built).
  """
  client = _get_rule('client_rule', CLIENT_RULES, client_rule)
  server = _get_rule('server_rule', SERVER_RULES, server_rule)
  compose.check_arguments(model_fn, client_weighting, loop_implementation)
  unused = sorted(set(hyperparameters) - set(client.names) - set(server.names))
  if unused:
    raise ValueError(
        f'{unused} not used by client rule {client_rule!r} (takes '
        f'{sorted(client.names)}) or server rule {server_rule!r} (takes '
        f'{sorted(server.names)})'
    )
  values = {**server.hparams, **client.hparams}
  for name, value in hyperparameters.items():
    values[name] = (client if name in client.names else server).check(name, value)
  values['client_learning_rate'] = hp.POSITIVE.check(
      'client_learning_rate', client_learning_rate
  )
  values['server_learning_rate'] = hp.POSITIVE.check(
      'server_learning_rate', server_learning_rate
  )
  hparams = types.SimpleNamespace(**values)
  variables = compose.trainable_variables(model_fn)
  return compose.compose_process(
      model_fn, client.build(hparams, variables), server.build(hparams, variables),
      client_weighting, loop_implementation=loop_implementation,
      model_aggregator=model_aggregator,
  )
