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

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_benchmark_prints_a_parseable_line_per_contender_with_its_own_bound(tmp_path):
  output = tmp_path / 'bench.json'
  with open(tmp_path / 'out.txt', 'w') as out:
    rc = subprocess.run(
        [sys.executable, '-m', 'launch.benchmark', '--algos=fedzmg,local_gc', '--clients_per_round=2',
         '--examples_per_client=40', '--repeats=2', '--scaling_clients=', '--concurrency=',
         f'--cache_dir={tmp_path / "data"}', f'--output={output}'],
        cwd=_REPO, stdout=out, stderr=subprocess.STDOUT, timeout=600,
    ).returncode
  text = (tmp_path / 'out.txt').read_text()
  assert rc == 0, text
  results = json.loads(output.read_text())['contenders']
  # Each algorithm's own bound runs its client rule (ZMG-SGDM, LocalGC SGDM) in plain TF.
  # Two rules, so that a plain loop is traced after another rule's mask was built.
  assert list(results) == [
      'plain_tf', 'plain_tf/zmg_sgdm', 'plain_tf/local_gc', 'tff_fedavg', 'fedzmg', 'local_gc'
  ]
  assert results['fedzmg']['bound'] == 'plain_tf/zmg_sgdm'
  assert results['local_gc']['bound'] == 'plain_tf/local_gc'
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
    for field, reference in (('paired_bound', r['bound']), ('paired_tff_fedavg', 'tff_fedavg')):
      ratios = [a / b for a, b in zip(r['seconds'], results[reference]['seconds'])]
      assert float(fields[field]) == round(sum(ratios) / 2, 2), (name, field)
      assert r['paired'][field[len('paired_'):]] == sum(ratios) / 2
    assert float(fields['peak_rss_mib']) > 100


_PLAIN_CONTENDERS = """
import sys
import tasks
from launch import benchmark
task = tasks.get('emnist', data_source='synthetic', cache_dir=sys.argv[1],
                 synthetic_settings=dict(num_train_clients=4, num_test_clients=2,
                                         mean_examples_per_client=80))
datasets = benchmark.client_datasets(task, 2, 20)
algos = ['fedavg', 'fedzmg', 'local_gc', 'global_gc', 'gcfed', 'fedrkmgc']
fns, bounds = benchmark.plain_contenders(task, algos, datasets)
for fn in fns.values():
  fn()  # Traced once already; a second round must run too.
print(sorted(fns))
print([bounds[a] for a in algos])
"""


def test_every_plain_bound_traces_with_all_six_algorithms_masks_built(tmp_path):
  # With the masks of these six algorithms built in graphs between the plain loops,
  # Keras once refused to trace plain_tf: the full benchmark crashed before timing.
  result = subprocess.run(
      [sys.executable, '-c', _PLAIN_CONTENDERS, str(tmp_path / 'data')],
      cwd=_REPO, capture_output=True, text=True, timeout=600,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  names, bounds = result.stdout.strip().splitlines()[-2:]
  assert names == str(['plain_tf', 'plain_tf/local_gc', 'plain_tf/sgdm', 'plain_tf/zmg_sgdm'])
  assert bounds == str([
      'plain_tf', 'plain_tf/zmg_sgdm', 'plain_tf/local_gc', 'plain_tf/sgdm',
      'plain_tf/local_gc', 'plain_tf/sgdm',
  ])
