"""What a run spends besides time: a DP run's privacy, and every run's bytes per client.

* `epsilon_after(settings, num_train_clients)`: `rounds -> epsilon` of a DP run (None for
  the other aggregators), `aggregation.epsilon` for the run's sampling: `m` of the `N`
  training clients drawn uniformly without replacement each round
  (`experiment._selection_fn`), i.e. fixed-size sampling. The run's `RoundReleaseManager`
  releases it after each round as `privacy/epsilon` (metrics.csv, TensorBoard); round 0,
  the untrained model's evaluation, has spent nothing.
* `client_bytes(output_dir, process)`: the bytes one client receives and sends per round
  (`aggregation.client_bytes`, seconds of TFF's compiler), computed once per run and kept
  in the run's communication.json, which `launch.compare` reads.
* `aggregator_line`, `communication_line` and `summary`: what the run says of them;
  `describe_aggregator`, a recorded aggregator in words (`launch.compare`'s tables).

docs/privacy_and_communication.md has the formulas and the choices.
"""

import contextlib
import math
import os
from typing import Callable, Optional

import tensorflow_federated as tff

from launch.run import run_config
from launch.run import run_directory
from tff_zmg import aggregation
from tff_zmg.algorithms import registry
from tff_zmg import analysis
from tff_zmg import run_files

# Each round's clients are drawn uniformly without replacement (`experiment._selection_fn`).
SAMPLING = 'fixed_size'
WEIGHTS = {tff.learning.ClientWeighting.UNIFORM: 'uniform weights',
           tff.learning.ClientWeighting.NUM_EXAMPLES: 'weights by examples'}


def epsilon_after(
    settings: aggregation.AggregatorSettings, num_train_clients: int
) -> Optional[Callable[[int], float]]:
  """`rounds -> epsilon` of `(epsilon, target_delta)`-DP after that many rounds of a run
  aggregating with `settings` (None: the aggregator is not differentially private)."""
  if not settings.is_private:
    return None

  def epsilon(rounds: int) -> float:
    return aggregation.epsilon(
        noise_multiplier=settings.noise_multiplier,
        clients_per_round=settings.clients_per_round, num_clients=num_train_clients,
        rounds=rounds, target_delta=settings.target_delta, sampling=SAMPLING,
    )

  return epsilon


def describe_aggregator(record: Optional[dict]) -> str:
  """'dp_fixed (noise_multiplier=1, clip=0.1, target_delta=1e-05)': an aggregator as a
  run records it (`AggregatorSettings.used()`; None, a run from before the setting: the
  mean), without the settings the run records apart (its clients per round, its seed)."""
  record = dict(record or aggregation.AggregatorSettings().used())
  kind = record.pop('kind')
  settings = ', '.join(f'{name}={value:g}' for name, value in record.items()
                       if name not in run_config.RUN_AGGREGATOR_SETTINGS)
  return f'{kind} ({settings})' if settings else kind


def aggregator_line(
    algo: str, settings: aggregation.AggregatorSettings, num_train_clients: int
) -> str:
  """One line: the aggregator, its settings, and how it weights the clients' updates."""
  algorithm_weighting = registry.get(algo).client_weighting
  weighting = aggregation.client_weighting(settings, algorithm_weighting)
  parts = [describe_aggregator(settings.used())]
  if settings.is_private:
    parts.append(f'{settings.clients_per_round} of {num_train_clients} clients a round,'
                 f' noise seeded by --seed, accounted for {SAMPLING} sampling')
  if weighting == algorithm_weighting:
    parts.append(f'{algo}\'s {WEIGHTS[weighting]}')
  else:  # DP counts each clipped update once (aggregation.factories).
    parts.append(f'{WEIGHTS[weighting]} in place of {algo}\'s {WEIGHTS[algorithm_weighting]}')
  return 'aggregator: ' + '; '.join(parts)


def client_bytes(output_dir: str, process) -> dict:
  """`aggregation.client_bytes(process).as_dict()`, computed once per run: a resumed run
  reads its communication.json (its settings, hence its process, are the same: the
  run's identity is checked before), a new one writes it."""
  with contextlib.suppress(OSError, ValueError):  # Unreadable: computed again.
    recorded = analysis.runs.read_communication(output_dir)
    if isinstance(recorded, dict):
      return recorded
  values = aggregation.client_bytes(process).as_dict()
  run_directory.write_json_atomically(
      os.path.join(output_dir, run_files.COMMUNICATION), values
  )
  return values


def communication_line(values: dict) -> str:
  """One line: the bytes broadcast to and uploaded by a client per round (of them, in
  tensors)."""
  return (
      f'communication per client and round: {values["broadcast_bytes_per_client"]:,} bytes'
      f' broadcast ({values["broadcast_tensor_bytes_per_client"]:,} in tensors),'
      f' {values["upload_bytes_per_client"]:,} uploaded'
      f' ({values["upload_tensor_bytes_per_client"]:,} in tensors)'
  )


def summary(
    config: run_config.ExperimentConfig, epsilon: Optional[Callable[[int], float]],
    rounds_completed: int, values: Optional[dict],
) -> dict:
  """The run summary's aggregator (as recorded), epsilon after the rounds trained (None:
  not private) and bytes per client and round (none if the run stopped before them).

  A DP aggregator that adds no noise (--noise_multiplier=0) guarantees nothing: its
  epsilon is infinite, which JSON cannot hold; the summary says null and
  `"epsilon_infinite": true`.
  """
  value = None if epsilon is None else epsilon(rounds_completed)
  infinite = value is not None and math.isinf(value)
  return {
      'aggregator': config.recorded()['aggregator'],
      'epsilon': None if infinite else value,
      **({'epsilon_infinite': True} if infinite else {}),
      **(values or {}),
  }
