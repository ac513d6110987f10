"""One run from its settings, as `launch.train` runs it: the protocol's line, the run, the
summary line. A warm slot (`launch.sweeps.warm_slot`) trains each cell by the same call."""

import json
from typing import Optional

from launch.run import builds as builds_lib
from launch.run import experiment
from launch.run import settings as run_settings


def train(settings: run_settings.Settings, between_rounds: experiment.BetweenRounds,
          builds: Optional[builds_lib.Builds] = None, cell=None) -> dict:
  """Runs (or resumes) the run `settings` describe; returns its summary (printed too).
  `between_rounds`, `builds` and `cell`: `experiment.run`'s."""
  settings, applied = run_settings.apply_protocol(settings)
  if applied:
    print(f'protocol {settings.values["protocol"]}: {json.dumps(applied)}', flush=True)
  summary = experiment.run(run_settings.experiment_config(settings), builds, cell,
                           between_rounds)
  print('summary: ' + json.dumps(summary), flush=True)
  return summary
