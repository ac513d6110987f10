"""The Ray driver of a sweep on a Ray cluster: the one process that calls `ray.init`.

`launch.sweeps.ray_slots` starts it as `python -P <this file>` and talks to it in JSON
lines, one answer per request, so that nothing of Ray runs in the program's own process:
Ray's C++ lines go to the driver's stderr (a log file), Ray's handlers never replace the
program's stop signals, and when the cluster is lost Ray ends this process, not the
program, which then says so in its own line. It imports nothing of the package (whose
import loads TensorFlow): the actors' class goes to Ray by value, and each actor imports
the package from its checkout.

Requests (stdin) and answers (stdout):

  {"init": {address, driver_ip, executor, cells_per_gpu, cpus_per_cell, repo_root}}
      -> {"ready": {"slots": N, "nodes": M}}: N actor places, GPU nodes first
  {"start_all": count}          -> {"ok": true}: actors in the first `count` places, ready
  {"start": {"slot", "request"}} -> {"ok": true}: the warm slot request, in the slot's
                                    actor (a new one if it has none)
  {"wait": seconds}             -> {"ended": [[slot, {"answer": ...} or {"died": why}]]}
  {"close": true}               -> {"ok": true}: every actor killed, Ray shut down

Any request may be answered {"error": line} (bad input: an address where no cluster
answers, a cluster without a place for the runs) or {"lost": why} (the cluster stopped
answering); the program then ends. The terminal's Ctrl-C does not reach the driver (the
program's to handle: it closes the driver), and the driver dies with the program (Linux):
`ray_slots` starts it so (a process group of its own, `children.dying_with_parent`).
"""

import contextlib
import json
import os
import socket
import sys
import time
from typing import Optional

# How long a TCP connection to the cluster's head may take to open.
_CONNECT_TIMEOUT_S = 5.0
# How long the head may refuse connections before the cluster counts as lost (Ray's own
# driver waits 60 s for it), and how often it is asked meanwhile.
_HEAD_LOST_AFTER_S = 5.0
_HEAD_CHECK_EVERY_S = 1.0


class _CellActor:
  """A warm slot inside a Ray actor."""

  def __init__(self):
    # pylint: disable=g-import-not-at-top
    from launch.cli import failures
    from launch.cli import quiet
    from launch.run import builds as builds_lib
    failures.install_managed_tff_context()
    quiet.quiet_libraries()
    self._builds = builds_lib.Builds()

  def where(self) -> str:
    from launch.sweeps import warm_slot  # pylint: disable=g-import-not-at-top
    return warm_slot.where()

  def run(self, request: dict) -> dict:
    # pylint: disable=g-import-not-at-top
    from launch.run import experiment
    from launch.sweeps import warm_slot
    # Ray ends its workers by SIGTERM (`ray stop`, a lost node): a stop deferred to the
    # next round kept an actor whose cluster was gone training to its run's end.
    return warm_slot.answer(request, self._builds, experiment.stops_where_they_land)


class BadAddress(Exception):
  """No Ray cluster answers at the address, or it has no place for the runs."""


def head_address(address: str) -> str:
  """HOST:PORT of the cluster's head that `address` names (auto: the one `ray.init`
  would find)."""
  from ray._private import services  # pylint: disable=g-import-not-at-top
  try:
    found = services.canonicalize_bootstrap_address(address)
  except (ConnectionError, ValueError) as e:
    raise BadAddress(_first_line(e)) from e
  if found is None:
    raise BadAddress('no Ray cluster runs on this machine')
  return found


def _first_line(error: BaseException) -> str:
  text = str(error).strip()
  return text.splitlines()[0] if text else type(error).__name__


def _connect(host_port: str, timeout_s: float) -> None:
  host, _, port = host_port.rpartition(':')
  with socket.create_connection((host.strip('[]'), int(port)), timeout_s):
    pass


def check_reachable(address: str, host_port: str) -> None:
  """Refuses a head (`host_port`, where Ray looks for the cluster at `address`) that does
  not take a TCP connection: `ray.init` would retry for minutes, printing Ray's C++
  warnings."""
  try:
    _connect(host_port, _CONNECT_TIMEOUT_S)
  except (OSError, ValueError) as e:
    why = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
    if isinstance(e, socket.timeout):
      why = f'no answer in {_CONNECT_TIMEOUT_S:g} s'
    if host_port != address:
      why += f' at {host_port}, where Ray looks for it'
    raise BadAddress(f'no Ray cluster answers there ({why})') from e


class Driver:
  """The cluster's actors, by place."""

  def __init__(self, settings: dict):
    try:
      import ray  # pylint: disable=g-import-not-at-top
    except ImportError:
      raise BadAddress('Ray is not installed here: pip install ray (scripts/bootstrap.sh'
                       ' installs it)') from None
    self._ray = ray
    address = settings['address']
    self._head = head_address(address)
    check_reachable(address, self._head)
    self._head_checked = time.monotonic()
    self._head_silent_since: Optional[float] = None
    try:
      ray.init(address=address, log_to_driver=False, logging_level='ERROR',
               runtime_env={'env_vars': {'PYTHONPATH': settings['repo_root']}},
               **({'_node_ip_address': settings['driver_ip']} if settings['driver_ip'] else {}))
    except (ConnectionError, RuntimeError, ValueError) as e:
      raise BadAddress(f'no Ray cluster answers there ({_first_line(e)})') from e
    self._actor_class = ray.remote(_CellActor)
    self.places = self._places_of(settings)
    if not self.places:
      raise BadAddress(f'the Ray cluster has no node that can train'
                       f' --executor={settings["executor"]} runs')
    self._actors: list = [None] * len(self.places)
    self._futures: dict[int, object] = {}  # slot -> the run it trains

  def _places_of(self, settings: dict) -> list[tuple[str, dict]]:
    """(node id, actor options) of each actor: GPU nodes first."""
    places = []
    for node in self._ray.nodes():
      if not node.get('Alive'):
        continue
      resources = node.get('Resources', {})
      gpus, cpus = int(resources.get('GPU', 0)), int(resources.get('CPU', 0))
      if gpus:
        share = 1.0 / settings['cells_per_gpu']
        places += [(node['NodeID'], dict(num_gpus=share, num_cpus=0))] * (
            gpus * settings['cells_per_gpu'])
      elif settings['executor'] == 'cpu' and cpus:
        per_cell = min(settings['cpus_per_cell'], cpus)
        places += [(node['NodeID'], dict(num_cpus=per_cell))] * (cpus // per_cell)
    return places

  def _actor(self, slot: int):
    if self._actors[slot] is None:
      # pylint: disable=g-import-not-at-top
      from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
      node, options = self.places[slot]
      self._actors[slot] = self._actor_class.options(
          scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False), **options
      ).remote()
    return self._actors[slot]

  def start_all(self, count: int) -> dict:
    """Actors in the first `count` places (all, when there are fewer), once each is ready."""
    slots = range(min(count, len(self.places)))
    self._ray.get([self._actor(slot).where.remote() for slot in slots])
    return {'ok': True}

  def start(self, slot: int, request: dict) -> dict:
    self._futures[slot] = self._actor(slot).run.remote(request)
    return {'ok': True}

  def _check_head(self) -> None:
    """Raises ConnectionError once the head has refused connections for
    `_HEAD_LOST_AFTER_S` (asked at most every `_HEAD_CHECK_EVERY_S`)."""
    now = time.monotonic()
    if now - self._head_checked < _HEAD_CHECK_EVERY_S:
      return
    self._head_checked = now
    try:
      _connect(self._head, _HEAD_CHECK_EVERY_S)
      self._head_silent_since = None
    except OSError as e:
      self._head_silent_since = self._head_silent_since or now
      if now - self._head_silent_since >= _HEAD_LOST_AFTER_S:
        raise ConnectionError(f'its head at {self._head} has not answered for'
                              f' {_HEAD_LOST_AFTER_S:g} s ({e.strerror or e})') from e

  def wait(self, seconds: float) -> dict:
    ray = self._ray
    self._check_head()
    if not self._futures:
      return {'ended': []}
    futures = list(self._futures.values())
    ready, _ = ray.wait(futures, num_returns=len(futures), timeout=seconds)
    ended = []
    for slot, future in list(self._futures.items()):
      if future not in ready:
        continue
      del self._futures[slot]
      try:
        ended.append([slot, {'answer': ray.get(future)}])
      except ray.exceptions.RayActorError as e:
        self._actors[slot] = None
        ended.append([slot, {'died': f'its Ray actor: {type(e).__name__}'}])
    return {'ended': ended}

  def close(self) -> dict:
    for actor in self._actors:
      if actor is not None:
        with contextlib.suppress(Exception):
          self._ray.kill(actor)
    with contextlib.suppress(Exception):
      self._ray.shutdown()
    return {'ok': True}


def _answer(driver: Optional[Driver], request: dict) -> tuple[Optional[Driver], dict]:
  if 'init' in request:
    driver = Driver(request['init'])
    nodes = len({node for node, _ in driver.places})
    return driver, {'ready': {'slots': len(driver.places), 'nodes': nodes}}
  if 'start_all' in request:
    return driver, driver.start_all(request['start_all'])
  if 'start' in request:
    return driver, driver.start(request['start']['slot'], request['start']['request'])
  if 'wait' in request:
    return driver, driver.wait(request['wait'])
  if driver is not None:
    driver.close()
  return None, {'ok': True}


def serve(requests, answers) -> None:
  """Answers each request line until `close` or the end of the input."""
  driver = None
  for line in requests:
    request = json.loads(line)
    try:
      driver, answer = _answer(driver, request)
    except BadAddress as e:
      answer = {'error': str(e)}
    except Exception as e:  # pylint: disable=broad-except
      answer = {'lost': f'{type(e).__name__}: {_first_line(e)}'}
    answers.write(json.dumps(answer) + '\n')
    answers.flush()
    if 'close' in request or 'error' in answer or 'lost' in answer:
      break
  if driver is not None:
    driver.close()


def main() -> None:
  # The answers go to the stdout the program reads; whatever Ray prints, to the log.
  answers = os.fdopen(os.dup(1), 'w')
  os.dup2(2, 1)
  serve(sys.stdin, answers)


if __name__ == '__main__':
  main()
