"""Learning rates a composed process keeps in its state: set there instead of built in.

TFF's `compose_learning_process` keeps the client optimizer's hyperparameters in the
client work's state and the server optimizer's in the finalizer's, and its `next` reads
them from there (`get_hparams`/`set_hparams` reach them). So a process built for one pair
of learning rates, started from a state that holds another pair, trains exactly as the
process built for that pair: the cells of a learning-rate grid can share one build.

    client_learning_rate  ->  get_hparams(state)['client_work']['learning_rate']
    server_learning_rate  ->  get_hparams(state)['finalizer']['learning_rate']

A process whose state does not hold a rate there (clients that keep state, an optimizer
that names it otherwise) is found out by `held_in_state`, from its `get_hparams` type
(nothing runs), and then needs its own build.
"""

from collections.abc import Mapping
from typing import Any

import numpy as np
from tensorflow_federated.python.common_libs import structure

PATHS = {
    'client_learning_rate': ('client_work', 'learning_rate'),
    'server_learning_rate': ('finalizer', 'learning_rate'),
}


def _leaf(hparams: Mapping[str, Any], path: tuple[str, ...]):
  for key in path:
    if not isinstance(hparams, Mapping) or key not in hparams:
      return None
    hparams = hparams[key]
  return hparams


def _type_has(struct_type, path: tuple[str, ...]) -> bool:
  for key in path:
    if not isinstance(struct_type, structure.Struct) or key not in structure.name_list(
        struct_type):
      return False
    struct_type = getattr(struct_type, key)
  return True


def held_in_state(process) -> frozenset[str]:
  """The names of `PATHS` whose value `process` keeps in its state at their paths."""
  if not (hasattr(process, 'get_hparams') and hasattr(process, 'set_hparams')):
    return frozenset()
  result = process.get_hparams.type_signature.result
  return frozenset(name for name, path in PATHS.items() if _type_has(result, path))


def set_in_state(process, state, values: Mapping[str, Any]):
  """`state` with the learning rates `values` (names of `PATHS`) set in it."""
  hparams = process.get_hparams(state)
  for name, value in values.items():
    *outer, last = PATHS[name]
    _leaf(hparams, tuple(outer))[last] = np.float32(value)
  return process.set_hparams(state, hparams)
