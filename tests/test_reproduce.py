"""`launch.reproduce`: a paper's protocol end to end at the ci scale, resumption, dry run."""

import csv
import dataclasses
import io
import json
import math
import os
import re

from absl import flags
import numpy as np
import pytest
import scipy.stats

from launch import papers
from launch import reproduce
from launch.reproduce import scales
from launch.sweeps import calibration
from launch.sweeps import comparison
from launch.run import run_config
from launch.run import settings as settings_lib
from launch.sweeps import lr_grid
from launch.sweeps import runner
from conftest import SMALL_SYNTHETIC
from small_runs import write_run as _write_run
from tasks import client_work
from tasks import sources

_ALGOS = ('fedzmg', 'fedavg', 'fedadam')
_LONG = os.environ.get('TFF_ZMG_LONG_TESTS') == '1'
_TINY = [
    '--data_source=synthetic', '--synthetic_train_clients=4', '--synthetic_test_clients=2',
    '--synthetic_examples_per_client=10', '--client_batch_size=5',
    '--rounds_per_checkpoint=1000',
]


def _parse(*args):
  flags.FLAGS.unparse_flags()
  flags.FLAGS(['reproduce', *args])


def _pool():
  """The pool of the parsed flags, as `launch.reproduce`'s main makes it."""
  return runner.pool_from_flags(batches=True)


def _reproduce(args):
  """Runs the protocol the flags describe in-process; (plan, report path, progress output)."""
  _parse(*args)
  try:
    plan = reproduce.plan_from_flags()
    out = io.StringIO()
    path = reproduce.reproduce(plan, _pool(), stream=out)
  finally:
    flags.FLAGS.unparse_flags()
  return plan, path, out.getvalue()


def _accuracy(run_dir):
  """(rounds, accuracies) straight from metrics.csv, without the package's readers."""
  with open(os.path.join(run_dir, 'metrics.csv'), newline='') as f:
    rows = [r for r in csv.DictReader(f) if int(r['key']) > 0]
  column = 'evaluation/sparse_categorical_accuracy'
  return (np.array([int(r['key']) for r in rows]),
          np.array([float(r[column]) for r in rows]))


def _rounds_to(rounds, acc, threshold):
  """specification.md section 6 by hand: the 4-round average stays >= threshold from here."""
  average = np.convolve(acc, np.ones(4) / 4, mode='valid')
  if average.size == 0 or average[-1] < threshold:
    return None
  first = max([i + 1 for i, a in enumerate(average) if a < threshold], default=0)
  return int(rounds[first + 3])


def _metrics_mtimes(directory):
  return {
      dirpath: os.stat(os.path.join(dirpath, 'metrics.csv')).st_mtime_ns
      for dirpath, _, filenames in os.walk(directory) if 'metrics.csv' in filenames
  }


def _check_report(plan, path, thresholds, seeds):
  """Tables 5 and 6 of report.md/report.json against the runs' metrics CSVs by hand."""
  directory = plan.directory
  results = json.load(open(os.path.join(directory, 'report.json')))['tables']
  series = {}
  for a in _ALGOS:
    for s in seeds:
      run_dir = os.path.join(directory, 'runs', 'emnist', comparison.run_name('emnist', a, s))
      if not os.path.exists(os.path.join(run_dir, 'diverged.txt')):
        series[(a, s)] = _accuracy(run_dir)
  reached = {k: [_rounds_to(r, acc, t) for t in thresholds] for k, (r, acc) in series.items()}
  second = [v[1] for v in reached.values()]
  start = None if None in second else max(second)
  text = open(path).read()
  table5 = papers.get_published('fedzmg', 5)
  for algo in _ALGOS:
    ours = results['5'][algo]
    for i, key in enumerate(('rounds_to_t1', 'rounds_to_t2')):
      values = [reached[(algo, s)][i] for s in seeds]
      expected = None if None in values else np.mean(values)
      assert ours[key]['ours'] == (None if expected is None else pytest.approx(expected))
      assert ours[key]['paper'] == table5.value(algo, key)
    late = None if start is None else np.mean(
        [np.mean(series[(algo, s)][1][series[(algo, s)][0] >= start]) for s in seeds])
    assert ours['late_stage_t2']['ours'] == (None if late is None else pytest.approx(late))
    # The Markdown row: each cell 'ours (paper)', the paper's numbers from Table 5.
    row = next(line for line in text.splitlines() if line.startswith(f'| {algo} |'))
    cells = [c.strip() for c in row.strip('|').split('|')][1:]
    paper = [table5.value(algo, k) for k in ('rounds_to_t1', 'rounds_to_t2', 'late_stage_t2')]
    assert cells[0].endswith(f'({paper[0]:g})') and cells[1].endswith(f'({paper[1]:g})')
    assert cells[2].endswith(f'({paper[2]:.2f})')
    assert cells[2].startswith('not reached' if late is None else f'{100 * late:.2f}')
    for i, key in enumerate(('rounds_to_t1', 'rounds_to_t2')):
      value = ours[key]['ours']
      assert cells[i].startswith('not reached' if value is None else f'{value:.4g}')

  # Table 6: the paired t-test of the final accuracies against scipy, beside the paper's t.
  final = {k: np.mean(acc[r > r[-1] - math.ceil(0.1 * r[-1])]) for k, (r, acc) in series.items()}
  for pair in ('fedzmg vs fedavg', 'fedzmg vs fedadam'):
    a, b = pair.split(' vs ')
    paired = [s for s in seeds if (a, s) in final and (b, s) in final]
    expected = scipy.stats.ttest_rel([final[(a, s)] for s in paired],
                                     [final[(b, s)] for s in paired])
    ours = results['6'][pair]
    t_paper = papers.get_published('fedzmg', 6).value(pair, 't')
    assert ours['t']['paper'] == t_paper and ours['n'] == len(paired)
    assert ours['p']['paper_from_t'] == pytest.approx(2 * scipy.stats.t.sf(t_paper, 4))
    assert ours['t']['ours'] == pytest.approx(expected.statistic, nan_ok=True)
    assert ours['p']['ours'] == pytest.approx(expected.pvalue, nan_ok=True)
    row = next(line for line in text.splitlines() if line.startswith(f'| {pair} |'))
    assert f'{ours["t"]["ours"]:.4g} ({t_paper:g})' in row

  for needle in ('## Table 5', '## Table 6', 'Source: FedZMG, Table 5', f'Scale **{plan.scale.name}**',
                 'synthetic', '## Summary', '](compare/emnist/emnist_accuracy.png)'):
    assert needle in text, needle
  for figure in re.findall(r'\]\(([^)]+\.png)\)', text):
    assert os.path.exists(os.path.join(directory, figure)), figure
  assert len(re.findall(r'grid_heatmap\.png', text)) == 3


# --- the protocol on runs designed to reach the thresholds, one trained for real ---------

_THRESHOLDS = (0.4, 0.6)
_REAL_CELL = ('fedavg', 10.0 ** -3, 10.0 ** -3)  # Left out, so reproduce trains it.
# Each grid's designed optimum (client, server): FedAvg's and FedAdam's are their registry
# defaults, which the report must still call tuned; FedZMG's is not.
_OPTIMUM = {'fedzmg': (10.0 ** -1.5, 10.0 ** -0.5), 'fedavg': (0.1, 1.0), 'fedadam': (0.1, 0.01)}


def _designed_args(root, cache_dir):
  # A scale of 0.012: 12 comparison rounds, 1-round grid cells, the 9 x 9 grid, 5 seeds.
  return ['--paper=fedzmg', '--table=5,6', '--scale=0.012', f'--cache_dir={cache_dir}',
          f'--root_output_dir={root}', '--parallel=1', '--thresholds=0.4,0.6', *_TINY]


@pytest.fixture(scope='module')
def designed(tmp_path_factory, synthetic_cache_dir):
  """FedZMG's EMNIST tables over designed finished runs and one real grid cell.

  Every grid cell but one, the stability re-run of each pick and every comparison run
  are written beforehand as `launch.train` leaves a finished run, with accuracy curves that reach the thresholds
  (a real 12-round run on synthetic data reaches none); the left-out cell is trained by
  `launch.reproduce` itself, and its score enters the grid search.

  Returns:
    (root, plan, report path, progress output, designed best rates).
  """
  root = str(tmp_path_factory.mktemp('designed'))
  _parse(*_designed_args(root, synthetic_cache_dir))
  try:
    plan = reproduce.plan_from_flags()
    rng = np.random.default_rng(0)
    best = {}
    rounds = plan.search().final_rounds
    for (key, algo), grid in reproduce.grid_groups(plan).items():
      for c, s in grid.cells:
        if (algo, c, s) == _REAL_CELL:
          continue
        # A smooth optimum away from the corners, 0.9 at its peak (a real 1-round cell
        # on synthetic data scores far below), and one corner diverged in round 1 (so,
        # as launch.train leaves it, with no round recorded).
        c_top, s_top = _OPTIMUM[algo]
        score = (0.9 - 0.05 * math.log10(c / c_top) ** 2
                 - 0.05 * math.log10(s / s_top) ** 2)
        corner = (c, s) == (10.0, 10.0)
        _write_run(grid.run((c, s), rounds), [] if corner else [score], diverged=corner)
        if (c, s) == _OPTIMUM[algo]:
          best[(key, algo)] = dict(client_learning_rate=c, server_learning_rate=s)
          # Its stability re-run with seed 1, finished: stable.
          _write_run(grid.run((c, s), rounds, seed=1), [score])
    speed = {'fedzmg': 2.0, 'fedavg': 4.0, 'fedadam': 3.0}
    for run in reproduce.comparison_runs(plan, best):
      rounds = np.arange(1, plan.total_rounds + 1)
      curve = 0.9 * (1 - np.exp(-rounds / speed[run.config.algo]))
      _write_run(run, np.round(curve + rng.normal(0, 0.01, rounds.size), 4))
    out = io.StringIO()
    path = reproduce.reproduce(plan, _pool(), stream=out)
  finally:
    flags.FLAGS.unparse_flags()
  return root, plan, path, out.getvalue(), best


def test_grid_best_rates_feed_the_comparison_and_the_report(designed):
  _, plan, path, out, best = designed
  real_algo, real_c, real_s = _REAL_CELL
  real_name = f'grid-emnist-{real_algo}-{lr_grid.cell_name(real_c, real_s)}'
  assert re.findall(r'\] (\S+): started', out) == [real_name]  # Only the missing run.
  assert 'grid search, 243 runs (3 grids of 9 x 9)' in out and 'comparison, 15 runs' in out
  for algo in _ALGOS:
    grid_dir = os.path.join(plan.directory, 'grid', 'emnist', algo)
    rows = list(csv.DictReader(open(os.path.join(grid_dir, 'grid.csv'))))
    assert len(rows) == 81
    scores = {}
    for row in rows:
      cell = row['output_dir']
      if os.path.exists(os.path.join(cell, 'diverged.txt')):
        assert row['status'] == 'diverged' and row['score'] == 'nan'
      else:  # 1-round cells: the score is that round's accuracy.
        rates = (float(row['client_learning_rate']), float(row['server_learning_rate']))
        scores[rates] = _accuracy(cell)[1][-1]
        assert float(row['score']) == pytest.approx(scores[rates])
    chosen = json.load(open(os.path.join(grid_dir, 'best.json')))
    top = max(scores, key=scores.get)
    assert (chosen['client_learning_rate'], chosen['server_learning_rate']) == top
    assert best[('emnist', algo)] == dict(client_learning_rate=top[0], server_learning_rate=top[1])
  # The real cell: trained once, for 1 round, at its rates, on the protocol's cohort.
  real_dir = os.path.join(plan.directory, 'grid', 'emnist', real_algo,
                          lr_grid.cell_name(real_c, real_s))
  recorded = json.load(open(os.path.join(real_dir, 'flags.json')))
  assert (recorded['total_rounds'], recorded['clients_per_round']) == (1, 10)
  assert recorded['hparams'] == dict(client_learning_rate=real_c, server_learning_rate=real_s,
                                     client_momentum=0.0, weight_decay=0.0)
  assert list(_accuracy(real_dir)[0]) == [1]
  _check_report(plan, path, _THRESHOLDS, tuple(range(5)))
  text = open(path).read()
  # 1-round cells: the report says the rates were not tuned honestly, and why.
  assert ('**Not a result: the learning rates were not tuned honestly at this scale**'
          " (cells scored after 1 of the paper's 50 rounds)") in text
  assert json.load(open(os.path.join(plan.directory, 'report.json')))['tuned_honestly'] is False
  compared = open(os.path.join(plan.directory, 'compare', 'emnist', 'report.md')).read()
  assert '**Untuned:**' not in compared
  for algo in _ALGOS:
    rows = [line for line in text.splitlines() if line.startswith(f'| emnist | {algo} |')]
    communication, tuning = sorted(rows, key=lambda line: 'not recorded' not in line)
    c, s = _OPTIMUM[algo]
    assert f'| {c:.3g} | {s:.3g} | 0.9000 | 1-1 | 81 x 1 | stable with seed 1 |' in tuning, tuning
    # These runs are written by the test, without launch.train's communication.json.
    assert communication == f'| emnist | {algo} | mean | not recorded | not recorded |'
    # A grid's pick is tuned, equal to the registry defaults (fedavg's, fedadam's) or not.
    row = next(line for line in compared.splitlines() if line.startswith(f'| {algo} |'))
    assert f'| tuned: client_learning_rate={c:g}, server_learning_rate={s:g} |' in row, row
  assert 'exhaustive: 81 x 1 (cells x rounds)' in text
  for algo in _ALGOS:  # Designed so that every run reaches both thresholds.
    row = next(line for line in text.splitlines() if line.startswith(f'| {algo} |'))
    assert 'not reached' not in row and '[5/5]' in row, row


def test_a_second_run_trains_nothing_and_reuses_every_run(designed, synthetic_cache_dir):
  root, plan, path, _, _ = designed
  mtimes = _metrics_mtimes(plan.directory)
  # The designed diverged corners have a metrics.csv too; 3 stability re-runs.
  assert len(mtimes) == 243 + 3 + 15
  before = json.load(open(os.path.join(plan.directory, 'report.json')))
  _, path_again, out = _reproduce(_designed_args(root, synthetic_cache_dir))
  assert path_again == path and ': started' not in out
  assert len(re.findall(r': already finished', out)) == 243 - 3 + 3 + 15
  assert len(re.findall(r': already diverged', out)) == 3
  assert _metrics_mtimes(plan.directory) == mtimes
  assert json.load(open(os.path.join(plan.directory, 'report.json'))) == before


@pytest.mark.skipif(not _LONG, reason='every table trained for real at the ci scale, ~15'
                    ' to ~100 runs a paper, CPU minutes to an hour: set TFF_ZMG_LONG_TESTS=1')
@pytest.mark.parametrize('paper, tables', [
    ('fedzmg', '5,6'), ('fedzmg', '3,4,7,8'), ('gcfed', '4,5'), ('fedrkmgc', '1'),
    ('fedgps', '1'),
])
def test_ci_scale_trains_each_table_and_then_reuses_it(
    tmp_path, synthetic_cache_dir, paper, tables):
  """Each paper's tables at the ci scale for real (FedZMG's: 2 x 1 grid cells per task and
  algorithm, their picks' stability re-runs, 2 seeds; the others': every setting, algorithm
  and seed), then a re-run that trains nothing; each run says its paper's client optimizer
  in its protocol line, and FedZMG's report says its rates were not tuned honestly."""
  args = [f'--paper={paper}', f'--table={tables}', '--scale=ci', '--data_source=synthetic',
          f'--cache_dir={synthetic_cache_dir}', f'--root_output_dir={tmp_path}',
          '--parallel=2']
  if paper == 'fedzmg':
    args.append('--thresholds=0.0,0.05')
  plan, path, out = _reproduce(args)
  runs = reproduce.planned_runs(plan)
  assert len(re.findall(r': started', out)) == len(runs)
  text = open(path).read()
  assert 'no runs' not in text
  for planned in runs:
    run = planned.run
    recorded = json.load(open(os.path.join(run.config.output_dir, 'flags.json')))['hparams']
    lr, momentum, decay = _PAPER_SGD[paper][run.config.algo]
    assert recorded['client_momentum'] == momentum, run.name
    assert recorded.get('lambda3' if run.config.algo == 'fedgps' else 'weight_decay',
                        0.0) == decay, run.name
    if lr is not None:
      assert recorded['client_learning_rate'] == lr, run.name
      log = open(os.path.join(plan.directory, 'logs', f'{run.name}.log')).read()
      line = next(l for l in log.splitlines() if l.startswith(f'protocol {paper}: '))
      assert json.loads(line.removeprefix(f'protocol {paper}: '))['client_momentum'] == momentum
  if tables == '5,6':
    for algo in _ALGOS:
      chosen = json.load(open(os.path.join(plan.directory, 'grid', 'emnist', algo, 'best.json')))
      for seed in (0, 1):
        run_dir = os.path.join(plan.directory, 'runs', 'emnist',
                               comparison.run_name('emnist', algo, seed))
        recorded = json.load(open(os.path.join(run_dir, 'flags.json')))
        assert recorded['hparams']['client_learning_rate'] == chosen['client_learning_rate']
    _check_report(plan, path, (0.0, 0.05), (0, 1))
  if paper == 'fedzmg':
    assert 'not tuned honestly at this scale** (a 2 x 1 grid' in text
  mtimes = _metrics_mtimes(plan.directory)
  _, _, out = _reproduce(args)
  assert ': started' not in out and len(re.findall(r': already', out)) == len(runs)
  assert _metrics_mtimes(plan.directory) == mtimes


def _dry_run(root, *args, timing=None, paper='fedzmg'):
  """The dry run of the flags; with `timing` ({runs at a time: Timing}), every kind of its
  runs is timed at it beforehand (so nothing trains)."""
  _parse(f'--paper={paper}', '--dry_run', f'--root_output_dir={root}', *args)
  try:
    plan = reproduce.plan_from_flags()
    if timing is not None:
      directory = os.path.join(plan.directory, 'dry_run')
      os.makedirs(directory, exist_ok=True)
      kinds = {calibration.kind_of(p.run.config) for p in reproduce.planned_runs(plan)}
      with open(os.path.join(directory, calibration.CALIBRATION_FILENAME), 'w') as f:
        json.dump({calibration.timing_key(k, parallel): dataclasses.asdict(t)
                   for k in kinds for parallel, t in timing.items()}, f)
    out = io.StringIO()
    counts = reproduce.dry_run(plan, _pool(), stream=out)
  finally:
    flags.FLAGS.unparse_flags()
  return counts, out.getvalue()


def test_dry_run_lists_the_full_protocol_and_estimates_time(designed):
  """The full FedZMG protocol: 9 x 9 cells x 3 algorithms x 3 tasks, a stability re-run
  per grid, then 3 x 5 x 3 runs, at timings kept from an earlier dry run."""
  root, plan = designed[:2]
  timing = calibration.Timing(startup_s=10.0, round_s=2.0, evaluation_s=0.5, source='kept',
                              build_s=20.0, first_s=3.0, worker_s=7.0)
  for table, grids, comparisons in (([], 3 * 3, 3 * 5 * 3), (['--table=5'], 3, 15)):
    counts, out = _dry_run(root, *table, timing={1: timing})
    grid = 81 * grids
    assert (counts['grid'], counts['stability'], counts['comparison']) == (
        grid, grids, comparisons)
    assert f'total: {grid + grids + comparisons} runs' in out
    assert out.count('\n  grid-') == grid and out.count(' seed=') == comparisons + grids
    assert 'timing 3 rounds' not in out  # Nothing trained.
  assert '  grid-emnist-fedadam-clr10_slr10: emnist fedadam clr=10 slr=10 rounds=50 cohort=10\n' in out
  assert '  emnist-emnist_fedzmg_seed4: emnist fedzmg seed=4 rounds=1000 cohort=10\n' in out
  # 50-round cells and stability re-runs, evaluated at round 0 and in the 10 rounds their
  # score reads; 1000-round comparison runs, evaluated at round 0 and after every round.
  # One warm slot starts once, trains a first run of each kind (a task's FedZMG, and its
  # FedAvg and FedAdam, whose client rule is plain SGD; 3 grids a task), and builds once a
  # grid's cells, each stability re-run (another seed) and each comparison run (an
  # algorithm and seed).
  run_s = lambda rounds, evaluations: 10.0 + rounds * 2.0 + evaluations * 0.5
  kinds = 2 * grids // 3
  expected = ((grid + grids) * run_s(50, 11) + comparisons * run_s(1000, 1001)
              + 20.0 * (grids + grids + comparisons) + 3.0 * kinds + 7.0)
  assert counts['seconds'] == pytest.approx(expected)
  assert counts['tables'] == {5: pytest.approx(expected)}
  assert 'table 5: ' in out and 'estimated time: ' in out


def test_runs_at_a_time_are_timed_at_a_time(designed):
  """--parallel=2 shares the cores: its estimate uses timings of two runs at once, not a
  timing of one run alone halved."""
  alone = calibration.Timing(startup_s=10.0, round_s=2.0, evaluation_s=0.5, source='alone')
  shared = calibration.Timing(startup_s=12.0, round_s=3.0, evaluation_s=0.7, source='shared')
  counts, out = _dry_run(designed[0], '--table=5', timing={1: alone, 2: shared})
  counts_2, out_2 = _dry_run(designed[0], '--table=5', '--parallel=2',
                             timing={1: alone, 2: shared})
  run_s = lambda t, rounds, evaluations: (t.startup_s + rounds * t.round_s
                                          + evaluations * t.evaluation_s)
  # Three grids (FedZMG, FedAvg, FedAdam) of 81 cells and a stability re-run, evaluated at
  # round 0 and in their last 10 rounds; 15 comparisons evaluated every round.
  planned = [(3 * (81 + 1), 50, 11), (15, 1000, 1001)]  # (runs, rounds, evaluations each)
  assert counts['seconds'] == pytest.approx(sum(n * run_s(alone, *r) for n, *r in planned))
  assert counts_2['seconds'] == pytest.approx(
      sum(n * run_s(shared, *r) for n, *r in planned) / 2)
  assert 'at 2 at a time' in out_2 and '2 at once' in out_2 and 'timing 3 rounds' not in out_2
  # Kept timings of one run alone are not taken for two at once: those are timed.
  _parse('--paper=fedzmg', '--table=5', f'--root_output_dir={designed[0]}')
  try:
    plan = reproduce.plan_from_flags()
  finally:
    flags.FLAGS.unparse_flags()
  runs = [p.run for p in reproduce.planned_runs(plan)]
  directory = os.path.join(plan.directory, 'dry_run')
  with open(os.path.join(directory, calibration.CALIBRATION_FILENAME), 'w') as f:
    json.dump({calibration.timing_key(calibration.kind_of(r.config), 1):
               dataclasses.asdict(alone) for r in runs}, f)
  assert not calibration.untimed(runs, directory, 1)
  assert calibration.untimed(runs, directory, 2) == {calibration.kind_of(r.config) for r in runs}


def test_a_round_is_charged_its_expected_steps(designed, small_task, synthetic_cache_dir,
                                               tmp_path):
  """A round costs a fixed part + its expected steps over the cohorts it may sample x a
  step's seconds, a line fitted to the timed rounds whatever their own cohorts trained; the
  dry run says the spread the sampling brings, per round and in total."""
  (tmp_path / 'metrics.csv').write_text(
      'key,client_work/train/num_batches,training_time_in_seconds\n'
      '1,50,9.0\n2,40,4.0\n3,20,2.5\n')  # Round 1 traces: not a steady round.
  rounds = calibration.steady_rounds(str(tmp_path))
  assert rounds == [(40.0, 4.0), (20.0, 2.5)]
  # The line through them: 1 s + 0.075 s a step. A line falling with the steps is flat (a
  # round their mean); steps that do not vary give no fixed part.
  assert calibration.round_cost(rounds) == pytest.approx((1.0, 0.075))
  assert calibration.round_cost([(40.0, 2.0), (20.0, 3.0)]) == pytest.approx((2.5, 0.0))
  assert calibration.round_cost([(30.0, 3.0), (30.0, 4.0)]) == pytest.approx((0.0, 3.5 / 30))
  # A round's steps from the run's data: 3 of 8 small EMNIST clients, 2 epochs of at most
  # 25 examples, batch 7.
  config = run_config.ExperimentConfig(
      task='emnist', algo='fedavg', root_output_dir=str(tmp_path), experiment_name='x',
      data_source='synthetic', cache_dir=synthetic_cache_dir,
      synthetic_settings=dict(SMALL_SYNTHETIC['emnist']), clients_per_round=3,
      client_epochs_per_round=2, client_batch_size=7, max_elements_per_client=25)
  task = small_task('emnist')
  sizes = [len(task.train_client_tensors(c)['label'])
           for c in task.datasets.train_data.client_ids]
  steps = [math.ceil(min(2 * n, 25) / 7) for n in sizes]
  assert calibration.round_work(config) == pytest.approx(client_work.round_steps(steps, 3))

  timing = calibration.Timing(startup_s=10.0, round_s=2.0, evaluation_s=0.5, source='kept',
                              step_s=0.1, round_fixed_s=1.0, round_steps=20.0,
                              round_steps_std=5.0,
                              timed_steps=(40.0, 20.0))
  counts, out = _dry_run(designed[0], '--table=5', timing={1: timing})
  run_s = lambda rounds, evaluations: 10.0 + rounds * 3.0 + evaluations * 0.5
  planned = [(3 * (81 + 1), 50, 11), (15, 1000, 1001)]  # (runs, rounds, evaluations each)
  assert counts['seconds'] == pytest.approx(sum(n * run_s(*r) for n, *r in planned))
  assert ('    a round: 1 s + 20 ± 5 steps (mean ± std over the cohorts it may sample) x'
          ' 0.1 s = 3.00 ± 0.50 s (the timed rounds: 20-40 steps, median 2.00 s)\n') in out
  spread = 0.5 * math.sqrt(sum(n * rounds for n, rounds, _ in planned))
  assert f'(± {runner.duration_text(spread)} with the clients sampled) at 1 at a time' in out


# At --scale=small, from each paper's protocol: (settings of all its tables, algorithms,
# seeds (the first 3), comparison rounds (a tenth, at least 10)).
_SMALL = {
    'fedzmg': (3, 3, 3, 100),  # Grids: 81 cells x 10 rounds, 27 on to 20, 9 on to 50.
    'gcfed': (8 + 4, 4, 3, 80),  # No grid.
    'fedrkmgc': (4, 2, 1, 100),
    'fedgps': (5, 2, 1, 50),
}


@pytest.mark.parametrize('paper', papers.PAPER_NAMES)
def test_small_scale_dry_run_of_every_table(designed, paper):
  """Each paper's --dry_run of all its tables at --scale=small on synthetic data plans the
  paper's runs (timings kept, so nothing trains); FedZMG's grids are halved up to the
  paper's rounds: 81 cells x 10 rounds, the best 27 on to 20, the best 9 on to 50."""
  timing = calibration.Timing(startup_s=10.0, round_s=2.0, evaluation_s=0.5, source='kept')
  counts, out = _dry_run(designed[0], '--scale=small', '--data_source=synthetic',
                         paper=paper, timing={1: timing})
  settings, algos, seeds, rounds = _SMALL[paper]
  comparisons = settings * algos * seeds
  assert counts['comparison'] == comparisons and f'total: {counts["total"]} runs' in out
  assert set(counts['tables']) == set(papers.get(paper).tables)
  assert 'estimated time: ' in out and 'timing 3 rounds' not in out  # Nothing trained.
  if paper != 'fedzmg':
    assert (counts['grid'], counts['stability'], counts['rounds']) == (
        0, 0, comparisons * rounds)
    return
  grids = 3 * settings
  assert (counts['grid'], counts['stability']) == (grids * (81 + 27 + 9), grids)
  assert counts['rounds'] == grids * (81 * 10 + 27 * 10 + 9 * 30 + 50) + comparisons * rounds
  assert 'successive halving: 81 x 10, 27 x 20, 9 x 50 (cells x rounds)' in out
  assert ('  emnist fedzmg, rung 2: the best 27 of 81 cells continue to 20 rounds (+10 each)'
          in out)
  assert '  grid-emnist-fedzmg-clr10_slr10: emnist fedzmg clr=10 slr=10 rounds=10 cohort=10' in out
  _parse('--paper=fedzmg', '--scale=small', f'--root_output_dir={designed[0]}')
  try:
    plan = reproduce.plan_from_flags()
  finally:
    flags.FLAGS.unparse_flags()
  assert plan.tuning_caveat() is None


@pytest.mark.parametrize('paper', papers.PAPER_NAMES)
def test_a_timing_run_records_the_settings_its_command_trains_with(designed, paper):
  """A dry run's timing copy of each kind of run drops the run's own rates (a grid's corner
  cell may diverge) and so trains at its protocol's: its config is the one its command line
  gives, or the runner refuses the folder it trained (FedGPS's dry run did, its protocol's
  rate 0.01 recorded as FedGPS's default 0.1)."""
  _parse(f'--paper={paper}', '--scale=small', '--data_source=synthetic',
         f'--root_output_dir={designed[0]}')
  try:
    plan = reproduce.plan_from_flags()
  finally:
    flags.FLAGS.unparse_flags()
  first_of_kind = {}
  for planned in reproduce.planned_runs(plan):
    first_of_kind.setdefault(calibration.kind_of(planned.run.config), planned.run)
  for run in first_of_kind.values():
    copy = calibration._calibration_run(run, str(designed[0]), 'timing', 7)  # pylint: disable=protected-access
    flags.FLAGS(['train', *copy.args])
    try:
      from_command = settings_lib.config_of(settings_lib.settings_from_flags())
    finally:
      flags.FLAGS.unparse_flags()
    assert copy.config.recorded() == from_command.recorded(), run.name


def test_scales_shrink_the_protocol_keeping_its_shape():
  small = scales.get_scale('small')
  assert (small.rounds(1000), small.seeds(range(5)), small.halving) == (100, (0, 1, 2), True)
  assert scales.get_scale('0.25').rounds(1000) == 250
  assert scales.get_scale('0.1').rounds(50, grid=True) == 5
  assert scales.get_scale('full').rounds(1000) == 1000


@pytest.mark.parametrize('args, message', [
    (['--paper=fedprox'], "unknown --paper 'fedprox'"),
    ([], '--paper is required'),
    (['--paper=fedzmg', '--table=2'], 'choose from [3, 4, 5, 6, 7, 8]'),
    (['--paper=gcfed', '--table=x'], 'choose from [4, 5]'),
    (['--paper=fedzmg', '--scale=huge'], "choose one of ['full', 'small', 'ci']"),
    (['--paper=fedzmg', '--scale=1.5'], 'a number in (0, 1]'),
    (['--paper=fedzmg', '--seed=3'], '--seed is set by the fedzmg protocol'),
])
def test_bad_flags_are_refused_with_what_is_allowed(args, message, tmp_path):
  _parse(f'--root_output_dir={tmp_path}', *args)
  try:
    with pytest.raises(ValueError) as error:
      reproduce.plan_from_flags()
    assert message in str(error.value)
  finally:
    flags.FLAGS.unparse_flags()


# The client optimizer each paper trains every method with, from its text: (learning rate,
# momentum, weight decay). GC-Fed section 4.1; FedRKMGC section 4 (no decay named); FedGPS
# section 5 and Table 7 (FedGPS's decay is its lambda3). FedZMG tunes the rate (None) and
# gives momentum and decay to FedZMG alone (section 5.2.2; specification.md section 2).
_PAPER_SGD = {
    'gcfed': {algo: (0.01, 0.9, 1e-5) for algo in ('fedavg', 'local_gc', 'global_gc', 'gcfed')},
    'fedrkmgc': {'fedavg': (0.01, 0.8, 0.0), 'fedrkmgc': (0.01, 0.8, 0.0)},
    'fedgps': {'fedavg': (0.01, 0.9, 1e-5), 'fedgps': (0.01, 0.9, 1e-5)},
    'fedzmg': {'fedavg': (None, 0.0, 0.0), 'fedadam': (None, 0.0, 0.0),
               'fedzmg': (None, 0.9, 1e-4)},
}


@pytest.mark.parametrize('paper', sorted(_PAPER_SGD))
def test_every_algorithm_of_a_paper_trains_with_the_papers_client_optimizer(paper, tmp_path):
  """Each comparison run of each paper's tables records its paper's client optimizer."""
  _parse(f'--paper={paper}', f'--root_output_dir={tmp_path}')
  try:
    runs = reproduce.comparison_runs(reproduce.plan_from_flags())
  finally:
    flags.FLAGS.unparse_flags()
  assert {run.config.algo for run in runs} == set(_PAPER_SGD[paper])
  for run in runs:
    hparams = run.config.recorded()['hparams']
    lr, momentum, decay = _PAPER_SGD[paper][run.config.algo]
    if lr is not None:
      assert hparams['client_learning_rate'] == lr, run.name
    assert hparams['client_momentum'] == momentum, run.name
    assert hparams.get('lambda3' if run.config.algo == 'fedgps' else 'weight_decay',
                       0.0) == decay, run.name


def test_tfds_papers_need_their_data_but_not_for_a_dry_run(designed, tmp_path):
  _parse('--paper=gcfed', '--table=5', f'--cache_dir={tmp_path}',
         f'--root_output_dir={designed[0]}')
  try:
    plan = reproduce.plan_from_flags()
    with pytest.raises(sources.MissingDataError, match='cifar10 data is not on this machine'):
      reproduce.check_data(plan)
    counts = reproduce.dry_run(plan, _pool(), stream=io.StringIO())
  finally:
    flags.FLAGS.unparse_flags()
  assert (counts['grid'], counts['comparison']) == (0, 8 * 4 * 3)


# The accuracy thresholds each paper's figures draw: FedZMG's (its section 5.3,
# specification.md section 6) and GC-Fed's (section 4.4) for their own tasks; the
# others' tables name none.
_FIGURE_THRESHOLDS = {
    ('fedzmg', 'emnist'): '0.75, 0.85', ('fedzmg', 'cifar100'): '0.2, 0.33',
    ('fedzmg', 'shakespeare'): '0.35, 0.45', ('gcfed', 'cifar10'): '0.55, 0.6',
    ('gcfed', 'cifar100_tfds'): '0.25, 0.3',
}


@pytest.mark.parametrize('paper', papers.PAPER_NAMES)
def test_each_papers_tables_at_the_ci_scale_fill_from_their_runs(paper, tmp_path):
  """A paper's tables at --scale=ci on synthetic data, over finished runs written beforehand
  (nothing trains; `test_ci_scale_trains_each_table_and_then_reuses_it` trains them): every
  column filled from the runs, a grid's picks called tuned and a protocol's rates the
  paper's, each figure titled by its setting and drawing its own paper's thresholds only,
  and each algorithm's client optimizer said in the notes."""
  _parse(f'--paper={paper}', '--scale=ci', '--data_source=synthetic',
         f'--root_output_dir={tmp_path}')
  try:
    plan = reproduce.plan_from_flags()
    rng = np.random.default_rng(0)
    best, accuracy = {}, {}
    search = plan.search()
    for (key, algo), grid in reproduce.grid_groups(plan).items():
      pick = grid.cells[-1]  # Designed to score best, and stable with another seed.
      for cell in grid.cells:
        _write_run(grid.run(cell, search.final_rounds),
                   [0.5 if cell == pick else 0.3] * search.final_rounds)
      _write_run(grid.run(pick, search.final_rounds, seed=1), [0.5] * search.final_rounds)
      best[(key, algo)] = dict(client_learning_rate=pick[0], server_learning_rate=pick[1])
    for run in reproduce.comparison_runs(plan, best):
      accuracies = np.round(rng.uniform(0.1, 0.9, plan.total_rounds), 4)
      _write_run(run, accuracies)
      kind, n = plan.paper.accuracy  # By hand: the best, or the mean of the last n rounds.
      accuracy.setdefault((os.path.basename(run.config.root_output_dir), run.config.algo),
                          []).append(max(accuracies) if kind == 'best' else
                                     np.mean(accuracies[-n:]))
    out = io.StringIO()
    path = reproduce.reproduce(plan, _pool(), stream=out)
  finally:
    flags.FLAGS.unparse_flags()
  assert ': started' not in out.getvalue()
  text = open(path).read()
  assert 'no runs' not in text
  for table, spec in plan.paper.tables.items():
    results = json.load(open(os.path.join(plan.directory, 'report.json')))['tables'][str(table)]
    section = text[text.index(f'## Table {table}: '):]
    section = section[:section.index('\n## ', 1)]
    if spec.layout == 'accuracy':
      published = papers.get_published(paper, table)
      for algo in plan.paper.algos:
        row = next(line for line in section.splitlines() if line.startswith(f'| {algo} |'))
        for setting in spec.settings:
          cell = results[algo][setting.key]
          assert cell['ours'] == pytest.approx(np.mean(accuracy[(setting.key, algo)]))
          assert cell['paper'] == published.value(algo, setting.key)
          assert f'| {100 * cell["ours"]:.2f} ' in row, row
    elif spec.layout == 'ttest':
      assert {cells['n'] for cells in results.values()} == {2}  # Two seeds paired.
    else:
      assert set(results) == set(plan.paper.algos)
  sgd = _PAPER_SGD[paper]
  trained = text[text.index('## How each algorithm trained'):]
  for algo in plan.paper.algos:
    row = next(line for line in trained.splitlines() if line.startswith(f'| {algo} |'))
    lr, momentum, decay = sgd[algo]
    decay_name = 'lambda3' if algo == 'fedgps' else 'weight_decay'
    assert f'client_momentum={momentum:g}' in row, row
    assert f'{decay_name}={decay:g}' in row or (decay == 0 and decay_name not in row), row
    if lr is not None:
      assert f'client_learning_rate={lr:g}' in row, row
  for setting in plan.settings:
    compared = open(os.path.join(plan.directory, 'compare', setting.key, 'report.md')).read()
    heading = compared.splitlines()[0]
    assert heading.startswith(f'## {setting.key}') and setting.task in heading, heading
    assert f'![{heading[3:]}](' in compared
    thresholds = _FIGURE_THRESHOLDS.get((paper, setting.task))
    assert (f'Dashed lines: the accuracy thresholds {thresholds}.' in compared
            if thresholds else 'Dashed lines' not in compared)
    source = 'tuned' if plan.paper.grid else "the paper's"
    for algo in plan.paper.algos:
      row = next(line for line in compared.splitlines() if line.startswith(f'| {algo} |'))
      assert f'| {source}: client_learning_rate=' in row, row
    assert '**Untuned:**' not in compared
  if paper == 'fedgps':  # Each scenario is its own Dirichlet draw of one synthetic dataset.
    seeds = {json.load(open(os.path.join(
        plan.directory, 'runs', f'scenario{i}', 'cifar100_fedavg_seed0', 'flags.json')))[
            'partition_seed'] for i in range(1, 6)}
    assert seeds == {0, 1, 2, 3, 4}
    assert 'cifar10 stood in for by synthetic cifar100 data' in text
