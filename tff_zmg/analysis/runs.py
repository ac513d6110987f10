"""Reading what a training run wrote: its metrics.csv, flags.json, runtime.json and
communication.json.

`launch.train` writes `<run>/metrics.csv` with TFF's `tff.program.CSVFileReleaseManager`:
one row per round, the round in column `key`, round 0 being the evaluation of the
initial model, and a column per metric ('evaluation/sparse_categorical_accuracy',
'client_work/train/loss', ...); a round without evaluation leaves the column empty.
This module is the one reader of that file: `read_rows`, `whole_rows` (a torn last row
dropped), `metric_by_round` and `metric_series`.
"""

import csv
import json
import os
from typing import Optional, Sequence

import numpy as np

from tff_zmg import run_files

EVAL_ACCURACY = 'evaluation/sparse_categorical_accuracy'
TRAIN_LOSS = 'client_work/train/loss'


def read_rows(csv_path: str) -> list[dict]:
  """Every row of a metrics.csv, a torn last one included.

  Raises:
    FileNotFoundError: no such file.
  """
  with open(csv_path, newline='') as f:
    return list(csv.DictReader(f))


def whole_rows(csv_path: str) -> list[dict]:
  """A metrics.csv's rows but a torn last one (a write a kill cut short); [] without it."""
  try:
    with open(csv_path, 'rb') as f:
      data = f.read()
  except FileNotFoundError:
    return []
  text = data[:data.rfind(b'\n') + 1].decode('utf-8', 'replace')
  return list(csv.DictReader(text.splitlines()))


def metric_by_round(csv_path: str, column: str) -> dict[int, float]:
  """`{round: value}` of one column of a metrics.csv (rounds that have it; a round
  written twice: its last row; a torn last row as far as it reaches); {} without the
  file or the column."""
  return metrics_by_round(csv_path, (column,))[column]


def metrics_by_round(csv_path: str, columns: Sequence[str]) -> dict[str, dict[int, float]]:
  """`{column: {round: value}}` of several columns of a metrics.csv, read once (each as
  `metric_by_round` reads it); the file is not read when no column is asked for."""
  rows = read_rows(csv_path) if columns and os.path.exists(csv_path) else []
  return {column: _by_round(rows, column) for column in columns}


def _by_round(rows, column: str) -> dict[int, float]:
  return {int(r['key']): float(r[column]) for r in rows if r.get(column) not in (None, '')}


def metric_series(
    csv_path: str, column: str = EVAL_ACCURACY, *, include_initial: bool = False
) -> tuple[np.ndarray, np.ndarray]:
  """(rounds, values) of one column of a metrics.csv, in round order.

  Rows whose column is empty are skipped; if a round appears twice, the last row wins.
  Round 0 (the untrained model) is left out unless `include_initial`.

  Raises:
    FileNotFoundError: no such file.
    ValueError: the file has no such column.
  """
  with open(csv_path, newline='') as f:
    reader = csv.DictReader(f)
    if reader.fieldnames is None or column not in reader.fieldnames or 'key' not in (
        reader.fieldnames
    ):
      raise ValueError(
          f'{csv_path} has no column {column!r} (columns: {reader.fieldnames})'
      )
    by_round = _by_round(reader, column)
  rounds = sorted(r for r in by_round if include_initial or r > 0)
  return np.array(rounds, dtype=int), np.array([by_round[r] for r in rounds], dtype=float)


def accuracy_series(
    run: str, *, include_initial: bool = False
) -> tuple[np.ndarray, np.ndarray]:
  """(rounds, validation accuracy) of a run directory or of its metrics.csv."""
  path = os.path.join(run, run_files.METRICS) if os.path.isdir(run) else run
  return metric_series(path, EVAL_ACCURACY, include_initial=include_initial)


def completed_rounds(run: str) -> int:
  """The last round with a training loss in a run's metrics.csv (0 if none or no file)."""
  path = os.path.join(run, run_files.METRICS) if os.path.isdir(run) else run
  if not os.path.exists(path):
    return 0
  try:
    rounds, _ = metric_series(path, TRAIN_LOSS)
  except ValueError:
    return 0
  return int(rounds[-1]) if rounds.size else 0


def read_flags(run_dir: str) -> Optional[dict]:
  """The settings a run recorded in flags.json, or None when it has none."""
  path = os.path.join(run_dir, run_files.FLAGS)
  if not os.path.exists(path):
    return None
  return _read_json(path)


def read_runtime(run_dir: str) -> list[dict]:
  """The sessions of a run that runtime.json records, oldest first ([] when it has none).

  Each session is one process that trained rounds of the run (a resume is another):
  `rounds` ([first, last] it trained), `runtime`, `client_devices` (where the clients'
  computations ran, and how many), `intra_op_threads`, `evaluation` (what it covered, on
  which device) and `started` (UTC). A runtime.json from before sessions holds one such
  record, of the newest process only: it reads as one session whose `rounds` is None.
  """
  path = os.path.join(run_dir, run_files.RUNTIME)
  if not os.path.exists(path):
    return []
  record = _read_json(path)
  if isinstance(record, dict) and isinstance(record.get('sessions'), list):
    return record['sessions']
  if not isinstance(record, dict):
    raise ValueError(f'{path} holds no record of sessions; {_DAMAGED_HELP}')
  return [dict(record, rounds=None)]


def read_communication(run_dir: str) -> Optional[dict]:
  """The bytes one client of a run receives and sends per round, or None when it has no
  record: `broadcast_bytes_per_client`, `upload_bytes_per_client` and their tensor
  parts (`tff_zmg.aggregation.client_bytes`, written once per run by `launch.train`)."""
  path = os.path.join(run_dir, run_files.COMMUNICATION)
  if not os.path.exists(path):
    return None
  return _read_json(path)


# What to do about a damaged record; each is rewritten by the run that needs it.
_DAMAGED_HELP = ('move it away or delete it (the run writes it anew; what it said of past'
                 ' sessions is lost) and re-run')


def _read_json(path: str):
  """The JSON in `path`; a file that is not JSON is named in a one-line `ValueError`."""
  try:
    with open(path, encoding='utf-8') as f:
      return json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f'{path} is damaged (not JSON: {e}); {_DAMAGED_HELP}') from None
