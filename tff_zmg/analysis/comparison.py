"""Comparing algorithms over seeds on one task: the FedZMG paper's result tables.

    series = {'fedzmg': {0: (rounds, acc), 1: ...}, 'fedavg': {0: ..., 1: ...}}
    tables = compare_runs(series, thresholds=(0.75, 0.85))
    tables['runs'], tables['summary'], tables['ttests']   # lists of rows (dicts)

Per run (an algorithm and a seed): the final accuracy, the rounds to each threshold and
the late-stage sustained accuracy at each threshold, which averages every run from the
same round on: the round by which the slowest of all compared runs has reached the
threshold (`metrics.slowest_round`); it is undefined ("not reached") when some run never
reaches it. Per algorithm: mean and standard deviation (ddof=1) over seeds; the mean
rounds to a threshold is "not reached" unless every seed reached it. Paired t-tests
(`metrics.paired_t_test`) of each algorithm against each later one in `series` order,
pairing runs by seed, so the runs must share their data splits.
"""

import itertools
import math
from typing import Mapping, Optional, Sequence

import numpy as np

from tff_zmg.analysis import metrics

Series = tuple[np.ndarray, np.ndarray]


def rounds_column(threshold: float) -> str:
  return f'rounds_to_{threshold:g}'


def late_stage_column(threshold: float) -> str:
  return f'late_stage_{threshold:g}'


def metric_columns(thresholds: Sequence[float]) -> list[str]:
  """The per-run metrics, in table order."""
  return (
      ['final_accuracy']
      + [rounds_column(t) for t in thresholds]
      + [late_stage_column(t) for t in thresholds]
  )


def _mean_std(values: Sequence[Optional[float]]) -> tuple[Optional[float], Optional[float]]:
  """(mean, std with ddof=1) or (None, None) when a value is missing; std NaN for one value."""
  if not values or any(v is None for v in values):
    return None, None
  values = np.asarray(values, dtype=float)
  return float(values.mean()), float(values.std(ddof=1)) if values.size > 1 else math.nan


def compare_runs(
    series: Mapping[str, Mapping[int, Series]], thresholds: Sequence[float]
) -> dict[str, list[dict]]:
  """The 'runs', 'summary' and 'ttests' tables of one task.

  Args:
    series: algorithm -> seed -> (rounds, validation accuracies) of its runs.
    thresholds: Accuracy thresholds, e.g. the task's (0.75, 0.85).

  Returns:
    {'runs': one row per run, 'summary': one row per algorithm, 'ttests': one row per
    metric and pair of algorithms with t, p and n}.
  """
  run_metrics = {}
  for algo, by_seed in series.items():
    for seed, (rounds, acc) in sorted(by_seed.items()):
      row = {'final_accuracy': metrics.final_accuracy(acc, rounds)}
      for t in thresholds:
        row[rounds_column(t)] = metrics.rounds_to_threshold(acc, t, rounds)
      run_metrics[(algo, seed)] = row
  late_start = {
      t: metrics.slowest_round([m[rounds_column(t)] for m in run_metrics.values()])
      for t in thresholds
  }
  runs = []
  for (algo, seed), row in run_metrics.items():
    rounds, acc = series[algo][seed]
    for t in thresholds:
      row[late_stage_column(t)] = metrics.late_stage_accuracy(acc, late_start[t], rounds)
    runs.append({'algo': algo, 'seed': seed, 'last_round': int(rounds[-1]), **row})

  columns = metric_columns(thresholds)
  summary = []
  for algo, by_seed in series.items():
    rows = [run_metrics[(algo, s)] for s in sorted(by_seed)]
    out = {'algo': algo, 'seeds': len(rows)}
    for c in columns:
      out[f'{c}_mean'], out[f'{c}_std'] = _mean_std([r[c] for r in rows])
    for t in thresholds:
      reached = sum(r[rounds_column(t)] is not None for r in rows)
      out[f'{rounds_column(t)}_reached'] = f'{reached}/{len(rows)}'
      out[f'{late_stage_column(t)}_from_round'] = late_start[t]
    summary.append(out)

  ttests = []
  for c in columns:
    for a, b in itertools.combinations(series, 2):
      seeds = sorted(set(series[a]) & set(series[b]))
      x = [run_metrics[(a, s)][c] for s in seeds]
      y = [run_metrics[(b, s)][c] for s in seeds]
      result = metrics.paired_t_test(x, y)
      if result.n == 0:
        continue
      paired = [
          (u, v) for u, v in zip(x, y)
          if u is not None and v is not None and np.isfinite(u) and np.isfinite(v)
      ]
      ttests.append({
          'metric': c, 'algo_a': a, 'algo_b': b,
          'mean_a': float(np.mean([u for u, _ in paired])),
          'mean_b': float(np.mean([v for _, v in paired])),
          'mean_difference': result.mean_difference,
          't': result.t, 'p': result.p, 'n': result.n,
      })
  return {'runs': runs, 'summary': summary, 'ttests': ttests}
