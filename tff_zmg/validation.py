"""Argument checks shared by the package: one place, one message format.

Every check raises `ValueError` whose message names the parameter, the value received and
the valid range, e.g. `momentum must be in [0, 1), got 1.5`. The numeric checks live in
`tasks.checks` (so that `tasks` needs nothing of `tff_zmg`) and are re-exported here;
real-number checks return the value as a Python `float` so callers can store it.
"""

from collections.abc import Collection, Iterable, Sequence
from typing import Any, Optional

import numpy as np

# The numeric checks, re-exported: callers keep `validation.check_positive(...)`.
from tasks.checks import check_in_range
from tasks.checks import check_integer
from tasks.checks import check_non_negative
from tasks.checks import check_positive


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
