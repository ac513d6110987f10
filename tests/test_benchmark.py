"""launch.benchmark end to end on a tiny round: the lines users parse agree with its data.

Timings themselves are not asserted (the benchmark prints ratios; a timed test on a shared
machine could only flake). A separate process: the benchmark's flags share names with
launch.train's, which other tests import.
"""

import json
import os
import re
import subprocess
import sys

import pytest

from launch.benchmarking import sweep
from tasks import evaluation as tasks_evaluation

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A stateless algorithm whose rule projects the feature layers only, and a stateful one:
# both kinds of bound, the second traced after the first's mask was built in a graph
# (Keras once refused that).
_ALGOS = ['gcfed', 'fedrkmgc']


def test_benchmark_prints_a_parseable_line_per_contender_with_its_own_bound(tmp_path):
  output = tmp_path / 'bench.json'
  with open(tmp_path / 'out.txt', 'w') as out:
    rc = subprocess.run(
        [sys.executable, '-m', 'launch.benchmark', f'--algos={",".join(_ALGOS)}',
         '--clients_per_round=2', '--examples_per_client=20', '--repeats=2',
         '--synthetic_test_clients=2',
         '--scaling_clients=', '--concurrency=', f'--cache_dir={tmp_path / "data"}',
         f'--output={output}'],
        cwd=_REPO, stdout=out, stderr=subprocess.STDOUT, timeout=900,
    ).returncode
  text = (tmp_path / 'out.txt').read_text()
  assert rc == 0, text
  report = json.loads(output.read_text())
  results = report['contenders']
  # docs/performance.md's tables are rendered from this JSON, by this command.
  assert report['command'][-1] == f'--output={output}' and report['cpus'] == os.cpu_count()
  table = subprocess.run(
      [sys.executable, 'scripts/benchmark_table.py', str(output)],
      cwd=_REPO, capture_output=True, text=True, check=True,
  ).stdout
  assert all(f'\n| {name} | ' in table for name in results), table
  assert list(results) == [
      'plain_tf', 'plain_tf_keras', 'tff_fedavg', 'tff_fedavg_stock', 'in_process/tff_fedavg',
      *(name for algo in _ALGOS
        for name in (f'plain_tf/{algo}', algo, f'in_process/{algo}')),
  ]
  # Each algorithm's bound is its own client function in plain TF, on either runtime.
  for algo in _ALGOS:
    assert results[algo]['bound'] == f'plain_tf/{algo}'
    assert results[f'in_process/{algo}']['bound'] == f'plain_tf/{algo}'
  assert results['tff_fedavg']['bound'] == 'plain_tf'
  assert results['in_process/tff_fedavg']['bound'] == 'plain_tf'
  # Warm-up and 2 repeats of 3 in-process contenders with 2 clients, all on the host CPU.
  (device, count), = report['in_process_client_devices'].items()
  assert device.endswith('/device:CPU:0') and count == 3 * 3 * 2
  assert report['worker_intra_op_threads'] == max(1, os.cpu_count() // 2)
  medians = {name: r['median_s'] for name, r in results.items()}
  for name, r in results.items():
    assert len(r['seconds']) == 2 and r['median_s'] == sum(r['seconds']) / 2
    line = re.search(rf'^{re.escape(name)} +(.*)$', text, re.MULTILINE)
    assert line, text
    fields = dict(f.split('=') for f in line.group(1).split())
    expected = {
        'ratio': medians[r['bound']], 'ratio_plain_sgd': medians['plain_tf'],
        'ratio_tff_fedavg': medians['tff_fedavg'],
    }
    for field, denominator in expected.items():
      assert float(fields[field]) == round(r['median_s'] / denominator, 2), (name, field)
    # Per-repeat ratios: repeat i of a contender over repeat i of the reference.
    references = (
        ('paired_bound', r['bound']), ('paired_plain_sgd', 'plain_tf'),
        ('paired_tff_fedavg', 'tff_fedavg'),
    )
    for field, reference in references:
      ratios = [a / b for a, b in zip(r['seconds'], results[reference]['seconds'])]
      assert float(fields[field]) == round(sum(ratios) / 2, 2), (name, field)
      assert r['paired'][field[len('paired_'):]] == sum(ratios) / 2
    assert float(fields['peak_rss_mib']) > 100
  # The evaluation beside the fastest of its floors (a bare forward pass at each candidate
  # batch), and a round as users run it beside both floors.
  evaluation = report['evaluation']
  floors = [f'plain_tf_forward/{b}' for b in tasks_evaluation.BATCH_CANDIDATES]
  floors = floors[:len([n for n in evaluation if n.startswith('plain_tf_forward/')])]
  assert floors and list(evaluation) == [*floors, 'evaluation', 'tff_fed_eval',
                                         *(f'round_as_run/{algo}' for algo in _ALGOS)]
  fastest = min(floors, key=lambda n: evaluation[n]['median_s'])
  assert f'evaluation floor: {fastest}, the fastest bare forward pass' in text
  floor = evaluation[fastest]['median_s']
  for name in (*floors, 'evaluation', 'tff_fed_eval'):
    assert evaluation[name]['bound'] == fastest
    assert evaluation[name]['ratio'] == evaluation[name]['median_s'] / floor
    assert re.search(rf'^{name} +median_s=.* ratio={evaluation[name]["ratio"]:.2f} ', text,
                     re.MULTILINE), text
  for algo in _ALGOS:
    line = evaluation[f'round_as_run/{algo}']
    assert line['train_s'] == results[f'in_process/{algo}']['median_s']
    assert line['total_s'] == line['train_s'] + evaluation['evaluation']['median_s']
    assert line['floor_s'] == results[f'plain_tf/{algo}']['median_s'] + floor
    assert line['ratio_tff_fed_eval'] == line['total_s'] / (
        line['train_s'] + evaluation['tff_fed_eval']['median_s'])
    assert f'round_as_run/{algo}' in text


def test_a_sweep_cell_costs_the_training_and_evaluation_seconds_of_its_metrics_csv(tmp_path):
  (tmp_path / 'metrics.csv').write_text(
      'key,training_time_in_seconds,evaluation/evaluation_time_in_seconds,'
      'client_work/train/loss\n0,,0.5,\n1,1.25,,2.0\n2,1.5,0.25,1.5\n')
  assert sweep.rounds_seconds(str(tmp_path)) == pytest.approx(0.5 + 1.25 + 1.5 + 0.25)


def test_an_unknown_algorithm_fails_before_any_timing(tmp_path):
  result = subprocess.run(
      [sys.executable, '-m', 'launch.benchmark', '--algos=fedavg,fedzmgg',
       f'--cache_dir={tmp_path / "data"}'],
      cwd=_REPO, capture_output=True, text=True, timeout=300,
  )
  assert result.returncode != 0
  assert 'fedzmgg' in result.stderr and 'warm-up' not in result.stdout


@pytest.mark.parametrize('flag, line', [
    # --local_workers compares two ways of splitting a round among workers: one is none.
    ('--local_workers=1', '--local_workers must be 0 (not timed) or at least 2'),
    ('--sweep_cells=3', '--sweep_cells applies only with --sweep'),
])
def test_a_flag_it_would_not_use_is_refused_before_any_timing(tmp_path, flag, line):
  result = subprocess.run(
      [sys.executable, '-m', 'launch.benchmark', flag, f'--cache_dir={tmp_path / "data"}'],
      cwd=_REPO, capture_output=True, text=True, timeout=300,
  )
  assert result.returncode == 2, result.stderr
  (error,) = result.stderr.splitlines()
  assert error.startswith('benchmark: error: ') and line in error, result.stderr
  assert 'warm-up' not in result.stdout
