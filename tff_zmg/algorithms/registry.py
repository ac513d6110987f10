"""The algorithms by `--algo` name: builder, hyperparameters, rules and weighting.

`ALGORITHMS` is the table of specification.md section 4. Each name maps to a build function,
the `Hparams` dataclass of its family (the one source of its hyperparameters' defaults,
ranges and help, from which the training program makes its flags) and, for the
FedRKMGC ablations, the defaults the name overrides:

    process = registry.build('fedzmg', task.model_fn, client_learning_rate=0.03)
    registry.resolve('fedzmg', {'client_learning_rate': 0.03})  # Every value it uses.

Any client rule with any server rule of `rules` is an algorithm too, named by both
(`pair_name`; what `launch.train --client_rule=zmg_sgdm --server_rule=adam` trains):

    process = registry.build('zmg_sgdm+adam', task.model_fn)

Every algorithm builds with any aggregator of `tff_zmg.aggregation` (DP, compression,
robust) or refuses in one line naming what its clients upload besides the update:

    registry.build('fedzmg', task.model_fn, aggregator=aggregation.AggregatorSettings(
        kind='dp_fixed', noise_multiplier=1.0, clip=0.5, clients_per_round=10))
    registry.check_aggregator('scaffold', settings)  # The same refusal, without a model.
"""

from collections.abc import Callable, Mapping
import dataclasses
import functools
import types
from typing import Any, Optional
import warnings

import tensorflow_federated as tff

from tff_zmg import aggregation
from tff_zmg.algorithms import fedavg
from tff_zmg.algorithms import fedgps
from tff_zmg.algorithms import fedprox
from tff_zmg.algorithms import fedrkmgc
from tff_zmg.algorithms import fedzmg
from tff_zmg.algorithms import gcfed
from tff_zmg.algorithms import mime_lite
from tff_zmg.algorithms import rules
from tff_zmg.algorithms import scaffold
from tff_zmg.templates import compose
from tff_zmg.templates import hparams as hp

_EXAMPLES = tff.learning.ClientWeighting.NUM_EXAMPLES
_UNIFORM = tff.learning.ClientWeighting.UNIFORM


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
  """One algorithm of the registry.

  Attributes:
    name: The `--algo` name.
    builder: `builder(model_fn, hparams, *, loop_implementation[, keras_model_fn])
      -> LearningProcess` (or a `StatefulClientsLearningProcess` when `stateful`).
    hparams_class: The `Hparams` dataclass of its hyperparameters.
    client_rule: The client rule: a key of `rules.CLIENT_RULES`, or the stateful
      client work of FedRKMGC ('corrected_sgdm'), FedGPS ('fedgps') or SCAFFOLD
      ('scaffold_sgd', 'scaffold_zmg_sgdm').
    server_rule: The key of `rules.SERVER_RULES` of its server step.
    client_weighting: How client updates are averaged.
    description: One line for `--help`.
    default_overrides: Defaults this name sets unlike its `hparams_class` (the
      FedRKMGC ablations' `rho`).
    stateful: Whether clients keep state across rounds (the process's `next`
      then also takes and returns the sampled clients' states).
    needs_keras_model: Whether the builder also takes the task's bare Keras
      model (`keras_model_fn`), as FedGPS does for its features.
    needs_num_clients: Whether the builder also takes the number of training
      clients (`num_clients`), as SCAFFOLD does for its server control variate.
    full_gradient_pass: Whether each client also computes its full-batch gradient at
      the round's model, a second pass over its data (Mime-Lite).
  """

  name: str
  builder: Callable[..., tff.learning.templates.LearningProcess]
  hparams_class: type[hp.Hparams]
  client_rule: str
  server_rule: str
  client_weighting: tff.learning.ClientWeighting
  description: str
  default_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  stateful: bool = False
  needs_keras_model: bool = False
  needs_num_clients: bool = False
  full_gradient_pass: bool = False

  def hparams(self, **values: Any) -> hp.Hparams:
    """The algorithm's hyperparameters: its defaults with `values`, checked.

    Raises:
      ValueError: If a name is not one of its hyperparameters, or a value is out of
        range.
    """
    unknown = sorted(set(values) - set(self.hparams_class.names()))
    if unknown:
      raise ValueError(
          f'Unknown hyperparameters {unknown} for algorithm {self.name!r}; its '
          f'hyperparameters are {sorted(self.hparams_class.names())}'
      )
    return self.hparams_class(**{**self.default_overrides, **values})

  @property
  def defaults(self) -> Mapping[str, Any]:
    """Every hyperparameter and its default, read-only."""
    return types.MappingProxyType(self.hparams().as_dict())


def _fedrkmgc_variant(name, correction_update, description, default_overrides=None):
  """A FedRKMGC ablation: its correction update and the defaults its name overrides."""
  return AlgorithmSpec(
      name=name,
      builder=functools.partial(fedrkmgc.build_fedrkmgc, correction_update=correction_update),
      hparams_class=fedrkmgc.FedRkmgcHparams,
      client_rule='corrected_sgdm',
      server_rule='sgd',
      client_weighting=_UNIFORM,
      description=description,
      default_overrides=types.MappingProxyType(default_overrides or {}),
      stateful=True,
  )


ALGORITHMS: Mapping[str, AlgorithmSpec] = types.MappingProxyType({
    spec.name: spec
    for spec in (
        AlgorithmSpec(
            name='fedavg',
            builder=fedavg.build_fedavg,
            hparams_class=fedavg.FedAvgHparams,
            client_rule='sgd',
            server_rule='sgd',
            client_weighting=_EXAMPLES,
            description='FedAvg: client SGD, server SGD (McMahan et al. 2017).',
        ),
        AlgorithmSpec(
            name='fedadam',
            builder=fedavg.build_fedadam,
            hparams_class=fedavg.FedAdamHparams,
            client_rule='sgd',
            server_rule='adam',
            client_weighting=_EXAMPLES,
            description='FedAdam: client SGD, server Adam (Reddi et al. 2021).',
        ),
        AlgorithmSpec(
            name='fedzmg',
            builder=fedzmg.build_fedzmg,
            hparams_class=fedzmg.FedZmgHparams,
            client_rule='zmg_sgdm',
            server_rule='sgd',
            client_weighting=_EXAMPLES,
            description='FedZMG: zero-mean-gradient client SGDM with decoupled weight '
            'decay, server SGD (Zantalis, Zervas and Koulouras 2026).',
        ),
        AlgorithmSpec(
            name='fedzmg_adam',
            builder=fedzmg.build_fedzmg_adam,
            hparams_class=fedzmg.FedZmgAdamHparams,
            client_rule='zmg_sgdm',
            server_rule='adam',
            client_weighting=_EXAMPLES,
            description='FedZMG-Adam: FedZMG clients, FedAdam server.',
        ),
        AlgorithmSpec(
            name='fedzmg_yogi',
            builder=fedzmg.build_fedzmg_yogi,
            hparams_class=fedzmg.FedZmgYogiHparams,
            client_rule='zmg_sgdm',
            server_rule='yogi',
            client_weighting=_EXAMPLES,
            description='FedZMG-Yogi: FedZMG clients, FedYogi server.',
        ),
        AlgorithmSpec(
            name='fedyogi',
            builder=fedavg.build_fedyogi,
            hparams_class=fedavg.FedYogiHparams,
            client_rule='sgd',
            server_rule='yogi',
            client_weighting=_EXAMPLES,
            description='FedYogi: client SGD, server Yogi (Reddi et al. 2021).',
        ),
        AlgorithmSpec(
            name='fedadagrad',
            builder=fedavg.build_fedadagrad,
            hparams_class=fedavg.FedAdagradHparams,
            client_rule='sgd',
            server_rule='adagrad',
            client_weighting=_EXAMPLES,
            description='FedAdagrad: client SGD, server Adagrad (Reddi et al. 2021).',
        ),
        AlgorithmSpec(
            name='fedprox',
            builder=fedprox.build_fedprox,
            hparams_class=fedprox.FedProxHparams,
            client_rule='prox_sgd',
            server_rule='sgd',
            client_weighting=_EXAMPLES,
            description='FedProx: client SGD on the loss plus (mu/2)||w - w^t||^2, server'
            ' SGD (Li et al. 2020).',
        ),
        AlgorithmSpec(
            name='fedzmg_prox',
            builder=fedprox.build_fedzmg_prox,
            hparams_class=fedprox.FedZmgProxHparams,
            client_rule='prox_zmg_sgdm',
            server_rule='sgd',
            client_weighting=_EXAMPLES,
            description='FedZMG-Prox: FedZMG clients on the proximal gradient'
            ' g + mu (w - w^t), server SGD.',
        ),
        AlgorithmSpec(
            name='mime_lite',
            builder=mime_lite.build_mime_lite,
            hparams_class=mime_lite.MimeLiteHparams,
            client_rule='sgdm',
            server_rule='sgd',
            client_weighting=_EXAMPLES,
            description='Mime-Lite: client SGDM with the server\'s momentum frozen, server'
            ' SGD (Karimireddy et al. 2021; TFF\'s build_weighted_mime_lite).',
            full_gradient_pass=True,
        ),
        AlgorithmSpec(
            name='local_gc',
            builder=gcfed.build_local_gc,
            hparams_class=gcfed.LocalGcHparams,
            client_rule='local_gc',
            server_rule='sgd',
            client_weighting=_UNIFORM,
            description='LocalGC: gradient-centralized client SGDM on every layer, '
            'server SGD (GC-Fed paper).',
        ),
        AlgorithmSpec(
            name='global_gc',
            builder=gcfed.build_global_gc,
            hparams_class=gcfed.GlobalGcHparams,
            client_rule='sgd',
            server_rule='global_gc',
            client_weighting=_UNIFORM,
            description='GlobalGC: client SGDM with coupled weight decay, server SGD on the'
            ' centralized mean update (GC-Fed paper).',
        ),
        AlgorithmSpec(
            name='gcfed',
            builder=gcfed.build_gcfed,
            hparams_class=gcfed.GcFedHparams,
            client_rule='local_gc',
            server_rule='global_gc',
            client_weighting=_UNIFORM,
            description='GC-Fed: LocalGC on feature layers, GlobalGC on classifier '
            'layers (Seo et al. 2025).',
        ),
        _fedrkmgc_variant(
            'fedrkmgc', 'fast_km',
            'FedRKMGC: corrected client SGDM with fast KM steps, relaxed '
            'server averaging (stateful clients).',
        ),
        _fedrkmgc_variant(
            'fedrkmgc_raw', 'raw',
            'FedRKMGC ablation: raw correction, no KM, no relaxation.',
            fedrkmgc.NO_RELAXATION,
        ),
        _fedrkmgc_variant(
            'fedrkmgc_re', 'raw',
            'FedRKMGC ablation: raw correction with relaxation.',
        ),
        _fedrkmgc_variant(
            'fedrkmgc_km', 'km',
            'FedRKMGC ablation: standard KM correction, no relaxation.',
            fedrkmgc.NO_RELAXATION,
        ),
        _fedrkmgc_variant(
            'fedrkmgc_fast_km', 'fast_km',
            'FedRKMGC ablation: fast KM correction, no relaxation.',
            fedrkmgc.NO_RELAXATION,
        ),
        _fedrkmgc_variant(
            'fedrkmgc_re_km', 'km',
            'FedRKMGC ablation: standard KM correction with relaxation.',
        ),
        AlgorithmSpec(
            name='scaffold',
            builder=scaffold.build_scaffold,
            hparams_class=scaffold.ScaffoldHparams,
            client_rule='scaffold_sgd',
            server_rule='sgd',
            client_weighting=_UNIFORM,
            description='SCAFFOLD (option II): client SGD on g - c_i + c with client and'
            ' server control variates, server SGD on the uniform mean (Karimireddy et al.'
            ' 2020; stateful clients).',
            stateful=True,
            needs_num_clients=True,
        ),
        AlgorithmSpec(
            name='fedzmg_scaffold',
            builder=scaffold.build_fedzmg_scaffold,
            hparams_class=scaffold.FedZmgScaffoldHparams,
            client_rule='scaffold_zmg_sgdm',
            server_rule='sgd',
            client_weighting=_UNIFORM,
            description='FedZMG-SCAFFOLD: FedZMG clients on the SCAFFOLD-controlled'
            ' gradient P(g - c_i + c), server SGD on the uniform mean (stateful clients).',
            stateful=True,
            needs_num_clients=True,
        ),
        AlgorithmSpec(
            name='fedgps',
            builder=fedgps.build_fedgps,
            hparams_class=fedgps.FedGpsHparams,
            client_rule='fedgps',
            server_rule='sgd',
            client_weighting=_UNIFORM,
            description='FedGPS: surrogate-prototype objective, gradients at a look-ahead'
            ' along the other clients\' last update (Yang et al., NeurIPS 2025; stateful'
            ' clients).',
            stateful=True,
            needs_keras_model=True,
        ),
        AlgorithmSpec(
            name='fedgps_cf',
            builder=functools.partial(fedgps.build_fedgps, exclude_own_update=False),
            hparams_class=fedgps.FedGpsHparams,
            client_rule='fedgps',
            server_rule='sgd',
            client_weighting=_UNIFORM,
            description='FedGPS-CF: FedGPS with the look-ahead along last round\'s mean'
            ' update (no own update kept).',
            stateful=True,
            needs_keras_model=True,
        ),
    )
})
NAMES = tuple(ALGORITHMS)


def pair_name(client_rule: str, server_rule: str) -> str:
  """The algorithm name of a client rule composed with a server rule (`rules`)."""
  return f'{client_rule}+{server_rule}'


@functools.cache
def _pair(name: str) -> AlgorithmSpec:
  """The algorithm `pair_name` names: `rules.build_process` of its two rules, their
  hyperparameters `rules.pair_hparams`, the clients' updates weighted by their examples
  (TFF's default)."""
  client_rule, server_rule = name.split('+')
  hparams_class = rules.pair_hparams(client_rule, server_rule)

  def build_pair(model_fn, hparams, *, loop_implementation, model_aggregator=None):
    return rules.build_process(
        model_fn, client_rule, server_rule, client_weighting=_EXAMPLES,
        loop_implementation=loop_implementation, model_aggregator=model_aggregator,
        **hparams.as_dict())

  return AlgorithmSpec(
      name=name, builder=build_pair, hparams_class=hparams_class, client_rule=client_rule,
      server_rule=server_rule, client_weighting=_EXAMPLES,
      description=f'client rule {client_rule}, server rule {server_rule}.')


def get(name: str) -> AlgorithmSpec:
  """The `AlgorithmSpec` named `name`: a registered algorithm, or a client rule composed
  with a server rule (`pair_name`: 'zmg_sgdm+adam').

  Raises:
    ValueError: If `name` is neither; the message lists the valid names (or rules).
  """
  if isinstance(name, str) and name.count('+') == 1:
    return _pair(name)
  if not isinstance(name, str) or name not in ALGORITHMS:
    raise ValueError(
        f'Unknown algorithm {name!r}; valid names are {list(NAMES)}, or'
        f" '<client rule>+<server rule>' (rules.CLIENT_RULES, rules.SERVER_RULES)"
    )
  return ALGORITHMS[name]


def resolve(name: str, hyperparameters: Mapping[str, Any]) -> dict[str, Any]:
  """Every hyperparameter algorithm `name` trains with, given `hyperparameters`.

  Raises:
    ValueError: If `name` is unknown, a hyperparameter is not one of the algorithm's, or
      a value is out of range.
  """
  return get(name).hparams(**hyperparameters).as_dict()


def build(
    name: str,
    model_fn: compose.ModelFn,
    *,
    keras_model_fn: Optional[Callable[[], Any]] = None,
    num_clients: Optional[int] = None,
    loop_implementation: tff.learning.LoopImplementation = compose.DATASET_REDUCE,
    aggregator: Optional[aggregation.AggregatorSettings] = None,
    **hyperparameters: Any,
) -> tff.learning.templates.LearningProcess:
  """Builds algorithm `name` with its defaults overridden by `hyperparameters`.

  Args:
    name: A key of `ALGORITHMS`, or a rule pair (`pair_name`).
    model_fn: A no-arg function returning a new
      `tff.learning.models.VariableModel`.
    keras_model_fn: A no-arg function returning the same model as a bare Keras
      model (`task.keras_model_fn`); needed by algorithms with
      `needs_keras_model` (FedGPS), ignored by the others.
    num_clients: The number of training clients (`len(task.datasets.train_data
      .client_ids)`); needed by algorithms with `needs_num_clients` (SCAFFOLD),
      ignored by the others.
    loop_implementation: The client training loop.
    aggregator: How client updates are aggregated (default: the algorithm's mean);
      under DP uniformly, whatever the algorithm's weighting
      (`aggregation.client_weighting` says which, and a warning when it changes).
    **hyperparameters: Values for some fields of `get(name).hparams_class`.

  Returns:
    A `tff.learning.templates.LearningProcess`, or a
    `StatefulClientsLearningProcess` for a stateful algorithm.

  Raises:
    ValueError: If `name` is unknown, a hyperparameter is not one of the
      algorithm's, a value is out of range, `keras_model_fn` or `num_clients`
      is missing for an algorithm that needs it, or the algorithm's clients upload
      something besides their update that `aggregator` would not cover (SCAFFOLD,
      FedGPS, Mime-Lite with any aggregator but the mean).
  """
  spec = get(name)
  hparams = spec.hparams(**hyperparameters)
  options = {}
  if aggregator is not None:
    if not isinstance(aggregator, aggregation.AggregatorSettings):
      raise ValueError(
          f'aggregator must be an aggregation.AggregatorSettings, got {aggregator!r}'
      )
    model_aggregator = aggregation.model_aggregator(aggregator, spec.client_weighting)
    if model_aggregator is not None:  # None: the algorithm's own mean.
      options['model_aggregator'] = model_aggregator
  if spec.needs_keras_model:
    if keras_model_fn is None:
      raise ValueError(
          f'algorithm {name!r} needs the task\'s Keras model: pass'
          ' keras_model_fn=task.keras_model_fn'
      )
    options['keras_model_fn'] = keras_model_fn
  if spec.needs_num_clients:
    options['num_clients'] = num_clients
  return spec.builder(
      model_fn, hparams, loop_implementation=loop_implementation, **options
  )


class _StopBeforeTheModel(Exception):
  """Raised by `check_aggregator`'s model function: the builder took the aggregator."""


def _stop_before_the_model():
  raise _StopBeforeTheModel()


def check_aggregator(name: str, aggregator: aggregation.AggregatorSettings) -> None:
  """Raises the one-line `ValueError` `build(name, ..., aggregator=aggregator)` would raise
  if algorithm `name` refuses `aggregator`, in microseconds, without a model or data.

  Every builder refuses an aggregator before it first calls its model function
  (`compose.refuse_model_aggregator`), so a build whose model function stops it at once
  has got past the refusal when it stops there: a program can refuse a combination
  before it reads any data or writes anything.

  Raises:
    ValueError: If `name` is unknown, or its clients upload something `aggregator`
      would not cover (the refusal `build` raises).
  """
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')  # DP's uniform weighting: `build` says it when it builds.
    try:
      build(name, _stop_before_the_model, keras_model_fn=_stop_before_the_model,
            num_clients=1, aggregator=aggregator)
    except _StopBeforeTheModel:
      pass
