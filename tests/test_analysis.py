"""The papers' metrics, statistics, tables and figures on hand-made numbers with known answers."""

import csv
import math

import matplotlib.image
import numpy as np
import pytest
import scipy.stats

from tff_zmg import analysis
from tff_zmg.analysis import comparison
from tff_zmg.analysis import metrics
from tff_zmg.analysis import plots


# --- moving average and rounds to threshold ---------------------------------------------


def test_moving_average_is_trailing_over_full_windows():
  np.testing.assert_allclose(metrics.moving_average([1, 2, 3, 4, 5], 2), [1.5, 2.5, 3.5, 4.5])
  np.testing.assert_allclose(metrics.moving_average([0, 4, 8, 0, 4], 4), [3.0, 4.0])
  assert metrics.moving_average([1, 2, 3], 4).size == 0


def test_rounds_to_threshold_waits_until_the_series_stays_above():
  # 4-round averages at rounds 4..12: .875 1 .75 .5 .5 .5 .75 1 1 -- above at round 4,
  # falls back at 7, above for good from round 10.
  acc = [0.5, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1]
  assert analysis.rounds_to_threshold(acc, 0.75) == 10
  assert analysis.rounds_to_threshold(acc, 0.5) == 4


def test_rounds_to_threshold_is_none_when_never_reached_or_lost_at_the_end():
  assert analysis.rounds_to_threshold([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], 0.75) is None
  assert analysis.rounds_to_threshold([1, 1, 1, 1, 1, 0, 0, 0, 0], 0.75) is None
  assert analysis.rounds_to_threshold([1, 1, 1], 0.5) is None  # Shorter than the window.
  # A NaN (a failed evaluation) counts as below in every window that holds it.
  assert analysis.rounds_to_threshold([1, 1, 1, 1, np.nan, 1, 1, 1], 0.5) is None
  assert analysis.rounds_to_threshold([1, 1, 1, 1, np.nan, 1, 1, 1, 1], 0.5) == 9


def test_rounds_to_threshold_counts_a_tie_as_reached():
  assert analysis.rounds_to_threshold([0.75] * 6, 0.75) == 4
  assert analysis.rounds_to_threshold([0.5, 1.0, 0.5, 1.0, 0.75], 0.75) == 4
  assert analysis.rounds_to_threshold([0.5, 1.0, 0.5, 1.0, 0.75], 0.7501) == 5  # .8125
  assert analysis.rounds_to_threshold([0.5, 1.0, 0.5, 1.0, 0.75], 0.8126) is None


def test_rounds_to_threshold_reports_rounds_not_evaluation_indices():
  # Evaluated every 5 rounds: the average of the evaluations at 5..20 is 0.75.
  assert analysis.rounds_to_threshold([0, 1, 1, 1, 1], 0.75, [5, 10, 15, 20, 25]) == 20


# --- final accuracy, grid score, late stage ---------------------------------------------


@pytest.mark.parametrize(
    'last_round, window', [(1, 1), (5, 1), (50, 5), (51, 6), (999, 100), (1000, 100), (1500, 100)]
)
def test_final_window_is_100_rounds_or_10_percent_when_shorter(last_round, window):
  assert metrics.final_window(last_round) == window


def test_final_accuracy_averages_the_final_window():
  acc = np.arange(1, 51) / 100.0  # Round r has accuracy r / 100.
  assert analysis.final_accuracy(acc) == pytest.approx(np.mean([0.46, 0.47, 0.48, 0.49, 0.50]))
  long = np.arange(1, 1501) / 1500.0
  assert analysis.final_accuracy(long) == pytest.approx(np.mean(np.arange(1401, 1501)) / 1500)
  rounds = np.arange(10, 1001, 10)  # Every 10 rounds to 1000: the last 100 rounds = 10 evals.
  assert analysis.final_accuracy(rounds / 1000.0, rounds) == pytest.approx(
      np.mean(np.arange(910, 1001, 10)) / 1000
  )


def test_grid_score_is_the_mean_of_the_last_10_rounds():
  acc = np.r_[np.zeros(40), np.arange(10)]
  assert analysis.mean_of_last_rounds(acc) == pytest.approx(4.5)
  assert analysis.mean_of_last_rounds([0.2, 0.4]) == pytest.approx(0.3)


def test_late_stage_starts_where_the_slowest_run_reached_the_threshold():
  assert analysis.slowest_round([12, 30, 7]) == 30
  assert analysis.slowest_round([12, None]) is None
  acc = [0.1, 0.2, 0.9, 0.8, 1.0]
  assert analysis.late_stage_accuracy(acc, 3) == pytest.approx(0.9)
  assert analysis.late_stage_accuracy(acc, None) is None
  assert analysis.late_stage_accuracy(acc, 6) is None


def test_series_must_be_well_formed():
  with pytest.raises(ValueError, match='non-empty'):
    analysis.final_accuracy([])
  with pytest.raises(ValueError, match='increasing'):
    analysis.final_accuracy([0.1, 0.2], [2, 1])
  with pytest.raises(ValueError, match='length'):
    analysis.rounds_to_threshold([0.1, 0.2], 0.5, [1, 2, 3])


# --- paired t-test ----------------------------------------------------------------------


def test_paired_t_test_matches_the_formula_and_scipy():
  a = [0.81, 0.83, 0.80, 0.85, 0.82]
  b = [0.78, 0.80, 0.79, 0.81, 0.80]
  result = analysis.paired_t_test(a, b)
  # d = (.03, .03, .01, .04, .02): mean .026, sample variance 1.3e-4.
  t = 0.026 / math.sqrt(1.3e-4 / 5)
  assert result.t == pytest.approx(t)
  assert result.t == pytest.approx(5.0990195, rel=1e-6)
  assert result.p == pytest.approx(2 * scipy.stats.t.sf(t, df=4))
  expected = scipy.stats.ttest_rel(a, b)
  assert (result.t, result.p) == pytest.approx((expected.statistic, expected.pvalue))
  assert result.n == 5 and result.mean_difference == pytest.approx(0.026)


def test_paired_t_test_drops_incomplete_pairs_and_needs_two():
  result = analysis.paired_t_test([1.0, None, 3.0, 5.0], [0.0, 1.0, 1.0, float('nan')])
  assert result.n == 2 and result.mean_difference == pytest.approx(1.5)
  one = analysis.paired_t_test([1.0], [0.5])
  assert one.n == 1 and math.isnan(one.t) and math.isnan(one.p)
  with pytest.raises(ValueError, match='pair'):
    analysis.paired_t_test([1.0, 2.0], [1.0])


# --- heterogeneity ----------------------------------------------------------------------


def test_statistics_of_hand_computed_distributions():
  half = [2, 2, 0, 0]
  assert analysis.volume(half) == 4 and analysis.label_diversity(half) == 2
  assert analysis.normalized_entropy(half) == pytest.approx(math.log(2) / math.log(4))
  # sum |c_i - c_j| = 16 over the ordered pairs; 16 / (2 * 4 * 4) = 0.5.
  assert analysis.gini(half) == pytest.approx(0.5)
  assert analysis.normalized_entropy([3, 3, 3, 3]) == pytest.approx(1.0)
  assert analysis.gini([3, 3, 3, 3]) == pytest.approx(0.0)
  assert analysis.normalized_entropy([4, 0, 0, 0]) == pytest.approx(0.0)
  assert analysis.gini([4, 0, 0, 0]) == pytest.approx(0.75)  # (C - 1) / C.
  assert analysis.gini([1, 2, 3]) == pytest.approx(8 / 36)  # |1-2|+|1-3|+|2-3| = 4, twice.
  assert analysis.dominant_class_fraction([3, 1]) == pytest.approx(0.75)


def test_kl_divergence_to_the_global_distribution():
  assert analysis.kl_divergence([2, 2, 0, 0], [1, 1, 1, 1]) == pytest.approx(math.log(2))
  expected = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)
  assert analysis.kl_divergence([3, 1], [5, 5]) == pytest.approx(expected)
  assert analysis.kl_divergence([1, 1], [1, 1]) == pytest.approx(0.0)
  assert analysis.kl_divergence([1, 1], [1, 0]) == math.inf


def test_client_table_and_summary():
  counts = np.array([[2, 2, 0, 0], [4, 0, 0, 0]])
  rows = analysis.client_table(['a', 'b'], counts, counts.sum(axis=0))
  assert [r['client_id'] for r in rows] == ['a', 'b']
  # p = (1, 0, 0, 0), q = (6, 2, 0, 0) / 8.
  assert rows[1]['kl_divergence'] == pytest.approx(math.log(4 / 3))
  summary = analysis.summary(rows)
  assert summary['num_clients'] == 2
  assert summary['gini_mean'] == pytest.approx(0.625)
  assert summary['gini_std'] == pytest.approx(np.std([0.5, 0.75], ddof=1))
  assert math.isnan(analysis.summary(rows[:1])['gini_std'])


def test_statistics_reject_empty_or_negative_counts():
  with pytest.raises(ValueError, match='no examples'):
    analysis.gini([0, 0])
  with pytest.raises(ValueError, match='>= 0'):
    analysis.volume([1, -1])
  with pytest.raises(ValueError, match='lie in'):
    analysis.label_counts([0, 5], 3)
  np.testing.assert_array_equal(analysis.label_counts([0, 2, 2], 4), [1, 0, 2, 0])


# --- comparison tables ------------------------------------------------------------------


def test_compare_runs_on_hand_made_runs():
  rounds = np.arange(1, 11)
  fast = np.array([0.2, 0.5, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 0.9])
  slow = np.array([0.1, 0.2, 0.3, 0.5, 0.6, 0.8, 0.8, 0.8, 0.8, 0.8])
  series = {
      'a': {0: (rounds, fast), 1: (rounds, fast + 0.05)},
      'b': {0: (rounds, slow), 1: (rounds, slow - 0.1)},
  }
  tables = analysis.compare_runs(series, thresholds=(0.68, 0.95))
  runs = {(r['algo'], r['seed']): r for r in tables['runs']}
  assert runs[('a', 0)]['final_accuracy'] == pytest.approx(0.9)  # 10 rounds: the last one.
  assert runs[('a', 0)]['rounds_to_0.68'] == 5  # (.5 + .8 + .8 + .8) / 4 = .725 at round 5.
  assert runs[('b', 0)]['rounds_to_0.68'] == 8  # .675 at round 7, .75 at round 8.
  assert runs[('b', 1)]['rounds_to_0.68'] == 9  # slow - .1: .65 at round 8, .7 at 9.
  assert runs[('a', 0)]['rounds_to_0.95'] is None
  # Late stage from round 9 (the slowest run) for every run.
  assert runs[('a', 0)]['late_stage_0.68'] == pytest.approx(0.85)
  assert runs[('b', 1)]['late_stage_0.68'] == pytest.approx(0.7)
  assert runs[('a', 0)]['late_stage_0.95'] is None
  summary = {r['algo']: r for r in tables['summary']}
  assert summary['b']['rounds_to_0.68_mean'] == pytest.approx(8.5)
  assert summary['b']['rounds_to_0.68_std'] == pytest.approx(np.std([8, 9], ddof=1))
  assert summary['b']['rounds_to_0.68_reached'] == '2/2'
  assert summary['a']['rounds_to_0.95_mean'] is None
  assert summary['a']['rounds_to_0.95_reached'] == '0/2'
  assert summary['a']['late_stage_0.68_from_round'] == 9
  ttests = {r['metric']: r for r in tables['ttests']}
  final = ttests['final_accuracy']
  expected = scipy.stats.ttest_rel([0.9, 0.95], [0.8, 0.7])
  assert (final['algo_a'], final['algo_b'], final['n']) == ('a', 'b', 2)
  assert final['mean_difference'] == pytest.approx(0.175)
  assert final['t'] == pytest.approx(expected.statistic)
  assert final['p'] == pytest.approx(expected.pvalue)
  assert ttests['rounds_to_0.68']['mean_difference'] == pytest.approx(-3.5)
  assert 'late_stage_0.95' not in ttests  # Undefined: no pairs.


# --- files ------------------------------------------------------------------------------


def test_metric_series_reads_a_training_csv(tmp_path):
  path = tmp_path / 'metrics.csv'
  path.write_text(
      'key,evaluation/sparse_categorical_accuracy,client_work/train/loss\n'
      '0,0.01,\n1,0.2,2.0\n2,,1.5\n3,0.4,1.0\n3,0.5,0.9\n'
  )
  rounds, acc = analysis.accuracy_series(str(tmp_path))
  np.testing.assert_array_equal(rounds, [1, 3])
  np.testing.assert_allclose(acc, [0.2, 0.5])  # Round 3 written twice: the last row wins.
  rounds, _ = analysis.accuracy_series(str(path), include_initial=True)
  np.testing.assert_array_equal(rounds, [0, 1, 3])
  assert analysis.runs.completed_rounds(str(tmp_path)) == 3
  assert analysis.runs.completed_rounds(str(tmp_path / 'none')) == 0
  with pytest.raises(ValueError, match='no column'):
    analysis.metric_series(str(path), 'evaluation/loss')


def test_metrics_csv_reader_drops_a_torn_last_row_only_where_asked(tmp_path):
  path = tmp_path / 'metrics.csv'
  # Round 3's row was cut short by a kill: no line break, its loss half written.
  path.write_bytes(b'key,evaluation/sparse_categorical_accuracy,client_work/train/loss\r\n'
                   b'0,0.01,\r\n1,0.2,2.0\r\n2,,1.5\r\n3,0.4,1.')
  whole = analysis.runs.whole_rows(str(path))
  assert [r['key'] for r in whole] == ['0', '1', '2']
  assert whole[2] == {'key': '2', 'evaluation/sparse_categorical_accuracy': '',
                      'client_work/train/loss': '1.5'}
  assert [r['key'] for r in analysis.runs.read_rows(str(path))] == ['0', '1', '2', '3']
  # `metric_by_round` reads every row, the torn one too (its round is trained again).
  assert analysis.runs.metric_by_round(str(path), 'client_work/train/loss') == {
      1: 2.0, 2: 1.5, 3: 1.0}
  assert analysis.runs.metric_by_round(
      str(path), 'evaluation/sparse_categorical_accuracy') == {0: 0.01, 1: 0.2, 3: 0.4}
  assert analysis.runs.metric_by_round(str(path), 'evaluation/loss') == {}
  # Several columns in one read, each as `metric_by_round` reads it alone.
  columns = ('client_work/train/loss', 'evaluation/sparse_categorical_accuracy',
             'evaluation/loss')
  assert analysis.runs.metrics_by_round(str(path), columns) == {
      c: analysis.runs.metric_by_round(str(path), c) for c in columns}
  path.write_bytes(b'key,client_work/train/loss\n1,2.0\n1,1.5\n')  # Round 1 twice.
  assert analysis.runs.metric_by_round(str(path), 'client_work/train/loss') == {1: 1.5}
  assert analysis.runs.whole_rows(str(path)) == analysis.runs.read_rows(str(path))
  path.write_bytes(b'key,client_work/tr')  # Torn header: no whole row.
  assert analysis.runs.whole_rows(str(path)) == []


def test_metrics_csv_reader_on_a_missing_file(tmp_path):
  missing = str(tmp_path / 'metrics.csv')
  assert analysis.runs.whole_rows(missing) == []
  assert analysis.runs.metric_by_round(missing, 'client_work/train/loss') == {}
  assert analysis.runs.metrics_by_round(missing, ('client_work/train/loss',)) == {
      'client_work/train/loss': {}}
  assert analysis.runs.completed_rounds(missing) == 0
  with pytest.raises(FileNotFoundError):
    analysis.runs.read_rows(missing)
  with pytest.raises(FileNotFoundError):
    analysis.metric_series(missing, 'client_work/train/loss')


def test_tables_write_not_reached_for_missing_values(tmp_path):
  rows = [{'algo': 'a', 'rounds': None, 'acc': 0.123456}, {'algo': 'b', 'rounds': 12,
                                                           'acc': float('nan')}]
  path = analysis.write_csv(str(tmp_path / 't.csv'), rows)
  with open(path, newline='') as f:
    written = list(csv.DictReader(f))
  assert written[0]['rounds'] == 'not reached' and written[1]['rounds'] == '12'
  assert float(written[0]['acc']) == 0.123456
  md = analysis.markdown_table(rows)
  assert md.splitlines()[0] == '| algo | rounds | acc |'
  assert '| a | not reached | 0.1235 |' in md and '| b | 12 | nan |' in md


def test_plots_write_pngs_that_open(tmp_path):
  rounds = np.arange(1, 6)
  curves = {'a': [(rounds, rounds / 10), (rounds, rounds / 10 + 0.1)], 'b': [(rounds, rounds / 20)]}
  analysis.accuracy_curves(curves, str(tmp_path / 'curves.png'), thresholds=(0.3,))
  analysis.heatmap([[0.1, np.nan], [0.3, 0.4]], ['1', '10'], ['0.01', '0.1'],
                   str(tmp_path / 'heat.png'), highlight=(1, 1))
  for name in ('curves.png', 'heat.png'):
    image = matplotlib.image.imread(str(tmp_path / name))
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
  r, mean, std = plots.mean_and_std([(rounds, rounds / 10), (rounds[1:], rounds[1:] / 10 + 0.2)])
  np.testing.assert_array_equal(r, [2, 3, 4, 5])
  np.testing.assert_allclose(mean, rounds[1:] / 10 + 0.1)
  np.testing.assert_allclose(std, np.full(4, np.std([0, 0.2], ddof=1)))
  with pytest.raises(ValueError, match='labels'):
    analysis.heatmap([[0.1]], ['1', '2'], ['1'], str(tmp_path / 'x.png'))
