"""A comparison of algorithms over seeds: its runs' names, the hyperparameters per algorithm,
the grid searches' picks it trains at, collecting the runs and writing the tables.

`launch.compare` trains the runs and calls `report`; `launch.reproduce` writes each of a
paper's settings' tables with the same `report` and `collect`.
"""

import json
import os
import sys
from typing import Optional

from absl import flags

from launch.run import accounting
from launch.run import run_identity
from launch.run import settings as run_settings
from launch.sweeps import runner
import tasks
from tff_zmg.algorithms import registry
from tff_zmg import analysis
from tff_zmg import run_files

THRESHOLDS = flags.DEFINE_list(
    'thresholds', None,
    "Accuracy thresholds (comma list); default: the task's (emnist 0.75,0.85; cifar100"
    ' 0.2,0.33; shakespeare 0.35,0.45).',
)

# flags.json settings that fix the data a run trains on: a grid's rates carry over to a
# comparison only on the same data.
TRAINING_DATA_SETTINGS = (
    'data_source', 'synthetic_settings', 'partition', 'dirichlet_alpha', 'num_clients',
    'partition_seed',
)
# flags.json settings that fix a run's data: runs compared in pairs must agree on them.
DATA_SETTINGS = TRAINING_DATA_SETTINGS + ('evaluation', 'eval_examples', 'num_eval_clients')
# Each algorithm's aggregator and what one client receives and sends per round, measured
# from its runs' processes (communication.json): summary.csv's columns.
COMMUNICATION_COLUMNS = (
    'aggregator', 'broadcast_bytes_per_client', 'upload_bytes_per_client',
    'broadcast_tensor_bytes_per_client', 'upload_tensor_bytes_per_client',
)


def run_name(task: str, algo: str, seed: int) -> str:
  """The run directory name, `launch.train`'s default experiment name."""
  return f'{task}_{algo}_seed{seed}'


def parse_thresholds(values) -> Optional[tuple[float, ...]]:
  """--thresholds' comma list as numbers; None when it gives none (each task's own)."""
  if not values:
    return None
  try:
    return tuple(float(t) for t in values)
  except ValueError:
    raise ValueError(f'--thresholds must be numbers, got {values}') from None


def _hparam_names() -> set:
  return set().union(*(spec.defaults for spec in registry.ALGORITHMS.values()))


def parse_algo_hparams(text, algos) -> dict[str, dict]:
  """'algo:name=value,name=value;algo:...' -> {algo: {name: typed value}}."""
  out = {}
  for part in filter(None, (p.strip() for p in (text or '').split(';'))):
    algo, sep, assignments = part.partition(':')
    algo = algo.strip()
    if not sep or algo not in algos:
      raise ValueError(
          f"--algo_hparams: {part!r} must read 'algo:name=value,...' with algo one of"
          f' --algos {list(algos)}'
      )
    for item in filter(None, (i.strip() for i in assignments.split(','))):
      name, eq, value = (x.strip() for x in item.partition('='))
      if not eq or name not in _hparam_names():
        raise ValueError(
            f'--algo_hparams: {item!r} must read name=value with name one of'
            f' {sorted(_hparam_names())}'
        )
      if name not in registry.get(algo).defaults:
        raise ValueError(
            f'--algo_hparams: {name} does not apply to {algo}; its hyperparameters are'
            f' {sorted(registry.get(algo).defaults)}'
        )
      try:  # As launch.train's command line reads it: its flag's type and range.
        out.setdefault(algo, {})[name] = run_settings.settings_of({name: value}).values[name]
      except ValueError as e:
        raise ValueError(f'--algo_hparams: {algo}: {e}') from None
  return out


def tuned_picks(path, task_names, algos, hparams, given: frozenset[str],
                allow_untuned=False) -> dict:
  """The grid searches' picks under `path` for these tasks and algorithms, by (task, algo);
  `hparams` are --algo_hparams', `given` the flags of `launch.train` the command line gave.

  Raises:
    ValueError: a task and algorithm without a pick (unless `allow_untuned`), a pick that
      is not of the algorithm's hyperparameters, or a flag or --algo_hparams entry that
      would replace a tuned value.
  """
  picks = analysis.find_tuned(path)
  wanted = [(t, a) for t in task_names for a in algos]
  missing = [f'{a} on {t}' for t, a in wanted if (t, a) not in picks]
  if missing and not allow_untuned:
    raise ValueError(
        f'--tuned_from={path} has no grid search result for {", ".join(missing)}; tune it'
        ' with launch.grid_search, or add --allow_untuned to run it at its defaults'
    )
  out = {key: picks[key] for key in wanted if key in picks}
  for (task, algo), pick in out.items():
    for name in pick.hparams:
      if name not in registry.get(algo).defaults:
        raise ValueError(f'{pick.path}: {name} is not a hyperparameter of {algo}')
      if name in hparams.get(algo, {}) or name in given:
        raise ValueError(
            f'--{name} (or --algo_hparams) would replace the value {algo} was tuned to on'
            f' {task} ({pick.path}); give one of them'
        )
  return out


def check_tuned_data(run: runner.Run, pick: analysis.TunedRates, stream=None) -> None:
  """Refuses a run on other training data than its pick's grid search used.

  Raises:
    ValueError: the pick's run recorded other training-data settings.
  """
  recorded = None if pick.run_dir is None else analysis.runs.read_flags(pick.run_dir)
  if recorded is None:
    print(f'compare: {pick.path} does not say which data its search used; the rates are'
          ' taken unchecked', file=stream or sys.stdout, flush=True)
    return
  ours = run.config.recorded()
  differ = [f'{k}={recorded.get(k)!r} there, {ours.get(k)!r} here'
            for k in TRAINING_DATA_SETTINGS if recorded.get(k) != ours.get(k)]
  if differ:
    raise ValueError(
        f'{pick.algo} was tuned on {pick.task} with other data ({pick.path}: '
        + '; '.join(differ) + '), so its rates need not carry over'
    )


def rates_source(task: str, algo: str, hparams, tuned: dict, paper_rates=None) -> str:
  """analysis.tuning's TUNED, PAPER, DEFAULTS or GIVEN for a run of `algo` with `hparams`
  (`paper_rates`: the rates a paper fixes for every method, if it does)."""
  return analysis.tuning.rates_source(
      hparams, registry.get(algo).defaults, tuned.get((task, algo)), paper_rates)


def untuned_warning(task: str, algos) -> str:
  """One line: these algorithms ran at untuned default rates, and how to tune them."""
  return (
      f'the learning rates of {", ".join(algos)} on {task} are untuned registry defaults,'
      ' which can reverse a comparison; tune them with launch.grid_search and compare with'
      ' --tuned_from=<grid directory>'
  )


def collect(root: str, task: str, algos, seeds, stream=None, tuned=None, hparams=None,
            paper_rates=None):
  """(series algo -> seed -> (rounds, accuracies), one status row per run) of a task.

  Missing and diverged runs are left out of the series, with a line on `stream`. Each row
  says where the run's learning rates came from (`rates`: tuned by a grid search in
  `tuned`, `tuned_picks`'s mapping; the paper's, `paper_rates`; untuned defaults; or
  given by hand); a run trained with
  other hyperparameters than `hparams[algo]` (those the comparison asks for) is compared as
  it is, with a line saying which differ (--collect_only).

  Raises:
    ValueError: the runs were not trained on the same data split.
  """
  stream = stream or sys.stdout
  series, rows, data = {a: {} for a in algos}, [], {}
  for algo in algos:
    for seed in seeds:
      run_dir = os.path.join(root, run_name(task, algo, seed))
      recorded = analysis.runs.read_flags(run_dir)
      row = {'task': task, 'algo': algo, 'seed': seed, 'run_dir': run_dir}
      if recorded is None:
        print(f'{task}: no run {run_dir}; left out', file=stream, flush=True)
        continue
      run_hparams = recorded.get('hparams', {})
      row['hparams'] = json.dumps(run_hparams, sort_keys=True)
      row['rates'] = rates_source(task, algo, run_hparams, tuned or {}, paper_rates)
      row['learning_rates'] = analysis.tuning.format_hparams(
          {k: v for k, v in run_hparams.items() if k.endswith('learning_rate')})
      if hparams is not None:
        asked = json.loads(json.dumps(hparams[algo]))
        differ = run_identity.differences(asked, run_hparams)
        if differ:
          row['other_hparams'] = differ
          print(f'{task}: {run_dir} was trained with other hyperparameters than asked'
                f' ({differ}); compared as it is', file=stream, flush=True)
      row['aggregator'] = accounting.describe_aggregator(recorded.get('aggregator'))
      row.update(analysis.runs.read_communication(run_dir) or {})  # None: an older run.
      data[run_dir] = {k: recorded.get(k) for k in DATA_SETTINGS}
      done = analysis.runs.completed_rounds(run_dir)
      if os.path.exists(os.path.join(run_dir, run_files.DIVERGED)):
        row['status'] = runner.DIVERGED
        print(f'{task}: {run_dir} diverged; left out', file=stream, flush=True)
      else:
        rounds, acc = analysis.accuracy_series(run_dir)
        if not acc.size:
          print(f'{task}: {run_dir} has no evaluation yet; left out', file=stream, flush=True)
          continue
        series[algo][seed] = (rounds, acc)
        total = recorded.get('total_rounds')
        row['status'] = runner.FINISHED if done >= (total or 0) else f'unfinished ({done}/{total})'
      rows.append(row)
  if len({json.dumps(d, sort_keys=True) for d in data.values()}) > 1:
    first = next(iter(data))
    differ = [
        f'{d}: ' + ', '.join(f'{k}={v[k]!r}' for k in DATA_SETTINGS if v[k] != data[first][k])
        for d, v in data.items() if v != data[first]
    ]
    raise ValueError(
        f'the {task} runs do not share one data split, so they cannot be paired; against'
        f' {first}, ' + '; '.join(differ)
    )
  return {a: s for a, s in series.items() if s}, rows


def _by_algo(status_rows, cell) -> dict[str, str]:
  """algo -> `cell(row)` of its runs ('; '-joined, sorted, if they differ)."""
  by_algo = {}
  for row in status_rows:
    by_algo.setdefault(row['algo'], set()).add(cell(row))
  return {algo: '; '.join(sorted(texts)) for algo, texts in by_algo.items()}


def _rates_by_algo(status_rows) -> dict[str, str]:
  """algo -> 'tuned: client_learning_rate=0.1, ...' of its runs."""
  return _by_algo(status_rows, lambda row: f"{row['rates']}: {row['learning_rates']}")


def communication_by_algo(status_rows) -> dict[str, dict[str, str]]:
  """algo -> its aggregator and the bytes one client receives and sends per round, as its
  runs recorded them (`COMMUNICATION_COLUMNS`; '' for a run from before the record)."""
  columns = {column: _by_algo(status_rows, lambda row, c=column: str(row.get(c, '')))
             for column in COMMUNICATION_COLUMNS}
  return {algo: {column: columns[column][algo] for column in columns}
          for algo in columns['aggregator']}


def communication_cells(values: dict[str, str]) -> dict[str, str]:
  """The Markdown cells of `communication_by_algo`'s values: the aggregator, and the
  bytes broadcast and uploaded with thousands separators ('not recorded' for runs from
  before the record or made without `launch.train`)."""
  def number(text):
    return '; '.join(f'{int(v):,}' for v in text.split('; ')) if text else 'not recorded'

  return {'aggregator': values['aggregator'],
          'bytes broadcast per client and round': number(values['broadcast_bytes_per_client']),
          'bytes uploaded per client and round': number(values['upload_bytes_per_client'])}


def _format_summary(summary, thresholds, rates, communication):
  """Summary rows for Markdown: 'mean ± std' cells, the learning rates and their source,
  the aggregator and the bytes per client and round."""
  def cell(row, column):
    mean, std = row[f'{column}_mean'], row[f'{column}_std']
    if mean is None:
      return analysis.NOT_REACHED
    return analysis.tables.format_value(mean) + (
        '' if std is None or std != std else f' ± {analysis.tables.format_value(std, 2)}'
    )

  out = []
  for row in summary:
    r = {'algo': row['algo'], 'seeds': row['seeds'],
         'final accuracy': cell(row, 'final_accuracy')}
    for t in thresholds:
      col = analysis.comparison.rounds_column(t)
      r[f'rounds to {t:g}'] = f'{cell(row, col)} ({row[f"{col}_reached"]})'
    for t in thresholds:
      col = analysis.comparison.late_stage_column(t)
      start = row[f'{col}_from_round']
      r[f'late-stage {t:g}'] = cell(row, col) + ('' if start is None else f' (from round {start})')
    r['learning rates'] = rates.get(row['algo'], '')
    r.update(communication_cells(communication[row['algo']]))
    out.append(r)
  return out


def report(root, report_dir, task_names, algos, seeds, thresholds, stream=None,
           tuned=None, hparams=None, paper_rates=None, titles=None) -> str:
  """Collects the runs, writes the tables and figures; returns the Markdown report.

  `thresholds`: the accuracy thresholds of the tables and figures; None: each task's,
  () none. `tuned`: `tuned_picks`'s mapping (or any of (task, algo) -> the grid's
  `TunedRates`), to tell tuned rates from given ones; `paper_rates`: the rates a paper
  fixes for every method. A task whose runs used untuned default rates gets a warning (on
  stderr and atop its section). `hparams`: task -> algo -> the hyperparameters asked for
  (`collect`); runs trained with others are named in the report too. `titles`: task ->
  what its section and figure are called (default: the task).
  """
  stream = stream or sys.stdout
  os.makedirs(report_dir, exist_ok=True)
  all_runs, all_summary, all_ttests, markdown = [], [], [], []
  for task in task_names:
    task_thresholds = (tasks.SPECS[task].accuracy_thresholds if thresholds is None
                       else thresholds)
    title = (titles or {}).get(task, task)
    series, status_rows = collect(root, task, algos, seeds, stream, tuned,
                                  None if hparams is None else hparams[task], paper_rates)
    markdown.append(f'## {title}\n\n')
    rates = _rates_by_algo(status_rows)
    communication = communication_by_algo(status_rows)
    untuned = [a for a in algos
               if any(r['algo'] == a and r['rates'] == analysis.tuning.DEFAULTS
                      for r in status_rows)]
    if untuned:
      print(f'compare: warning: {untuned_warning(task, untuned)}', file=sys.stderr, flush=True)
      markdown.append(f'**Untuned:** {untuned_warning(task, untuned)}.\n\n')
    markdown += [f'Note: {r["run_dir"]} was trained with other hyperparameters than asked'
                 f' ({r["other_hparams"]}).\n\n' for r in status_rows if 'other_hparams' in r]
    if not series:
      markdown.append('No runs to compare.\n\n')
      all_runs.extend(status_rows)
      continue
    tables = analysis.compare_runs(series, task_thresholds)
    by_run = {(r['algo'], r['seed']): r for r in tables['runs']}
    for row in status_rows:
      all_runs.append({**row, **by_run.get((row['algo'], row['seed']), {})})
    all_summary.extend({'task': task, **r, 'learning_rates': rates.get(r['algo'], ''),
                        **communication[r['algo']]} for r in tables['summary'])
    all_ttests.extend({'task': task, **r} for r in tables['ttests'])
    figure = os.path.join(report_dir, f'{task}_accuracy.png')
    analysis.accuracy_curves(
        {a: list(s.values()) for a, s in series.items()}, figure,
        title=f'{title}: validation accuracy, mean and std over seeds',
        thresholds=task_thresholds,
    )
    markdown += [
        analysis.markdown_table(
            _format_summary(tables['summary'], task_thresholds, rates, communication)),
        '\nPaired t-tests over seeds (a - b):\n\n',
        analysis.markdown_table(tables['ttests'], [
            'metric', 'algo_a', 'algo_b', 'mean_a', 'mean_b', 'mean_difference', 't', 'p',
            'n']) if tables['ttests'] else 'None (fewer than two algorithms with runs).\n',
        f'\n![{title}]({os.path.basename(figure)})\n\n',
        (f'Dashed lines: the accuracy thresholds {", ".join(f"{t:g}" for t in task_thresholds)}.'
         '\n\n' if task_thresholds else ''),
    ]
  analysis.write_csv(os.path.join(report_dir, 'runs.csv'), all_runs)
  analysis.write_csv(os.path.join(report_dir, 'summary.csv'), all_summary)
  analysis.write_csv(os.path.join(report_dir, 'ttests.csv'), all_ttests)
  text = ''.join(markdown)
  with open(os.path.join(report_dir, 'report.md'), 'w') as f:
    f.write(text)
  return text
