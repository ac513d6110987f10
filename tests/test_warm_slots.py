"""Warm slots train a sweep's runs as `launch.train` would, to the bit, and keep the
runner's promises: a worker that dies costs one retry of its run, Ctrl-C stops everything
and the same command resumes to the same results, and no worker outlives the program."""

import csv
import dataclasses
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

from absl import flags
import psutil
import pytest

import small_runs
from launch import grid_search
from launch.run import settings as run_settings
from launch.sweeps import local_slots
from launch.sweeps import lr_grid
from launch.sweeps import runner
from launch.sweeps import pool as pool_lib
from tff_zmg.algorithms import registry
from tff_zmg.analysis import runs as run_folders

_rows = small_runs.metric_rows


def _args(cache_dir, root, algo, name, client_lr, *extra):
  return (f'--task=emnist', f'--algo={algo}', f'--cache_dir={cache_dir}', *small_runs.FLAGS,
          '--total_rounds=2', f'--client_learning_rate={client_lr}',
          f'--root_output_dir={root}', f'--experiment_name={name}', *extra)


def _run(args, name) -> runner.Run:
  """The `runner.Run` of `launch.train` arguments."""
  return runner.Run(name=name, settings=small_runs.settings_of(args))


@pytest.mark.parametrize('overrides', [
    {'algo': 'fedzmg', 'client_learning_rate': 0.03, 'server_learning_rate': 1, 'seed': 2},
    {'algo': 'fedgps', 'protocol': 'fedgps', 'total_rounds': 5, 'model': None},
    {'algo': 'fedavg', 'workers': ['a:1'], 'worker_timeout_s': 3, 'overwrite': False,
     'divergence_factor': float('inf'), 'eval_last_rounds': 2},
    {'algo': 'fedavg', 'aggregator': 'dp_fixed', 'noise_multiplier': 2, 'clip': 0.5,
     'partition': 'dirichlet', 'num_clients': 7},
    # A rule pair: --client_rule and --server_rule on the command line.
    {'algo': 'local_gc+adam', 'adam_beta_1': 0.8, 'gc_lambda': 0.5},
])
def test_a_cell_sent_as_data_is_the_run_its_command_line_makes(overrides):
  """The settings a warm slot receives (JSON of the flags a cell gives) make the config
  `launch.train` makes of the cell's command line, whatever absl's global flags hold."""
  flags.FLAGS.unparse_flags()
  try:
    flags.FLAGS(['grid_search', '--task=emnist', '--data_source=synthetic', '--seed=5'])
    run = runner.train_run(run_settings.settings_from_flags(), 'cell', overrides)
    flags.FLAGS.unparse_flags()
    flags.FLAGS(['train', *run.args])
    from_command = run_settings.config_of(run_settings.settings_from_flags())
    flags.FLAGS.unparse_flags()
    flags.FLAGS(['train', '--task=cifar100', '--algo=scaffold', '--seed=9'])  # Not read.
    received = run_settings.settings_of(json.loads(json.dumps(run.given)))
    from_data = run_settings.config_of(received)
  finally:
    flags.FLAGS.unparse_flags()
  assert from_data == from_command
  assert json.dumps(from_data.recorded()) == json.dumps(from_command.recorded())


@pytest.mark.parametrize('row', small_runs.MATRIX)
def test_a_warm_cell_equals_its_launch_train_run_bit_for_bit(row, tmp_path):
  """Two cells of a row of the guarantees' matrix given to one warm slot together
  (--batch_cells=2), the first at half the client rate, the second the row's own run: the
  second ends as the row's `python -m launch.train` run (`small_runs.reference_run`), bit
  for bit. A process whose state holds its rates is built once and trains the two as
  batched cells; one whose clients keep state is built for each cell, and its cells train
  one after another, which the runner says once."""
  reference = small_runs.reference_run(row)
  task, algo = small_runs.matrix_flag(row, 'task'), small_runs.matrix_flag(row, 'algo')
  spec = registry.get(algo)
  rebuilds = spec.stateful
  warm = tmp_path / 'warm'
  rate = spec.defaults['client_learning_rate'] / 2
  runs = [_run(small_runs.matrix_args(row, warm, 'a', f'--client_learning_rate={rate}'), 'a'),
          _run(small_runs.matrix_args(row, warm, 'b'), 'b')]
  stream = io.StringIO()
  accuracy = run_folders.EVAL_ACCURACY
  with local_slots.LocalSlots(1, str(tmp_path / 'logs')) as slots:
    results = runner.run_all(runs, pool=pool_lib.Pool(executor='cpu', batch_cells=2),
                             log_dir=str(tmp_path / 'logs'), slots=slots, stream=stream,
                             metrics=(accuracy,))
  assert {name: r.state for name, r in results.items()} == {'a': runner.FINISHED,
                                                             'b': runner.FINISHED}
  # Each run's answer carries the rounds of the column asked for, as its folder holds them.
  for name, result in results.items():
    recorded = run_folders.metric_by_round(str(warm / name / 'metrics.csv'), accuracy)
    assert recorded and result.metrics == {accuracy: recorded}, name
  alone = f'batched cells: {algo} cells train one after another: its clients keep state'
  assert (alone in stream.getvalue()) == rebuilds, stream.getvalue()
  small_runs.assert_same_run(warm / 'b', reference)
  worker_log = open(next((tmp_path / 'logs' / 'workers').iterdir())).read()
  assert f"built so far: {{'task': 1, 'process': {2 if rebuilds else 1}" in worker_log
  # The cell's log reads as `launch.train`'s output, under the command that trains it alone.
  log = open(tmp_path / 'logs' / 'b.log').read()
  assert log.startswith('=== start ') and f' -m launch.train --task={task}' in log
  assert 'round 2/2' in log and 'summary: {' in log


_CELLS = ('clr0.1_slr1', 'clr0.03_slr1', 'clr0.01_slr1')


def _grid_flags(cache_dir, root, *extra):
  """`launch.grid_search`'s flags: three cells of two rounds, each scored by its last."""
  return ('--task=emnist', '--algo=fedavg', f'--cache_dir={cache_dir}', *small_runs.FLAGS,
          '--client_learning_rates=0.1,0.03,0.01', '--server_learning_rates=1',
          '--score_rounds=1', '--nostability_check', f'--root_output_dir={root}', *extra)


def _grid_command(cache_dir, root, *extra):
  return [sys.executable, '-m', 'launch.grid_search',
          *_grid_flags(cache_dir, root, '--total_rounds=2', *extra)]


def _halving_flags(cache_dir, root):
  """The same cells searched by halving: all to 2 rounds (the grid above), one on to 4."""
  return _grid_flags(cache_dir, root, '--search=halving', '--rung_rounds=2,4')


def _grid_results(root):
  """What a grid leaves: best.json but its seconds, grid.csv but its cells' paths, each
  cell's metrics.csv but its seconds and the arrays of its newest checkpoint, bit for bit."""
  grid = os.path.join(root, 'grid_emnist_fedavg')
  best = json.load(open(os.path.join(grid, 'best.json')))
  best.pop('cost')  # Seconds.
  with open(os.path.join(grid, 'grid.csv')) as f:
    table = [{k: v for k, v in row.items() if k != 'output_dir'} for row in csv.DictReader(f)]
  cells = {name: (_rows(os.path.join(grid, name)),
                  [(a.dtype.str, a.shape, a.tobytes())
                   for a in small_runs.final_checkpoint(os.path.join(grid, name))])
           for name in _CELLS}
  return best, table, cells


@pytest.fixture
def whole_grid(run_program, synthetic_cache_dir, tmp_path_factory):
  """The grid of `_grid_command`, uninterrupted, made once (launch.grid_search in this
  process): (its root, `_grid_results`)."""

  def make():
    root = tmp_path_factory.mktemp('whole')
    code, _, err = run_program(grid_search,
                               *_grid_flags(synthetic_cache_dir, root, '--total_rounds=2'))
    assert code == 0, err
    return root, _grid_results(root)

  return small_runs.made_once(('test_warm_slots', 'whole'), make)


@pytest.fixture
def halving_grid(whole_grid, run_program, synthetic_cache_dir, tmp_path_factory):
  """The halving search of `_halving_flags`, uninterrupted, made once: (its root,
  `_grid_results`). Its first rung is `whole_grid`'s cells, so it continues a copy of
  them (launch.grid_search in this process)."""

  def make():
    root = tmp_path_factory.mktemp('halving')
    shutil.copytree(whole_grid[0] / 'grid_emnist_fedavg', root / 'grid_emnist_fedavg')
    code, out, err = run_program(grid_search, *_halving_flags(synthetic_cache_dir, root))
    assert code == 0, err
    assert out.count(': already finished') == 3, out  # Rung 1: the grid's cells.
    return root, _grid_results(root)

  return small_runs.made_once(('test_warm_slots', 'halving'), make)


def _when_training(root, pid):
  """Waits until the grid program `pid` trains a round of a cell; that cell's log."""
  logs = os.path.join(root, 'grid_emnist_fedavg', 'logs')
  deadline = time.monotonic() + 600
  while time.monotonic() < deadline:
    for name in sorted(os.listdir(logs)) if os.path.isdir(logs) else []:
      path = os.path.join(logs, name)
      if name.endswith('.log') and re.search(r'^round 1/2', open(path).read(), re.M):
        return path
    time.sleep(0.2)
  raise AssertionError(f'no round trained under {logs}')


def test_a_worker_killed_mid_cell_costs_one_retry_and_the_same_best(
    whole_grid, synthetic_cache_dir, tmp_path):
  with small_runs.running(_grid_command(synthetic_cache_dir, tmp_path)) as proc:
    log = _when_training(tmp_path, proc.pid)
    (worker,) = small_runs.warm_slots(proc.pid)
    worker.send_signal(signal.SIGKILL)
    out, err = proc.communicate(timeout=900)
  assert proc.returncode == 0, err
  assert 'its warm slot died (killed by SIGKILL' in open(log).read()
  assert _grid_results(tmp_path) == whole_grid[1]
  assert 'picked:' in out


def test_ctrl_c_mid_search_then_the_same_command_gives_the_same_results(
    whole_grid, run_program, synthetic_cache_dir, tmp_path):
  """The cell under way stops between rounds, as launch.train: its log ends in the line
  that names the last round in its metrics.csv (or it ended first)."""
  command = _grid_command(synthetic_cache_dir, tmp_path)
  with small_runs.running(command) as proc:
    log = _when_training(tmp_path, proc.pid)
    workers = small_runs.warm_slots(proc.pid)
    assert workers
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
  assert proc.returncode == 130, err
  assert err.strip().splitlines()[-1].startswith('grid_search: error: interrupted'), err
  for worker in workers:
    assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE
  cell = os.path.join(tmp_path, 'grid_emnist_fedavg', os.path.basename(log)[:-len('.log')])
  ended = re.findall(r'^train: error: .*$', open(log).read(), re.M)
  if ended:
    kept = run_folders.completed_rounds(cell)
    assert ended == [f'train: error: interrupted after round {kept}; re-run the same command'
                     ' to resume'], ended
  else:
    assert 'summary: {' in open(log).read()
  # The same command again (in this process, to save a TensorFlow start-up).
  code, _, err = run_program(grid_search,
                             *_grid_flags(synthetic_cache_dir, tmp_path, '--total_rounds=2'))
  assert code == 0, err
  assert _grid_results(tmp_path) == whole_grid[1]


def test_evaluation_due_with_eval_last_rounds_is_round_0_and_the_last_rounds():
  from launch.run import rounds  # pylint: disable=g-import-not-at-top
  config = _run(_args('/tmp', '/tmp', 'fedavg', 'x', 0.1), 'x').config
  due = lambda **changes: [r for r in range(11) if rounds.evaluation_due(
      dataclasses.replace(config, total_rounds=10, **changes), r)]
  assert due() == list(range(11))
  assert due(eval_last_rounds=3) == [0, 8, 9, 10]
  assert due(eval_last_rounds=3, rounds_per_eval=2) == [0, 8, 10]
  assert due(eval_last_rounds=20) == list(range(11))


def test_grid_cells_evaluate_only_the_rounds_their_scores_read(halving_grid):
  """Halving with rungs of 2 and 4 rounds, each rung scored by its last round: every
  cell evaluates rounds 0 and 2, the one promoted also 4, and flags.json says so."""
  grid = halving_grid[0] / 'grid_emnist_fedavg'
  evaluated = {}
  for cell in _CELLS:
    rows = _rows(grid / cell)
    evaluated[cell] = [int(r['key']) for r in rows if r['evaluation/loss']]
    assert json.load(open(grid / cell / 'flags.json'))['eval_last_rounds'] == 1
  assert sorted(evaluated.values()) == [[0, 2], [0, 2], [0, 2, 4]], evaluated


def _copy_grid(reference_root, root):
  shutil.copytree(reference_root / 'grid_emnist_fedavg', root / 'grid_emnist_fedavg')
  return root / 'grid_emnist_fedavg'


def _save_cut_short(cell_dir, round_num):
  """The checkpoint of `round_num` as a kill during its background save, or a full disk,
  leaves it: TFF's temporary folder."""
  folder = cell_dir / 'checkpoints'
  os.rename(folder / f'program_state_{round_num}', folder / f'program_state_{round_num}_temp77')


def _twice(run_program, flags_):
  """`launch.grid_search` run twice with the same flags (in this process): each stdout."""
  outs = []
  for _ in range(2):
    code, out, err = run_program(grid_search, *flags_)
    assert code == 0, err
    outs.append(out)
  return outs


def test_a_grid_resumes_cells_a_kill_or_a_full_disk_left_unfinished_to_the_same_results(
    whole_grid, run_program, synthetic_cache_dir, tmp_path):
  """Three cells of the grid as an interruption leaves them, each with all its rounds in
  metrics.csv: its last checkpoint only TFF's temporary folder (killed during its
  background save; a full disk), its last row torn (a checkpoint on the disk beside it: a
  damaged disk), the evaluation it is scored by gone. The same command resumes each of
  them; run again, it trains nothing; the grid is the uninterrupted one."""
  grid = _copy_grid(whole_grid[0], tmp_path)
  saved, torn, unevaluated = (grid / cell for cell in _CELLS)
  _save_cut_short(saved, 2)
  data = (torn / 'metrics.csv').read_bytes()
  (torn / 'metrics.csv').write_bytes(data[:data.rstrip().rfind(b'\n') + 8])
  with open(unevaluated / 'metrics.csv') as f:
    reader = csv.DictReader(f)
    rows, columns = list(reader), reader.fieldnames
  rows[-1].update({k: '' for k in columns if k.startswith('evaluation/')})
  with open(unevaluated / 'metrics.csv', 'w', newline='') as f:
    writer = csv.DictWriter(f, columns)
    writer.writeheader()
    writer.writerows(rows)
  first, second = _twice(run_program,
                         _grid_flags(synthetic_cache_dir, tmp_path, '--total_rounds=2'))
  assert 'already' not in first and first.count(': started') == 3, first
  assert second.count(': already finished') == 3 and 'started' not in second, second
  logs = grid / 'logs'
  assert 'removed what interrupted saves left: checkpoints/program_state_2_temp77' in (
      logs / f'{_CELLS[0]}.log').read_text()
  assert ('metrics.csv ends at round 1: resuming from the checkpoint of round 1, the'
          ' checkpoints of round 2 are written again') in (logs / f'{_CELLS[1]}.log').read_text()
  assert 'metrics.csv lacks the evaluation of round 2: resuming from' in (
      logs / f'{_CELLS[2]}.log').read_text()
  assert _grid_results(tmp_path) == whole_grid[1]


def test_a_kill_during_rung_ones_last_save_changes_no_pick(
    whole_grid, halving_grid, run_program, synthetic_cache_dir, tmp_path):
  """Issue 54's case: a halving search killed while the checkpoint of rung 1's last
  round of the cell it then promotes was written in the background. Its metrics.csv
  holds that round: the cell was taken as done, continued from the round before without
  evaluating the round again, and the next run scored it NaN and picked another cell.
  Now the same command trains that round again first; twice, the search is the
  uninterrupted one."""
  best = halving_grid[1][0]
  promoted = lr_grid.cell_name(best['client_learning_rate'], best['server_learning_rate'])
  grid = _copy_grid(whole_grid[0], tmp_path)  # Rung 1 done, the search stopped there.
  _save_cut_short(grid / promoted, 2)
  first, second = _twice(run_program, _halving_flags(synthetic_cache_dir, tmp_path))
  assert f'{promoted}: started' in first.split('rung 2/2')[0], first
  assert second.count(': already finished') == 3 + 1, second
  assert _grid_results(tmp_path) == halving_grid[1]


