"""Argument checks shared by the package: one place, one message format.

Every check raises `ValueError` whose message names the parameter, the value
received and the valid range, e.g. `momentum must be in [0, 1), got 1.5`.
Numeric checks return the value as a Python `float` so callers can store it.
"""

import math
from collections.abc import Collection, Iterable, Sequence
from typing import Any, Optional

import numpy as np


def _as_real(name: str, value: Any) -> float:
  """Returns `value` as a float, or raises if it is not a real number."""
  if isinstance(value, bool):
    raise ValueError(f'{name} must be a real number, got {value!r}')
  try:
    return float(value)
  except (TypeError, ValueError):
    raise ValueError(f'{name} must be a real number, got {value!r}') from None


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
  `2.0` are rejected, e.g. `seed must be an integer >= 0, got -1`.
  """
  if (
      isinstance(value, bool)
      or not isinstance(value, (int, np.integer))
      or value < minimum
  ):
    raise ValueError(f'{name} must be an integer >= {minimum}, got {value!r}')
  return int(value)


def check_bool(name: str, value: Any) -> bool:
  """Checks that `value` is a Python or NumPy bool."""
  if not isinstance(value, (bool, np.bool_)):
    raise ValueError(f'{name} must be a bool (True or False), got {value!r}')
  return bool(value)


def check_mask(
    name: str, mask: Optional[Iterable[Any]]
) -> Optional[tuple[bool, ...]]:
  """Checks a tensor mask: `None` or a sequence of bools; returns a tuple."""
  if mask is None:
    return None
  if isinstance(mask, (str, bytes)) or not isinstance(mask, Iterable):
    raise ValueError(
        f'{name} must be None or a sequence of bools, got {mask!r}'
    )
  mask = tuple(mask)
  for i, entry in enumerate(mask):
    check_bool(f'{name}[{i}]', entry)
  return tuple(bool(entry) for entry in mask)


def check_length(name: str, value: Sequence[Any], expected: int) -> None:
  """Checks `len(value) == expected`."""
  if len(value) != expected:
    raise ValueError(
        f'{name} must have length {expected}, got length {len(value)}'
    )


def check_known_keys(
    name: str, keys: Iterable[str], allowed: Collection[str]
) -> None:
  """Checks that every key in `keys` is one of `allowed`."""
  unknown = sorted(set(keys) - set(allowed))
  if unknown:
    raise ValueError(
        f'{name} has unknown keys {unknown}; valid keys are {sorted(allowed)}'
    )
