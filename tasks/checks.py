"""Checks of numeric arguments: one place, one message format.

Every check raises `ValueError` whose message names the parameter, the value received
and the valid range, e.g. `momentum must be in [0, 1), got 1.5`. Real-number checks
return the value as a Python `float`, `check_integer` as an `int`, so callers can store
it.

They live here, in the package that imports nothing of ours, so that `tasks` and the
library (`tff_zmg.validation` re-exports them) share them without `tasks` importing
`tff_zmg`.
"""

import math
from typing import Any

import numpy as np

FLOAT32_MAX = float(np.finfo(np.float32).max)
INT64_MAX = int(np.iinfo(np.int64).max)


def _as_real(name: str, value: Any) -> float:
  """Returns `value` as a float, or raises if it is not a real number."""
  if isinstance(value, bool):
    raise ValueError(f'{name} must be a real number, got {value!r}')
  try:
    number = float(value)
  except (TypeError, ValueError, OverflowError):
    raise ValueError(f'{name} must be a real number, got {value!r}') from None
  if math.isfinite(number) and abs(number) > FLOAT32_MAX:
    raise ValueError(
        f'{name} must be at most {FLOAT32_MAX:.6g} in magnitude (a float32), got {value!r}'
    )
  return number


def check_positive(name: str, value: Any) -> float:
  """Checks `value > 0` (NaN and infinity rejected)."""
  number = _as_real(name, value)
  if not (number > 0 and math.isfinite(number)):
    raise ValueError(f'{name} must be > 0, got {value!r}')
  return number


def check_non_negative(name: str, value: Any) -> float:
  """Checks `value >= 0` (NaN and infinity rejected)."""
  number = _as_real(name, value)
  if not (number >= 0 and math.isfinite(number)):
    raise ValueError(f'{name} must be >= 0, got {value!r}')
  return number


def check_in_range(
    name: str,
    value: Any,
    low: float,
    high: float,
    *,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
) -> float:
  """Checks that `value` lies in the interval from `low` to `high`.

  Args:
    name: The parameter's name, used in the error message.
    value: The value to check.
    low: Lower end of the interval.
    high: Upper end of the interval.
    low_inclusive: Whether `low` itself is allowed.
    high_inclusive: Whether `high` itself is allowed.

  Returns:
    `value` as a float.

  Raises:
    ValueError: If `value` is not a real number or lies outside the interval,
      e.g. `momentum must be in [0, 1), got 1.5`.
  """
  number = _as_real(name, value)
  above_low = number >= low if low_inclusive else number > low
  below_high = number <= high if high_inclusive else number < high
  if not (above_low and below_high):
    interval = (
        f'{"[" if low_inclusive else "("}{low:g}, '
        f'{high:g}{"]" if high_inclusive else ")"}'
    )
    raise ValueError(f'{name} must be in {interval}, got {value!r}')
  return number


def check_integer(name: str, value: Any, minimum: int) -> int:
  """Checks that `value` is an integer (not a bool) `>= minimum`.

  Unlike the real-number checks this returns a Python `int`; floats such as
  `2.0` are rejected, e.g. `seed must be an integer >= 0, got -1`, and so are integers
  beyond int64 (`INT64_MAX`).
  """
  if (
      isinstance(value, bool)
      or not isinstance(value, (int, np.integer))
      or value < minimum
  ):
    raise ValueError(f'{name} must be an integer >= {minimum}, got {value!r}')
  if value > INT64_MAX:
    raise ValueError(
        f'{name} must be an integer in [{minimum}, {INT64_MAX}] (an int64), got {value!r}'
    )
  return int(value)
