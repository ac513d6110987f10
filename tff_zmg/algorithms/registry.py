"""The algorithms by `--algo` name: builder, rules, weighting and defaults.

`ALGORITHMS` is the table of ALGORITHMS.md section 4; a training program builds
its flags and `--help` from it and calls `build(name, model_fn, **flags)`:

    process = registry.build('fedzmg', task.model_fn, client_learning_rate=0.03)
"""

from collections.abc import Callable, Mapping
import dataclasses
import functools
import inspect
import types
from typing import Any, Optional

import tensorflow_federated as tff

from tff_zmg.algorithms import compose
from tff_zmg.algorithms import fedavg
from tff_zmg.algorithms import fedgps
from tff_zmg.algorithms import fedrkmgc
from tff_zmg.algorithms import fedzmg
from tff_zmg.algorithms import gc_fed

_EXAMPLES = tff.learning.ClientWeighting.NUM_EXAMPLES
_UNIFORM = tff.learning.ClientWeighting.UNIFORM
# `correction` and `exclude_own_update` are part of a FedRKMGC or FedGPS variant's
# identity (its registry name); `keras_model_fn` comes from the task.
_NOT_HYPERPARAMETERS = (
    'model_fn', 'keras_model_fn', 'loop_implementation', 'correction',
    'exclude_own_update',
)


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
  """One algorithm of the registry.

  Attributes:
    name: The `--algo` name.
    builder: `builder(model_fn, **hyperparameters) -> LearningProcess` (or a
      `StatefulClientsLearningProcess` when `stateful`).
    client_rule: The client rule: a key of `compose.CLIENT_RULES`, or
      'corrected_sgdm' (FedRKMGC's stateful client work) or 'fedgps'
      (FedGPS's).
    server_rule: The key of `compose.SERVER_RULES` the builder uses.
    client_weighting: How client updates are averaged.
    defaults: Every hyperparameter the builder takes, with its default (read
      from the builder's signature).
    description: One line for `--help`.
    stateful: Whether clients keep state across rounds (the process's `next`
      then also takes and returns the sampled clients' states).
    needs_keras_model: Whether the builder also takes the task's bare Keras
      model (`keras_model_fn`), as FedGPS does for its features.
  """

  name: str
  builder: Callable[..., tff.learning.templates.LearningProcess]
  client_rule: str
  server_rule: str
  client_weighting: tff.learning.ClientWeighting
  defaults: Mapping[str, Any]
  description: str
  stateful: bool = False
  needs_keras_model: bool = False


def _defaults(builder: Callable[..., Any]) -> Mapping[str, Any]:
  """The keyword hyperparameters of `builder` and their defaults, read-only."""
  return types.MappingProxyType({
      name: parameter.default
      for name, parameter in inspect.signature(builder).parameters.items()
      if name not in _NOT_HYPERPARAMETERS
  })


def _spec(
    name, builder, client_rule, server_rule, weighting, description,
    stateful=False, needs_keras_model=False,
):
  return AlgorithmSpec(
      name=name,
      builder=builder,
      client_rule=client_rule,
      server_rule=server_rule,
      client_weighting=weighting,
      defaults=_defaults(builder),
      description=description,
      stateful=stateful,
      needs_keras_model=needs_keras_model,
  )


def _fed_rkmgc_variant(name, correction, rho, description):
  builder = functools.partial(
      fedrkmgc.build_fed_rkmgc, correction=correction, rho=rho
  )
  return _spec(
      name, builder, 'corrected_sgdm', 'sgd', _UNIFORM, description,
      stateful=True,
  )


ALGORITHMS: Mapping[str, AlgorithmSpec] = types.MappingProxyType({
    spec.name: spec
    for spec in (
        _spec(
            'fedavg', fedavg.build_fedavg, 'sgd', 'sgd', _EXAMPLES,
            'FedAvg: client SGD, server SGD (McMahan et al. 2017).',
        ),
        _spec(
            'fedadam', fedavg.build_fedadam, 'sgd', 'adam', _EXAMPLES,
            'FedAdam: client SGD, server Adam (Reddi et al. 2021).',
        ),
        _spec(
            'fedzmg', fedzmg.build_fedzmg, 'zmg_sgdm', 'sgd', _EXAMPLES,
            'FedZMG: zero-mean-gradient client SGDM with decoupled weight '
            'decay, server SGD.',
        ),
        _spec(
            'fedzmg_adam', fedzmg.build_fedzmg_adam, 'zmg_sgdm', 'adam',
            _EXAMPLES,
            'FedZMG-Adam: FedZMG clients, FedAdam server.',
        ),
        _spec(
            'local_gc', gc_fed.build_local_gc, 'local_gc', 'sgd', _UNIFORM,
            'LocalGC: gradient-centralized client SGDM on every layer, '
            'server SGD (GC-Fed paper).',
        ),
        _spec(
            'global_gc', gc_fed.build_global_gc, 'sgdm', 'global_gc',
            _UNIFORM,
            'GlobalGC: client SGDM, server SGD on the centralized mean '
            'update (GC-Fed paper).',
        ),
        _spec(
            'gcfed', gc_fed.build_gcfed, 'local_gc', 'global_gc', _UNIFORM,
            'GC-Fed: LocalGC on feature layers, GlobalGC on classifier '
            'layers (Seo et al. 2025).',
        ),
        _fed_rkmgc_variant(
            'fedrkmgc', 'fast_km', 1.5,
            'FedRKMGC: corrected client SGDM with fast KM steps, relaxed '
            'server averaging (stateful clients).',
        ),
        _fed_rkmgc_variant(
            'fedrkmgc_raw', 'raw', 1.0,
            'FedRKMGC ablation: raw correction, no KM, no relaxation.',
        ),
        _fed_rkmgc_variant(
            'fedrkmgc_re', 'raw', 1.5,
            'FedRKMGC ablation: raw correction with relaxation.',
        ),
        _fed_rkmgc_variant(
            'fedrkmgc_km', 'km', 1.0,
            'FedRKMGC ablation: standard KM correction, no relaxation.',
        ),
        _fed_rkmgc_variant(
            'fedrkmgc_fast_km', 'fast_km', 1.0,
            'FedRKMGC ablation: fast KM correction, no relaxation.',
        ),
        _fed_rkmgc_variant(
            'fedrkmgc_re_km', 'km', 1.5,
            'FedRKMGC ablation: standard KM correction with relaxation.',
        ),
        _spec(
            'fedgps', fedgps.build_fedgps, 'fedgps', 'sgd', _UNIFORM,
            'FedGPS: surrogate-prototype objective, gradients at a look-ahead'
            ' along the other clients\' last update (stateful clients).',
            stateful=True, needs_keras_model=True,
        ),
        _spec(
            'fedgps_cf',
            functools.partial(fedgps.build_fedgps, exclude_own_update=False),
            'fedgps', 'sgd', _UNIFORM,
            'FedGPS-CF: FedGPS with the look-ahead along last round\'s mean'
            ' update (no own update kept).',
            stateful=True, needs_keras_model=True,
        ),
    )
})
NAMES = tuple(ALGORITHMS)


def get(name: str) -> AlgorithmSpec:
  """The `AlgorithmSpec` named `name`.

  Raises:
    ValueError: If `name` is not a registered algorithm; the message lists the
      valid names.
  """
  if not isinstance(name, str) or name not in ALGORITHMS:
    raise ValueError(
        f'Unknown algorithm {name!r}; valid names are {list(NAMES)}'
    )
  return ALGORITHMS[name]


def build(
    name: str,
    model_fn: compose.ModelFn,
    *,
    keras_model_fn: Optional[Callable[[], Any]] = None,
    loop_implementation: tff.learning.LoopImplementation = (
        tff.learning.LoopImplementation.DATASET_REDUCE
    ),
    **hyperparameters: Any,
) -> tff.learning.templates.LearningProcess:
  """Builds algorithm `name` with its defaults overridden by `hyperparameters`.

  Args:
    name: A key of `ALGORITHMS`.
    model_fn: A no-arg function returning a new
      `tff.learning.models.VariableModel`.
    keras_model_fn: A no-arg function returning the same model as a bare Keras
      model (`task.keras_model_fn`); needed by algorithms with
      `needs_keras_model` (FedGPS), ignored by the others.
    loop_implementation: The client training loop.
    **hyperparameters: Values for some of `get(name).defaults`.

  Returns:
    A `tff.learning.templates.LearningProcess`, or a
    `StatefulClientsLearningProcess` for a stateful algorithm.

  Raises:
    ValueError: If `name` is unknown, a hyperparameter is not one of the
      algorithm's, a value is out of range, or `keras_model_fn` is missing for
      an algorithm that needs it.
  """
  spec = get(name)
  unknown = sorted(set(hyperparameters) - set(spec.defaults))
  if unknown:
    raise ValueError(
        f'Unknown hyperparameters {unknown} for algorithm {name!r}; its '
        f'hyperparameters are {sorted(spec.defaults)}'
    )
  merged = {**spec.defaults, **hyperparameters}
  if spec.needs_keras_model:
    if keras_model_fn is None:
      raise ValueError(
          f'algorithm {name!r} needs the task\'s Keras model: pass'
          ' keras_model_fn=task.keras_model_fn'
      )
    merged['keras_model_fn'] = keras_model_fn
  return spec.builder(
      model_fn, loop_implementation=loop_implementation, **merged
  )
