"""What `launch.memory_benchmark` measures: one FedRKMGC run per (store, population), each in
a child process of its own so that its peak resident memory is its own, and the lines that
report the peaks and how they grow with the population."""

import json
import os
import subprocess
import sys
import time
from typing import Optional

from launch.benchmarking import resources
from tff_zmg import client_states
from tff_zmg import run_files


def run_settings(*, task, store, population, cohort, rounds, examples, root) -> dict:
  """The settings of one run, as its child process takes them (JSON-able)."""
  return dict(
      task=task, store=store, population=population, cohort=cohort, rounds=rounds,
      examples=examples, root=os.path.join(root, 'runs'), cache_dir=os.path.join(root, 'data'),
  )


def measure_run(settings: dict) -> None:
  """One run of `settings` in this process; prints one JSON line with its peak memory."""
  from launch.run import experiment  # pylint: disable=g-import-not-at-top
  from launch.run import run_config  # pylint: disable=g-import-not-at-top

  sampler = resources.PeakMemorySampler()
  config = run_config.ExperimentConfig(
      task=settings['task'],
      algo='fedrkmgc',
      root_output_dir=settings['root'],
      experiment_name=f'{settings["store"]}_{settings["population"]}',
      data_source='synthetic',
      cache_dir=settings['cache_dir'],
      synthetic_settings=dict(
          num_train_clients=settings['population'],
          num_test_clients=2,
          mean_examples_per_client=settings['examples'],
      ),
      total_rounds=settings['rounds'],
      clients_per_round=settings['cohort'],
      rounds_per_eval=settings['rounds'],
      rounds_per_checkpoint=settings['rounds'],
      client_state_store=settings['store'],
      overwrite=True,
  )
  start = time.monotonic()
  summary = experiment.run(config)
  peak = sampler.stop()
  store = client_states.create_store(
      settings['store'],
      os.path.join(summary['output_dir'], run_files.CLIENT_STATES),
  )
  store.restore(settings['rounds'])
  print(
      json.dumps(
          dict(
              peak_rss_mib=round(peak / 2**20),
              clients_with_state=len(store.client_ids()),
              wall_s=round(time.monotonic() - start, 1),
          )
      ),
      flush=True,
  )


def run_in_child(program: str, settings: dict, log_path: str) -> tuple[int, Optional[dict]]:
  """Runs `python -m <program> --child=<settings>`, its output to `log_path`.

  Returns its exit status and the figures of its `measure_run` line (None: it printed none).
  """
  with open(log_path, 'w') as log:
    # Output to a file: a TFF worker that outlived the child could otherwise hold a pipe
    # open.
    rc = subprocess.call(
        [sys.executable, '-m', program, f'--child={json.dumps(settings)}'],
        stdout=log, stderr=subprocess.STDOUT,
    )
  with open(log_path) as log:
    lines = [l for l in log.read().splitlines() if l.startswith('{')]
  return rc, (json.loads(lines[-1]) if lines else None)


def last_error_line(log_path: str) -> str:
  with open(log_path, errors='replace') as log:
    lines = [l.strip() for l in log.read().splitlines() if 'error:' in l]
  return lines[-1] if lines else 'no error line'


def run_line(settings: dict, result: dict) -> str:
  return (
      f'store={settings["store"]} population={settings["population"]}'
      f' cohort={settings["cohort"]} rounds={settings["rounds"]}'
      f' peak_rss_mib={result["peak_rss_mib"]}'
      f' clients_with_state={result["clients_with_state"]}'
      f' wall_s={result["wall_s"]}'
  )


def ratio_line(store: str, peaks: dict) -> str:
  """The largest population's peak over the smallest's; `peaks`: {population: MiB}."""
  small, large = min(peaks), max(peaks)
  return (
      f'store={store} peak_rss_ratio={peaks[large] / peaks[small]:.2f}'
      f' (population x{large / small:g})'
  )
