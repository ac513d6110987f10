"""Warm slots as Ray actors, over the GPUs and machines of an existing Ray cluster.

With `--ray_address=auto` (the cluster this machine is part of) or `HOST:PORT`, a sweep's
runs are trained by Ray actors instead of local processes, each actor a warm slot
(`launch.sweeps.warm_slot`, one run per call):

  * on a node with GPUs, `--cells_per_gpu` actors per GPU, each given its share of one
    GPU (`num_gpus=1/cells_per_gpu`), so that Ray shows it that GPU alone
    (`CUDA_VISIBLE_DEVICES`);
  * on a node without, with `--executor=cpu`, one actor per `--cpus_per_cell` of its CPUs.

Every node must import this package from the same path and see the run folders at the
same path (a shared file system): the actors write each run's folder and log where the
program on this machine names them, and a run resumes from them as it would locally.
Ray itself runs in a driver process of its own (`launch.sweeps.ray_driver`, its output in
`<logs>/ray_driver.log`); without `--ray_address` nothing of Ray is imported or started.

An address where no cluster answers is refused within seconds (`CONNECT_S`), in one line.
An actor that dies while training a run costs that run only: it starts again, once, in a
fresh actor on the same node. A cluster that stops answering (its head lost) ends the
program in one line (`errors.WorkerLostError`): the runs resume from their checkpoints
when the same command is run again, here or on a cluster. `close` (the program's end,
Ctrl-C, SIGTERM) kills the actors.
"""

import contextlib
import json
import os
import select
import subprocess
import sys
import time
from typing import Optional

from absl import flags

from launch.cli import unused_flags
from launch.run import errors
from launch.sweeps import local_slots
from launch.sweeps import pool as pool_lib
from tff_zmg.runtime import children

RAY_ADDRESS = flags.DEFINE_string(
    'ray_address', pool_lib.Pool.ray_address,
    'Train the runs on a Ray cluster: auto (the cluster this machine belongs to) or'
    ' HOST:PORT of its head (`ray start --head`); every node sees the run folders at the'
    ' same path. Unset: warm slot processes on this machine (--parallel).',
)
RAY_DRIVER_IP = flags.DEFINE_string(
    'ray_driver_ip', pool_lib.Pool.ray_driver_ip,
    "With --ray_address: this machine's address as the cluster's nodes reach it (default:"
    " Ray's own choice; give it where this machine has several).",
)
CELLS_PER_GPU = flags.DEFINE_integer(
    'cells_per_gpu', pool_lib.Pool.cells_per_gpu,
    'With --ray_address: runs trained at once on each GPU of the cluster.',
    lower_bound=1,
)
CPUS_PER_CELL = flags.DEFINE_integer(
    'cpus_per_cell', pool_lib.Pool.cpus_per_cell,
    'With --ray_address and --executor=cpu: the CPUs of a node without GPUs each run takes.',
    lower_bound=1,
)
# How long the driver may take to join the cluster (Ray's own start-up included).
CONNECT_S = 20.0
# How long past a request's own time its answer may take before the cluster counts as lost.
_ANSWER_GRACE_S = 120.0
_DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'ray_driver.py')
DRIVER_LOG = 'ray_driver.log'
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def check_flags(pool: pool_lib.Pool) -> None:
  """Refuses the flags of a Ray cluster given without --ray_address, and --cpus_per_cell
  where no run takes a node's CPUs (--executor=gpu): `pool` is what the flags made."""
  if not pool.ray_address:
    unused_flags.refuse(('ray_driver_ip', 'cells_per_gpu', 'cpus_per_cell'),
                        'applies only with --ray_address')
  if pool.executor != 'cpu':
    unused_flags.refuse(('cpus_per_cell',), 'applies only with --executor=cpu')


class RaySlots(pool_lib.Slots):
  """The actors of `pool`'s Ray cluster (`pool.ray_address`), through the driver process
  (`launch.sweeps.ray_driver`)."""

  def __init__(self, pool: pool_lib.Pool, log_dir: str):
    super().__init__()
    address = self._address = pool.ray_address
    os.makedirs(log_dir, exist_ok=True)
    self._log_path = os.path.join(log_dir, DRIVER_LOG)
    with open(self._log_path, 'a') as log:
      log.write(f'=== ray driver {time.strftime("%Y-%m-%d %H:%M:%S")}:'
                f' --ray_address={address}\n')
      log.flush()
      # A process group of its own: the terminal's Ctrl-C reaches the program, which
      # closes the driver.
      self._driver = subprocess.Popen(
          children.dying_with_parent([sys.executable, '-P', _DRIVER], 'TERM'),
          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
          env=local_slots.child_environment(), process_group=0)
    self._pending = b''
    try:
      ready = self._ask({'init': dict(
          address=address, driver_ip=pool.ray_driver_ip, executor=pool.executor,
          cells_per_gpu=pool.cells_per_gpu, cpus_per_cell=pool.cpus_per_cell,
          repo_root=_REPO_ROOT)}, CONNECT_S, connecting=True)['ready']
    except BaseException:
      self._end_driver()
      raise
    self._tasks: list = [None] * ready['slots']  # (task, key) per slot
    self._keys: list = [None] * ready['slots']
    print(f'ray: {ready["slots"]} slots on {ready["nodes"]} nodes ({address})', flush=True)

  def _ask(self, request: dict, seconds: Optional[float], connecting: bool = False) -> dict:
    """The driver's answer to `request`, in `seconds` at most (None: however long).

    Raises:
      ValueError: (connecting) no cluster answers at the address, or it has no place.
      errors.WorkerLostError: the driver ended, or did not answer in time.
    """
    try:
      self._driver.stdin.write((json.dumps(request) + '\n').encode())
      self._driver.stdin.flush()
    except OSError:
      pass  # The driver has ended: said below.
    deadline = None if seconds is None else time.monotonic() + seconds
    while b'\n' not in self._pending:
      left = None if deadline is None else deadline - time.monotonic()
      if left is not None and left <= 0:
        self._lost(f'it did not answer in {seconds:.0f} s', connecting)
      readable, _, _ = select.select([self._driver.stdout], [], [], left)
      if readable:
        chunk = os.read(self._driver.stdout.fileno(), 65536)
        if not chunk:
          code = self._driver.wait()
          self._lost(f'its driver ended, {local_slots.signal_text(code)}', connecting)
        self._pending += chunk
    line, self._pending = self._pending.split(b'\n', 1)
    answer = json.loads(line)
    if 'error' in answer:
      raise ValueError(f'--ray_address={self._address}: {answer["error"]}')
    if 'lost' in answer:
      self._lost(answer['lost'], connecting)
    return answer

  def _lost(self, why: str, connecting: bool):
    self._end_driver()
    if connecting:
      raise ValueError(f'--ray_address={self._address}: no Ray cluster answers there ({why};'
                       f' Ray\'s own lines: {self._log_path})')
    raise errors.WorkerLostError(
        f'the Ray cluster at {self._address} was lost ({why}; Ray\'s own lines:'
        f' {self._log_path}); the runs resume from their checkpoints: re-run the same'
        ' command')

  def _end_driver(self) -> None:
    if self._driver.poll() is None:
      self._driver.terminate()
      try:
        self._driver.wait(timeout=30)
      except subprocess.TimeoutExpired:
        self._driver.kill()
        self._driver.wait()
    for pipe in (self._driver.stdin, self._driver.stdout):
      with contextlib.suppress(OSError):
        pipe.close()

  @property
  def size(self) -> int:
    return len(self._tasks)

  def idle(self) -> list[int]:
    return [i for i, task in enumerate(self._tasks) if task is None]

  def key(self, slot: int):
    return self._keys[slot]

  def start_all(self, count: int) -> None:
    self._ask({'start_all': count}, None)

  def start(self, slot: int, task: pool_lib.Task, key) -> None:
    self._ask({'start': {'slot': slot, 'request': task.request()}}, _ANSWER_GRACE_S)
    self._tasks[slot] = (task, key)
    self._keys[slot] = key

  def wait(self, timeout_s: float) -> list[tuple[pool_lib.Task, dict[str, pool_lib.Outcome]]]:
    if not any(self._tasks):
      time.sleep(timeout_s)
      return []
    answer = self._ask({'wait': timeout_s}, timeout_s + _ANSWER_GRACE_S)
    ended = []
    for slot, result in answer['ended']:
      task, key = self._tasks[slot]
      self._tasks[slot] = None
      if 'answer' in result:
        ended.append((task, task.outcomes(result['answer'])))
        continue
      outcomes = self.died(slot, task, key, result['died'])
      if outcomes is not None:
        ended.append((task, outcomes))
    return ended

  def close(self) -> None:
    """Kills every actor (a run still training resumes from its checkpoint next time)."""
    if self._driver.poll() is None:
      with contextlib.suppress(Exception):
        self._ask({'close': True}, 60)
    self._end_driver()
    self._tasks = [None] * len(self._tasks)
