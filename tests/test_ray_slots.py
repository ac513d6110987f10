"""A grid search on a Ray cluster gives what it gives on this machine, and ends in one
line of its own when no cluster answers or the cluster is lost; a Ray cell of each row of
the guarantees' matrix (`small_runs.MATRIX`) ends as its `launch.train` run.

The cluster is two Ray nodes on this machine, started once for the module, on loopback
addresses (127.0.0.2 and 127.0.0.3: Ray rewrites 127.0.0.1 to the machine's outward
address), each with one logical GPU (`--num-gpus=1`; nothing here runs on a GPU, Ray only
hands out its id), and two cells per GPU. Ray's home folder is the test's own, with the
file that stops its start-up from asking a cloud's metadata address where it runs, and
its usage reports off: no traffic leaves loopback. Every Ray process is stopped after the
module, and checked gone.
"""

import contextlib
import json
import os
import pathlib
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

import small_runs
import test_warm_slots
from launch import grid_search
from launch.cli import exit_status
from tff_zmg.analysis import runs as run_folders

_HEAD, _SECOND = '127.0.0.2', '127.0.0.3'
# Ray's processes, and the program's Ray driver (launch/sweeps/ray_driver.py).
_RAY_PROCESS = re.compile(r'raylet|gcs_server|ray::|site-packages/ray/|ray_driver\.py')


def _ray_processes() -> list[str]:
  found = []
  for process in psutil.process_iter(['cmdline']):
    with_args = ' '.join(process.info['cmdline'] or [])
    if _RAY_PROCESS.search(with_args):
      found.append(f'{process.pid} {with_args[:120]}')
  return found


def _free_port(host: str) -> int:
  with socket.socket() as s:
    s.bind((host, 0))
    return s.getsockname()[1]


@contextlib.contextmanager
def _two_node_cluster():
  """(address, environment, what stops it) of a two-node cluster, one logical GPU a node."""
  # Short: Ray's sockets live below it, and a socket's path has at most 107 bytes.
  folder = pathlib.Path(tempfile.mkdtemp(prefix='ray', dir='/tmp'))
  home = folder / 'home'
  home.mkdir()
  (home / 'ray_bootstrap_config.yaml').write_text('{}\n')  # Not a cloud: no metadata probe.
  # Ray's token authentication, with the cluster's own token; loopback addresses other than
  # 127.0.0.1 taken as they are (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER).
  env = dict(os.environ, HOME=str(home), RAY_USAGE_STATS_ENABLED='0',
             RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER='1', RAY_AUTH_MODE='token',
             RAY_AUTH_TOKEN=secrets.token_hex(16), RAY_TMPDIR=str(folder / 'rt'))
  ray = [sys.executable, '-m', 'ray.scripts.scripts']  # Ray's CLI, whatever its script's path.
  common = ['--num-cpus=1', '--num-gpus=1', f'--temp-dir={folder / "rt"}',
            '--disable-usage-stats']
  port = _free_port(_HEAD)
  stop = lambda: subprocess.run([*ray, 'stop', '--force'], env=env, capture_output=True,
                                timeout=180)
  try:
    subprocess.run([*ray, 'start', '--head', f'--node-ip-address={_HEAD}', f'--port={port}',
                    '--include-dashboard=false', *common],
                   env=env, check=True, capture_output=True, timeout=180)
    subprocess.run([*ray, 'start', f'--address={_HEAD}:{port}', f'--node-ip-address={_SECOND}',
                    *common], env=env, check=True, capture_output=True, timeout=180)
    yield f'{_HEAD}:{port}', env, stop
  finally:
    stop()
    deadline = time.monotonic() + 30
    while _ray_processes() and time.monotonic() < deadline:
      time.sleep(0.5)
    shutil.rmtree(folder, ignore_errors=True)
    assert _ray_processes() == []


@pytest.fixture(scope='module')
def ray_cluster():
  """One cluster for the module's tests, started once (its last test loses it)."""
  with _two_node_cluster() as cluster:
    yield cluster


_ONE_CELL = ('--client_learning_rates=0.1', '--server_learning_rates=1')


def _grid_flags(cache_dir, root, *extra, cells=('--client_learning_rates=0.1,0.03',
                                                 '--server_learning_rates=1,0.5')):
  return ('--task=emnist', '--algo=fedavg', f'--cache_dir={cache_dir}', *small_runs.FLAGS,
          *cells, '--total_rounds=2', '--nostability_check', f'--root_output_dir={root}',
          *extra)


def _grid_command(*args, **cells):
  return [sys.executable, '-m', 'launch.grid_search', *_grid_flags(*args, **cells)]


def _grid(cache_dir, root, env, *extra):
  """The grid on the cluster (a process of its own, in the cluster's environment)."""
  proc = subprocess.run(_grid_command(cache_dir, root, *extra), cwd=small_runs.REPO,
                        env=env, capture_output=True, text=True, timeout=1200)
  assert proc.returncode == 0, proc.stderr
  return proc.stdout


def _local_grid(run_program, *args, **cells):
  """The grid on this machine (in this process)."""
  code, _, err = run_program(grid_search, *_grid_flags(*args, **cells))
  assert code == 0, err


def _results(root):
  grid = os.path.join(root, 'grid_emnist_fedavg')
  best = json.load(open(os.path.join(grid, 'best.json')))
  best.pop('cost')  # Seconds.
  cells = sorted(n for n in os.listdir(grid) if n.startswith('clr'))
  return best, {n: test_warm_slots._rows(os.path.join(grid, n)) for n in cells}  # pylint: disable=protected-access


def test_an_address_where_no_cluster_answers_is_refused_in_one_line(run_program, tmp_path):
  """Ray itself would retry for minutes, printing its C++ warnings: the reason is the
  program's own TCP check's (Connection refused), made before `ray.init` is called."""
  code, _, err = run_program(grid_search, '--task=emnist', '--algo=fedavg',
                             '--data_source=synthetic', '--client_learning_rates=0.1',
                             '--server_learning_rates=1', '--total_rounds=1',
                             f'--root_output_dir={tmp_path}', '--ray_address=127.0.0.1:1')
  assert code == exit_status.BAD_INPUT, err
  (line,) = err.strip().splitlines()
  assert line.startswith('grid_search: error: --ray_address=127.0.0.1:1: no Ray cluster'
                         ' answers there (Connection refused'), err


# A sweep's driver (`runner.run_all` in the pool of a Ray cluster, as launch.grid_search
# runs its cells with --ray_address) of the runs given as {name: launch.train's arguments}.
_RAY_CELLS = """
import json, sys
from absl import flags
from launch.run import settings
from launch.sweeps import pool as pool_lib, runner
address, driver_ip, log_dir, cells = json.loads(sys.argv[1])
runs = []
for name, args in cells.items():
  flags.FLAGS.unparse_flags()
  flags.FLAGS(['train', *args])
  runs.append(runner.Run(name=name, settings=settings.settings_from_flags()))
pool = pool_lib.Pool(executor='cpu', ray_address=address, ray_driver_ip=driver_ip)
results = runner.run_all(runs, pool=pool, log_dir=log_dir, metrics=[sys.argv[2]])
print(json.dumps({name: [r.state, r.metrics] for name, r in results.items()}))
"""


@pytest.fixture(scope='module')
def matrix_on_ray(ray_cluster, tmp_path_factory):
  """The folder of each row's run (`small_runs.MATRIX`) trained as a cell on the
  cluster (one actor a node, the rows two at a time), by the row's name; the logs under
  `logs`."""
  address, env, _ = ray_cluster
  root = tmp_path_factory.mktemp('matrix_on_ray')
  cells = {row: small_runs.matrix_args(row, root, row) for row in small_runs.MATRIX}
  # A guard against a hang, not a bound on time: alone this takes about 2 minutes; beside
  # two busy loops and the other test process its cells took 4-8 minutes each, and 1,800 s
  # ran out in the fourth.
  proc = subprocess.run(
      [sys.executable, '-c', _RAY_CELLS,
       json.dumps([address, _HEAD, str(root / 'logs'), cells]), run_folders.EVAL_ACCURACY],
      cwd=small_runs.REPO, env=env, capture_output=True, text=True, timeout=3600)
  assert proc.returncode == 0, proc.stderr
  assert 'ray: 2 slots on 2 nodes' in proc.stdout, proc.stdout
  # Each actor answered with the rounds of the column asked for, as the run's folder
  # holds them (JSON made the rounds strings).
  results = json.loads(proc.stdout.strip().splitlines()[-1])
  for row in cells:
    recorded = run_folders.metric_by_round(str(root / row / 'metrics.csv'),
                                           run_folders.EVAL_ACCURACY)
    assert results[row] == ['finished', {run_folders.EVAL_ACCURACY: {
        str(r): v for r, v in recorded.items()}}] and recorded, (row, results[row])
  return root


@pytest.mark.parametrize('row', small_runs.MATRIX)
def test_a_ray_cell_equals_its_launch_train_run_bit_for_bit(row, matrix_on_ray):
  small_runs.assert_same_run(matrix_on_ray / row, small_runs.reference_run(row))
  log = open(matrix_on_ray / 'logs' / f'{row}.log').read()
  assert re.search(r'^--- warm slot \d+ on .*, Ray node ', log, re.M), log


# Last: it loses the module's cluster.
def test_a_grid_on_a_two_node_ray_cluster_equals_the_local_grid_and_resumes_when_it_is_lost(
    ray_cluster, run_program, synthetic_cache_dir, tmp_path):
  address, env, stop_cluster = ray_cluster
  _local_grid(run_program, synthetic_cache_dir, tmp_path / 'local')
  out = _grid(synthetic_cache_dir, tmp_path / 'ray', env, f'--ray_address={address}',
              f'--ray_driver_ip={_HEAD}', '--cells_per_gpu=2')
  assert 'ray: 4 slots on 2 nodes' in out
  local, on_ray = _results(tmp_path / 'local'), _results(tmp_path / 'ray')
  assert on_ray == local and len(local[1]) == 4
  # Each cell saw one GPU, as Ray gave it to its actor; the two nodes' GPUs took two each.
  logs = tmp_path / 'ray' / 'grid_emnist_fedavg' / 'logs'
  seen = []
  for name in local[1]:
    seen += re.findall(r'^--- warm slot \d+ on .*, Ray node (\S+), CUDA_VISIBLE_DEVICES=(\S+)$',
                       open(logs / f'{name}.log').read(), re.M)
  assert sorted(seen) == [(_HEAD, '0'), (_HEAD, '0'), (_SECOND, '0'), (_SECOND, '0')], seen
  # The dry run times its runs on the cluster's actors, started and ready first.
  out = _grid(synthetic_cache_dir, tmp_path / 'dry', env, f'--ray_address={address}',
              f'--ray_driver_ip={_HEAD}', '--cells_per_gpu=2', '--dry_run')
  assert 'dry run: timing 3 rounds of emnist fedavg' in out and 'estimated time: ' in out, out
  timing, = json.load(open(tmp_path / 'dry' / 'grid_emnist_fedavg' / 'dry_run'
                           / 'calibration.json')).values()
  assert timing['worker_s'] > 0 and timing['round_s'] > 0, timing
  # The cluster lost while a cell trains (a grid of one of the cells above; its actor held
  # after round 1, so that the loss comes first): the program ends in its own line, which
  # says the runs resume; the same command without --ray_address ends the cell here as
  # the grid trained here alone ended it.
  lost = _grid_command(synthetic_cache_dir, tmp_path / 'lost', f'--ray_address={address}',
                       f'--ray_driver_ip={_HEAD}', cells=_ONE_CELL)
  with small_runs.running(lost, env=env) as proc:
    log = test_warm_slots._when_training(  # pylint: disable=protected-access
        tmp_path / 'lost', proc.pid)
    actor = int(re.search(r'^--- warm slot (\d+) ', open(log).read(), re.M).group(1))
    psutil.Process(actor).suspend()
    stop_cluster()
    _, err = proc.communicate(timeout=300)
  assert proc.returncode == exit_status.WORKER_LOST, err
  (line,) = err.strip().splitlines()
  assert line.startswith(f'grid_search: error: the Ray cluster at {address} was lost'), err
  assert line.endswith('the runs resume from their checkpoints: re-run the same command'), err
  _local_grid(run_program, synthetic_cache_dir, tmp_path / 'lost', cells=_ONE_CELL)
  assert _results(tmp_path / 'lost')[1] == {'clr0.1_slr1': local[1]['clr0.1_slr1']}
