"""The experiment programs: grid search, comparison and data statistics, end to end."""

import csv
import json
import math
import os
import re
import signal
import subprocess
import sys

from absl import flags
import matplotlib.image
import numpy as np
import pytest
import scipy.stats

from launch import compare
from launch import data_stats
from launch import grid_search
from launch.run import settings as run_settings
from launch.sweeps import calibration
from launch.sweeps import comparison
from launch.sweeps import lr_grid
from launch.sweeps import runner
from small_runs import write_found_run
from small_runs import write_run
from tasks import labels
from tasks import preprocessing
from tff_zmg import analysis
from tff_zmg.analysis import runs as run_folders

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TINY = [
    '--data_source=synthetic', '--synthetic_train_clients=4', '--synthetic_test_clients=2',
    '--synthetic_examples_per_client=10', '--clients_per_round=2',
]


def _rows(path):
  with open(path, newline='') as f:
    return list(csv.DictReader(f))


def _attempts(log_path):
  with open(log_path) as f:
    return sum(line.startswith('=== start') for line in f)


def _write_cells(args, cells, rounds):
  """Cells of the grid `launch.grid_search` makes of `args`, written beforehand as
  `launch.train` leaves `rounds`-round runs (`small_runs.write_run`), so that the search
  takes them as done and does not train them: `cells` maps (client lr, server lr) to the
  cell's accuracies, None for a cell that diverged in round 1 (no round recorded). Also
  the grid's logs/ folder, which marks its folder as a grid's."""
  flags.FLAGS.unparse_flags()
  try:
    flags.FLAGS(['grid_search', *args])
    directory = os.path.join(
        flags.FLAGS.root_output_dir,
        flags.FLAGS.experiment_name or f'grid_{flags.FLAGS.task}_{flags.FLAGS.algo}')
    grid = lr_grid.Grid(directory=directory, base=run_settings.settings_from_flags(),
                            client_lrs=tuple(dict.fromkeys(c for c, _ in cells)),
                            server_lrs=tuple(dict.fromkeys(s for _, s in cells)))
    for cell, accuracies in cells.items():
      write_run(grid.run(cell, rounds), accuracies or [], diverged=accuracies is None)
    os.makedirs(os.path.join(directory, lr_grid.LOGS_DIRNAME))
  finally:
    flags.FLAGS.unparse_flags()


# --- grid search ------------------------------------------------------------------------


def test_grid_search_completes_resumes_after_an_interruption_and_reports(
    synthetic_cache_dir, tmp_path, run_program
):
  """A 2 x 2 grid of 2-round cells, 2 at a time; SIGTERM once two cells are done.

  The client learning rate 1e30 diverges in round 1 (the second batch overflows); a
  divergence is recorded, not retried. The Dirichlet flags pass through to every cell.
  """
  args = [
      '--task=emnist', '--algo=fedavg', f'--cache_dir={synthetic_cache_dir}',
      f'--root_output_dir={tmp_path}', *_TINY, '--total_rounds=2', '--rounds_per_checkpoint=2',
      '--client_batch_size=5', '--client_learning_rates=0.05,1e30',
      '--server_learning_rates=1,0.5', '--parallel=2', '--partition=dirichlet',
      '--num_clients=4', '--dirichlet_alpha=0.5', '--nostability_check',
  ]
  grid = tmp_path / 'grid_emnist_fedavg'
  cells = ['clr0.05_slr1', 'clr1e+30_slr1', 'clr0.05_slr0.5', 'clr1e+30_slr0.5']
  first = subprocess.Popen([sys.executable, '-m', 'launch.grid_search', *args], cwd=_REPO,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
  done = []
  try:
    for line in first.stdout:
      if re.search(r': (finished|diverged) in', line):
        done.append(line.split(']')[1].split(':')[0].strip())
        if len(done) == 2:
          first.send_signal(signal.SIGTERM)
          break
    first.communicate(timeout=120)
  finally:
    if first.poll() is None:
      first.kill()
  assert len(done) == 2 and set(done) < set(cells)

  # Resumed by the same command (in-process here, to save a TensorFlow start-up).
  rc, out, err = run_program(grid_search, *args)
  assert rc == 0, err
  for cell in cells:
    state = 'diverged' if '1e+30' in cell else 'finished'
    if cell in done:  # Started once, never again.
      assert f'{cell}: already {state}' in out
      assert _attempts(grid / 'logs' / f'{cell}.log') == 1
    elif f'{cell}: already {state}' in out:
      # On a loaded machine a running cell can end before SIGTERM lands; it too must
      # not start again.
      assert _attempts(grid / 'logs' / f'{cell}.log') == 1
    else:
      assert f'{cell}: {state} in' in out

  rows = {(r['client_learning_rate'], r['server_learning_rate']): r
          for r in _rows(grid / 'grid.csv')}
  assert sorted(rows) == [('0.05', '0.5'), ('0.05', '1.0'), ('1e+30', '0.5'), ('1e+30', '1.0')]
  for (c, s), row in rows.items():
    cell = grid / lr_grid.cell_name(float(c), float(s))
    recorded = json.loads((cell / 'flags.json').read_text())
    assert recorded['hparams'] == {'client_learning_rate': float(c),
                                   'server_learning_rate': float(s),
                                   'client_momentum': 0.0, 'weight_decay': 0.0}
    assert (recorded['partition'], recorded['num_clients'], recorded['total_rounds']) == (
        'dirichlet', 4, 2)
    if c == '0.05':
      rounds, acc = analysis.accuracy_series(str(cell))
      assert row['status'] == 'finished' and list(rounds) == [1, 2]
      assert float(row['score']) == pytest.approx(np.mean(acc))
    else:
      assert row['status'] == 'diverged' and row['score'] == 'nan'
  best = json.loads((grid / 'best.json').read_text())
  assert best['client_learning_rate'] == 0.05
  assert best['score'] == max(float(r['score']) for r in rows.values() if r['score'] != 'nan')
  assert f'best: --client_learning_rate=0.05 --server_learning_rate={best["server_learning_rate"]}' in out
  image = matplotlib.image.imread(str(grid / 'grid_heatmap.png'))
  assert image.ndim == 3 and min(image.shape[:2]) > 100


def test_halving_promotes_the_best_cell_continuing_its_run_and_checks_it_with_another_seed(
    synthetic_cache_dir, tmp_path, run_program
):
  """2 cells x 1 round, the best third (1 cell) on to 3 rounds, then a re-run with seed 1.

  The client rate 1e30 diverged in round 1 (its cell written beforehand as the runner
  records a diverged run: a real divergence is test_grid_search_completes_...'s): it
  scores as failed and is never promoted, though the rung keeps a third of 2 cells, one.
  The promoted cell is its rung-1 run continued (a second process that trains rounds 2-3
  only).
  """
  args = [
      '--task=emnist', '--algo=fedavg', f'--cache_dir={synthetic_cache_dir}',
      f'--root_output_dir={tmp_path}', *_TINY, '--client_batch_size=5',
      '--search=halving', '--rung_rounds=1,3', '--score_rounds=2',
      '--client_learning_rates=1e30,0.05', '--server_learning_rates=1', '--parallel=2',
  ]
  _write_cells(args, {(1e30, 1.0): None}, 1)
  rc, out, err = run_program(grid_search, *args)
  assert rc == 0, err
  assert 'clr1e+30_slr1: already diverged' in out
  grid = tmp_path / 'grid_emnist_fedavg'
  assert 'rung 1/2: 2 cells to 1 rounds' in out and 'rung 2/2: 1 cells to 3 rounds' in out
  rounds, acc = analysis.accuracy_series(str(grid / 'clr0.05_slr1'))
  assert list(rounds) == [1, 2, 3]
  log = grid / 'logs' / 'clr0.05_slr1.log'
  assert _attempts(log) == 2
  assert 'round 1/3' not in log.read_text() and 'round 3/3' in log.read_text()  # Continued.
  rows = {r['client_learning_rate']: r for r in _rows(grid / 'grid.csv')}
  assert rows['1e+30']['status'] == 'diverged' and rows['1e+30']['rounds'] == '1'
  assert rows['1e+30']['score_at_1'] == rows['1e+30']['score'] == 'nan'
  row = rows['0.05']
  assert float(row['score_at_1']) == pytest.approx(acc[0])
  assert (row['rounds'], row['score_rounds']) == ('3', '2')
  assert float(row['score']) == float(row['score_at_3']) == pytest.approx(np.mean(acc[1:]))

  best = json.loads((grid / 'best.json').read_text())
  assert best['client_learning_rate'] == 0.05 and best['search'] == 'halving'
  assert (best['total_rounds'], best['score_rounds']) == (3, 2)
  assert best['rungs'] == [{'rounds': 1, 'cells': 2}, {'rounds': 3, 'cells': 1}]
  check = grid / 'stability' / 'clr0.05_slr1_seed1'
  assert json.loads((check / 'flags.json').read_text())['seed'] == 1
  # Evaluated (but round 0) in the rounds a score would read only: the last 2.
  assert list(analysis.accuracy_series(str(check))[0]) == [2, 3]
  assert best['stability']['checked'] == [
      {'client_learning_rate': 0.05, 'server_learning_rate': 1.0, 'stable': True}]
  assert not best['stability']['replaced']
  # Rounds trained: 3 (the promoted cell) + 0 (diverged in round 1) + 3 (the re-run).
  assert best['cost']['rounds'] == 6 and best['cost']['seconds'] > 0
  assert 'picked: client 0.05, server 1 (score' in out and 'mean of rounds 2-3' in out

  # Re-run: nothing trains; the same pick.
  rc, out, err = run_program(grid_search, *args)
  assert rc == 0 and ': started' not in out, err
  assert json.loads((grid / 'best.json').read_text()) == best


def test_grid_axes_default_to_half_decades_and_reject_bad_lists(run_program, tmp_path):
  np.testing.assert_allclose(grid_search.parse_learning_rates('x', None),
                             [1e-3, 10**-2.5, 1e-2, 10**-1.5, 0.1, 10**-0.5, 1, 10**0.5, 10])
  assert grid_search.parse_learning_rates('x', ['0.1', '1']) == (0.1, 1.0)
  base = ['--task=emnist', '--algo=fedavg', f'--root_output_dir={tmp_path}']
  for args, message in [
      (['--client_learning_rates=0.1,-1'], 'positive'),
      (['--server_learning_rates=0.1,0.1'], 'repeated'),
      (['--client_learning_rates=a'], 'comma list of numbers'),
      (['--client_learning_rate=0.1'], 'give the values with --client_learning_rates'),
      (['--gc_lambda=0.5'], 'does not apply'),
      (['--rung_rounds=5,10'], '--rung_rounds needs --search=halving'),
      (['--search=halving', '--rung_rounds=10,5'], 'positive and increasing'),
      (['--search=halving', '--rung_rounds=a'], 'comma list of integers'),
      (['--search=halving', '--rung_rounds=5,10', '--total_rounds=20'], 'give one of them'),
      (['--algo=fedrkmgc'], '--algo=fedrkmgc has no server learning rate'),
  ]:
    rc, _, err = run_program(grid_search, *base, *args)
    assert rc == 2 and err.startswith('grid_search: error:') and message in err, err
  # Without --algo: a rule pair stands for it.
  for args, message in [
      ([], '--algo is required (or --client_rule with --server_rule)'),
      (['--client_rule=sgd'], 'give --algo, or --client_rule with --server_rule'),
      (['--client_rule=sgd', '--server_rule=adam', '--proximal_strength=0.1'],
       '--proximal_strength does not apply to --algo=sgd+adam'),
  ]:
    rc, _, err = run_program(grid_search, '--task=emnist', f'--root_output_dir={tmp_path}',
                             *args)
    assert rc == 2 and err.startswith('grid_search: error:') and message in err, err
  assert not os.listdir(tmp_path)


def test_grid_search_covers_a_third_hyperparameter_axis(run_program, tmp_path):
  """FedProx's mu as the third axis: a grid per value, the best over all of them."""
  base = ['--task=emnist', '--algo=fedprox', f'--root_output_dir={tmp_path}', *_TINY,
          '--client_learning_rates=0.1', '--server_learning_rates=1', '--total_rounds=1',
          '--score_rounds=1', f'--cache_dir={tmp_path / "cache"}', '--nostability_check']
  for axis, message in [
      ('proximal_strength:-1,0.1', 'proximal_strength must be >= 0, got'),
      ('proximal_strength:0.1,0.1', 'repeated values'),
      ('beta:0.1', "'beta' is not a hyperparameter of --algo=fedprox"),
      ('proximal_strength', 'must be name:v1,v2'),
  ]:
    rc, _, err = run_program(grid_search, *base, f'--hparam_grid={axis}')
    assert rc == 2 and err.startswith('grid_search: error:') and message in err, err
    assert len(err.strip().splitlines()) == 1
  rc, out, err = run_program(grid_search, *base, '--hparam_grid=proximal_strength:0.01,1')
  assert rc == 0, err
  grid_dir = tmp_path / 'grid_emnist_fedprox'
  scores = {}
  for mu in ('0.01', '1'):
    (row,) = _rows(grid_dir / f'proximal_strength={mu}' / 'grid.csv')
    assert row['status'] == runner.FINISHED
    recorded = json.loads((grid_dir / f'proximal_strength={mu}' / 'clr0.1_slr1' /
                           'flags.json').read_text())
    assert recorded['hparams']['proximal_strength'] == float(mu)
    scores[float(mu)] = float(row['score'])
  best = json.loads((grid_dir / 'best.json').read_text())
  assert best['score'] == max(scores.values())
  assert scores[best['proximal_strength']] == best['score']
  assert f"--proximal_strength={best['proximal_strength']!r}" in out


# --- runs side by side ------------------------------------------------------------------


def _record_rounds(run, rounds):
  """The run's metrics.csv as `launch.train` leaves it after `rounds` rounds (the column
  the runner counts)."""
  os.makedirs(run.config.output_dir, exist_ok=True)
  with open(run.config.metrics_csv, 'w') as f:
    f.write('key,client_work/train/loss\n' + ''.join(f'{r},1.0\n' for r in range(1, rounds + 1)))


def test_progress_gives_the_runs_to_go_and_their_time_at_the_pace_so_far(tmp_path):
  """Three 10-round runs, b resumed from round 4, two at a time, on a hand-set clock."""
  flags.FLAGS.unparse_flags()
  try:
    flags.FLAGS(['compare', '--task=emnist', '--algo=fedavg', f'--root_output_dir={tmp_path}',
                 '--total_rounds=10'])
    base = run_settings.settings_from_flags()
    a, b, c = (runner.train_run(base, name, {'experiment_name': name}) for name in 'abc')
  finally:
    flags.FLAGS.unparse_flags()
  _record_rounds(b, 4)
  now = [100.0]
  progress = runner.Progress([a, b, c], parallel=2, clock=lambda: now[0])
  assert progress.text([c], [a, b]) == '  (3 to go)'  # No round trained yet.

  _record_rounds(a, 10)
  _record_rounds(b, 7)
  now[0] = 160.0
  progress.done(a)
  # 10 + 3 rounds in 60 s; c's 10 and b's last 3 left: 13 rounds, 60 s.
  assert progress.text([c], [b]) == '  (2 to go, about 1 min 00 s)'

  _record_rounds(b, 10)
  now[0] = 220.0
  progress.done(b)
  # 10 + 6 rounds in 120 s by two runs; c's 10 left, alone: 75 s x 2.
  assert progress.text([], [c]) == '  (1 to go, about 2 min 30 s)'
  _record_rounds(c, 2)  # Diverged in round 3.
  progress.done(c)
  assert progress.text([], []) == ''
  # The same 60 s, 13 rounds, with 2 runs of 26 rounds in all after: 60 s + 120 s.
  later = runner.LaterWork(runs=2, rounds=26, whole='the whole search')
  _record_rounds(a, 0)
  _record_rounds(b, 4)
  _record_rounds(c, 0)
  progress = runner.Progress([a, b, c], parallel=2, later=later, clock=lambda: now[0])
  now[0] += 60.0
  _record_rounds(a, 10)
  _record_rounds(b, 7)
  progress.done(a)
  assert progress.text([c], [b]) == (
      '  (2 to go, about 1 min 00 s; the whole search, about 3 min 00 s)')
  assert runner.time_left(3600.0, 18, 36, parallel=4, runs_left=9) == 7200.0
  assert runner.time_left(3600.0, 18, 36, parallel=4, runs_left=2) == 14400.0
  assert [runner.duration_text(s) for s in (7500, 249.4, 33.4)] == [
      '2 h 05 min', '4 min 09 s', '33 s']


def test_later_work_counts_the_later_rungs_and_the_stability_re_run_at_most():
  search = lr_grid.Search(rung_rounds=(10, 20, 50), score_rounds=10)
  # Two grids of 81 cells: after rung 1, 27 x 10 + 9 x 30 rounds and a 50-round re-run each.
  assert lr_grid.later_work([81, 81], search, 1) == runner.LaterWork(
      runs=2 * 37, rounds=2 * 590, whole='the whole search')
  assert lr_grid.later_work([81], search, 3) == runner.LaterWork(
      runs=1, rounds=50, whole='the whole search')
  exhaustive = lr_grid.Search(rung_rounds=(50,), score_rounds=10, stability_check=False)
  assert lr_grid.later_work([81], exhaustive, 1).runs == 0


def test_a_cell_is_scored_and_costed_from_its_rounds_metrics_as_its_slot_answers_them():
  loss, acc = run_folders.TRAIN_LOSS, run_folders.EVAL_ACCURACY
  training, evaluation = 'training_time_in_seconds', 'evaluation/evaluation_time_in_seconds'
  assert set(lr_grid.SCORED_METRICS) == {loss, acc, training, evaluation}
  metrics = {loss: {1: 2.0, 2: 1.5, 3: 1.0}, acc: {0: 0.1, 1: 0.2, 2: 0.4, 3: 0.9},
             training: {1: 1.0, 2: 2.0, 3: 4.0}, evaluation: {0: 0.5, 2: 0.25, 3: 1.0}}
  # The last score_rounds of the rung's rounds, round 0 (untrained) never, later rounds not.
  assert lr_grid.rung_score(metrics, 2, 2) == pytest.approx((0.2 + 0.4) / 2)
  assert lr_grid.rung_score(metrics, 3, 2) == pytest.approx((0.4 + 0.9) / 2)
  assert lr_grid.rung_score(metrics, 3, 10) == pytest.approx((0.2 + 0.4 + 0.9) / 3)
  # Not every round of the rung trained (it diverged), or nothing evaluated: failed.
  assert math.isnan(lr_grid.rung_score(metrics, 4, 2))
  assert math.isnan(lr_grid.rung_score({loss: metrics[loss]}, 3, 2))
  assert math.isnan(lr_grid.rung_score({}, 1, 2))
  # Rounds 1-2 trained, and the evaluations of rounds 0 and 2.
  assert lr_grid.run_cost(metrics, 2) == (2, pytest.approx(1.0 + 2.0 + 0.5 + 0.25))
  assert lr_grid.run_cost({}, 2) == (0, 0)


# --- comparison -------------------------------------------------------------------------


def test_compare_collects_runs_and_reports_the_papers_metrics(run_program, tmp_path):
  root = str(tmp_path / 'runs')
  ramp = np.array([0.1, 0.3, 0.5, 0.7, 0.8, 0.8, 0.9, 0.9])
  for seed, (zmg_shift, avg_shift) in enumerate([(0.0, 0.01), (0.02, 0.02), (-0.02, -0.04)]):
    write_found_run(root, 'emnist', 'fedzmg', seed, ramp + zmg_shift)
    write_found_run(root, 'emnist', 'fedavg', seed, ramp - 0.1 + avg_shift)
  write_found_run(root, 'emnist', 'fedadam', 0, ramp, diverged=True)
  rc, out, err = run_program(
      compare, '--task=emnist', '--algos=fedzmg,fedavg,fedadam', '--seeds=0,1,2',
      f'--root_output_dir={root}', '--collect_only', '--thresholds=0.75,0.95',
  )
  assert rc == 0, err
  report = tmp_path / 'runs' / 'compare'
  assert 'diverged; left out' in out and 'no run' in out  # fedadam seeds 0 and 1, 2.
  runs = {(r['algo'], r['seed']): r for r in _rows(report / 'runs.csv')}
  assert runs[('fedadam', '0')]['status'] == 'diverged'
  # 8 rounds: the final accuracy is the last round's. The 4-round averages of the ramp are
  # .4 .575 .7 .8 .85 at rounds 4..8: fedzmg reaches .75 at round 7 (.7 + shift at 6),
  # fedavg (-.1 + shift) at round 8 for seeds 0 and 1 (.76, .77), never for seed 2 (.71).
  assert float(runs[('fedzmg', '0')]['final_accuracy']) == pytest.approx(0.9)
  assert [runs[('fedzmg', s)]['rounds_to_0.75'] for s in '012'] == ['7', '7', '7']
  assert [runs[('fedavg', s)]['rounds_to_0.75'] for s in '012'] == ['8', '8', 'not reached']
  assert runs[('fedzmg', '0')]['rounds_to_0.95'] == 'not reached'
  assert runs[('fedzmg', '0')]['late_stage_0.75'] == 'not reached'  # fedavg seed 2 never.
  ttests = {(r['metric'], r['algo_a'], r['algo_b']): r for r in _rows(report / 'ttests.csv')}
  final = ttests[('final_accuracy', 'fedzmg', 'fedavg')]
  expected = scipy.stats.ttest_rel([0.9, 0.92, 0.88], [0.81, 0.82, 0.76])
  assert int(final['n']) == 3
  assert float(final['mean_difference']) == pytest.approx(0.31 / 3)
  assert float(final['t']) == pytest.approx(expected.statistic)
  assert float(final['p']) == pytest.approx(expected.pvalue)
  rounds = ttests[('rounds_to_0.75', 'fedzmg', 'fedavg')]
  assert int(rounds['n']) == 2 and float(rounds['mean_difference']) == pytest.approx(-1.0)
  assert ('final_accuracy', 'fedzmg', 'fedadam') not in ttests  # fedadam has no runs left.
  summary = {r['algo']: r for r in _rows(report / 'summary.csv')}
  assert float(summary['fedzmg']['final_accuracy_mean']) == pytest.approx(0.9)
  assert summary['fedavg']['rounds_to_0.75_reached'] == '2/3'
  assert summary['fedavg']['rounds_to_0.75_mean'] == 'not reached'
  text = (report / 'report.md').read_text()
  assert '## emnist' in text and '| fedzmg | 3 | 0.9 ± 0.02 |' in text
  assert 'not reached (2/3)' in text and 'emnist_accuracy.png' in text
  image = matplotlib.image.imread(str(report / 'emnist_accuracy.png'))
  assert image.ndim == 3


def test_compare_refuses_runs_on_different_data_splits(run_program, tmp_path):
  root = str(tmp_path)
  write_found_run(root, 'emnist', 'fedzmg', 0, [0.5] * 4)
  write_found_run(root, 'emnist', 'fedavg', 0, [0.5] * 4, partition='dirichlet')
  rc, _, err = run_program(compare, '--task=emnist', '--algos=fedzmg,fedavg', '--seeds=0',
                        f'--root_output_dir={root}', '--collect_only')
  assert rc == 2, err
  assert 'do not share one data split' in err and "partition='dirichlet'" in err


def test_compare_builds_one_training_run_per_algorithm_and_seed(tmp_path):
  """--algo_hparams override the shared flags per algorithm; nothing is trained here."""
  flags.FLAGS.unparse_flags()
  try:
    flags.FLAGS(['compare', '--algos=fedzmg,fedavg', '--seeds=0,1', '--task=emnist',
                 f'--root_output_dir={tmp_path}', '--client_learning_rate=0.2',
                 '--algo_hparams=fedzmg:client_learning_rate=0.03,weight_decay=0.001'])
    _, algos, seeds, hparams, _ = compare._parse_settings()  # pylint: disable=protected-access
    assert hparams == {'fedzmg': {'client_learning_rate': 0.03, 'weight_decay': 0.001}}
    base = run_settings.settings_from_flags()
    runs = {
        (a, s): runner.train_run(base, comparison.run_name('emnist', a, s), {
            'algo': a, 'seed': s, 'experiment_name': comparison.run_name('emnist', a, s),
            **hparams.get(a, {})})
        for a in algos for s in seeds
    }
    zmg, avg = runs[('fedzmg', 1)], runs[('fedavg', 0)]
    assert zmg.config.hparams == {'client_learning_rate': 0.03, 'weight_decay': 0.001}
    assert zmg.config.seed == 1 and zmg.config.output_dir == str(tmp_path / 'emnist_fedzmg_seed1')
    assert '--client_learning_rate=0.03' in zmg.args and '--algo=fedzmg' in zmg.args
    assert avg.config.hparams == {'client_learning_rate': 0.2}
    assert '--client_learning_rate=0.2' in avg.args and '--seed=0' in avg.args
    assert flags.FLAGS.client_learning_rate == 0.2 and flags.FLAGS.algo is None  # Restored.
    assert runner.status(zmg) == runner.PENDING
    for bad, message in [
        ('fedavg:beta=0.1', 'does not apply to fedavg'),
        ('fedprox:client_learning_rate=1', 'algo one of'),
        ('fedzmg:client_learning_rate', 'name=value'),
        ('fedzmg:client_learning_rate=abc', 'abc'),
    ]:
      with pytest.raises(ValueError, match=message):
        comparison.parse_algo_hparams(bad, algos)
  finally:
    flags.FLAGS.unparse_flags()


# --- dry runs ---------------------------------------------------------------------------


def test_dry_runs_of_a_grid_search_and_a_comparison_count_and_time_their_runs_only(
    synthetic_cache_dir, tmp_path, run_program
):
  """A 3 x 3 halving grid (rungs of 1, 2 and 4 rounds) and a comparison of three seeds,
  one finished and one a round in: each dry run counts the runs and rounds it would
  train and estimates each at start-up + rounds x round + evaluations x evaluation, from
  the timing kept for its kind of run (the grid's, which the comparison's runs share;
  the timing runs themselves are test_reproduce.py's). Nothing trains."""
  common = ['--task=emnist', f'--cache_dir={synthetic_cache_dir}', *_TINY, '--parallel=1']
  grid_args = [*common, '--algo=fedavg', f'--root_output_dir={tmp_path}', '--search=halving',
               '--rung_rounds=1,2,4', '--client_learning_rates=0.01,0.1,1',
               '--server_learning_rates=0.1,1,10', '--dry_run']
  grid = tmp_path / 'grid_emnist_fedavg'
  flags.FLAGS.unparse_flags()
  try:
    flags.FLAGS(['grid_search', *grid_args])
    cell = lr_grid.Grid(directory=str(grid), base=run_settings.settings_from_flags(),
                        client_lrs=(0.1,), server_lrs=(1.0,))
    kind = calibration.kind_of(cell.run((0.1, 1.0), 1).config)
  finally:
    flags.FLAGS.unparse_flags()
  kept = grid / 'dry_run' / calibration.CALIBRATION_FILENAME
  kept.parent.mkdir(parents=True)
  (grid / 'logs').mkdir()
  kept.write_text(json.dumps({calibration.timing_key(kind, 1): dict(
      startup_s=10.0, round_s=2.0, evaluation_s=0.5, source='kept', build_s=5.0,
      first_s=2.0, worker_s=3.0)}))
  rc, out, err = run_program(grid_search, *grid_args)
  assert rc == 0, err
  assert 'dry run: 14 runs, 18 rounds at most' in out
  for line in ('  9 runs of 1 rounds: every cell',
               '  3 runs of +1 rounds: rung 2: the best 3 of 9 cells continue to 2 rounds',
               '  1 run of +2 rounds: rung 3: the best 1 of 9 cells continue to 4 rounds',
               '  1 run of 4 rounds: stability re-run: the pick, or its neighbours while'
               ' re-runs diverge',
               f'  {kind}: 5.0 s, 10.0 s, 2.00 s, 0.50 s, 2.0 s, 3.0 s (kept)'):
    assert line + '\n' in out, out
  assert 'dry run: timing' not in out
  # Each run: start-up, its rounds, its evaluations (round 0's only when it starts afresh);
  # the warm slot starts once, trains its first run of the kind, and builds once for the
  # cells, once for the stability re-run (another seed).
  run_s = lambda rounds, evaluations: 10.0 + rounds * 2.0 + evaluations * 0.5
  grid_s = (9 * run_s(1, 2) + 3 * run_s(1, 1) + run_s(2, 2)  # Rungs 1, 2 and 3.
            + run_s(4, 5) + 2 * 5.0 + 2.0 + 3.0)  # The stability re-run; builds; worker.
  assert grid_s == 205.0 and 'estimated time: 3 min 25 s at 1 at a time' in out
  assert sorted(os.listdir(grid)) == ['dry_run', 'logs']  # No cell trained.

  root = tmp_path / 'runs'
  compare_args = [*common, '--algos=fedavg', '--seeds=0,1,2', '--total_rounds=3',
                  f'--root_output_dir={root}']
  flags.FLAGS.unparse_flags()
  try:
    flags.FLAGS(['compare', *compare_args])
    base = run_settings.settings_from_flags()
    made = {seed: runner.train_run(base, comparison.run_name('emnist', 'fedavg', seed), dict(
        task='emnist', algo='fedavg', seed=seed,
        experiment_name=comparison.run_name('emnist', 'fedavg', seed))) for seed in (0, 1)}
  finally:
    flags.FLAGS.unparse_flags()
  write_run(made[0], [0.1, 0.2, 0.3])  # Finished.
  write_run(made[1], [0.1])  # One round of three: resumed.
  (root / 'compare' / 'dry_run').mkdir(parents=True)
  (root / 'compare' / 'dry_run' / 'calibration.json').write_text(kept.read_text())
  rc, out, err = run_program(compare, *compare_args, '--dry_run')
  assert rc == 0, err
  assert 'dry run: 2 of 3 runs to train (1 of them resumed), 5 rounds' in out
  assert 'dry run: timing' not in out  # The grid's cells are runs of the same kind.
  compare_s = run_s(2, 2) + run_s(3, 4) + 2 * 5.0 + 2.0 + 3.0  # Each seed builds.
  assert compare_s == 48.0 and 'estimated time: 48 s at 1 at a time' in out
  assert sorted(os.listdir(root)) == ['compare', 'emnist_fedavg_seed0', 'emnist_fedavg_seed1']
  rc, out, err = run_program(compare, *compare_args, '--dry_run', '--overwrite')  # Afresh.
  assert rc == 0 and 'dry run: 3 of 3 runs to train (0 of them resumed), 9 rounds' in out, err
  assert 'estimated time: 1 min 14 s at 1 at a time' in out  # 3 x (run_s(3, 4) + 5) + 2 + 3.
  # Flags it would not use: refused in one line before anything is done.
  for flag, line in (
      ('--collect_only', '--dry_run does not apply with --collect_only, which trains nothing'),
      ('--batch_cells=2', '--batch_cells does not apply here: no two runs of this program'),
      ('--cells_per_gpu=2', '--cells_per_gpu applies only with --ray_address')):
    rc, out, err = run_program(compare, *compare_args, '--dry_run', flag)
    assert rc == 2 and err.startswith(f'compare: error: {line}') and not out, err
    assert len(err.splitlines()) == 1, err


# --- data statistics --------------------------------------------------------------------


def _direct_counts(task, client_data, cid):
  """Class counts by iterating the client's examples in Python."""
  counts = np.zeros(labels.NUM_CLASSES[task], dtype=int)
  for e in client_data.create_tf_dataset_for_client(cid):
    if task == 'shakespeare':
      for byte in e['snippets'].numpy():  # The model reads bytes.
        ch = chr(byte)
        counts[preprocessing.SHAKESPEARE_CHARS.find(ch) % 66] += 1  # -1 -> 65 (OOV).
    else:
      counts[int(e['label'])] += 1
  return counts


def test_data_stats_refuses_the_flags_of_training_before_anything(run_program, tmp_path):
  rc, out, err = run_program(data_stats, '--task=emnist', '--data_source=synthetic',
                             '--total_rounds=5', '--protocol=gcfed',
                             f'--output_dir={tmp_path / "stats"}')
  assert rc == 2 and not out, err
  assert err == ('data_stats: error: --protocol does not apply to data_stats, which'
                 ' describes the data and trains nothing\n'), err
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize('task, extra', [
    ('emnist', ['--partition=dirichlet', '--num_clients=5', '--dirichlet_alpha=0.3']),
    ('shakespeare', []),
])
def test_data_stats_tables_match_direct_counts(run_program, small_task, synthetic_cache_dir,
                                               tmp_path, task, extra):
  settings = ['--synthetic_train_clients=8', '--synthetic_test_clients=3',
              '--synthetic_examples_per_client=' + ('6' if task == 'shakespeare' else '20')]
  rc, out, err = run_program(
      data_stats, f'--task={task}', '--data_source=synthetic',
      f'--cache_dir={synthetic_cache_dir}', *settings, *extra, '--num_sampled_clients=3',
      f'--output_dir={tmp_path}',
  )
  assert rc == 0, err
  kwargs = dict(partition='dirichlet', dirichlet_alpha=0.3, num_clients=5) if extra else {}
  client_data = small_task(task, **kwargs).datasets.train_data
  rows = _rows(tmp_path / f'{task}_clients.csv')
  assert len(rows) == 3 and len({r['client_id'] for r in rows}) == 3
  global_counts = sum(_direct_counts(task, client_data, c) for c in client_data.client_ids)
  for row in rows:
    counts = _direct_counts(task, client_data, row['client_id'])
    assert int(row['volume']) == counts.sum()
    assert int(row['label_diversity']) == np.count_nonzero(counts)
    assert float(row['kl_divergence']) == pytest.approx(
        scipy.stats.entropy(counts, global_counts))
    assert float(row['gini']) == pytest.approx(analysis.gini(counts))
  summary = _rows(tmp_path / f'{task}_summary.csv')[0]
  assert int(summary['clients']) == len(client_data.client_ids)
  assert int(summary['labels']) == global_counts.sum()
  assert float(summary['volume_mean']) == pytest.approx(np.mean([int(r['volume']) for r in rows]))
  assert (tmp_path / f'{task}_summary.md').read_text() in out
