"""Warm workers as Ray actors, over the GPUs and machines of an existing Ray cluster.

With `--ray_address=auto` (the cluster this machine is part of) or `HOST:PORT`, a sweep's
runs are trained by Ray actors instead of local processes, each actor a warm worker
(`launch.sweeps.warm_worker.run_cell`, one run per call):

  * on a node with GPUs, `--cells_per_gpu` actors per GPU, each given its share of one
    GPU (`num_gpus=1/cells_per_gpu`), so that Ray shows it that GPU alone
    (`CUDA_VISIBLE_DEVICES`);
  * on a node without, with `--executor=cpu`, one actor per `--cpus_per_cell` of its CPUs.

Every node must import this package from the same path and see the run folders at the
same path (a shared file system): the actors write each run's folder and log where the
program on this machine names them, and a run resumes from them as it would locally.
Without `--ray_address` nothing of Ray is imported or started.

An actor that dies while training a run costs that run only: it starts again, once, in a
fresh actor on the same node. `close` (the program's end, Ctrl-C, SIGTERM) kills the
actors; the runs they were training resume from their checkpoints next time.
"""

import contextlib
import os
import time

from absl import flags

from launch.sweeps import workers

RAY_ADDRESS = flags.DEFINE_string(
    'ray_address', None,
    'Train the runs on a Ray cluster: auto (the cluster this machine belongs to) or'
    ' HOST:PORT of its head (`ray start --head`); every node sees the run folders at the'
    ' same path. Unset: warm worker processes on this machine (--parallel).',
)
RAY_DRIVER_IP = flags.DEFINE_string(
    'ray_driver_ip', None,
    "With --ray_address: this machine's address as the cluster's nodes reach it (default:"
    " Ray's own choice; give it where this machine has several).",
)
CELLS_PER_GPU = flags.DEFINE_integer(
    'cells_per_gpu', 1, 'With --ray_address: runs trained at once on each GPU of the cluster.',
    lower_bound=1,
)
CPUS_PER_CELL = flags.DEFINE_integer(
    'cpus_per_cell', 2,
    'With --ray_address and --executor=cpu: the CPUs of a node without GPUs each run takes.',
    lower_bound=1,
)
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _CellActor:
  """A warm worker inside a Ray actor (made remote by `RayWorkers`)."""

  def __init__(self):
    # pylint: disable=g-import-not-at-top
    from absl import flags as absl_flags
    from launch.cli import failures
    from launch.cli import quiet
    from launch.run import builds as builds_lib
    absl_flags.FLAGS(['ray_worker'])
    failures.install_managed_tff_context()
    quiet.quiet_libraries()
    self._builds = builds_lib.Builds()

  def where(self) -> str:
    from launch.sweeps import warm_worker  # pylint: disable=g-import-not-at-top
    return warm_worker.where()

  def run(self, request: dict) -> dict:
    from launch.sweeps import warm_worker  # pylint: disable=g-import-not-at-top
    return warm_worker.answer(request, self._builds)


def _import_ray():
  try:
    import ray  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ValueError('--ray_address needs Ray: pip install ray (scripts/bootstrap.sh'
                     ' installs it)') from None
  return ray


class RayWorkers(workers.Workers):
  """The actors of a Ray cluster."""

  def __init__(self, address: str, log_dir: str, executor: str = 'cpu'):
    super().__init__()
    self._ray = ray = _import_ray()
    self._log_dir = log_dir
    try:
      ray.init(address=address, log_to_driver=False, logging_level='ERROR',
               runtime_env={'env_vars': {'PYTHONPATH': _REPO_ROOT}},
               **({'_node_ip_address': RAY_DRIVER_IP.value} if RAY_DRIVER_IP.value else {}))
    except (ConnectionError, RuntimeError, ValueError) as e:
      raise ValueError(f'--ray_address={address}: no Ray cluster answers there ({e})') from e
    self._actor_class = ray.remote(_CellActor)
    self._places = self._places_of(executor)
    if not self._places:
      ray.shutdown()
      raise ValueError(f'the Ray cluster at {address} has no node that can train'
                       f' --executor={executor} runs')
    self._actors = [None] * len(self._places)
    self._tasks = [None] * len(self._places)  # (task, key, future)
    self._keys = [None] * len(self._places)
    print(f'ray: {len(self._places)} workers on {len({p[0] for p in self._places})} nodes'
          f' ({address})', flush=True)

  def _places_of(self, executor: str) -> list[tuple[str, dict]]:
    """(node id, actor options) of each actor: GPU nodes first."""
    places = []
    for node in self._ray.nodes():
      if not node.get('Alive'):
        continue
      resources = node.get('Resources', {})
      gpus, cpus = int(resources.get('GPU', 0)), int(resources.get('CPU', 0))
      if gpus:
        share = 1.0 / CELLS_PER_GPU.value
        places += [(node['NodeID'], dict(num_gpus=share, num_cpus=0))] * (
            gpus * CELLS_PER_GPU.value)
      elif executor == 'cpu' and cpus:
        per_cell = min(CPUS_PER_CELL.value, cpus)
        places += [(node['NodeID'], dict(num_cpus=per_cell))] * (cpus // per_cell)
    return places

  def _new_actor(self, slot: int):
    # pylint: disable=g-import-not-at-top
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    node, options = self._places[slot]
    actor = self._actor_class.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False), **options
    ).remote()
    self._actors[slot] = actor
    return actor

  @property
  def size(self) -> int:
    return len(self._places)

  def idle(self) -> list[int]:
    return [i for i, task in enumerate(self._tasks) if task is None]

  def key(self, slot: int):
    return self._keys[slot]

  def start_all(self, count: int) -> None:
    for slot, actor in enumerate(self._actors[:count]):
      if actor is None:
        self._new_actor(slot)
    self._ray.get([actor.where.remote() for actor in self._actors[:count]])

  def start(self, slot: int, task: workers.Task, key) -> None:
    actor = self._actors[slot] or self._new_actor(slot)
    self._tasks[slot] = (task, key, actor.run.remote(task.request()))
    self._keys[slot] = key

  def wait(self, timeout_s: float) -> list[tuple[workers.Task, dict[str, int]]]:
    ray = self._ray
    futures = [task[2] for task in self._tasks if task is not None]
    if not futures:
      time.sleep(timeout_s)
      return []
    ready, _ = ray.wait(futures, num_returns=len(futures), timeout=timeout_s)
    ended = []
    for slot, started in enumerate(self._tasks):
      if started is None or started[2] not in ready:
        continue
      task, key, future = started
      self._tasks[slot] = None
      try:
        ended.append((task, task.statuses(ray.get(future))))
        continue
      except ray.exceptions.RayActorError as e:
        cause = f'{type(e).__name__}'
      self._actors[slot] = None
      how = f'its Ray actor: {cause}'
      statuses = self.died(slot, task, key, how)
      if statuses is not None:
        ended.append((task, statuses))
    return ended

  def close(self) -> None:
    """Kills every actor (a run still training resumes from its checkpoint next time)."""
    ray = self._ray
    for actor in self._actors:
      if actor is not None:
        with contextlib.suppress(Exception):
          ray.kill(actor)
    self._actors = [None] * len(self._places)
    self._tasks = [None] * len(self._places)
    with contextlib.suppress(Exception):
      ray.shutdown()
