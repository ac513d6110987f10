r"""Heterogeneity statistics of a task's clients: `python -m launch.data_stats --task=...`.

For a sample of clients (FedZMG paper, section 5.1; docs/specification.md section 6): volume,
label diversity, normalized label entropy, Gini coefficient of the class counts, KL
divergence to the global label distribution (all clients of the split pooled) and the
share of the dominant class, plus the dataset summary (mean and standard deviation over
the sampled clients). Any data `launch.train` can train on, with the same flags:

  python -m launch.data_stats --task=emnist --output_dir=stats
  python -m launch.data_stats --task=cifar100 --partition=dirichlet --dirichlet_alpha=0.1 \
      --num_clients=100 --output_dir=stats
  python -m launch.data_stats --task=shakespeare --data_source=synthetic --output_dir=stats

Writes <task>_clients.{csv,md} and <task>_summary.{csv,md} to --output_dir. Shakespeare's
labels are characters (see `tasks.labels`).

Exit status: as every program's (docs/operations.md, "Exit statuses").
"""

import os
import sys
import time

from absl import flags
import numpy as np

from launch.cli import failures
from launch.cli import quiet
from launch.cli import unused_flags
from launch.run import errors
from launch.run import settings as run_settings
import tasks
from tasks import labels
from tff_zmg import analysis

_OUTPUT_DIR = flags.DEFINE_string('output_dir', 'data_stats', 'Where the tables go.')
_NUM_SAMPLED = flags.DEFINE_integer(
    'num_sampled_clients', 100, 'How many clients to sample (0: all).'
)
_SAMPLE_SEED = flags.DEFINE_integer('sample_seed', 0, 'Seed of the client sample.')
_SPLIT = flags.DEFINE_enum('split', 'train', ['train', 'test'], 'Which clients to describe.')
# The flags of launch.train that say what the data is: the others are refused.
_DATA_FLAGS = (
    'task', 'data_source', 'cache_dir', 'partition', 'dirichlet_alpha', 'num_clients',
    'partition_seed',
)
for _name in _DATA_FLAGS:
  flags.declare_key_flag(_name)
_SYNTHETIC_FLAGS = ('synthetic_train_clients', 'synthetic_test_clients',
                    'synthetic_examples_per_client', 'synthetic_dirichlet_alpha',
                    'synthetic_seed')

_SUMMARY_COLUMNS = ('task', 'split', 'clients', 'sampled_clients', 'classes', 'examples',
                    'labels')


def sample_clients(client_ids, num_sampled: int, seed: int) -> list[str]:
  """A uniform sample without replacement (all when num_sampled is 0 or too large), sorted."""
  if num_sampled < 0:
    raise ValueError(f'--num_sampled_clients must be >= 0, got {num_sampled}')
  ids = sorted(client_ids)
  if num_sampled == 0 or num_sampled >= len(ids):
    return ids
  rng = np.random.default_rng(seed)
  return sorted(rng.choice(ids, size=num_sampled, replace=False).tolist())


def data_statistics(task_name: str, client_data, sampled_ids, stream=None):
  """(client rows, summary row) of the sampled clients of a ClientData."""
  stream = stream or sys.stdout
  start = time.monotonic()
  print(f'{task_name}: counting the labels of all {len(client_data.client_ids)} clients',
        file=stream, flush=True)
  global_counts, total_examples = labels.count_labels(
      task_name, client_data.create_tf_dataset_from_all_clients()
  )
  counts, examples = [], []
  step = max(1, len(sampled_ids) // 10)
  per_client = labels.client_label_counts(task_name, client_data, sampled_ids)
  for i, (c, n) in enumerate(per_client):
    counts.append(c)
    examples.append(n)
    if (i + 1) % step == 0 or i + 1 == len(sampled_ids):
      print(f'{task_name}: {i + 1}/{len(sampled_ids)} sampled clients'
            f' ({time.monotonic() - start:.0f} s)', file=stream, flush=True)
  rows = [
      {'client_id': row.pop('client_id'), 'examples': n, **row}
      for row, n in zip(analysis.client_table(sampled_ids, np.array(counts), global_counts),
                        examples)
  ]
  summary = {
      'task': task_name, 'clients': len(client_data.client_ids),
      'sampled_clients': len(sampled_ids), 'classes': int(global_counts.size),
      'examples': total_examples, 'labels': int(global_counts.sum()),
      **analysis.summary(rows, ('examples', *analysis.heterogeneity.STATISTICS)),
  }
  summary.pop('num_clients')
  return rows, summary


def _check_output_dir(path: str) -> None:
  """Fails before anything is computed unless the tables can be written to `path`."""
  try:
    os.makedirs(path, exist_ok=True)
  except FileExistsError as e:
    raise errors.RunEnvironmentError(
        f'--output_dir={path} is a file, not a directory; choose another --output_dir'
    ) from e
  except OSError as e:
    raise errors.RunEnvironmentError(
        f'--output_dir={path} cannot be created ({e.strerror}); choose another --output_dir'
    ) from e
  if not os.access(path, os.W_OK | os.X_OK):
    raise errors.RunEnvironmentError(
        f'--output_dir={path} is not writable; choose another --output_dir'
    )


@failures.one_line_errors('data_stats')
def main(argv) -> int:
  del argv
  quiet.quiet_libraries()
  task_name = flags.FLAGS.task
  if task_name is None:
    raise ValueError('--task is required')
  settings = run_settings.settings_from_flags()
  unused_flags.refuse(sorted(settings.given - {*_DATA_FLAGS, *_SYNTHETIC_FLAGS}),
                      'does not apply to data_stats, which describes the data and trains'
                      ' nothing')
  _check_output_dir(_OUTPUT_DIR.value)
  task = tasks.get(
      task_name, data_source=flags.FLAGS.data_source, cache_dir=flags.FLAGS.cache_dir,
      synthetic_settings=run_settings.synthetic_settings(settings),
      **run_settings.partition_settings(settings),
  )
  client_data = (
      task.datasets.train_data if _SPLIT.value == 'train' else task.datasets.test_data
  )
  sampled = sample_clients(client_data.client_ids, _NUM_SAMPLED.value, _SAMPLE_SEED.value)
  rows, summary = data_statistics(task_name, client_data, sampled)
  summary = {'split': _SPLIT.value, **summary}
  summary = {**{k: summary[k] for k in _SUMMARY_COLUMNS}, **summary}
  out = _OUTPUT_DIR.value
  client_columns = ['client_id', 'examples', *analysis.heterogeneity.STATISTICS]
  analysis.write_csv(os.path.join(out, f'{task_name}_clients.csv'), rows, client_columns)
  analysis.write_csv(os.path.join(out, f'{task_name}_summary.csv'), [summary])
  summary_md = (
      f'{task_name} ({_SPLIT.value} split): {summary["clients"]} clients,'
      f' {summary["sampled_clients"]} sampled, {summary["classes"]} classes,'
      f' {summary["examples"]} examples, {summary["labels"]} labels\n\n'
      + analysis.markdown_table([
          {'statistic': s, 'mean': summary[f'{s}_mean'], 'std': summary[f'{s}_std']}
          for s in ('examples', *analysis.heterogeneity.STATISTICS)
      ])
  )
  with open(os.path.join(out, f'{task_name}_clients.md'), 'w') as f:
    f.write(analysis.markdown_table(rows, client_columns))
  with open(os.path.join(out, f'{task_name}_summary.md'), 'w') as f:
    f.write(summary_md)
  print(summary_md)
  print(f'tables: {os.path.abspath(out)}/{task_name}_{{clients,summary}}.{{csv,md}}', flush=True)
  return 0


if __name__ == '__main__':
  failures.run_program('data_stats', main)
