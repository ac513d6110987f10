"""Times a plan that `launch.reproduce --dry_run` estimated, and prints measured / estimated.

  .venv/bin/python scripts/benchmark_estimate.py [--algos=fedavg,fedzmg] [--parallel=1]

FedZMG's table 5 (EMNIST) at `--scale=ci` on synthetic data, one seed, no grid, with two
kinds of run (FedAvg and FedZMG: two client rules). The dry run times each kind (3 rounds,
kept in `<root>/.../dry_run/calibration.json`) and estimates the plan; the plan then trains
in this process, its wall time measured. Run it with nothing else on the machine: the dry
run times its rounds under the load it finds, and the plan trains under the load it finds
then. docs/experiments.md quotes the ratio.
"""

import argparse
import dataclasses
import io
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags
from launch import reproduce
from launch.sweeps import runner


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--algos', default='fedavg,fedzmg')
  parser.add_argument('--parallel', type=int, default=1)
  args = parser.parse_args()
  root = tempfile.mkdtemp(prefix='benchmark_estimate-')
  flags.FLAGS(['reproduce', '--paper=fedzmg', '--table=5', '--scale=ci',
               '--data_source=synthetic', f'--cache_dir={root}/data',
               f'--root_output_dir={root}/runs', f'--parallel={args.parallel}'])
  plan = reproduce.plan_from_flags()
  plan = dataclasses.replace(
      plan, paper=dataclasses.replace(plan.paper, algos=tuple(args.algos.split(',')),
                                      grid=None),
      scale=dataclasses.replace(plan.scale, max_seeds=1))
  pool = runner.pool_from_flags(batches=True)  # As `launch.reproduce`'s main makes it.
  counts = reproduce.dry_run(plan, pool, stream=sys.stdout)
  start = time.monotonic()
  reproduce.reproduce(plan, pool, stream=io.StringIO())
  measured = time.monotonic() - start
  print(f'runs: {counts["total"]}, kinds timed: {len(counts["timings"])}')
  print(f'estimated: {counts["seconds"]:.1f} s, measured: {measured:.1f} s, '
        f'measured / estimated: {measured / counts["seconds"]:.2f}')
  print(f'(the runs are in {root})')


if __name__ == '__main__':
  main()
