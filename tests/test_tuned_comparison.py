"""Comparisons at tuned rates: launch.compare --tuned_from, and the untuned-defaults warning."""

import json

import pytest

from launch import compare
from launch import grid_search
from small_runs import write_found_run
from test_experiments import _TINY
from test_experiments import _rows
from test_experiments import _write_cells
from tff_zmg import analysis

# Each grid's designed 1-round scores: the pick is the client rate that is not the
# algorithm's registry default (fedavg's 0.1, fedzmg's 0.01), so a comparison that ran at
# the defaults would fail the checks of its flags.json.
_DESIGNED_SCORES = {'fedavg': {0.01: 0.5, 0.1: 0.3}, 'fedzmg': {0.01: 0.3, 0.1: 0.5}}


def test_compare_runs_each_algorithm_at_the_rates_its_grid_search_picked(
    synthetic_cache_dir, tmp_path, run_program
):
  """Two 2 x 1 grids of 1-round cells, then a comparison at their picks (1 seed, 1 round).

  The grids' cells are written beforehand with designed scores (`_DESIGNED_SCORES`):
  the grid search (run for real) picks from them without training; the comparison trains
  its two runs for real.
  """
  root = tmp_path / 'runs'
  common = ['--task=emnist', f'--cache_dir={synthetic_cache_dir}', f'--root_output_dir={root}',
            *_TINY, '--total_rounds=1']
  for algo in ('fedavg', 'fedzmg'):
    args = [*common, f'--algo={algo}', f'--experiment_name=grids/{algo}',
            '--client_learning_rates=0.01,0.1', '--server_learning_rates=1',
            '--nostability_check']
    _write_cells(args, {(c, 1.0): [a] for c, a in _DESIGNED_SCORES[algo].items()}, 1)
    rc, out, err = run_program(grid_search, *args)
    assert rc == 0 and ': started' not in out, err
  grids = root / 'grids'
  picks = {a: json.loads((grids / a / 'best.json').read_text()) for a in ('fedavg', 'fedzmg')}
  assert {a: p['client_learning_rate'] for a, p in picks.items()} == {
      'fedavg': 0.01, 'fedzmg': 0.1}
  assert analysis.find_tuned(str(grids))[('emnist', 'fedzmg')].hparams == {
      k: picks['fedzmg'][k] for k in ('client_learning_rate', 'server_learning_rate')}

  for extra, message in [
      (['--algos=fedavg,fedadam'],
       f'--tuned_from={grids} has no grid search result for fedadam on emnist; tune it'),
      (['--algos=fedavg', '--client_learning_rate=0.5'],
       '--client_learning_rate (or --algo_hparams) would replace the value fedavg was tuned'),
      (['--algos=fedavg', '--synthetic_seed=7'], 'fedavg was tuned on emnist with other data'),
      (['--algos=fedavg', '--allow_untuned', f'--tuned_from={tmp_path / "nowhere"}'],
       'is not a directory'),
  ]:
    rc, _, err = run_program(compare, *common, '--seeds=0', f'--tuned_from={grids}', *extra)
    assert rc == 2 and err.startswith('compare: error:') and message in err, err
    assert err.count('\n') == 1 and not (root / 'emnist_fedavg_seed0').exists()

  rc, out, err = run_program(compare, *common, '--algos=fedavg,fedzmg', '--seeds=0',
                          f'--tuned_from={grids}')
  assert rc == 0, err
  assert 'warning' not in err and 'compare: fedzmg on emnist at its tuned' in out
  summary = {r['algo']: r for r in _rows(root / 'compare' / 'summary.csv')}
  for algo, best in picks.items():
    recorded = json.loads((root / f'emnist_{algo}_seed0' / 'flags.json').read_text())
    for rate in ('client_learning_rate', 'server_learning_rate'):
      assert recorded['hparams'][rate] == best[rate]
    assert summary[algo]['learning_rates'] == (
        f"tuned: client_learning_rate={best['client_learning_rate']:g},"
        f" server_learning_rate={best['server_learning_rate']:g}")
  assert 'Untuned' not in (root / 'compare' / 'report.md').read_text()


def test_compare_at_default_rates_warns_and_marks_its_tables(run_program, tmp_path):
  root = str(tmp_path)
  defaults = {'client_learning_rate': 0.01, 'server_learning_rate': 1.0}  # FedZMG's.
  write_found_run(root, 'emnist', 'fedzmg', 0, [0.5] * 4, hparams=defaults)
  write_found_run(root, 'emnist', 'fedavg', 0, [0.5] * 4,
                  hparams={'client_learning_rate': 0.05, 'server_learning_rate': 1.0})
  rc, _, err = run_program(compare, '--task=emnist', '--algos=fedzmg,fedavg', '--seeds=0',
                        f'--root_output_dir={root}', '--collect_only')
  assert rc == 0, err
  assert err == ('compare: warning: the learning rates of fedzmg on emnist are untuned'
                 ' registry defaults, which can reverse a comparison; tune them with'
                 ' launch.grid_search and compare with --tuned_from=<grid directory>\n')
  text = (tmp_path / 'compare' / 'report.md').read_text()
  assert '**Untuned:** the learning rates of fedzmg on emnist' in text
  assert 'untuned defaults: client_learning_rate=0.01, server_learning_rate=1 |' in text
  assert 'given: client_learning_rate=0.05, server_learning_rate=1 |' in text
  summary = {r['algo']: r for r in _rows(tmp_path / 'compare' / 'summary.csv')}
  assert summary['fedzmg']['learning_rates'].startswith('untuned defaults:')


def test_find_tuned_reads_each_pick_once(tmp_path):
  for folder in ('a', 'b'):
    (tmp_path / folder).mkdir()
    (tmp_path / folder / 'best.json').write_text(json.dumps(dict(
        task='emnist', algo='fedavg', client_learning_rate=0.1, server_learning_rate=1.0,
        score=0.5, run_dir='clr0.1_slr1')))
  pick = analysis.tuning.read_best(str(tmp_path / 'a' / 'best.json'))
  assert pick.hparams == {'client_learning_rate': 0.1, 'server_learning_rate': 1.0}
  assert pick.run_dir == str(tmp_path / 'a' / 'clr0.1_slr1')
  with pytest.raises(ValueError, match='two grid results for fedavg on emnist'):
    analysis.find_tuned(str(tmp_path))
  (tmp_path / 'c').mkdir()
  with pytest.raises(ValueError, match='no grid search result'):
    analysis.find_tuned(str(tmp_path / 'c'))
