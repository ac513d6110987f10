r"""Peak memory of FedRKMGC's client states as the population grows at a fixed cohort.

  python -m launch.memory_benchmark --populations=30,300 --cohort=10 --rounds=30

Each (store, population) pair is an ordinary `launch.run.experiment` run of `fedrkmgc` on
synthetic data in its own child process, so that its peak resident memory is its
own. The peak is sampled over the child and the processes it starts (a TFF worker, if its
runtime uses one) together. With the disk
store the peak must stay flat as the population grows (only the cohort's states are
ever in memory); with the memory store it grows with the clients that have taken
part, which shows the benchmark can see growth. One line per run, then one line per
store with the ratio of the largest population's peak to the smallest's:

  store=disk population=30 ... peak_rss_mib=2311 clients_with_state=29
  store=disk peak_rss_ratio=1.01 (population x10)

Exit status: as every program's (docs/operations.md, "Exit statuses"); a run that fails
passes on its own status, with its error line.
"""

import json
import os
import sys
import tempfile

from absl import flags

from launch.benchmarking import memory
from launch.cli import exit_status
from launch.cli import failures
import tasks
from tff_zmg import client_states

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


def _failed(store, population, rc, log_path) -> int:
  """One line on stderr (the log may be in this program's temporary folder, removed as it
  ends): the child's own error line; returns its status where documented."""
  kept = f' (its log: {log_path})' if _OUTPUT_DIR.value else ''
  print(f'memory_benchmark: error: store={store} population={population} failed'
        f' (exit {rc}): {memory.last_error_line(log_path)}{kept}', file=sys.stderr, flush=True)
  return rc if rc in exit_status.DOCUMENTED else exit_status.UNEXPECTED


@failures.one_line_errors('memory_benchmark')
def main(argv) -> int:
  del argv
  if _CHILD.value:
    memory.measure_run(json.loads(_CHILD.value))
    return 0
  populations = _check_flags()
  root = _OUTPUT_DIR.value or tempfile.mkdtemp(prefix='tff_zmg-memory-')
  os.makedirs(root, exist_ok=True)
  print(f'runs and data under {root}', flush=True)
  for store in _STORES.value:
    peaks = {}
    for population in populations:
      settings = memory.run_settings(
          task=_TASK.value, store=store, population=population, cohort=_COHORT.value,
          rounds=_ROUNDS.value, examples=_EXAMPLES.value, root=root,
      )
      log_path = os.path.join(root, f'{store}_{population}.log')
      rc, result = memory.run_in_child('launch.memory_benchmark', settings, log_path)
      if rc != 0 or result is None:
        return _failed(store, population, rc, log_path)
      peaks[population] = result['peak_rss_mib']
      print(memory.run_line(settings, result), flush=True)
    print(memory.ratio_line(store, peaks), flush=True)
  return 0


if __name__ == '__main__':
  # It measures its own --child subprocesses and runs no TFF computation itself.
  failures.run_program('memory_benchmark', main, tff_context=False)
