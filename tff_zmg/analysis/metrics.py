"""The papers' accuracy metrics (specification.md section 6) as plain functions on series.

A series is the validation accuracy of one run by round: `accuracies[i]` was measured
after training round `rounds[i]`. `rounds` defaults to 1, 2, ..., n (an evaluation every
round); a run evaluated every k rounds passes the rounds its CSV holds, and every window
below stays measured in rounds, not in evaluations. `tff_zmg.analysis.runs` reads both
arrays from a training run's metrics.csv.

    rounds, acc = runs.accuracy_series('runs/emnist_fedzmg_seed0/metrics.csv')
    final_accuracy(acc, rounds)              # mean of the last 100 rounds (10% if shorter)
    rounds_to_threshold(acc, 0.75, rounds)   # None when never reached for good
"""

import collections
import math
from typing import Optional, Sequence
import warnings

import numpy as np
import scipy.stats

MOVING_AVERAGE_WINDOW = 4
FINAL_ROUNDS = 100
FINAL_FRACTION = 0.1
GRID_SCORE_ROUNDS = 10

TTestResult = collections.namedtuple('TTestResult', ['t', 'p', 'n', 'mean_difference'])


def _series(accuracies, rounds) -> tuple[np.ndarray, np.ndarray]:
  """Checks a series; returns (accuracies, rounds) as float and int arrays."""
  acc = np.asarray(accuracies, dtype=float)
  if acc.ndim != 1 or acc.size == 0:
    raise ValueError(f'accuracies must be a non-empty 1-D sequence, got shape {acc.shape}')
  if rounds is None:
    return acc, np.arange(1, acc.size + 1)
  rounds = np.asarray(rounds)
  if rounds.shape != acc.shape:
    raise ValueError(
        f'rounds must match accuracies in length, got {rounds.shape} and {acc.shape}'
    )
  if np.any(np.diff(rounds) <= 0):
    raise ValueError('rounds must be strictly increasing')
  return acc, rounds.astype(int)


def moving_average(values: Sequence[float], window: int = MOVING_AVERAGE_WINDOW) -> np.ndarray:
  """Trailing means of `window` consecutive values.

  out[i] = (values[i] + ... + values[i + window - 1]) / window, for the n - window + 1
  full windows (empty when n < window); out[i] belongs to position i + window - 1, the
  last value of its window.
  """
  if int(window) != window or window < 1:
    raise ValueError(f'window must be an integer >= 1, got {window!r}')
  values = np.asarray(values, dtype=float)
  if values.size < window:
    return np.empty(0)
  return np.lib.stride_tricks.sliding_window_view(values, int(window)).mean(axis=1)


def mean_of_last_rounds(
    accuracies: Sequence[float], rounds: Optional[Sequence[int]] = None,
    num_rounds: int = GRID_SCORE_ROUNDS,
) -> float:
  """Mean accuracy over the last `num_rounds` rounds: rounds r > R - num_rounds, R the last.

  This is the grid search's score (num_rounds=10). With evaluations every k > num_rounds
  rounds the window still holds the last evaluation.
  """
  acc, rounds = _series(accuracies, rounds)
  if num_rounds < 1:
    raise ValueError(f'num_rounds must be >= 1, got {num_rounds!r}')
  return float(np.mean(acc[rounds > rounds[-1] - num_rounds]))


def final_window(last_round: int, last_rounds: int = FINAL_ROUNDS,
                 fraction: float = FINAL_FRACTION) -> int:
  """Rounds averaged by `final_accuracy`: w = min(last_rounds, max(1, ceil(fraction * R))).

  "The last 100 rounds, or the last 10% when shorter": a run of R >= 1000 rounds averages
  its last 100, a shorter one its last 10% (at least one round), so the window never
  reaches back into early training.
  """
  return int(min(last_rounds, max(1, math.ceil(fraction * last_round))))


def final_accuracy(
    accuracies: Sequence[float], rounds: Optional[Sequence[int]] = None, *,
    last_rounds: int = FINAL_ROUNDS, fraction: float = FINAL_FRACTION,
) -> float:
  """Final accuracy: the mean over the last w rounds, w = `final_window(R)` (R = last round).

  E.g. R = 1500 averages rounds 1401..1500; R = 50 averages rounds 46..50.
  """
  acc, rounds = _series(accuracies, rounds)
  return mean_of_last_rounds(acc, rounds, final_window(int(rounds[-1]), last_rounds, fraction))


def rounds_to_threshold(
    accuracies: Sequence[float], threshold: float,
    rounds: Optional[Sequence[int]] = None, *, window: int = MOVING_AVERAGE_WINDOW,
) -> Optional[int]:
  """First round from which the trailing moving average stays >= `threshold` to the end.

  With m = moving_average(accuracies, window), the answer is rounds[j + window - 1] for the
  smallest j with m[j], m[j + 1], ..., m[-1] all >= threshold (a tie counts as reached).
  A series that crosses the threshold and falls back below it has not reached it until
  it crosses for good.

  Returns:
    The round, or None when the last moving average is below the threshold (never
    reached for good; NaN counts as below) or the series is shorter than `window`.
  """
  acc, rounds = _series(accuracies, rounds)
  reached = moving_average(acc, window) >= threshold
  if reached.size == 0 or not reached[-1]:
    return None
  below = np.flatnonzero(~reached)
  first = below[-1] + 1 if below.size else 0
  return int(rounds[first + window - 1])


def slowest_round(rounds_reached: Sequence[Optional[int]]) -> Optional[int]:
  """The round by which every compared run has reached a threshold: the max, or None.

  None when any run never reached it (then there is no late stage to compare).
  """
  rounds_reached = list(rounds_reached)
  if not rounds_reached or any(r is None for r in rounds_reached):
    return None
  return int(max(rounds_reached))


def late_stage_accuracy(
    accuracies: Sequence[float], start_round: Optional[int],
    rounds: Optional[Sequence[int]] = None,
) -> Optional[float]:
  """Late-stage sustained accuracy: the mean accuracy of the rounds r >= `start_round`.

  `start_round` is where the slowest compared algorithm reaches the threshold
  (`slowest_round` of their `rounds_to_threshold`), the same for every run compared, so
  all average over the same rounds. None when `start_round` is None (some run never
  reached the threshold) or the series has no round from it on.
  """
  acc, rounds = _series(accuracies, rounds)
  if start_round is None:
    return None
  after = rounds >= start_round
  return float(np.mean(acc[after])) if after.any() else None


def paired_t_test(a: Sequence[Optional[float]], b: Sequence[Optional[float]]) -> TTestResult:
  """Paired t-test of a against b (`scipy.stats.ttest_rel`): pairs i are runs with one seed.

  t = mean(d) / (std(d, ddof=1) / sqrt(n)) with d_i = a_i - b_i, two-sided p. Pairs where
  either value is None or NaN are left out; n counts the pairs used. With n < 2, t and p
  are NaN. When every difference is equal, the variance is zero and scipy gives NaN
  (all zero) or an infinite t.

  Returns:
    TTestResult(t, p, n, mean_difference).
  """
  if len(a) != len(b):
    raise ValueError(f'a and b must pair up, got lengths {len(a)} and {len(b)}')
  pairs = [
      (float(x), float(y)) for x, y in zip(a, b)
      if x is not None and y is not None and np.isfinite(x) and np.isfinite(y)
  ]
  n = len(pairs)
  if n == 0:
    return TTestResult(math.nan, math.nan, 0, math.nan)
  x, y = map(np.array, zip(*pairs))
  mean_difference = float(np.mean(x - y))
  if n < 2:
    return TTestResult(math.nan, math.nan, n, mean_difference)
  # Zero-variance differences are a documented outcome here, not something to warn about.
  with np.errstate(divide='ignore', invalid='ignore'), warnings.catch_warnings():
    warnings.simplefilter('ignore', RuntimeWarning)
    result = scipy.stats.ttest_rel(x, y)
  return TTestResult(float(result.statistic), float(result.pvalue), n, mean_difference)
