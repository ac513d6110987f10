"""A grid's cells trained batched (`--batch_cells`, launch/sweeps/batched_cells.py) end as
the same cells trained one by one: every metric but times, every checkpoint variable, a
cell diverging in round 2 included; a batched group stopped by Ctrl-C, then by its worker's
death, resumes to the same end."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

import small_runs

# 1.6 diverges in round 2 on this data (its evaluation loss passes 10 x round 0's).
_RATES = ('0.1', '0.03', '0.01', '1.6')
_CELLS = tuple(f'clr{r}_slr1' for r in _RATES)
_ROUNDS = 5


def _grid_command(cache_dir, root, batch_cells):
  return [sys.executable, '-m', 'launch.grid_search', '--task=emnist', '--algo=fedavg',
          f'--cache_dir={cache_dir}', *small_runs.FLAGS,
          f'--client_learning_rates={",".join(_RATES)}', '--server_learning_rates=1',
          f'--total_rounds={_ROUNDS}', '--nostability_check', f'--root_output_dir={root}',
          f'--batch_cells={batch_cells}']


def _grid(root):
  return os.path.join(root, 'grid_emnist_fedavg')


def _log(root, cell):
  return os.path.join(_grid(root), 'logs', f'{cell}.log')


def _results(root):
  """best.json but its cost, each cell's metrics but times, whether it diverged, and its
  last checkpoint."""
  grid = _grid(root)
  best = json.load(open(os.path.join(grid, 'best.json')))
  best.pop('cost')  # Seconds.
  cells = {}
  for cell in _CELLS:
    run_dir = os.path.join(grid, cell)
    cells[cell] = (small_runs.metric_rows(run_dir),
                   os.path.exists(os.path.join(run_dir, 'diverged.txt')),
                   small_runs.final_checkpoint(run_dir))
  return best, cells


def _assert_same(ours, theirs):
  assert ours[0] == theirs[0]
  for cell in _CELLS:
    (rows, diverged, checkpoint), (their_rows, their_diverged, their_checkpoint) = (
        ours[1][cell], theirs[1][cell])
    assert rows == their_rows, cell
    assert diverged == their_diverged, cell
    for a, b in zip(checkpoint, their_checkpoint, strict=True):
      np.testing.assert_array_equal(a, b, err_msg=cell)


@pytest.fixture(scope='module')
def cell_by_cell(tmp_path_factory, synthetic_cache_dir):
  root = tmp_path_factory.mktemp('cell_by_cell')
  proc = subprocess.run(_grid_command(synthetic_cache_dir, root, 1), cwd=small_runs.REPO,
                        capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr
  return _results(root)


def test_four_batched_cells_equal_the_cells_trained_one_by_one(
    cell_by_cell, synthetic_cache_dir, tmp_path):
  proc = subprocess.run(_grid_command(synthetic_cache_dir, tmp_path, 4), cwd=small_runs.REPO,
                        capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr
  _assert_same(_results(tmp_path), cell_by_cell)
  rows, diverged, _ = cell_by_cell[1]['clr1.6_slr1']
  assert diverged and [r['key'] for r in rows] == ['0', '1']  # Diverged in round 2.
  logs = os.path.join(_grid(tmp_path), 'logs')
  assert 'one of 4 batched cells' in open(os.path.join(logs, 'clr0.1_slr1.log')).read()
  (worker_log,) = os.listdir(os.path.join(logs, 'workers'))
  assert "'cells': 1" in open(os.path.join(logs, 'workers', worker_log)).read()


def _when_logged(log, pattern, proc):
  """Waits until `log` has a line matching `pattern` (`proc` still running)."""
  deadline = time.monotonic() + 600
  while not (os.path.exists(log) and re.search(pattern, open(log).read(), re.M)):
    assert time.monotonic() < deadline and proc.poll() is None, f'no {pattern} in {log}'
    time.sleep(0.2)


def test_a_batched_group_stopped_by_ctrl_c_then_by_its_workers_death_ends_the_same(
    cell_by_cell, synthetic_cache_dir, tmp_path):
  """Ctrl-C in round 2: every cell stops (status 130, no worker left); the same command
  resumes them, and its worker SIGKILLed in round 4 costs one retry of the group."""
  command = _grid_command(synthetic_cache_dir, tmp_path, 4)
  log = _log(tmp_path, 'clr0.1_slr1')
  with small_runs.running(command) as proc:
    _when_logged(log, r'^round 2/', proc)
    (worker,) = small_runs.warm_slots(proc.pid)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
  assert proc.returncode == 130, err
  assert err.strip().splitlines()[-1].startswith('grid_search: error: interrupted'), err
  assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE
  for cell in _CELLS[:-1]:  # The last diverged in round 2.
    assert 'train: error: interrupted' in open(_log(tmp_path, cell)).read(), cell
  with small_runs.running(command) as proc:
    _when_logged(log, r'^round 4/', proc)
    (worker,) = small_runs.warm_slots(proc.pid)
    worker.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=900)
  assert proc.returncode == 0, err
  assert 'its warm slot died (killed by SIGKILL' in open(log).read()
  _assert_same(_results(tmp_path), cell_by_cell)
