"""What a sweep's cells cost by warm slots against one `launch.train` process each, and
batched against one after another.

`launch.benchmark --sweep` trains the same cells up to three ways, one after another, in
one program run: each as its own `python -m launch.train` process (cold), all of them in
one warm slot (`launch.sweeps.local_slots`), one after another (warm), and in one warm
slot as batched cells, K at once (`launch.sweeps.batched_cells`). Each cold and warm
cell is timed from its start to its end as the program that runs it sees it, beside its
own rounds (the training and evaluation seconds its metrics.csv records), so that

  ratio (a cell)            = its wall time / its rounds' time
  warm / cold (the grid)    = the warm slot's wall time / the cold processes'
  batched / warm (the grid) = the batching slot's wall time / the warm slot's

say what start-up costs (a warm slot pays it once, for its first cell) and what
training cells together saves.
"""

import collections
import dataclasses
import os
import subprocess
import sys
import time

from launch.sweeps import local_slots
from launch.sweeps import pool as pool_lib
from tff_zmg import analysis
from tff_zmg import run_files

_TIME_COLUMNS = ('training_time_in_seconds', 'evaluation/evaluation_time_in_seconds')
_POLL_S = 0.2


@dataclasses.dataclass(frozen=True)
class Cell:
  """One cell: its name, the `launch.train` flags it gives (a `runner.Run`'s `given`: a
  warm slot's request) and its run folder."""

  name: str
  given: dict
  run_dir: str

  @property
  def args(self) -> tuple[str, ...]:
    """Its `launch.train` command line."""
    return tuple(f'--{flag}={value}' for flag, value in self.given.items())


def cells(common: dict, client_lrs, rounds: int, root: str) -> list[Cell]:
  """A cell per client learning rate (as its command line gives it: 6 significant
  digits): `rounds` rounds each, in `root`."""
  out = []
  for i, lr in enumerate(client_lrs):
    name = f'cell{i + 1}'
    out.append(Cell(name=name, given={
        **common, 'client_learning_rate': float(f'{lr:g}'), 'total_rounds': rounds,
        'root_output_dir': root, 'experiment_name': name}, run_dir=os.path.join(root, name)))
  return out


def rounds_seconds(run_dir: str) -> float:
  """The training and evaluation seconds a run's metrics.csv records, summed."""
  rows = analysis.runs.read_rows(os.path.join(run_dir, run_files.METRICS))
  return sum(float(row[c]) for row in rows for c in _TIME_COLUMNS if row.get(c))


def time_cold(cells_: list[Cell], log_dir: str) -> list[float]:
  """Each cell's wall seconds as a `launch.train` process of its own, one after another."""
  walls = []
  for cell in cells_:
    start = time.monotonic()
    with open(os.path.join(log_dir, f'cold-{cell.name}.log'), 'w') as log:
      code = subprocess.call([sys.executable, '-m', 'launch.train', *cell.args], stdout=log,
                             stderr=subprocess.STDOUT, env=local_slots.child_environment())
    if code:
      raise RuntimeError(f'{cell.name} failed ({local_slots.signal_text(code)}): see'
                         f' {log.name}')
    walls.append(time.monotonic() - start)
  return walls


def time_warm(cells_: list[Cell], log_dir: str) -> tuple[list[float], float]:
  """Each cell's wall seconds in one warm slot, in turn, and the whole's (the slot's
  start and its closing included)."""
  return _time_in_one_slot(cells_, log_dir, 1, 'warm')


def time_batched(cells_: list[Cell], log_dir: str, batch: int) -> tuple[list[float], float]:
  """Each group's wall seconds as `batch` batched cells in one warm slot, group after
  group, and the whole's (the slot's start and its closing included)."""
  return _time_in_one_slot(cells_, log_dir, batch, 'batched')


def _time_in_one_slot(cells_: list[Cell], log_dir: str, batch: int,
                        kind: str) -> tuple[list[float], float]:
  """Each task's wall seconds (`batch` cells at a time, one warm slot, logs named
  `<kind>-<cell>.log`), and the whole's."""
  walls = []
  start = time.monotonic()
  with local_slots.LocalSlots(1, log_dir) as slots:
    for first in range(0, len(cells_), batch):
      group = cells_[first:first + batch]
      logs = tuple(os.path.join(log_dir, f'{kind}-{cell.name}.log') for cell in group)
      began = time.monotonic()
      slots.start(0, pool_lib.Task(tuple(group), logs), key=None)
      ended = []
      while not ended:
        ended = slots.wait(_POLL_S)
      ((_, outcomes),) = ended
      failed = {name: local_slots.signal_text(outcome.status)
                for name, outcome in outcomes.items() if outcome.status}
      if failed:
        raise RuntimeError(f'{kind} cells failed ({failed}): see {", ".join(logs)}')
      walls.append(time.monotonic() - began)
  return walls, time.monotonic() - start


def batched_lines(cells_: list[Cell], walls: list[float], whole: float, batch: int,
                  warm_whole: float) -> tuple[list[str], dict]:
  """The batched cells' lines and results, against the warm slot's whole."""
  out, results = [], collections.OrderedDict()
  for index, wall in enumerate(walls):
    names = [c.name for c in cells_[index * batch:(index + 1) * batch]]
    results[f'batched/{names[0]}-{names[-1]}'] = dict(wall_s=wall)
    out.append(f'sweep/batched/{names[0]}-{names[-1]} wall_s={wall:.2f}')
  ratio = whole / warm_whole if warm_whole else float('nan')
  results['batched'] = dict(wall_s=whole, batch_cells=batch, ratio_to_warm=ratio)
  out.append(f'sweep/batched wall_s={whole:.2f} ratio_to_warm={ratio:.2f} (bound 0.5;'
             f' {batch} cells at once)')
  return out, results


def lines(cold_cells: list[Cell], cold: list[float], warm_cells: list[Cell],
          warm: list[float], warm_whole: float) -> tuple[list[str], dict]:
  """The benchmark's lines, and its results for --output (`cold` empty: not timed)."""
  out, results = [], collections.OrderedDict()
  for kind, cells_, walls in (('cold', cold_cells, cold), ('warm', warm_cells, warm)):
    for cell, wall in zip(cells_, walls):
      own = rounds_seconds(cell.run_dir)
      results[f'{kind}/{cell.name}'] = dict(wall_s=wall, rounds_s=own, ratio=wall / own)
      out.append(f'sweep/{kind}/{cell.name} wall_s={wall:.2f} rounds_s={own:.2f}'
                 f' ratio={wall / own:.2f}')
  later = [results[f'warm/{c.name}']['ratio'] for c in warm_cells[1:]]
  worst = max(later, default=float('nan'))
  results['warm'] = dict(wall_s=warm_whole, max_ratio_after_first=worst)
  to_cold = ''
  if cold:
    results['cold'] = dict(wall_s=sum(cold))
    results['warm']['ratio_to_cold'] = warm_whole / sum(cold)
    out.append(f'sweep/cold wall_s={sum(cold):.2f} (one launch.train process per cell)')
    to_cold = f' ratio_to_cold={warm_whole / sum(cold):.2f} (bound 0.5)'
  out.append(f'sweep/warm wall_s={warm_whole:.2f}{to_cold}'
             f' max_cell_ratio_after_first={worst:.2f} (bound 1.1)')
  return out, results
