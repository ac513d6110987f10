"""Result tables as CSV and Markdown, with one convention for missing values.

A value of None is a metric that does not exist for that run (a threshold never reached
for good): both formats write it as `NOT_REACHED`. NaN (e.g. a t-test with fewer than
two pairs, a diverged grid cell) is written as 'nan'.
"""

import csv
import math
import os
from typing import Optional, Sequence

NOT_REACHED = 'not reached'


def format_value(value, digits: int = 4) -> str:
  """A cell: None -> 'not reached', floats with `digits` significant digits."""
  if value is None:
    return NOT_REACHED
  if isinstance(value, float):
    if math.isnan(value):
      return 'nan'
    return f'{value:.{digits}g}'
  return str(value)


def _columns(rows: Sequence[dict], columns: Optional[Sequence[str]]) -> list[str]:
  if columns is not None:
    return list(columns)
  out = []
  for row in rows:
    out.extend(k for k in row if k not in out)
  return out


def write_csv(path: str, rows: Sequence[dict], columns: Optional[Sequence[str]] = None) -> str:
  """Writes rows (dicts) as CSV with full precision; returns the path."""
  columns = _columns(rows, columns)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(columns)
    for row in rows:
      writer.writerow([
          NOT_REACHED if row.get(c) is None and c in row else row.get(c, '')
          for c in columns
      ])
  return path


def markdown_table(
    rows: Sequence[dict], columns: Optional[Sequence[str]] = None, digits: int = 4
) -> str:
  """A GitHub Markdown table of rows (dicts), values through `format_value`."""
  columns = _columns(rows, columns)
  lines = ['| ' + ' | '.join(columns) + ' |', '|' + '---|' * len(columns)]
  for row in rows:
    lines.append(
        '| ' + ' | '.join(format_value(row.get(c, ''), digits) for c in columns) + ' |'
    )
  return '\n'.join(lines) + '\n'
