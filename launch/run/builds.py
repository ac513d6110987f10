"""What a warm slot keeps from one run to the next: tasks, processes and evaluators.

Each is kept by everything that made it, so a run gets back only what it would have built
itself: a task by `tasks.get`'s arguments, an evaluator by its task, evaluation settings
and device, a process by its algorithm, task and every build argument but the learning
rates its state holds (`tff_zmg.templates.state_hparams`). A run at other learning rates
than the kept process was built for starts from a state that holds its own, which trains
bit for bit as its own build would. Reusing the very same process objects also reuses
what the runtime compiled of them.

`launch.run.experiment.run(config, builds)` asks for them; without `builds` it builds
everything itself, as a run of `launch.train` does.
"""

import json
from typing import Any, Callable, Mapping, Optional

from tff_zmg.templates import state_hparams


def key_of(values: Mapping[str, Any]) -> str:
  """A key for build arguments: their JSON, with anything JSON lacks by its repr."""
  return json.dumps(values, sort_keys=True, default=repr)


class Builds:
  """Tasks, processes and evaluators, kept by what built them, for the life of a warm slot."""

  def __init__(self):
    self._kept: dict[tuple[str, str], Any] = {}
    # Processes by their key without the rates their state can hold: (rates built with,
    # the names held in state, process).
    self._processes: dict[str, list[tuple[dict, frozenset, Any]]] = {}
    self.built: dict[str, int] = {}  # What was built, by kind: for the slot's log.

  def get(self, kind: str, arguments: Mapping[str, Any], build: Callable[[], Any]):
    """The `kind` built from `arguments`, built by `build()` the first time."""
    key = (kind, key_of(arguments))
    if key not in self._kept:
      self._kept[key] = build()
      self.built[kind] = self.built.get(kind, 0) + 1
    return self._kept[key]

  def process(self, arguments: Mapping[str, Any], hparams: Mapping[str, Any],
              build: Callable[[], Any]) -> tuple[Any, dict]:
    """A process for `hparams` and the other build `arguments`, and the learning rates its
    initial state must be given (empty when it was built with them).

    Args:
      arguments: Every build argument but the hyperparameters (task, algorithm, ...).
      hparams: The run's hyperparameters.
      build: Builds the process for exactly these `hparams` and `arguments`.
    """
    rates = {n: hparams[n] for n in state_hparams.PATHS if n in hparams}
    others = {n: v for n, v in hparams.items() if n not in rates}
    key = key_of({'arguments': arguments, 'hparams': others})
    for built_with, held, process in self._processes.get(key, []):
      differ = {n: v for n, v in rates.items() if built_with.get(n) != v}
      if set(differ) <= held:
        return process, differ
    process = build()
    held = state_hparams.held_in_state(process)
    self._processes.setdefault(key, []).append((rates, held, process))
    self.built['process'] = self.built.get('process', 0) + 1
    return process, {}


def starting_state(process, rates: Mapping[str, Any]) -> Optional[Any]:
  """The initial state of `process` holding `rates` (None: its own initial state)."""
  if not rates:
    return None
  return state_hparams.set_in_state(process, process.initialize(), rates)
