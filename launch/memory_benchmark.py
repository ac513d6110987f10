r"""Peak memory of FedRKMGC's client states as the population grows at a fixed cohort.

  python -m launch.memory_benchmark --populations=30,300 --cohort=10 --rounds=30

Each (store, population) pair is an ordinary `launch.run.experiment` run of `fedrkmgc` on
synthetic data in its own child process, so that its peak resident memory is its
own. The peak is sampled over the child and its TFF worker together. With the disk
store the peak must stay flat as the population grows (only the cohort's states are
ever in memory); with the memory store it grows with the clients that have taken
part, which shows the benchmark can see growth. One line per run, then one line per
store with the ratio of the largest population's peak to the smallest's:

  store=disk population=30 ... peak_rss_mib=2311 clients_with_state=29
  store=disk peak_rss_ratio=1.01 (population x10)

Exit status: 0 done, 1 an unexpected failure, 2 bad flags, 5 the machine refused, 130
interrupted (launch/cli/failures.py); a run that fails passes on its own status, with its
error line.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

from absl import flags

from launch.cli import exit_status
from launch.cli import failures
import tasks
from tff_zmg import client_states
from tff_zmg import run_files

_POPULATIONS = flags.DEFINE_list(
    'populations', ['30', '300'], 'Numbers of training clients to compare.'
)
_STORES = flags.DEFINE_list('stores', ['disk', 'memory'], 'Client-state stores.')
_COHORT = flags.DEFINE_integer('cohort', 10, 'Clients per round.', lower_bound=1)
_ROUNDS = flags.DEFINE_integer('rounds', 30, 'Training rounds per run.', lower_bound=1)
_TASK = flags.DEFINE_string('task', 'emnist', 'Task (its model sets the state size).')
_EXAMPLES = flags.DEFINE_integer(
    'examples_per_client', 5, 'Synthetic examples per client (few: memory is the point).',
    lower_bound=1,
)
_OUTPUT_DIR = flags.DEFINE_string(
    'output_dir', None, 'Where runs and data go (default: a temporary directory).'
)
_CHILD = flags.DEFINE_string('child', None, 'Internal: run one benchmark (JSON).')


def _child(settings: dict) -> None:
  """One run; prints one JSON line with its peak memory."""
  from launch.run import experiment  # pylint: disable=g-import-not-at-top
  from launch.run import run_config  # pylint: disable=g-import-not-at-top
  from launch.benchmarking import resources  # pylint: disable=g-import-not-at-top

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


def _check_flags() -> list[int]:
  """The populations, sorted; every flag checked before the first run."""
  if _TASK.value not in tasks.TASK_NAMES:
    raise ValueError(f'--task must be one of {list(tasks.TASK_NAMES)}, got {_TASK.value!r}')
  unknown = [s for s in _STORES.value if s not in client_states.STORES]
  if unknown or not _STORES.value:
    raise ValueError(f'--stores must name stores of {list(client_states.STORES)}, got'
                     f' {_STORES.value}')
  try:
    populations = sorted(int(p) for p in _POPULATIONS.value)
  except ValueError:
    populations = []
  if not populations or populations[0] < 1:
    raise ValueError(f'--populations must be integers >= 1, got {_POPULATIONS.value}')
  return populations


def _last_error_line(log_path: str) -> str:
  with open(log_path, errors='replace') as log:
    lines = [l.strip() for l in log.read().splitlines() if 'error:' in l]
  return lines[-1] if lines else 'no error line'


@failures.one_line_errors('memory_benchmark')
def main(argv) -> int:
  del argv
  if _CHILD.value:
    _child(json.loads(_CHILD.value))
    return 0
  populations = _check_flags()
  root = _OUTPUT_DIR.value or tempfile.mkdtemp(prefix='tff_zmg-memory-')
  os.makedirs(root, exist_ok=True)
  print(f'runs and data under {root}', flush=True)
  peaks = {}
  for store in _STORES.value:
    for population in populations:
      settings = dict(
          task=_TASK.value, store=store, population=population, cohort=_COHORT.value,
          rounds=_ROUNDS.value, examples=_EXAMPLES.value,
          root=os.path.join(root, 'runs'), cache_dir=os.path.join(root, 'data'),
      )
      log_path = os.path.join(root, f'{store}_{population}.log')
      with open(log_path, 'w') as log:
        # Output to a file: a TFF worker that outlived the child could otherwise
        # hold a pipe open.
        rc = subprocess.call(
            [sys.executable, '-m', 'launch.memory_benchmark',
             f'--child={json.dumps(settings)}'],
            stdout=log, stderr=subprocess.STDOUT,
        )
      with open(log_path) as log:
        lines = [l for l in log.read().splitlines() if l.startswith('{')]
      if rc != 0 or not lines:
        # One line on stderr (the log may be in this program's temporary folder, removed
        # as it ends): the child's own error line and its status, when documented.
        kept = f' (its log: {log_path})' if _OUTPUT_DIR.value else ''
        print(f'memory_benchmark: error: store={store} population={population} failed'
              f' (exit {rc}): {_last_error_line(log_path)}{kept}', file=sys.stderr, flush=True)
        return rc if rc in exit_status.DOCUMENTED else exit_status.UNEXPECTED
      result = json.loads(lines[-1])
      peaks[store, population] = result['peak_rss_mib']
      print(
          f'store={store} population={population} cohort={_COHORT.value}'
          f' rounds={_ROUNDS.value} peak_rss_mib={result["peak_rss_mib"]}'
          f' clients_with_state={result["clients_with_state"]}'
          f' wall_s={result["wall_s"]}',
          flush=True,
      )
    small, large = populations[0], populations[-1]
    print(
        f'store={store} peak_rss_ratio={peaks[store, large] / peaks[store, small]:.2f}'
        f' (population x{large / small:g})',
        flush=True,
    )
  return 0


if __name__ == '__main__':
  # It measures `launch.train` subprocesses and runs no TFF computation itself.
  failures.run_program('memory_benchmark', main, tff_context=False)
