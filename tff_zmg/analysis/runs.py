"""Reading what a training run wrote: its metrics.csv, flags.json, runtime.json and
communication.json.

`launch.train` writes `<run>/metrics.csv` with TFF's `tff.program.CSVFileReleaseManager`:
one row per round, the round in column `key`, round 0 being the evaluation of the
initial model, and a column per metric ('evaluation/sparse_categorical_accuracy',
'client_work/train/loss', ...); a round without evaluation leaves the column empty.
"""

import csv
import json
import os
from typing import Optional

import numpy as np

from tff_zmg import run_files

EVAL_ACCURACY = 'evaluation/sparse_categorical_accuracy'
TRAIN_LOSS = 'client_work/train/loss'


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
    by_round = {int(r['key']): float(r[column]) for r in reader if r[column] not in ('', None)}
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
