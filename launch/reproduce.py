r"""One command per paper table: `python -m launch.reproduce --paper=fedzmg [--table=N] [--scale=...]`.

Runs a paper's protocol (launch/papers.py) end to end and writes a report beside the
published numbers (tff_zmg/analysis/published.py):

1. the learning-rate grid search where the paper tuned (FedZMG: 9 x 9 client x server
   rates, 50 rounds, cohort 10, each algorithm on each task; `launch.grid_search`);
2. the comparison: every algorithm on every setting of the chosen tables over the
   paper's seeds, all seeds on one data split, at the best rates of step 1
   (`launch.compare`);
3. the paper's metrics and statistics (`tff_zmg.analysis`), the accuracy curves and the
   grid heatmaps, and `report.md`: each table in the paper's layout with cells
   "ours (paper)", and a generated summary of where the two agree.

    python -m launch.reproduce --paper=fedzmg --scale=small --parallel=2
    python -m launch.reproduce --paper=gcfed --table=5 --cache_dir=~/tensorflow_datasets
    python -m launch.reproduce --paper=fedzmg --table=5,6 --scale=ci --data_source=synthetic
    python -m launch.reproduce --paper=fedzmg --dry_run      # the runs, their count, a time

--scale: `full` (the paper's protocol), `small`, `ci`, or a number in (0, 1] that scales
the rounds only (see `papers.SCALES`). Every run is an ordinary `launch.train` run in
`<reproduce_dir>/grid/<setting>/<algo>/<cell>` or `<reproduce_dir>/runs/<setting>/`, so
re-running the same command reuses finished runs and resumes unfinished ones. Other
flags of `launch.train` (--cache_dir, --executor, --data_source, ...) pass on to every run;
the ones the protocol sets cannot be given. With --data_source=synthetic the tfds tasks
(CIFAR-10, the tfds CIFAR-100) are stood in for by synthetic data in TFF's CIFAR-100
format, split by the same Dirichlet protocol.

Exit status (launch/failures.py): 0 done, 1 an unexpected failure (a bug), 2 bad flags,
settings or data, 4 a TFF worker lost, 5 the machine refused (disk full, permissions),
130 interrupted (Ctrl-C, SIGTERM, SIGHUP; re-run the same command to resume); a run failing
otherwise passes on its own status. Every failure is one line `reproduce: error: ...` on
stderr; --verbose adds the traceback.
"""

import dataclasses
import io
import json
import math
import os
import statistics
import sys
import time
from typing import Optional

from absl import flags
import numpy as np
import scipy.stats

import tasks
from launch import compare
from launch import experiment
from launch import failures
from launch import grid_search
from launch import papers
from launch import protocols
from launch import runner
from launch import train
from tasks import sources
from tasks import tfds_source
from tff_zmg import analysis

_PAPER = flags.DEFINE_string(
    'paper', None, f'The paper to reproduce: one of {list(papers.PAPER_NAMES)}.'
)
_TABLE = flags.DEFINE_list(
    'table', [], "The paper's table number(s) to reproduce (comma list); default: all we"
    ' reproduce of it (fedzmg 3-8, gcfed 4-5, fedrkmgc 1, fedgps 1).',
)
_SCALE = flags.DEFINE_string(
    'scale', 'full',
    'How much of the protocol to run: '
    + '; '.join(f'{s.name}: {s.description}' for s in papers.SCALES.values())
    + '; or a number in (0, 1]: that fraction of the rounds, all else full.',
)
_DRY_RUN = flags.DEFINE_bool(
    'dry_run', False, 'List every run, their count and an estimated time; train nothing.'
)
_REPRODUCE_DIR = flags.DEFINE_string(
    'reproduce_dir', None,
    'Where the runs, figures and report.md go (default'
    ' <root_output_dir>/reproduce_<paper>_<scale>).',
)
for _name in ('root_output_dir', 'parallel', 'data_source', 'thresholds'):
  flags.declare_key_flag(_name)

# Flags the protocol sets per run; a command line giving them would break the protocol.
_SET_BY_PROTOCOL = (
    'task', 'algo', 'seed', 'experiment_name', 'total_rounds', 'client_learning_rate',
    'server_learning_rate', 'protocol', 'clients_per_round', 'partition', 'num_clients',
    'dirichlet_alpha', 'partition_seed', 'model', 'client_epochs_per_round',
)
REPORT_FILENAME = 'report.md'
RESULTS_FILENAME = 'report.json'


@dataclasses.dataclass(frozen=True)
class Plan:
  """What one command runs: a paper, its chosen tables and settings, at a scale."""

  paper: papers.Paper
  scale: papers.Scale
  tables: tuple[papers.TableSpec, ...]
  settings: tuple[papers.Setting, ...]
  data_source: str
  directory: str

  @property
  def seeds(self) -> tuple[int, ...]:
    return self.scale.seeds(self.paper.seeds)

  @property
  def total_rounds(self) -> int:
    return self.scale.rounds(self.paper.total_rounds)

  def grid_axes(self):
    """(client rates, server rates, rounds, cohort) of the scaled grid; None if none."""
    grid = self.paper.grid
    if grid is None:
      return None
    shape = self.scale.grid_shape or (None, None)
    client, server = self.scale.grid_rates or (
        papers.thin(grid.client_learning_rates, shape[0]),
        papers.thin(grid.server_learning_rates, shape[1]),
    )
    return (
        client, server,
        self.scale.rounds(grid.total_rounds, grid=True),
        self.scale.cap(grid.clients_per_round, self.scale.max_clients_per_round),
    )

  def task(self, setting: papers.Setting) -> str:
    return setting.task_for(self.data_source)

  def overrides(self, setting: papers.Setting) -> dict:
    """The `launch.train` flags of every run of a setting (task, split, cohort, scale)."""
    protocol = self.paper.flags.get('protocol')
    # The protocol's data and participation flags, explicit so that the scale can cap
    # them (its hyperparameters are left to launch.train, which skips the ones an
    # algorithm does not take).
    base = {} if protocol is None else {
        k: v for k, v in protocols.get(protocol).flag_values().items()
        if k not in protocols.get(protocol).hparams and not flags.FLAGS[k].present
    }
    values = {**base, **self.paper.flags, **setting.flags, 'task': self.task(setting)}
    if 'clients_per_round' in values:
      values['clients_per_round'] = self.scale.cap(
          values['clients_per_round'], self.scale.max_clients_per_round)
    if 'num_clients' in values:
      values['num_clients'] = self.scale.cap(values['num_clients'], self.scale.max_num_clients)
    for name, value in self.scale.flags.items():
      if not flags.FLAGS[name].present:
        values[name] = value
    if values.get('model') not in (None, *tasks.MODELS[values['task']]):
      # A synthetic stand-in task trains its own model (it has no other).
      del values['model']
    return values


def make_plan() -> Plan:
  """The plan the flags describe; ValueError for bad or conflicting flags."""
  if _PAPER.value is None:
    raise ValueError(f'--paper is required: one of {list(papers.PAPER_NAMES)}')
  paper = papers.get(_PAPER.value)
  scale = papers.get_scale(_SCALE.value)
  specs = papers.tables(paper, _TABLE.value)
  given = [n for n in _SET_BY_PROTOCOL if flags.FLAGS[n].present]
  if given:
    raise ValueError(
        f'--{given[0]} is set by the {paper.name} protocol (launch/papers.py); leave it out'
    )
  settings = {}
  for spec in specs:
    for setting in spec.settings:
      settings.setdefault(setting.key, setting)
  directory = _REPRODUCE_DIR.value or os.path.join(
      flags.FLAGS.root_output_dir, f'reproduce_{paper.name}_{scale.name}')
  return Plan(
      paper=paper, scale=scale, tables=tuple(specs), settings=tuple(settings.values()),
      data_source=flags.FLAGS.data_source, directory=directory,
  )


def _rename(run: runner.Run, name: str) -> runner.Run:
  return dataclasses.replace(run, name=name)


def grid_groups(plan: Plan) -> dict[tuple[str, str], tuple[str, dict]]:
  """(setting key, algo) -> (grid directory, its cells as `grid_search.grid_runs` gives)."""
  axes = plan.grid_axes()
  if axes is None:
    return {}
  client_lrs, server_lrs, rounds, cohort = axes
  groups = {}
  for setting in plan.settings:
    for algo in plan.paper.algos:
      grid_dir = os.path.join(plan.directory, 'grid', setting.key, algo)
      cells = grid_search.grid_runs(grid_dir, client_lrs, server_lrs, rounds, {
          **plan.overrides(setting), 'algo': algo, 'clients_per_round': cohort,
      })
      groups[(setting.key, algo)] = (grid_dir, {
          lrs: _rename(run, f'grid-{setting.key}-{algo}-{run.name}')
          for lrs, run in cells.items()
      })
  return groups


def comparison_runs(plan: Plan, best: Optional[dict] = None) -> list[runner.Run]:
  """Every algorithm on every setting over the seeds; `best[(key, algo)]` its rates."""
  runs = []
  for setting in plan.settings:
    task = plan.task(setting)
    for algo in plan.paper.algos:
      rates = {}
      if best is not None and (setting.key, algo) in best:
        rates = {k: best[(setting.key, algo)][k]
                 for k in ('client_learning_rate', 'server_learning_rate')}
      for seed in plan.seeds:
        name = compare.run_name(task, algo, seed)
        runs.append(_rename(runner.train_run(name, {
            **plan.overrides(setting), 'algo': algo, 'seed': seed, **rates,
            'total_rounds': plan.total_rounds, 'experiment_name': name,
            'root_output_dir': os.path.join(plan.directory, 'runs', setting.key),
        }), f'{setting.key}-{name}'))
  return runs


# --- time estimate ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RoundTime:
  """Timings read from one run's metrics.csv (TFF's training and evaluation times)."""

  source: str
  train_s_per_client: float  # A later round's training time / its clients per round.
  eval_s: float  # A later round's evaluation time.
  startup_s: float  # The first round and first evaluation beyond a later round's.


def read_round_time(run_dir: str) -> Optional[RoundTime]:
  """The median later-round times of a finished run (None without two trained rounds)."""
  recorded = analysis.runs.read_flags(run_dir)
  csv_path = os.path.join(run_dir, analysis.runs.METRICS_FILENAME)
  train = experiment.read_metric(csv_path, 'training_time_in_seconds')
  evaluation = experiment.read_metric(csv_path, 'evaluation/evaluation_time_in_seconds')
  later = sorted(r for r in train if r >= 2)
  if not recorded or not later:
    return None
  steady_train = statistics.median(train[r] for r in later)
  steady_eval = statistics.median([evaluation[r] for r in later if r in evaluation] or [0.0])
  first = train.get(1, steady_train) + evaluation.get(0, steady_eval)
  return RoundTime(
      source=run_dir,
      train_s_per_client=steady_train / max(1, recorded.get('clients_per_round') or 1),
      eval_s=steady_eval,
      startup_s=max(0.0, first - steady_train - steady_eval),
  )


def find_round_time(roots, prefer=()) -> Optional[RoundTime]:
  """The timings of the newest finished run under the first root that has one.

  Runs whose recorded (task, model) is in `prefer` come first: a ResNet's round says
  little about a CNN's.
  """
  for root in roots:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
      dirnames[:] = [d for d in dirnames if d not in ('checkpoints', 'tensorboard',
                                                      'client_states', 'logs')]
      if analysis.runs.METRICS_FILENAME in filenames and 'flags.json' in filenames:
        recorded = analysis.runs.read_flags(dirpath) or {}
        found.append((
            (recorded.get('task'), recorded.get('model')) in prefer,
            os.path.getmtime(os.path.join(dirpath, 'metrics.csv')), dirpath,
        ))
    for _, _, run_dir in sorted(found, reverse=True):
      timing = read_round_time(run_dir)
      if timing is not None:
        return timing
  return None


def measure_round_time(plan: Plan, stream) -> RoundTime:
  """Trains 2 rounds of the paper's first algorithm at the ci scale on synthetic data.

  Synthetic, so that a dry run never needs the real data.
  """
  small = dataclasses.replace(plan, data_source='synthetic', scale=papers.SCALES['ci'])
  name = 'measure_round_time'
  run = runner.train_run(name, {
      **small.overrides(small.settings[0]), 'data_source': 'synthetic',
      'algo': plan.paper.algos[0], 'total_rounds': 2, 'experiment_name': name,
      'root_output_dir': os.path.join(plan.directory, 'dry_run'),
  })
  print('dry run: no earlier run to time; training 2 rounds of a small synthetic build to'
        ' measure a round ...', file=stream, flush=True)
  runner.run_all([run], parallel=1, log_dir=os.path.join(plan.directory, 'dry_run'),
                 stream=stream)
  timing = read_round_time(run.config.output_dir)
  if timing is None:
    raise ValueError(f'the timing run {run.config.output_dir} recorded no round times')
  return timing


def estimate_seconds(runs, timing: RoundTime, parallel: int) -> float:
  """sum over runs of (startup + rounds x (cohort x train per client + evaluation)) / parallel.

  Runs are assumed to go `parallel` at a time at the measured speed; a rough guide only:
  the real data's clients are larger than a small build's, and a process's TensorFlow
  import and first tracing beyond its first round are not counted.
  """
  total = sum(
      timing.startup_s + r.config.total_rounds * (
          r.config.clients_per_round * timing.train_s_per_client + timing.eval_s)
      for r in runs
  )
  return total / max(1, parallel)


def _duration(seconds: float) -> str:
  hours, rest = divmod(int(round(seconds)), 3600)
  return f'{hours} h {rest // 60:02d} min' if hours else f'{rest // 60} min {rest % 60:02d} s'


def dry_run(plan: Plan, stream=None) -> dict:
  """Prints every run (grid cells, then comparison runs), the count and a time estimate."""
  stream = stream or sys.stdout
  groups = grid_groups(plan)
  cells = [run for _, group in groups.values() for run in group.values()]
  comparison = comparison_runs(plan)
  print(f'{plan.paper.name} at scale {plan.scale.name} ({plan.scale.description}), tables'
        f' {[t.number for t in plan.tables]}, data {plan.data_source}:', file=stream)
  if cells:
    print(f'grid search: {len(cells)} runs', file=stream)
    for run in cells:
      c = run.config
      print(f'  {run.name}: {c.task} {c.algo} clr={c.hparams["client_learning_rate"]:.3g}'
            f' slr={c.hparams["server_learning_rate"]:.3g} rounds={c.total_rounds}'
            f' cohort={c.clients_per_round}', file=stream)
  print(f'comparison: {len(comparison)} runs'
        + (' (learning rates from the grid search)' if cells else ''), file=stream)
  for run in comparison:
    c = run.config
    print(f'  {run.name}: {c.task} {c.algo} seed={c.seed} rounds={c.total_rounds}'
          f' cohort={c.clients_per_round}', file=stream)
  timing = find_round_time(
      (plan.directory, flags.FLAGS.root_output_dir),
      prefer={(r.config.task, r.config.model) for r in comparison})
  how = 'read from the earlier run'
  if timing is None:
    timing = measure_round_time(plan, stream)
    how = 'measured now on'
  runs = cells + comparison
  seconds = estimate_seconds(runs, timing, runner.PARALLEL.value)
  print(f'total: {len(runs)} runs ({len(cells)} grid, {len(comparison)} comparison),'
        f' {sum(r.config.total_rounds for r in runs)} rounds', file=stream)
  print(f'estimated time: {_duration(seconds)} at {runner.PARALLEL.value} at a time, from'
        f' round times {how} {timing.source} ({timing.train_s_per_client:.3g} s per client'
        f' per round, {timing.eval_s:.3g} s per evaluation, {timing.startup_s:.3g} s'
        ' start-up per run)', file=stream, flush=True)
  timed = analysis.runs.read_flags(timing.source) or {}
  if timed.get('data_source') != plan.data_source or timed.get('task') not in {
      plan.task(s) for s in plan.settings}:
    print(f'note: the timed run trained {timed.get("task")} on {timed.get("data_source")}'
          f' data, not this plan\'s {sorted({plan.task(s) for s in plan.settings})} on'
          f' {plan.data_source}: other models and real clients (larger than small synthetic'
          ' ones) take other times', file=stream, flush=True)
  return dict(grid=len(cells), comparison=len(comparison), total=len(runs),
              seconds=seconds, timing=dataclasses.asdict(timing))


# --- the report -------------------------------------------------------------------------


def run_accuracy(rounds, acc, how: tuple[str, int]) -> float:
  """A run's accuracy as the paper scores it: mean of the last n rounds, or the best."""
  kind, n = how
  if kind == 'best':
    return float(np.max(acc))
  return analysis.mean_of_last_rounds(acc, rounds, n)


def _percent(value, std=None) -> str:
  if value is None:
    return analysis.NOT_REACHED
  if isinstance(value, float) and math.isnan(value):
    return 'nan'
  text = f'{100 * value:.2f}'
  return text if std is None or math.isnan(std) else f'{text} ± {100 * std:.2f}'


def _paper(value, percent=False) -> str:
  if value is None:
    return '—'
  return f'{value:.2f}' if percent else analysis.tables.format_value(float(value))


def _published_p(t: Optional[float], n: int) -> Optional[float]:
  """The two-sided p of a published paired t with n pairs (Student's t, n - 1 df)."""
  return None if t is None else float(2 * scipy.stats.t.sf(abs(t), n - 1))


def _ttest_row(ttests, a: str, b: str) -> Optional[dict]:
  for row in ttests:
    if row['metric'] == 'final_accuracy' and {row['algo_a'], row['algo_b']} == {a, b}:
      sign = 1 if row['algo_a'] == a else -1
      return {**row, 't': sign * row['t'], 'algo_a': a, 'algo_b': b}
  return None


def _best(values: dict, pick=max) -> list:
  """The keys whose value is the best (`pick` of the defined values): several on a tie."""
  defined = {k: v for k, v in values.items() if v is not None and not math.isnan(v)}
  if not defined:
    return []
  top = pick(defined.values())
  return [k for k, v in defined.items() if v == top]


def _agreement(what: str, ours: list, paper: list) -> str:
  """'what: ours A, the paper B (agree)'; ties are joined with ' = '."""
  verdict = 'agree' if set(ours) == set(paper) else 'differ'
  return f'{what}: ours {" = ".join(ours)}, the paper {" = ".join(paper)} ({verdict})'


def _summary_layout(plan, spec, table, setting_tables, thresholds_of):
  """FedZMG Tables 3-5: rounds to each threshold and the late-stage accuracy, per algorithm."""
  setting = spec.settings[0]
  tables_, (t1, t2) = setting_tables[setting.key], thresholds_of(setting)
  by_algo = {r['algo']: r for r in tables_['summary']} if tables_ else {}
  header = ['Algorithm', f'Rounds to {t1:g}', f'Rounds to {t2:g}', f'Avg Acc Post-{t2:g} (%)']
  rows, results, lines = [], {}, []
  for algo in plan.paper.algos:
    r = by_algo.get(algo, {})
    ours = {
        'rounds_to_t1': r.get(f'{analysis.comparison.rounds_column(t1)}_mean'),
        'rounds_to_t2': r.get(f'{analysis.comparison.rounds_column(t2)}_mean'),
        'late_stage_t2': r.get(f'{analysis.comparison.late_stage_column(t2)}_mean'),
    }
    results[algo] = {k: {'ours': v, 'paper': table.value(algo, k)} for k, v in ours.items()}
    paper = {k: _paper(table.value(algo, k), k == 'late_stage_t2') for k in ours}
    if not r:
      rows.append([algo] + [f'no runs ({paper[k]})' for k in ours])
      continue
    reached = [r[f'{analysis.comparison.rounds_column(t)}_reached'] for t in (t1, t2)]
    rows.append([algo] + [
        f'{analysis.tables.format_value(ours[k])} [{reached[i]}] ({paper[k]})'
        for i, k in enumerate(('rounds_to_t1', 'rounds_to_t2'))
    ] + [f'{_percent(ours["late_stage_t2"])} ({paper["late_stage_t2"]})'])
  for key, what, best in (('rounds_to_t2', 'fastest to the second threshold', min),
                          ('late_stage_t2', 'highest after the second threshold', max)):
    ours = _best({a: results[a][key]['ours'] for a in results}, best)
    paper = _best({a: results[a][key]['paper'] for a in results}, best)
    if not ours:
      lines.append(f'{what}: the paper has {" = ".join(paper)}; ours is undefined (not'
                   ' reached by every run at this scale)')
      continue
    lines.append(_agreement(what, ours, paper))
  return header, rows, results, lines


def _ttest_layout(plan, spec, table, setting_tables, thresholds_of):
  """FedZMG Tables 6-8: paired t-tests of the final accuracy, fedzmg against each baseline.

  The paper's p-values are not in our copy: beside ours stands the p its t gives with
  the paper's seeds as pairs.
  """
  del thresholds_of  # The final accuracy has none.
  tables_ = setting_tables[spec.settings[0].key]
  header = ['Comparison', 't-Statistic', 'p-Value', 'n']
  rows, results, lines = [], {}, []
  n_paper = len(plan.paper.seeds)
  for pair in table.rows:
    a, b = (x.strip() for x in pair.split(' vs '))
    r = _ttest_row(tables_['ttests'], a, b) if tables_ else None
    t_paper = table.value(pair, 't')
    p_from_t = _published_p(t_paper, n_paper)
    ours_t, ours_p, n = (r['t'], r['p'], r['n']) if r else (None, None, 0)
    results[pair] = {'t': {'ours': ours_t, 'paper': t_paper},
                     'p': {'ours': ours_p, 'paper': table.value(pair, 'p'),
                           'paper_from_t': p_from_t}, 'n': n}
    rows.append([
        pair, f'{_paper(ours_t)} ({_paper(t_paper)})',
        f'{_paper(ours_p)} (— ; ≈{p_from_t:.3g} from t, {n_paper} pairs)', str(n)])
    if r is None or ours_t is None or math.isnan(ours_t):
      lines.append(f'{pair}: no t-test of ours (fewer than two paired seeds, or no spread)')
      continue
    lines.append(
        f'{pair}: t = {ours_t:.3g} (paper {t_paper:g}): the sign'
        f' {"agrees" if (ours_t > 0) == (t_paper > 0) else "differs"}; significant at 0.05:'
        f' ours {"yes" if ours_p < 0.05 else "no"} (p = {ours_p:.3g}, n = {n}), the paper'
        f' {"yes" if p_from_t < 0.05 else "no"} (p ≈ {p_from_t:.3g} from its t)')
  return header, rows, results, lines


def _accuracy_layout(plan, spec, table, setting_tables, thresholds_of):
  """A row per algorithm, a column per setting: the paper's accuracy, mean ± std over seeds."""
  del thresholds_of  # Accuracy tables have none.
  header = ['Algorithm'] + [table.columns[s.key] for s in spec.settings]
  rows, results, lines = [], {}, []
  for algo in plan.paper.algos:
    row, results[algo] = [algo], {}
    for setting in spec.settings:
      tables_ = setting_tables[setting.key]
      accs = tables_['accuracy'].get(algo, []) if tables_ else []
      mean = float(np.mean(accs)) if accs else None
      std = float(np.std(accs, ddof=1)) if len(accs) > 1 else math.nan
      paper = table.value(algo, setting.key)
      results[algo][setting.key] = {'ours': mean, 'paper': paper, 'seeds': len(accs)}
      row.append(f'{"no runs" if mean is None else _percent(mean, std)}'
                 f' ({_paper(paper, True)})')
    rows.append(row)
  agree = 0
  for setting in spec.settings:
    ours = _best({a: results[a][setting.key]['ours'] for a in results})
    paper = _best({a: results[a][setting.key]['paper'] for a in results})
    if ours and paper:
      agree += set(ours) == set(paper)
      lines.append(_agreement(f'{table.columns[setting.key]}, best', ours, paper))
  lines.append(f'the best algorithm agrees in {agree} of {len(spec.settings)} columns')
  return header, rows, results, lines


_LAYOUTS = {'summary': _summary_layout, 'ttest': _ttest_layout, 'accuracy': _accuracy_layout}


def table_summary(plan, spec, setting_tables, thresholds_of):
  """(Markdown table, results dict, summary sentences) of one published table."""
  table = papers.published_table(plan.paper, spec)
  header, rows, results, lines = _LAYOUTS[spec.layout](
      plan, spec, table, setting_tables, thresholds_of)
  markdown = analysis.markdown_table([dict(zip(header, row)) for row in rows], header)
  return markdown, results, lines


def _relative(plan: Plan, path: str) -> str:
  return os.path.relpath(path, plan.directory)


def write_report(plan: Plan, best: dict, heatmaps: dict, stream=None) -> str:
  """Collects every setting's runs, writes report.md and report.json; returns the path."""
  stream = stream or sys.stdout
  threshold_flag = [float(t) for t in flags.FLAGS.thresholds or []]

  def thresholds_of(setting):
    return tuple(threshold_flag) if threshold_flag else tasks.SPECS[
        plan.task(setting)].accuracy_thresholds

  setting_tables, figures = {}, {}
  for setting in plan.settings:
    task = plan.task(setting)
    root = os.path.join(plan.directory, 'runs', setting.key)
    report_dir = os.path.join(plan.directory, 'compare', setting.key)
    compare.report(root, report_dir, [task], plan.paper.algos, plan.seeds,
                   thresholds_of(setting), stream=stream)
    series, _ = compare.collect(root, task, plan.paper.algos, plan.seeds, io.StringIO())
    figures[setting.key] = os.path.join(report_dir, f'{task}_accuracy.png')
    if not series:
      setting_tables[setting.key] = None
      continue
    tables_ = analysis.compare_runs(series, thresholds_of(setting))
    tables_['accuracy'] = {
        algo: [run_accuracy(r, a, plan.paper.accuracy) for _, (r, a) in sorted(s.items())]
        for algo, s in series.items()
    }
    setting_tables[setting.key] = tables_

  grid = plan.grid_axes()
  scale = plan.scale
  md = [
      f'# Reproducing {plan.paper.title}\n\n',
      f'Scale **{scale.name}**: {scale.description}. Data: **{plan.data_source}**'
      + ''.join(sorted({f' ({s.task} stood in for by synthetic {plan.task(s)} data, with'
                        f' its own model)' for s in plan.settings if plan.task(s) != s.task}))
      + '.'
      f' Comparison: {len(plan.paper.algos)} algorithms x {len(plan.seeds)} seeds'
      f' {list(plan.seeds)} x {len(plan.settings)} setting(s), {plan.total_rounds} rounds'
      f' (the paper: {len(plan.paper.seeds)} seeds, {plan.paper.total_rounds} rounds).',
  ]
  if grid:
    md.append(
        f' Grid search first: {len(grid[0])} client x {len(grid[1])} server learning'
        f' rates, {grid[2]} rounds, cohort {grid[3]} (the paper:'
        f' {len(plan.paper.grid.client_learning_rates)} x'
        f' {len(plan.paper.grid.server_learning_rates)}, {plan.paper.grid.total_rounds}'
        ' rounds).')
  md.append('\n\nEach cell reads **ours (paper)**. Ours are means over our seeds.\n\n')
  results, summary = {}, []
  for spec in plan.tables:
    table = papers.published_table(plan.paper, spec)
    markdown, cells, lines = table_summary(plan, spec, setting_tables, thresholds_of)
    results[str(spec.number)] = cells
    md += [f'## Table {spec.number}: {table.caption}\n\n',
           f'Source: {table.source}.\n\n', markdown, '\n']
    if spec.layout == 'summary':
      md.append('Rounds are the mean over seeds ("not reached" unless every seed reached'
                ' the threshold for good; [k/n] seeds reached it).\n\n')
    for note in table.notes:
      md.append(f'- {note}\n')
    md.append('\n')
    summary += [f'Table {spec.number}: {line}.' for line in lines]
  md.append('## Figures\n\n')
  for setting in plan.settings:
    if os.path.exists(figures[setting.key]):
      md.append(f'![{setting.key} accuracy]({_relative(plan, figures[setting.key])})\n\n')
  for (key, algo), path in heatmaps.items():
    rates = best.get((key, algo))
    chosen = ('every cell diverged' if rates is None else
              f'best client {rates["client_learning_rate"]:.3g}, server'
              f' {rates["server_learning_rate"]:.3g}')
    md.append(f'![{key} {algo} grid]({_relative(plan, path)}) ({key}, {algo}: {chosen})\n\n')
  md.append('## Summary\n\n')
  md += [f'- {line}\n' for line in summary]
  caveat = (
      f'These numbers come from the **{scale.name}** scale'
      + (' on **synthetic** data, which only exercises the pipeline: they say nothing about'
         ' the papers\' claims.' if plan.data_source == 'synthetic' else
         ('.' if scale.name == 'full' else
          ', fewer rounds, seeds or grid points than the paper: orderings can change with'
          ' the full protocol.'))
  )
  md.append(f'\n{caveat}\n\n## Protocol choices\n\n')
  md += [f'- {note}\n' for note in plan.paper.notes]
  path = os.path.join(plan.directory, REPORT_FILENAME)
  with open(path, 'w') as f:
    f.write(''.join(md))
  with open(os.path.join(plan.directory, RESULTS_FILENAME), 'w') as f:
    json.dump(dict(paper=plan.paper.name, scale=scale.name, data_source=plan.data_source,
                   tables=results,
                   best_learning_rates={f'{k}/{a}': v for (k, a), v in best.items()}),
              f, indent=2)
  return path


def check_data(plan: Plan) -> None:
  """Raises tasks.MissingDataError (with how to get it) before any run starts."""
  if plan.data_source != 'tff':
    return
  for task in dict.fromkeys(plan.task(s) for s in plan.settings):
    if task in tasks.CENTRALIZED_TASK_NAMES:
      tfds_source.ensure_database(task, flags.FLAGS.cache_dir)
    else:
      sources.load_client_data(task, 'tff', flags.FLAGS.cache_dir)


def reproduce(plan: Plan, stream=None) -> str:
  """Grid search (if the paper tuned), comparison, report; returns report.md's path."""
  stream = stream or sys.stdout
  os.makedirs(plan.directory, exist_ok=True)
  log_dir = os.path.join(plan.directory, 'logs')
  start = time.monotonic()
  groups = grid_groups(plan)
  best, heatmaps = {}, {}
  if groups:
    cells = [run for _, group in groups.values() for run in group.values()]
    client_lrs, server_lrs, _, _ = plan.grid_axes()
    score_rounds = plan.paper.grid.score_rounds
    print(f'reproduce {plan.paper.name}: grid search, {len(cells)} runs'
          f' ({len(groups)} grids of {len(client_lrs)} x {len(server_lrs)})', file=stream,
          flush=True)
    states = runner.run_all(
        cells, parallel=runner.PARALLEL.value, log_dir=log_dir, stream=stream,
        describe=lambda run, s: f'score={grid_search.cell_score(run, s, score_rounds):.4f}',
    )
    for (key, algo), (grid_dir, group) in groups.items():
      best[(key, algo)], heatmaps[(key, algo)] = grid_search.write_results(
          grid_dir, group, states, client_lrs, server_lrs, score_rounds)
      if best[(key, algo)] is None:
        raise ValueError(f'every grid cell of {algo} on {key} diverged ({grid_dir}); no'
                         ' learning rates to compare with')
      print(f'reproduce: {key} {algo}: best client learning rate'
            f' {best[(key, algo)]["client_learning_rate"]:.3g}, server'
            f' {best[(key, algo)]["server_learning_rate"]:.3g}', file=stream, flush=True)
  runs = comparison_runs(plan, best if groups else None)
  print(f'reproduce {plan.paper.name}: comparison, {len(runs)} runs', file=stream, flush=True)
  runner.run_all(runs, parallel=runner.PARALLEL.value, log_dir=log_dir, stream=stream)
  path = write_report(plan, best, heatmaps, stream=stream)
  print(f'reproduce {plan.paper.name}: report {path} ({time.monotonic() - start:.0f} s)',
        file=stream, flush=True)
  return path


@failures.one_line_errors('reproduce')
def main(argv) -> int:
  del argv
  train.quiet_libraries()
  plan = make_plan()
  if _DRY_RUN.value:
    dry_run(plan)
    return 0
  check_data(plan)
  path = reproduce(plan)
  with open(path) as f:
    print(f.read())
  return 0


if __name__ == '__main__':
  failures.run_program('reproduce', main)
