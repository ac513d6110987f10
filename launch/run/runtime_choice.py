"""Who runs a run's rounds, on which devices, with how many threads, and how it is said.

- The choice: `--runtime` (`RUNTIMES`) is TFF's C++ worker (local, or remote ones with
  `--workers`) or this process's TensorFlow, the only way to a GPU; `resolved_runtime`
  settles 'auto', `check_runtime` refuses the combinations that cannot run, and
  `local_intra_op_threads` sets the threads per TF op where clients run on this CPU.
- Its setting-up: `set_in_process_threads` (before any TF op runs), `check_gpus` and
  `check_workers_reachable` (before anything is written), `execution_context` (the
  context the rounds run in, a lost remote worker turned into a `WorkerLostError`).
- Its description: `runtime_line`, printed before the first round, and `record_session`,
  each process's session in the run's runtime.json.

Each function takes the run's settings, a `run_config.ExperimentConfig` (whose checks
call `check_runtime`, so this module does not import it).
"""

import collections
import contextlib
import os
import time
from typing import Optional

import grpc
import tensorflow as tf
import tensorflow_federated as tff

from launch.run import errors
from launch.run import event_loop
from launch.run import run_directory
from tff_zmg.algorithms import registry
from tff_zmg import analysis
from tff_zmg import run_files
from tff_zmg.runtime import cpp_worker
from tff_zmg.runtime import gpu_diagnosis
from tff_zmg.runtime import in_process

IN_PROCESS, TFF_WORKER = 'in_process', 'tff_worker'
RUNTIMES = ('auto', IN_PROCESS, TFF_WORKER)
# `--executor=cpu --runtime=auto` runs in process: it starts sooner, and on a 2-core CPU its
# rounds were faster than TFF's worker's for fedavg, fedzmg, gcfed and fedrkmgc (0.87-0.96x;
# FedGPS's 1.13x; 2026-11-23), then within 8% of them or faster for every algorithm
# (2026-11-25; docs/performance.md; launch.benchmark's `in_process` contenders re-measure it).
CPU_RUNTIME = IN_PROCESS
_PROCESS_START = time.time()  # A session's start in runtime.json.


def resolved_runtime(config) -> str:
  """The runtime a run uses: the setting, or for 'auto' in-process on GPUs, TFF's
  workers with --workers, and `CPU_RUNTIME` on the CPU."""
  if config.runtime != 'auto':
    return config.runtime
  if config.workers:
    return TFF_WORKER
  return IN_PROCESS if config.executor == 'gpu' else CPU_RUNTIME


def check_runtime(config) -> None:
  """Refuses a runtime that cannot run these settings."""
  runtime = resolved_runtime(config)
  if config.executor == 'gpu' and config.workers:
    raise errors.ExperimentError(
        '--executor=gpu runs rounds in this process on its GPUs; --workers sends them to'
        " TFF's workers, whose pip build has no CUDA: drop one of the two"
    )
  if config.executor == 'gpu' and runtime == TFF_WORKER:
    raise errors.ExperimentError(
        "--executor=gpu needs --runtime=in_process (or auto): TFF's pip worker_binary is"
        ' built without CUDA and runs everything on the CPU'
    )
  if runtime == IN_PROCESS and config.workers:
    raise errors.ExperimentError('--runtime=in_process runs no remote workers; drop --workers')


def local_intra_op_threads(config) -> int:
  """Threads per TF op where the clients run on this machine's CPU (TFF's local worker,
  or this process in-process): the setting, or cores // clients at once (at least 1)."""
  if config.intra_op_threads > 0:
    return config.intra_op_threads
  concurrent = config.max_concurrent_clients
  if resolved_runtime(config) == IN_PROCESS and concurrent <= 0:
    concurrent = os.cpu_count() or 1  # InProcessContext's default: one client per core.
  return cpp_worker.intra_op_threads_for(
      config.clients_per_round, max_concurrent_clients=concurrent
  )


def set_in_process_threads(config) -> Optional[int]:
  """Sets this process's threads per TF op for an in-process CPU run (before any op runs).

  Returns the threads in effect (0: TensorFlow's default, every core), or None for a GPU
  run or TFF's worker. Where TensorFlow has already started in this process (a notebook,
  a test) its pools stay as they are, unless --intra_op_threads asked for another value.
  """
  if resolved_runtime(config) != IN_PROCESS or config.executor == 'gpu':
    return None
  threads = local_intra_op_threads(config)
  if in_process.set_intra_op_threads(threads):
    return threads
  running = tf.config.threading.get_intra_op_parallelism_threads()
  if config.intra_op_threads > 0:
    raise errors.ExperimentError(
        f'TensorFlow already runs with {running or "its default"} threads per op in this'
        f' process and cannot switch to --intra_op_threads={threads}: run the experiment'
        ' in a fresh process (python -m launch.train)'
    )
  return running


def check_gpus(config) -> None:
  """Refuses --executor=gpu where TensorFlow sees no GPU, saying the likely cause."""
  if config.executor == 'gpu' and not in_process.visible_gpus():
    raise errors.ExperimentError(
        '--executor=gpu but TensorFlow sees no GPU in this process:'
        f' {gpu_diagnosis.no_gpu_cause()} (or use --executor=cpu)'
    )


def check_workers_reachable(config) -> None:
  """Fails before anything is written if a remote worker does not answer."""
  try:
    workers = cpp_worker.connect_workers(config.workers, config.worker_timeout_s)
  except (ValueError, cpp_worker.WorkerUnavailableError) as e:
    raise errors.ExperimentError(str(e)) from e
  for worker in workers:
    worker.close()


def splits_stateful_rounds(config) -> bool:
  """Whether the rounds run here with only the clients' work on the --workers.

  So for an algorithm whose clients keep state, on several workers: TFF's mergeable
  context, which stateless algorithms use there, merges SERVER-placed results only and
  cannot return the clients' new states (`tff_zmg.runtime.remote_clients`).
  """
  return len(config.workers) > 1 and registry.get(config.algo).stateful


@contextlib.contextmanager
def execution_context(config, progress, builds=None):
  """The runtime's context: in-process, the local TFF worker, or the remote ones.

  With a warm slot's `builds`, an in-process context on this machine's devices uses
  what earlier runs' contexts compiled (the same processes need no compiling again).

  Yields the `in_process.InProcessContext` (None for TFF's workers). A remote worker
  lost mid-run ends the run: TFF's training loop releases a round's metrics and then
  saves its state, so the round that fails has written nothing and the run resumes
  from the last checkpoint; `progress` (the run's `rounds.RoundReleaseManager`) knows the
  last round released (`last_key`), after which it failed.
  """
  if resolved_runtime(config) == IN_PROCESS:
    devices = in_process.visible_gpus() if config.executor == 'gpu' else None
    clients_per_device = config.max_concurrent_clients
    clients_per_device = clients_per_device if clients_per_device > 0 else None
    compiled = None if builds is None else builds.get(
        'compiled', dict(devices=devices, clients_per_device=clients_per_device), dict)
    with in_process.in_process_context(
        devices, clients_per_device=clients_per_device, compiled=compiled
    ) as runtime_context:
      yield runtime_context
    return
  if not config.workers:
    with cpp_worker.execution_context(
        config.max_concurrent_clients, intra_op_threads=local_intra_op_threads(config)
    ):
      yield None
    return
  try:
    if splits_stateful_rounds(config):
      workers = cpp_worker.connect_workers(config.workers, config.worker_timeout_s)
      try:
        with in_process.in_process_context(workers=workers) as runtime_context:
          yield runtime_context
      finally:
        for worker in workers:
          worker.close()
      return
    with cpp_worker.remote_execution_context(config.workers, 0, config.worker_timeout_s):
      yield None
  except cpp_worker.WorkerUnavailableError as e:
    raise _worker_lost_error(config, progress.last_key, e) from e
  except grpc.RpcError as e:  # Every worker still answers: the computation failed there.
    details = e.details() if isinstance(e, grpc.Call) else str(e)
    code = e.code().name if isinstance(e, grpc.Call) else 'error'
    raise errors.ExperimentError(
        f'a computation failed on a TFF worker (gRPC {code}:'
        f' {details.strip().splitlines()[0] if details.strip() else "no details"}). Every'
        f' worker must run TFF {tff.__version__} and read the data files at the same'
        ' absolute path as this machine (--cache_dir): TFF sends each client\'s tf.data'
        ' pipeline, not its examples.'
    ) from e


def _worker_lost_error(
    config, last_released_round: Optional[int],
    error: cpp_worker.WorkerUnavailableError,
) -> errors.WorkerLostError:
  """Says which round a lost remote worker failed, what is kept, and how to resume."""
  manager = tff.program.FileProgramStateManager(config.checkpoint_dir)
  versions = event_loop.thread_event_loop().run_until_complete(manager.get_versions()) or []
  checkpoint = max(versions, default=None)
  if last_released_round is not None:
    failed = last_released_round + 1
  else:
    failed = 0 if checkpoint is None else checkpoint + 1
  kept = (
      'no checkpoint was written yet, so re-running starts afresh'
      if checkpoint is None
      else f'the checkpoint of round {checkpoint} is kept'
  )
  return errors.WorkerLostError(
      f'a TFF worker was lost in round {failed}: {error}. Nothing of round {failed} was'
      f' written and {kept}. Start the worker again (python -m launch.worker --port=PORT)'
      ' and re-run the same command to resume (--workers may name other machines).'
  )


def runtime_line(config, runtime_context, in_process_threads) -> str:
  """One line saying who runs the rounds, on which devices, with how many threads."""
  if runtime_context is not None and runtime_context.workers:
    return (
        f'runtime: rounds in this process, the clients\' work on the TFF workers at'
        f' {", ".join(runtime_context.workers)} (a contiguous slice of the clients each)'
    )
  if runtime_context is not None:
    threads = _threads(in_process_threads) if in_process_threads else "TensorFlow's default"
    return (
        f'runtime: in this process on {", ".join(runtime_context.devices)}'
        f' ({_count(runtime_context.clients_per_device, "client")} at once per device,'
        f' {threads} per TF op on the CPU)'
    )
  if config.workers:
    return f'runtime: TFF workers at {", ".join(config.workers)}'
  return (
      "runtime: TFF's local worker_binary on the CPU"
      f' ({_threads(local_intra_op_threads(config))} per TF op)'
  )


def _count(count: int, noun: str) -> str:
  return f'{count} {noun}' + ('s' if count != 1 else '')


def _threads(count: int) -> str:
  return _count(count, 'thread')


def record_session(
    config, runtime_context, in_process_threads: Optional[int], held_out,
    trained: Optional[tuple[int, int]],
) -> Optional[dict]:
  """Adds this process's session to `runtime.json` and returns it (None: it trained no
  round, and adds nothing: a no-op re-run does not erase what the sessions before say).

  A session: the rounds it trained, the runtime, where the clients' computations ran,
  the threads per TF op on this machine's CPU (None: TensorFlow's default, or remote),
  what the evaluation covered and the device its test examples were kept on, and when
  it started. In process, the devices are read from the tensors each client's training
  computation returned (with how many ran on each); TFF's worker returns NumPy values,
  and its pip build has only a CPU device. The evaluation runs in this process
  (`tasks.evaluation`); its device is read from its tensors too. A runtime.json from
  before sessions is kept as the first (`analysis.runs.read_runtime`).
  """
  if trained is None:
    return None
  if runtime_context is not None:
    client_devices = dict(sorted(runtime_context.client_devices.items()))
    threads = in_process_threads
  else:
    where = 'remote TFF workers' if config.workers else "TFF's local worker_binary"
    client_devices = {f'CPU of {where} (a build without CUDA)': None}
    threads = None if config.workers else local_intra_op_threads(config)
  session = collections.OrderedDict(
      rounds=list(trained), runtime=resolved_runtime(config), client_devices=client_devices,
      intra_op_threads=threads,
      evaluation=dict(covered=held_out.description, device=held_out.groups[0][0]['x'].device),
      started=time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(_PROCESS_START)),
  )
  sessions = analysis.runs.read_runtime(config.output_dir)
  run_directory.write_json_atomically(  # Each session's keys in the order above.
      os.path.join(config.output_dir, run_files.RUNTIME),
      {'sessions': [*sessions, session]}, sort_keys=False)
  return session
