"""`launch.reproduce`: a paper's protocol end to end at the ci scale, resumption, dry run."""

import csv
import io
import json
import math
import os
import re

from absl import flags
import numpy as np
import pytest
import scipy.stats

from launch import compare
from launch import papers
from launch import reproduce
from tasks import sources
from tff_zmg.analysis import published

_ALGOS = ('fedzmg', 'fedavg', 'fedadam')
_SEEDS = (0, 1)
_THRESHOLDS = (0.0, 0.05)  # Low enough for 4 rounds on synthetic data to reach.


def _parse(*args):
  flags.FLAGS.unparse_flags()
  flags.FLAGS(['reproduce', *args])


@pytest.fixture(scope='module')
def ci_root(tmp_path_factory):
  return str(tmp_path_factory.mktemp('reproduce'))


def _ci_args(root, cache_dir):
  return [
      '--paper=fedzmg', '--table=5,6', '--scale=ci', '--data_source=synthetic',
      f'--cache_dir={cache_dir}', f'--root_output_dir={root}', '--parallel=2',
      '--thresholds=' + ','.join(map(str, _THRESHOLDS)),
  ]


@pytest.fixture(scope='module')
def ci_run(ci_root, synthetic_cache_dir):
  """The FedZMG protocol for its EMNIST tables at the ci scale: (plan, report path, output)."""
  _parse(*_ci_args(ci_root, synthetic_cache_dir))
  try:
    plan = reproduce.make_plan()
    out = io.StringIO()
    path = reproduce.reproduce(plan, stream=out)
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
  """ALGORITHMS.md section 6 by hand: the 4-round average stays >= threshold from here."""
  average = np.convolve(acc, np.ones(4) / 4, mode='valid')
  if average.size == 0 or average[-1] < threshold:
    return None
  first = max([i + 1 for i, a in enumerate(average) if a < threshold], default=0)
  return int(rounds[first + 3])


def test_ci_scale_runs_grid_comparison_and_report(ci_run):
  plan, path, out = ci_run
  directory = plan.directory
  assert os.path.basename(directory) == 'reproduce_fedzmg_ci'
  assert 'grid search, 6 runs' in out and 'comparison, 6 runs' in out
  results = json.loads(open(os.path.join(directory, 'report.json')).read())

  # Grid: a 2 x 1 grid of 2-round cells per algorithm; the comparison trains at the best.
  for algo in _ALGOS:
    grid_dir = os.path.join(directory, 'grid', 'emnist', algo)
    scores = {}
    for name in os.listdir(grid_dir):
      cell = os.path.join(grid_dir, name)
      if os.path.isdir(cell) and name.startswith('clr'):
        recorded = json.load(open(os.path.join(cell, 'flags.json')))
        assert recorded['total_rounds'] == 2 and recorded['clients_per_round'] == 2
        if not os.path.exists(os.path.join(cell, 'diverged.txt')):
          scores[recorded['hparams']['client_learning_rate']] = np.mean(_accuracy(cell)[1])
    best = json.load(open(os.path.join(grid_dir, 'best.json')))
    assert best['score'] == pytest.approx(max(scores.values()))
    assert best['server_learning_rate'] == 0.1
    for seed in _SEEDS:
      run_dir = os.path.join(directory, 'runs', 'emnist', compare.run_name('emnist', algo, seed))
      recorded = json.load(open(os.path.join(run_dir, 'flags.json')))
      assert recorded['hparams']['client_learning_rate'] == best['client_learning_rate']
      assert (recorded['seed'], recorded['total_rounds']) == (seed, 4)
      assert recorded['synthetic_settings']['num_train_clients'] == 4  # One data split.
    assert os.path.exists(os.path.join(grid_dir, 'grid_heatmap.png'))

  # Table 5 from the metrics CSVs by hand: rounds to each threshold (mean over seeds,
  # 'not reached' unless both reached) and the late-stage accuracy after the second.
  series = {(a, s): _accuracy(os.path.join(
      directory, 'runs', 'emnist', compare.run_name('emnist', a, s)))
            for a in _ALGOS for s in _SEEDS}
  reached = {k: [_rounds_to(r, acc, t) for t in _THRESHOLDS] for k, (r, acc) in series.items()}
  second = [v[1] for v in reached.values()]
  start = None if None in second else max(second)
  text = open(path).read()
  table5 = published.get('fedzmg', 5)
  for algo in _ALGOS:
    ours = results['5'][algo]
    for i, key in enumerate(('rounds_to_t1', 'rounds_to_t2')):
      values = [reached[(algo, s)][i] for s in _SEEDS]
      expected = None if None in values else np.mean(values)
      assert ours[key]['ours'] == (None if expected is None else pytest.approx(expected))
      assert ours[key]['paper'] == table5.value(algo, key)
    late = None if start is None else np.mean(
        [np.mean(series[(algo, s)][1][series[(algo, s)][0] >= start]) for s in _SEEDS])
    assert ours['late_stage_t2']['ours'] == (None if late is None else pytest.approx(late))
    # The Markdown row: each cell 'ours (paper)', the paper's numbers from Table 5.
    row = next(line for line in text.splitlines() if line.startswith(f'| {algo} |'))
    cells = [c.strip() for c in row.strip('|').split('|')][1:]
    paper = [table5.value(algo, k) for k in ('rounds_to_t1', 'rounds_to_t2', 'late_stage_t2')]
    assert cells[0].endswith(f'({paper[0]:g})') and cells[1].endswith(f'({paper[1]:g})')
    assert cells[2].endswith(f'({paper[2]:.2f})')
    late_text = 'not reached' if late is None else f'{100 * late:.2f}'
    assert cells[2].startswith(late_text)
    first = 'not reached' if ours['rounds_to_t1']['ours'] is None else f'{ours["rounds_to_t1"]["ours"]:.4g}'
    assert cells[0].startswith(first)

  # Table 6: the paired t-test of the final accuracies (4 rounds: the last round's) against
  # scipy; the published t beside ours.
  final = {k: acc[-1] for k, (_, acc) in series.items()}
  for pair, (a, b) in (('fedzmg vs fedavg', ('fedzmg', 'fedavg')),
                       ('fedzmg vs fedadam', ('fedzmg', 'fedadam'))):
    x, y = [final[(a, s)] for s in _SEEDS], [final[(b, s)] for s in _SEEDS]
    expected = scipy.stats.ttest_rel(x, y)
    ours = results['6'][pair]
    assert ours['t']['paper'] == published.get('fedzmg', 6).value(pair, 't')
    if math.isnan(expected.statistic) or ours['t']['ours'] is None:
      continue  # Equal differences: no finite t from scipy either.
    assert ours['t']['ours'] == pytest.approx(expected.statistic)
    assert ours['p']['ours'] == pytest.approx(expected.pvalue)
    assert ours['n'] == 2
    row = next(line for line in text.splitlines() if line.startswith(f'| {pair} |'))
    assert f'({ours["t"]["paper"]:g})' in row
  assert ours['p']['paper_from_t'] == pytest.approx(2 * scipy.stats.t.sf(2.043, 4))

  # The report: both tables, sources, figures that exist, the scale and the caveat.
  for needle in ('## Table 5', '## Table 6', 'Source: FedZMG, Table 5', 'Scale **ci**',
                 'synthetic', '## Summary', 'compare/emnist/emnist_accuracy.png'):
    assert needle in text, needle
  for figure in re.findall(r'\]\(([^)]+\.png)\)', text):
    assert os.path.exists(os.path.join(directory, figure)), figure
  assert len(re.findall(r'grid_heatmap\.png', text)) == 3


def test_a_second_run_reuses_every_finished_run(ci_run, ci_root, synthetic_cache_dir):
  plan, path, _ = ci_run
  metrics = {}
  for dirpath, _, filenames in os.walk(plan.directory):
    if 'metrics.csv' in filenames:
      metrics[dirpath] = os.stat(os.path.join(dirpath, 'metrics.csv')).st_mtime_ns
  assert len(metrics) >= 9  # 12 runs; a diverged grid cell may have no metrics.
  before = json.load(open(os.path.join(plan.directory, 'report.json')))
  _parse(*_ci_args(ci_root, synthetic_cache_dir))
  try:
    out = io.StringIO()
    assert reproduce.reproduce(reproduce.make_plan(), stream=out) == path
  finally:
    flags.FLAGS.unparse_flags()
  out = out.getvalue()
  assert ': started' not in out
  assert len(re.findall(r': already (finished|diverged)', out)) == 12
  for dirpath, mtime in metrics.items():
    assert os.stat(os.path.join(dirpath, 'metrics.csv')).st_mtime_ns == mtime, dirpath
  assert json.load(open(os.path.join(plan.directory, 'report.json'))) == before


def test_dry_run_lists_the_full_protocol_and_estimates_time(ci_run, ci_root):
  """The full FedZMG protocol: 9 x 9 cells x 3 algorithms x 3 tasks, then 3 x 5 x 3 runs.

  The round time is read from the ci runs (so nothing trains here).
  """
  for table, grid, comparison in (([], 81 * 3 * 3, 3 * 5 * 3), (['--table=5'], 81 * 3, 15)):
    _parse('--paper=fedzmg', '--dry_run', f'--root_output_dir={ci_root}', *table)
    try:
      out = io.StringIO()
      counts = reproduce.dry_run(reproduce.make_plan(), stream=out)
    finally:
      flags.FLAGS.unparse_flags()
    out = out.getvalue()
    assert (counts['grid'], counts['comparison']) == (grid, comparison)
    assert f'total: {grid + comparison} runs' in out
    assert out.count('\n  grid-') == grid and out.count(' seed=') == comparison
    assert 'read from the earlier run' in out and counts['seconds'] > 0
    assert counts['timing']['source'].startswith(ci_run[0].directory)
  assert '  grid-emnist-fedadam-clr10_slr10: emnist fedadam clr=10 slr=10 rounds=50 cohort=10\n' in out
  assert '  emnist-emnist_fedzmg_seed4: emnist fedzmg seed=4 rounds=1000 cohort=10\n' in out
  # 50-round cells and 1000-round comparison runs at the measured speed.
  timing = reproduce.RoundTime(**counts['timing'])
  per_round = lambda cohort: cohort * timing.train_s_per_client + timing.eval_s
  expected = (grid * (timing.startup_s + 50 * per_round(10))
              + comparison * (timing.startup_s + 1000 * per_round(10)))
  assert counts['seconds'] == pytest.approx(expected)


def test_scales_shrink_the_protocol_keeping_its_shape():
  grid = papers.PAPERS['fedzmg'].grid
  assert papers.thin(grid.client_learning_rates, 3) == (1e-3, 0.1, 10.0)
  assert papers.thin(grid.client_learning_rates, 1) == (0.1,)
  small = papers.get_scale('small')
  assert (small.rounds(1000), small.rounds(50, grid=True), small.seeds(range(5))) == (
      100, 5, (0, 1, 2))
  assert papers.get_scale('0.25').rounds(1000) == 250
  assert papers.get_scale('full').rounds(1000) == 1000


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
      reproduce.make_plan()
    assert message in str(error.value)
  finally:
    flags.FLAGS.unparse_flags()


def test_tfds_papers_need_their_data_but_not_for_a_dry_run(ci_run, ci_root, tmp_path):
  _parse('--paper=gcfed', '--table=5', f'--cache_dir={tmp_path}', f'--root_output_dir={ci_root}')
  try:
    plan = reproduce.make_plan()
    with pytest.raises(sources.MissingDataError, match='cifar10 data is not on this machine'):
      reproduce.check_data(plan)
    counts = reproduce.dry_run(plan, stream=io.StringIO())
  finally:
    flags.FLAGS.unparse_flags()
  assert (counts['grid'], counts['comparison']) == (0, 8 * 4 * 3)
