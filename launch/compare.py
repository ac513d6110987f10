r"""Compares algorithms over seeds: `python -m launch.compare --task=... --algos=... --seeds=...`.

Trains (or finishes, or just collects) one run per task, algorithm and seed, all on the
same data split, then writes the FedZMG paper's tables and figures (docs/specification.md
section 6) for each task: final accuracy, rounds to each accuracy threshold, late-stage
sustained accuracy, paired t-tests of each algorithm against the others, the validation
accuracy curves (mean and standard deviation band over seeds), and each algorithm's
aggregator and bytes broadcast to and uploaded by a client per round, as its runs measured
them (docs/privacy_and_communication.md):

  python -m launch.compare --task=emnist --algos=fedzmg,fedavg,fedadam --seeds=0,1,2,3,4 \
      --total_rounds=1000 --parallel=2 \
      --algo_hparams='fedzmg:client_learning_rate=0.0316;fedavg:client_learning_rate=0.1'

Runs live where `launch.train` puts them by default, `<root_output_dir>/<task>_<algo>_seed<seed>`,
so runs made by hand are picked up, finished runs are not trained again, and an
interrupted comparison resumes. Every flag of `launch.train` is passed on to every run
(e.g. `--aggregator=dp_fixed --noise_multiplier=1 --clip=0.1`: every algorithm under DP);
--algo_hparams sets hyperparameters per algorithm ('algo:name=value,name=value;algo:...').
--tuned_from=<grid or reproduce directory> runs each algorithm at the rates its grid search
picked (its best.json); a comparison at untuned default rates says so in a warning line and
in its tables. --collect_only trains nothing and reports on the runs that exist. Reports go to
--report_dir (default `<root_output_dir>/compare`): runs.csv, summary.csv, ttests.csv,
report.md and <task>_accuracy.png; each run's training output to logs/ there.

--dry_run trains none of them: it says how many runs and rounds are left to train and
about how long they take here, timed by a 3-round run of each kind of run (kept in
`<report_dir>/dry_run/calibration.json` and reused by the next dry run).

Exit status: as every program's (docs/operations.md, "Exit statuses"); a run failing
otherwise passes on its own status.
"""

import os
import sys

from absl import flags

from launch.cli import failures
from launch.cli import quiet
from launch.cli import unused_flags
from launch.run import errors
from launch.run import settings as run_settings
from launch.sweeps import calibration
from launch.sweeps import comparison
from launch.sweeps import runner
from launch.sweeps import pool as pool_lib
import tasks
from tff_zmg.algorithms import registry
from tff_zmg import analysis

_ALGOS = flags.DEFINE_list(
    'algos', None,
    'The algorithms to compare (comma list): --algo names, or a client rule with a server'
    ' rule as <client_rule>+<server_rule> (zmg_sgdm+adam; launch.train --help).')
_SEEDS = flags.DEFINE_list('seeds', ['0', '1', '2'], 'The seeds of each algorithm (comma list).')
_TASKS = flags.DEFINE_list(
    'tasks', None, 'Tasks to compare on (comma list); default: the one of --task.'
)
_ALGO_HPARAMS = flags.DEFINE_string(
    'algo_hparams', None,
    "Hyperparameters per algorithm, e.g. 'fedzmg:client_learning_rate=0.03,"
    "server_learning_rate=1;fedavg:client_learning_rate=0.1'. They override the flags of"
    ' the same name for that algorithm.',
)
_COLLECT_ONLY = flags.DEFINE_bool(
    'collect_only', False, 'Train nothing: report on the runs that exist.'
)
_TUNED_FROM = flags.DEFINE_string(
    'tuned_from', None,
    'Run each algorithm at the rates its grid search picked: a launch.grid_search'
    " directory, a launch.reproduce directory or a folder of them (their best.json files)."
    ' An algorithm without a grid result there is refused (see --allow_untuned).',
)
_ALLOW_UNTUNED = flags.DEFINE_bool(
    'allow_untuned', False,
    'With --tuned_from: run algorithms without a grid result at their registry defaults'
    ' (the tables mark them) instead of refusing.',
)
_REPORT_DIR = flags.DEFINE_string(
    'report_dir', None, 'Where the tables and figures go (default <root_output_dir>/compare).'
)
for _name in ('task', 'total_rounds', 'root_output_dir', 'parallel', 'dry_run', 'thresholds'):
  flags.declare_key_flag(_name)


def _parse_settings():
  if _ALGOS.value is None:
    raise ValueError('--algos is required')
  for name, instead in (('algo', 'algos'), ('seed', 'seeds'), ('experiment_name', None)):
    if flags.FLAGS[name].present:
      hint = f'use --{instead}' if instead else 'runs are named <task>_<algo>_seed<seed>'
      raise ValueError(f'--{name} does not apply to a comparison; {hint}')
  algos = list(dict.fromkeys(_ALGOS.value))
  for algo in algos:
    registry.get(algo)
  try:
    seeds = [int(s) for s in _SEEDS.value]
  except ValueError:
    raise ValueError(f'--seeds must be integers, got {_SEEDS.value}') from None
  if flags.FLAGS.task is not None and _TASKS.value:
    raise ValueError('give the tasks with either --task or --tasks, not both')
  task_names = list(dict.fromkeys(_TASKS.value or filter(None, [flags.FLAGS.task])))
  if not task_names:
    raise ValueError('--task (or --tasks) is required')
  for t in task_names:
    if t not in tasks.TASK_NAMES:
      raise ValueError(f'unknown task {t!r}; choose from {list(tasks.TASK_NAMES)}')
  thresholds = comparison.parse_thresholds(comparison.THRESHOLDS.value)
  hparams = comparison.parse_algo_hparams(_ALGO_HPARAMS.value, algos)
  return task_names, algos, seeds, hparams, thresholds


def _tuned(base: run_settings.Settings, task_names, algos, hparams) -> dict:
  """--tuned_from's picks by (task, algo), each said in a line ({} without the flag)."""
  if _ALLOW_UNTUNED.value and not _TUNED_FROM.value:
    raise ValueError('--allow_untuned applies only with --tuned_from')
  if not _TUNED_FROM.value:
    return {}
  tuned = comparison.tuned_picks(_TUNED_FROM.value, task_names, algos, hparams, base.given,
                                 _ALLOW_UNTUNED.value)
  for (task, algo), pick in tuned.items():
    print(f'compare: {algo} on {task} at its tuned {pick.describe()}', flush=True)
  return tuned


def _check_rates(runs, task_names, algos, tuned, asked) -> None:
  """Refuses a tuned pick made on other data; warns of algorithms at untuned defaults."""
  for t in task_names:
    for a in algos:
      if (t, a) in tuned:
        comparison.check_tuned_data(
            next(r for r in runs if r.config.task == t and r.config.algo == a), tuned[t, a])
    untuned = [a for a in algos
               if comparison.rates_source(t, a, asked[t][a], tuned) == analysis.tuning.DEFAULTS]
    if untuned:
      print(f'compare: warning: {comparison.untuned_warning(t, untuned)}', file=sys.stderr,
            flush=True)


def _train(runs, pool: pool_lib.Pool, root: str, report_dir: str) -> None:
  print(f'compare: {len(runs)} runs in {root}, {pool.parallel} at a time', flush=True)
  try:
    runner.run_all(runs, pool=pool, log_dir=os.path.join(report_dir, 'logs'))
  except errors.RunEnvironmentError:
    raise
  except errors.ExperimentError as e:
    raise ValueError(
        f'{e} (in a comparison the run names are fixed, <task>_<algo>_seed<seed>: to compare'
        ' runs made with other settings, add --collect_only; for new runs, choose another'
        ' --root_output_dir)'
    ) from e


@failures.one_line_errors('compare')
def main(argv) -> int:
  del argv
  quiet.quiet_libraries()
  task_names, algos, seeds, hparams, thresholds = _parse_settings()
  pool = runner.pool_from_flags(batches=False)
  root = flags.FLAGS.root_output_dir
  report_dir = _REPORT_DIR.value or os.path.join(root, 'compare')
  if _COLLECT_ONLY.value:
    unused_flags.refuse(
        ('dry_run', 'overwrite', 'parallel', 'ray_address'),
        'does not apply with --collect_only, which trains nothing')
  base = run_settings.settings_from_flags()
  tuned = _tuned(base, task_names, algos, hparams)
  runs = [
      runner.train_run(base, comparison.run_name(t, a, s), {
          'task': t, 'algo': a, 'seed': s, 'experiment_name': comparison.run_name(t, a, s),
          **hparams.get(a, {}), **(tuned[t, a].hparams if (t, a) in tuned else {}),
      })
      for t in task_names for a in algos for s in seeds
  ]
  asked = {}  # task -> algo -> the hyperparameters this comparison trains with
  for run in runs:
    asked.setdefault(run.config.task, {})[run.config.algo] = run.config.recorded()['hparams']
  if not _COLLECT_ONLY.value:
    _check_rates(runs, task_names, algos, tuned, asked)
    if calibration.DRY_RUN.value:
      calibration.estimate_runs(runs, os.path.join(report_dir, calibration.DRY_RUN_DIRNAME),
                                pool, sys.stdout)
      return 0
    _train(runs, pool, root, report_dir)
  text = comparison.report(root, report_dir, task_names, algos, seeds, thresholds,
                           tuned=tuned, hparams=asked)
  print(text)
  print(f'tables and figures: {report_dir}', flush=True)
  return 0


if __name__ == '__main__':
  failures.run_program('compare', main)
