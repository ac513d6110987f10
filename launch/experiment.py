"""One federated training run: data, process, TFF's training loop, outputs, resumption.

`launch.train` fills an `ExperimentConfig` from its flags and calls `run`; the grid search
and comparison programs call `run` the same way, one directory per run. Everything that
can be rejected (task, algorithm, hyperparameters, data, an existing run with other
settings) is checked before anything is written to the output directory.
"""

import asyncio
import collections
import concurrent.futures
import contextlib
import csv
import dataclasses
import functools
import json
import math
import os
import sys
import time
from typing import Optional

import grpc
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
import tree

import tasks
from tasks import evaluation
from tasks import sources
from tasks import tfds_source
from launch import failures
from launch import run_directory
# Raised here, and named `experiment.<Error>` by programs, notebooks and tests.
from launch.errors import DivergedError
from launch.errors import ExperimentError
from launch.errors import RunEnvironmentError
from launch.errors import WorkerLostError
from tff_zmg import analysis
from tff_zmg import client_states
from tff_zmg.runtime import cpp_worker
from tff_zmg.runtime import in_process
from tff_zmg import validation
from tff_zmg.algorithms import registry
from tff_zmg.templates import stateful_clients

FLAGS_FILENAME = 'flags.json'
METRICS_FILENAME = 'metrics.csv'
CHECKPOINT_DIRNAME = 'checkpoints'
TENSORBOARD_DIRNAME = 'tensorboard'
CLIENT_STATES_DIRNAME = 'client_states'
RUNTIME_FILENAME = analysis.runs.RUNTIME_FILENAME
IN_PROCESS, TFF_WORKER = 'in_process', 'tff_worker'
RUNTIMES = ('auto', IN_PROCESS, TFF_WORKER)
# `--executor=cpu --runtime=auto` runs in process: on this 2-core CPU its rounds were faster
# than TFF's worker's for fedavg, fedzmg, gcfed and fedrkmgc (0.87-0.96x; FedGPS's 1.13x)
# and it starts sooner (docs/performance.md; launch.benchmark's `in_process` contenders
# re-measure it).
CPU_RUNTIME = IN_PROCESS
# A round whose training or evaluation loss is above this multiple of round 0's evaluation
# loss (an untrained model's, about the uniform prediction's log(classes): 4.1 on EMNIST's
# 62) diverged, as one whose loss is not finite did (`divergence`); --divergence_factor.
DIVERGENCE_FACTOR = 10.0
# Settings that may change between a run and its resumption without changing its results.
_RESUMABLE_CHANGES = frozenset(
    {
        'total_rounds', 'executor', 'runtime', 'max_concurrent_clients',
        'intra_op_threads', 'rounds_per_checkpoint', 'workers', 'worker_timeout_s',
        'divergence_factor',
    }
)
# Where a run and its data are, not what they are: a run folder may be copied or renamed
# and the data moved (the data's identity is checked instead, `_identity`).
_LOCATION_SETTINGS = frozenset({'root_output_dir', 'experiment_name', 'cache_dir'})
_PROCESS_START = time.time()  # A session's start in runtime.json.


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
  """Every setting of a run. `hparams` are the algorithm's (see the algorithm registry)."""

  task: str
  algo: str
  root_output_dir: str
  experiment_name: str
  hparams: dict = dataclasses.field(default_factory=dict)
  data_source: str = 'tff'
  cache_dir: Optional[str] = None
  synthetic_settings: Optional[dict] = None
  total_rounds: int = 10
  clients_per_round: int = 10
  client_epochs_per_round: int = 1
  client_batch_size: Optional[int] = None
  max_elements_per_client: Optional[int] = None
  seed: int = 0
  rounds_per_eval: int = 1
  # One of evaluation.KINDS; None: 'global', or for a run recorded before this setting
  # existed, the per-client evaluation it was started with (`resolve_evaluation`).
  evaluation: Optional[str] = None
  # global evaluation: a fixed subsample of this many test examples (None: all).
  eval_examples: Optional[int] = None
  # per_client evaluation: the first this many sorted test clients (None: all).
  num_eval_clients: Optional[int] = None
  rounds_per_checkpoint: int = 1
  executor: str = 'cpu'
  # Who runs the rounds: 'in_process' (this process's TensorFlow, the only way to a GPU),
  # 'tff_worker' (TFF's C++ worker, CPU only) or 'auto' (see `resolved_runtime`).
  runtime: str = 'auto'
  max_concurrent_clients: int = -1
  # Threads per TF op in the local worker; 0: `cpp_worker.intra_op_threads_for` the clients
  # it runs at once.
  intra_op_threads: int = 0
  overwrite: bool = False
  client_state_store: str = 'disk'
  # Dirichlet re-partitioning of the training examples (tasks.partition); None keeps the
  # dataset's clients and leaves the other three None.
  partition: Optional[str] = None
  dirichlet_alpha: Optional[float] = None
  num_clients: Optional[int] = None
  partition_seed: Optional[int] = None
  # `host:port` of remote TFF workers (`python -m launch.worker`) sharing each round's
  # clients; empty: one local worker.
  workers: tuple = ()
  # How long a remote worker may not answer, at start or during a round, before the run
  # stops.
  worker_timeout_s: float = cpp_worker.REMOTE_CONNECT_TIMEOUT_S
  # One of tasks.MODELS[task]; None is the task's own model.
  model: Optional[str] = None
  # A loss above this multiple of round 0's evaluation loss is divergence (`divergence`);
  # math.inf judges by finiteness alone.
  divergence_factor: float = DIVERGENCE_FACTOR

  @property
  def output_dir(self) -> str:
    return os.path.join(self.root_output_dir, self.experiment_name)

  @property
  def checkpoint_dir(self) -> str:
    return os.path.join(self.output_dir, CHECKPOINT_DIRNAME)

  @property
  def metrics_csv(self) -> str:
    return os.path.join(self.output_dir, METRICS_FILENAME)

  def recorded(self) -> dict:
    """The settings as saved in flags.json (what a resumed run must agree with), with
    every hyperparameter the algorithm trains with, the defaults resolved.

    Raises:
      ValueError: If the algorithm is unknown, or a hyperparameter is not one of its or
        out of its range.
    """
    values = dataclasses.asdict(self)
    values.pop('overwrite')
    # Unsettled (`resolve_evaluation`) only where no run exists yet: a new run's.
    values['evaluation'] = self.evaluation or evaluation.GLOBAL
    values['hparams'] = dict(self._resolved_hparams)
    return values

  @functools.cached_property
  def _resolved_hparams(self) -> dict:
    # Once per config: a run records and compares its settings several times, and each
    # resolution checks every value again (and repeats FedRKMGC's small-gamma warning).
    return registry.resolve(self.algo, self.hparams)


def _validate(config: ExperimentConfig) -> None:
  if config.task not in tasks.TASK_NAMES:
    raise ExperimentError(
        f'unknown task {config.task!r}; choose one of {list(tasks.TASK_NAMES)}'
    )
  run_directory.check_name(config.experiment_name)
  for name in (
      'total_rounds', 'clients_per_round', 'client_epochs_per_round', 'rounds_per_eval',
      'rounds_per_checkpoint',
  ):
    validation.check_positive(name, getattr(config, name))
  validation.check_non_negative('intra_op_threads', config.intra_op_threads)
  if not config.divergence_factor > 1:
    raise ExperimentError(
        f'divergence_factor must be > 1 (inf: only a non-finite loss is divergence), got'
        f' {config.divergence_factor!r}'
    )
  evaluation.check_settings(config.evaluation, config.eval_examples, config.num_eval_clients)
  for name in ('client_batch_size', 'max_elements_per_client'):  # None: no setting.
    if getattr(config, name) is not None:
      validation.check_positive(name, getattr(config, name))
  if config.executor not in ('cpu', 'gpu'):
    raise ExperimentError(f"executor must be 'cpu' or 'gpu', got {config.executor!r}")
  if config.runtime not in RUNTIMES:
    raise ExperimentError(f'runtime must be one of {list(RUNTIMES)}, got {config.runtime!r}')
  _validate_runtime(config)
  if config.client_state_store not in client_states.STORES:
    raise ExperimentError(
        f'client_state_store must be one of {list(client_states.STORES)}, got'
        f' {config.client_state_store!r}'
    )
  _validate_workers(config)


def _validate_workers(config: ExperimentConfig) -> None:
  if isinstance(config.workers, str):
    raise ExperimentError(
        f"workers must be a sequence of 'host:port' strings, got the string {config.workers!r}"
    )
  for address in config.workers:
    cpp_worker.parse_worker_address(address)  # ValueError says what is allowed.
  validation.check_positive('worker_timeout_s', config.worker_timeout_s)
  if config.workers and config.max_concurrent_clients > 0:
    raise ExperimentError(
        'max_concurrent_clients limits the local worker; with workers, give each its limit:'
        ' python -m launch.worker --port=PORT --max_concurrent_computation_calls=N'
    )
  if config.workers and config.intra_op_threads > 0:
    raise ExperimentError(
        'intra_op_threads sets the local worker; with workers, give each its own:'
        ' python -m launch.worker --port=PORT --intra_op_parallelism_threads=N'
    )


def resolved_runtime(config: ExperimentConfig) -> str:
  """The runtime a run uses: the setting, or for 'auto' in-process on GPUs, TFF's
  workers with --workers, and `CPU_RUNTIME` on the CPU."""
  if config.runtime != 'auto':
    return config.runtime
  if config.workers:
    return TFF_WORKER
  return IN_PROCESS if config.executor == 'gpu' else CPU_RUNTIME


def _validate_runtime(config: ExperimentConfig) -> None:
  runtime = resolved_runtime(config)
  if config.executor == 'gpu' and config.workers:
    raise ExperimentError(
        '--executor=gpu runs rounds in this process on its GPUs; --workers sends them to'
        " TFF's workers, whose pip build has no CUDA: drop one of the two"
    )
  if config.executor == 'gpu' and runtime == TFF_WORKER:
    raise ExperimentError(
        "--executor=gpu needs --runtime=in_process (or auto): TFF's pip worker_binary is"
        ' built without CUDA and runs everything on the CPU'
    )
  if runtime == IN_PROCESS and config.workers:
    raise ExperimentError('--runtime=in_process runs no remote workers; drop --workers')


def local_intra_op_threads(config: ExperimentConfig) -> int:
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


def _set_in_process_threads(config: ExperimentConfig) -> Optional[int]:
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
    raise ExperimentError(
        f'TensorFlow already runs with {running or "its default"} threads per op in this'
        f' process and cannot switch to --intra_op_threads={threads}: run the experiment'
        ' in a fresh process (python -m launch.train)'
    )
  return running


def _check_workers_reachable(config: ExperimentConfig) -> None:
  """Fails before anything is written if a remote worker does not answer."""
  try:
    workers = cpp_worker.connect_workers(config.workers, config.worker_timeout_s)
  except (ValueError, cpp_worker.WorkerUnavailableError) as e:
    raise ExperimentError(str(e)) from e
  for worker in workers:
    worker.close()


@contextlib.contextmanager
def _execution_context(config: ExperimentConfig, progress: '_RoundReleaseManager'):
  """The runtime's context: in-process, the local TFF worker, or the remote ones.

  Yields the `in_process.InProcessContext` (None for TFF's workers). A remote worker
  lost mid-run ends the run: TFF's training loop releases a round's metrics and then
  saves its state, so the round that fails has written nothing and the run resumes
  from the last checkpoint.
  """
  if resolved_runtime(config) == IN_PROCESS:
    devices = in_process.visible_gpus() if config.executor == 'gpu' else None
    clients_per_device = config.max_concurrent_clients
    with in_process.in_process_context(
        devices, clients_per_device=clients_per_device if clients_per_device > 0 else None
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
    with cpp_worker.remote_execution_context(config.workers, 0, config.worker_timeout_s):
      yield None
  except cpp_worker.WorkerUnavailableError as e:
    raise _worker_lost_error(config, progress.last_key, e) from e
  except grpc.RpcError as e:  # Every worker still answers: the computation failed there.
    details = e.details() if isinstance(e, grpc.Call) else str(e)
    code = e.code().name if isinstance(e, grpc.Call) else 'error'
    raise ExperimentError(
        f'a computation failed on a TFF worker (gRPC {code}:'
        f' {details.strip().splitlines()[0] if details.strip() else "no details"}). Every'
        f' worker must run TFF {tff.__version__} and read the data files at the same'
        ' absolute path as this machine (--cache_dir): TFF sends each client\'s tf.data'
        ' pipeline, not its examples.'
    ) from e


def _thread_event_loop() -> asyncio.AbstractEventLoop:
  """This thread's asyncio loop, made and set if there is none.

  TFF's training loop and program state managers call `asyncio.get_event_loop()`, which
  fails once an earlier `asyncio.run` in the same thread (a notebook cell, a test) has
  unset the loop.
  """
  try:
    loop = asyncio.get_event_loop()
  except RuntimeError:
    loop = None
  if loop is None or loop.is_closed():
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
  return loop


def _worker_lost_error(
    config: ExperimentConfig,
    last_released_round: Optional[int],
    error: cpp_worker.WorkerUnavailableError,
) -> 'WorkerLostError':
  """Says which round a lost remote worker failed, what is kept, and how to resume."""
  manager = tff.program.FileProgramStateManager(config.checkpoint_dir)
  versions = _thread_event_loop().run_until_complete(manager.get_versions()) or []
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
  return WorkerLostError(
      f'a TFF worker was lost in round {failed}: {error}. Nothing of round {failed} was'
      f' written and {kept}. Start the worker again (python -m launch.worker --port=PORT)'
      ' and re-run the same command to resume (--workers may name other machines).'
  )


def _client_seed(seed: int, round_num: int, client_index: int) -> int:
  """The shuffle seed of one client in one round: a pure function of the run's seed."""
  return int(np.random.SeedSequence([seed, round_num, client_index]).generate_state(1)[0])


def resolve_evaluation(config: ExperimentConfig) -> ExperimentConfig:
  """`config` with its evaluation settled: as given; for a run whose flags.json predates
  the setting, the per-client evaluation of the test clients it recorded, so that it
  resumes with the numbers it started with; otherwise 'global'."""
  if config.evaluation is not None:
    return config
  recorded = None
  if not config.overwrite:
    with contextlib.suppress(OSError, ValueError):  # `_check_resumable` says what is wrong.
      recorded = analysis.runs.read_flags(config.output_dir)
  if not isinstance(recorded, dict) or 'evaluation' in recorded:
    return dataclasses.replace(config, evaluation=evaluation.GLOBAL)
  clients = config.num_eval_clients
  if clients is None:
    clients = recorded.get('num_eval_clients') or None  # 0 was all.
  return dataclasses.replace(config, evaluation=evaluation.PER_CLIENT, num_eval_clients=clients)


def _check_resumable(config: ExperimentConfig) -> bool:
  """Refuses to continue a run whose flags.json records different settings.

  Returns:
    Whether flags.json exists (and agrees).
  """
  path = os.path.join(config.output_dir, FLAGS_FILENAME)
  if not os.path.exists(path):
    return False
  try:
    with open(path) as f:
      recorded = json.load(f)
  except (OSError, ValueError) as e:
    raise ExperimentError(
        f'{path} is unreadable ({type(e).__name__}); delete it to resume by the record'
        f' beside the checkpoints ({CHECKPOINT_DIRNAME}/{run_directory.IDENTITY_FILENAME}),'
        ' or pass --overwrite to start this experiment afresh'
    ) from e
  if not isinstance(recorded, dict):
    kind = {list: 'list', type(None): 'null', str: 'string', bool: 'boolean'}.get(
        type(recorded), 'number'
    )
    raise ExperimentError(
        f'{path} holds a JSON {kind}, not a run\'s settings; delete it'
        ' to resume by the record beside the checkpoints'
        f' ({CHECKPOINT_DIRNAME}/{run_directory.IDENTITY_FILENAME}), or pass --overwrite'
    )
  changed = run_directory.differences(
      _lasting_settings(recorded), _lasting_settings(config.recorded())
  )
  if changed:
    raise ExperimentError(
        f'{config.output_dir} holds a run with other settings ({changed}); pass'
        ' --overwrite to replace it or choose another --experiment_name'
    )
  return True


def _lasting_settings(recorded: dict) -> dict:
  """The settings a resumed run must share with its start, as JSON reads them back:
  without the rounds to go, where it runs, and where its files are.

  A record from before the evaluation setting evaluated each of its first
  `num_eval_clients` test clients (0: all), which is the per-client evaluation; one from
  before runs listed every hyperparameter holds only those given (`{}` for the
  defaults): the algorithm's defaults fill in the rest, so that it reads as the same run
  as today's record of the same command.
  """
  ignored = _RESUMABLE_CHANGES | _LOCATION_SETTINGS
  settings = {
      k: v for k, v in json.loads(json.dumps(recorded)).items() if k not in ignored
  }
  if 'evaluation' not in settings:  # Before the setting: TFF's evaluation per client.
    settings.update(evaluation=evaluation.PER_CLIENT, eval_examples=None,
                    num_eval_clients=settings.get('num_eval_clients') or None)
  hparams = settings.get('hparams')
  if isinstance(hparams, dict) and settings.get('algo') in registry.ALGORITHMS:
    defaults = json.loads(json.dumps(dict(registry.get(settings['algo']).defaults)))
    settings['hparams'] = {**defaults, **hparams}
  return settings


def _identity(config: ExperimentConfig, task) -> dict:
  """What a resumed run must share with the run that made its checkpoints.

  The settings that change results (not the rounds to go, where it runs, or where its
  files are) and the data's clients; no paths, so a copied run folder resumes.
  """
  return {
      'settings': _lasting_settings(config.recorded()),
      'data': run_directory.data_identity(
          task.datasets.train_data.client_ids, task.datasets.test_data.client_ids
      ),
  }


def _check_total_rounds(config: ExperimentConfig) -> None:
  """Refuses a --total_rounds below the rounds a run's checkpoints already hold."""
  versions = run_directory.checkpoint_versions(config.checkpoint_dir)
  if versions and versions[-1] > config.total_rounds:
    raise ExperimentError(
        f'{config.output_dir} already trained {versions[-1]} rounds, more than'
        f' --total_rounds={config.total_rounds}, and a run is never cut back (its'
        f' {METRICS_FILENAME} holds every round): pass --total_rounds={versions[-1]} or'
        ' more to continue it, or --overwrite to train afresh'
    )


def _newest_checkpoint(config: ExperimentConfig) -> Optional[int]:
  """The round of the newest complete checkpoint (what a re-run resumes from), or None.

  TFF writes a checkpoint under a temporary name and renames it when complete, so only
  `program_state_<round>` directories count.
  """
  return max(run_directory.checkpoint_versions(config.checkpoint_dir), default=None)


@contextlib.contextmanager
def _stops_say_what_is_kept(config: ExperimentConfig):
  """A stop signal, or the machine refusing a write, ends a run saying what it resumes from.

  Raises:
    failures.Interrupted: Ctrl-C, SIGTERM or SIGHUP (a `KeyboardInterrupt`).
    RunEnvironmentError: a write failed for want of space or permission (an `OSError`,
      TensorFlow's error from saving a checkpoint, or the TFF worker's gRPC error).
  """
  # TFF's state manager writes a checkpoint in a thread of the event loop's default
  # executor: a signal stops this thread, not that write, so what is kept is known only
  # once the write has ended (the message would otherwise name the round before).
  writes = concurrent.futures.ThreadPoolExecutor(thread_name_prefix='tff_zmg-writes')
  loop = _thread_event_loop()
  loop.set_default_executor(writes)
  try:
    yield
  except KeyboardInterrupt as e:
    writes.shutdown(wait=True, cancel_futures=True)
    _cancel_pending_tasks(loop)
    kept = _newest_checkpoint(config)
    if kept is None:
      message = 'interrupted before the first checkpoint; re-run the same command to start'
    else:
      message = f'interrupted after round {kept}; re-run the same command to resume'
    raise failures.Interrupted(message) from e
  except ExperimentError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    cause = failures.environment_cause(e)
    if cause is None:
      raise
    writes.shutdown(wait=True, cancel_futures=True)
    _cancel_pending_tasks(loop)
    kept = _newest_checkpoint(config)
    kept_text = (
        'no checkpoint was saved yet' if kept is None
        else f'the checkpoint of round {kept} is kept'
    )
    raise RunEnvironmentError(
        f'the machine refused a write ({cause}); {kept_text}. Free some space (or fix the'
        ' permissions) and re-run the same command to resume'
    ) from e
  finally:
    writes.shutdown(wait=True)
    loop.set_default_executor(concurrent.futures.ThreadPoolExecutor())  # For what follows.


def _cancel_pending_tasks(loop: asyncio.AbstractEventLoop) -> None:
  """Cancels what a stopped round left in the loop (e.g. a checkpoint's save, whose write
  has ended), so that no task is destroyed pending at exit: asyncio logs each on stderr."""
  pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
  for task in pending:
    task.cancel()
  if pending and not loop.is_running():
    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))


def _cache_dir(config: ExperimentConfig) -> str:
  """The folder the task's loader reads: the setting, or the loader's own default."""
  if config.cache_dir:
    return os.path.expanduser(config.cache_dir)
  if config.task in tasks.CENTRALIZED_TASK_NAMES:
    return tfds_source.DEFAULT_DATA_DIR
  return sources.DEFAULT_CACHE_DIR


def _check_run_directory(config: ExperimentConfig) -> None:
  """Everything about the run's folder that can be refused before any computation."""
  run_directory.check_environment(
      config.root_output_dir, config.output_dir, _cache_dir(config),
      # Derived data (synthetic, partitions, tfds copies) is built and locked there.
      cache_must_be_writable=(
          config.data_source == 'synthetic' or config.partition is not None
          or config.task in tasks.CENTRALIZED_TASK_NAMES
      ),
      num_parameters=tasks.registry.spec_with_model(config.task, config.model).num_parameters,
  )
  if config.overwrite:
    run_directory.check_deletable(config.root_output_dir, config.output_dir)
  elif os.path.isdir(config.output_dir):
    run_directory.check_holds_a_run(config.output_dir)
  run_directory.check_not_locked(config.output_dir)
  if not config.overwrite:
    _check_total_rounds(config)


@dataclasses.dataclass(frozen=True)
class LossLimit:
  """The loss above which a round diverged: `factor` x `reference`, round 0's evaluation
  loss (the run's own untrained model)."""

  factor: float
  reference: float

  @property
  def value(self) -> float:
    return self.factor * self.reference


def divergence(
    metrics: collections.abc.Mapping, limit: Optional[LossLimit] = None
) -> Optional[str]:
  """Why a round's flat metrics show that training diverged, or None.

  A round diverged when its training loss, or its evaluation loss where it was
  evaluated, is not finite or above `limit`; when the finalizer saw a non-finite update;
  or when more than half of its clients' updates were not finite. The last matters for
  client works that drop such an update (weight 0) and keep the client's old state
  (FedRKMGC, FedGPS): their round's loss stays finite while the model learns from
  (almost) no one.
  """
  for name, label in (('client_work/train/loss', 'training loss'),
                      ('evaluation/loss', 'evaluation loss')):
    if name not in metrics:
      continue
    value = float(metrics[name])
    if not math.isfinite(value):
      return f'{label} {value}'
    if limit is not None and value > limit.value:
      return (
          f'{label} {value:.4g} is above {limit.factor:g} x round 0\'s evaluation loss'
          f' {limit.reference:.4g} (--divergence_factor)'
      )
  if metrics.get('finalizer/update_non_finite', 0):
    return 'the aggregated update is not finite'
  clients = int(metrics.get('client_work/clients', 0))
  dropped = int(metrics.get('client_work/non_finite_clients', 0))
  if clients and 2 * dropped > clients:
    return f'{dropped} of {clients} clients\' updates were not finite'
  return None


def non_finite_leaf(structure) -> Optional[str]:
  """The path of the first float leaf of `structure` that holds a non-finite value."""
  for path, leaf in tree.flatten_with_path(structure):  # dm-tree reads attrs classes too.
    array = np.asarray(leaf)
    if np.issubdtype(array.dtype, np.floating) and not np.all(np.isfinite(array)):
      return '/'.join(str(p) for p in path)
  return None


def diverged_error(config: ExperimentConfig, round_num: int, reason: str) -> DivergedError:
  """Says which round diverged and why, what is kept, and how to train with other settings.

  The same command would resume and diverge again; other settings are a new run, which
  the run's folder refuses without --overwrite (or another --experiment_name).
  """
  kept = _newest_checkpoint(config)
  kept_text = ('no checkpoint was kept' if kept is None
               else f'the checkpoint of round {kept} is kept')
  rates = [f'--{n}' for n in ('client_learning_rate', 'server_learning_rate')
           if n in registry.get(config.algo).defaults]
  return DivergedError(
      f'training diverged in round {round_num}: {reason}. Nothing of round {round_num} was'
      f' saved; {kept_text}. To train with other settings (e.g. a smaller'
      f' {" or ".join(rates) or "learning rate"}), re-run with them and --overwrite, or'
      ' with another --experiment_name'
  )


class _FiniteStateManager(tff.program.FileProgramStateManager):
  """Saves a program state only if every float in it is finite.

  So the kept checkpoint is always one a run can continue from: a state with an
  infinite weight (a round without evaluation, whose loss did not show it yet) stops
  the run before it is written.
  """

  def __init__(self, config: ExperimentConfig, keep_total: int):
    super().__init__(config.checkpoint_dir, keep_total=keep_total)
    self._config = config

  async def save(self, program_state, version: int) -> None:
    where = non_finite_leaf(program_state)
    if where is not None:
      raise diverged_error(
          self._config, version, f'the state holds non-finite values ({where})')
    await super().save(program_state, version)


_EVALUATION_PREFIX = 'evaluation/'
_EVALUATION_TIME = 'evaluation/evaluation_time_in_seconds'


class _RoundReleaseManager(tff.program.ReleaseManager):
  """Judges each round, then releases its metrics and prints one progress line.

  A diverged round (`divergence`, against the limit round 0's evaluation loss sets)
  raises `DivergedError` before anything of it is written (metrics, TensorBoard,
  checkpoint: TFF's training loop releases a round's metrics before it saves the round's
  state). Otherwise the metrics go to `managers` in order, then one line: metrics, rounds
  per second, ETA.
  """

  def __init__(self, config: ExperimentConfig, stream=None):
    self._config = config
    self._total_rounds = config.total_rounds
    self.managers = []  # The run's CSV and TensorBoard managers, once it has made them.
    self._stream = stream
    self._start = None
    self._first_key = None
    self.last_key = None
    self.limit: Optional[LossLimit] = None
    self.trained_rounds: Optional[tuple[int, int]] = None  # [first, last] released here.

  def set_reference(self, round_0_loss: Optional[float]) -> None:
    """Round 0's evaluation loss (None: unknown, only non-finite losses count)."""
    if round_0_loss is not None and math.isfinite(round_0_loss) and round_0_loss > 0:
      if math.isfinite(self._config.divergence_factor):
        self.limit = LossLimit(self._config.divergence_factor, round_0_loss)

  async def release(self, value, key):
    evaluation = [k for k in value if k.startswith(_EVALUATION_PREFIX)]
    if evaluation == [_EVALUATION_TIME]:  # A round `_evaluation_due` skipped.
      value = collections.OrderedDict((k, v) for k, v in value.items() if k != _EVALUATION_TIME)
    flat = _flatten(value)
    reason = divergence(flat, self.limit)
    if reason is not None:
      raise diverged_error(self._config, key, reason)
    if key == 0 and 'evaluation/loss' in flat:
      self.set_reference(float(flat['evaluation/loss']))
    for manager in self.managers:
      await manager.release(value, key)
    self.last_key = key
    if key > 0:  # Round 0 is the untrained model's evaluation.
      self.trained_rounds = ((self.trained_rounds or (key,))[0], key)
    now = time.monotonic()
    if self._start is None:
      self._start, self._first_key = now, key
    parts = [f'round {key}/{self._total_rounds}']
    for name, label in (
        ('client_work/train/loss', 'loss'),
        ('client_work/train/sparse_categorical_accuracy', 'acc'),
        ('evaluation/loss', 'eval_loss'),
        ('evaluation/sparse_categorical_accuracy', 'eval_acc'),
    ):
      if name in flat:
        parts.append(f'{label}={float(flat[name]):.4f}')
    done = key - self._first_key
    if done > 0:
      rate = done / (now - self._start)
      eta = (self._total_rounds - key) / rate
      parts.append(f'{rate:.2f} rounds/s ETA {time.strftime("%H:%M:%S", time.gmtime(eta))}')
    print('  '.join(parts), file=self._stream or sys.stdout, flush=True)


def _flatten(value, prefix='') -> dict:
  if isinstance(value, collections.abc.Mapping):
    out = {}
    for k, v in value.items():
      out.update(_flatten(v, f'{prefix}{k}/'))
    return out
  return {prefix[:-1]: value}


def _evaluation_due(config: ExperimentConfig, round_num: int) -> bool:
  """Round 0, every `rounds_per_eval`-th round, and the last: a finished run's final
  accuracy is always that of its final weights."""
  return round_num % config.rounds_per_eval == 0 or round_num == config.total_rounds


class _Evaluation:
  """TFF's `evaluation_fn`: the run's held-out evaluation (tasks.evaluation) of a state's
  model weights, in rounds `_evaluation_due` asks for (the selection is True)."""

  def __init__(self, held_out, evaluator, training_process):
    self.held_out = held_out
    self._evaluator = evaluator
    self._process = training_process

  def __call__(self, state, due: bool) -> collections.OrderedDict:
    if not due:
      return collections.OrderedDict()
    return self._evaluator(self._process.get_model_weights(state))

  def close(self) -> None:
    self._evaluator.close()


def _evaluation_fn(config, task, training_process, runtime_context, in_process_threads):
  """The run's evaluation, its test examples read once: on the first GPU under
  --executor=gpu (the data kept there), else on the host, as many groups at once as the
  in-process clients' threads per op leave cores for."""
  device, parallel = None, 1
  if config.executor == 'gpu':
    device = runtime_context.devices[0]
  elif runtime_context is not None:
    parallel = evaluation.groups_at_once(in_process_threads)
  held_out = evaluation.read_held_out(
      task, config.evaluation, num_examples=config.eval_examples,
      num_clients=config.num_eval_clients, device=device,
  )
  evaluator = evaluation.Evaluator(task.model_fn, held_out, parallel=parallel, device=device)
  return _Evaluation(held_out, evaluator, training_process)


def _check_checkpoint(config: ExperimentConfig, process, store=None) -> Optional[int]:
  """Resumes from the newest checkpoint that can be read into this process's state (and
  whose client states `store`, if any, can restore).

  Newer ones that cannot (a save cut short, a damaged disk, a lost snapshot) are set aside as
  `checkpoints/unreadable_program_state_N`, saying so; if none can, the run is refused.

  Returns:
    The round of the checkpoint the run resumes from (None: it starts afresh).
  """
  if not os.path.isdir(config.checkpoint_dir):
    return None
  manager = tff.program.FileProgramStateManager(config.checkpoint_dir)
  structure = process.initialize()
  loop = _thread_event_loop()

  def load(version):
    loop.run_until_complete(manager.load(version, structure))
    if store is not None:
      store.check_restorable(version)

  version, refused = run_directory.find_intact_checkpoint(config.checkpoint_dir, load)
  if refused and version is None:
    newest, e = refused[0]
    message = str(e).strip().splitlines()[0] if str(e).strip() else ''
    raise ExperimentError(
        f'no checkpoint in {config.checkpoint_dir} can be restored into this experiment'
        f' (round {newest}: {type(e).__name__}: {message[:200]}); pass --overwrite to start'
        ' afresh'
    )
  for newer, e in refused:
    aside = run_directory.set_aside_unreadable(config.checkpoint_dir, newer)
    print(
        f'checkpoint of round {newer} cannot be read ({type(e).__name__}); resuming from'
        f' round {version}, the newest intact one (kept as'
        f' {CHECKPOINT_DIRNAME}/{aside})', flush=True,
    )
  return version


def _say_if_capped(config: ExperimentConfig, train_data) -> None:
  """One line when --clients_per_round asks for more clients than the data has."""
  population = len(train_data.client_ids)
  if config.clients_per_round > population:
    print(f'clients_per_round: {config.clients_per_round} asked, but the data has'
          f' {population} training clients: all {population} train every round', flush=True)


def _runtime_line(config: ExperimentConfig, runtime_context, in_process_threads) -> str:
  """One line saying who runs the rounds, on which devices, with how many threads."""
  if runtime_context is not None:
    threads = _threads(in_process_threads) if in_process_threads else "TensorFlow's default"
    return (
        f'runtime: in this process on {", ".join(runtime_context.devices)}'
        f' ({runtime_context.clients_per_device} clients at once per device,'
        f' {threads} per TF op on the CPU)'
    )
  if config.workers:
    return f'runtime: TFF workers at {", ".join(config.workers)}'
  return (
      "runtime: TFF's local worker_binary on the CPU"
      f' ({_threads(local_intra_op_threads(config))} per TF op)'
  )


def _threads(count: int) -> str:
  return f'{count} thread' + ('s' if count != 1 else '')


def _record_session(
    config: ExperimentConfig, runtime_context, in_process_threads: Optional[int], held_out,
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
      os.path.join(config.output_dir, RUNTIME_FILENAME), {'sessions': [*sessions, session]},
      sort_keys=False)
  return session


def read_metric(csv_path: str, name: str) -> dict[int, float]:
  """`{round: value}` of one metric column of a run's metrics.csv (rounds that have it)."""
  if not os.path.exists(csv_path):
    return {}
  with open(csv_path, newline='') as f:
    rows = list(csv.DictReader(f))
  return {
      int(r['key']): float(r[name]) for r in rows if r.get(name) not in (None, '')
  }


def is_finished(config: ExperimentConfig) -> bool:
  """Whether the run has trained all `config.total_rounds` rounds (its metrics.csv says so).

  Raises:
    ExperimentError: the directory holds a run with other settings.
  """
  _check_resumable(resolve_evaluation(config))
  train_loss = read_metric(config.metrics_csv, 'client_work/train/loss')
  return max(train_loss, default=0) >= config.total_rounds


def run(config: ExperimentConfig) -> dict:
  """Runs (or resumes) one experiment and returns its summary.

  Raises:
    ExperimentError: bad settings, an existing run with other settings, an unreadable
      checkpoint, an unreachable remote worker, or divergence (then the last good
      checkpoint is kept).
    WorkerLostError: a remote worker stopped answering mid-run (an ExperimentError; the
      failed round wrote nothing and re-running resumes from the last checkpoint).
    RunEnvironmentError: an output or cache folder that is a file or not writable, or too
      little free space for a checkpoint (an ExperimentError; checked before any
      computation, `run_directory.check_environment`).
    tasks.MissingDataError, tasks.CorruptDataError: the data is not usable.
    ValueError: a hyperparameter out of its range.
  """
  config = resolve_evaluation(config)
  _validate(config)
  in_process_threads = _set_in_process_threads(config)  # Before any TF op runs.
  flags_agree = False if config.overwrite else _check_resumable(config)
  if config.executor == 'gpu' and not in_process.visible_gpus():
    from tff_zmg.runtime import gpu_diagnosis  # pylint: disable=g-import-not-at-top
    raise ExperimentError(
        '--executor=gpu but TensorFlow sees no GPU in this process:'
        f' {gpu_diagnosis.no_gpu_cause()} (or use --executor=cpu)'
    )
  _check_run_directory(config)
  if config.workers:
    _check_workers_reachable(config)
  task = tasks.get(
      config.task,
      data_source=config.data_source,
      cache_dir=config.cache_dir,
      batch_size=config.client_batch_size,
      num_epochs=config.client_epochs_per_round,
      max_elements=config.max_elements_per_client,
      shuffle_seed=config.seed,
      model_seed=config.seed,
      synthetic_settings=config.synthetic_settings,
      partition=config.partition,
      dirichlet_alpha=config.dirichlet_alpha,
      num_clients=config.num_clients,
      partition_seed=config.partition_seed,
      model=config.model,
      gpu_kernels=config.executor == 'gpu',
  )
  identity = _identity(config, task)
  if not config.overwrite:
    run_directory.check_identity(
        config.output_dir, config.checkpoint_dir, identity, legacy_flags_ok=flags_agree,
        read_settings=_lasting_settings,
    )
  loop = (
      tff.learning.LoopImplementation.DATASET_ITERATOR
      if config.executor == 'gpu'
      else tff.learning.LoopImplementation.DATASET_REDUCE
  )
  process = registry.build(
      config.algo, task.model_fn, keras_model_fn=task.keras_model_fn,
      num_clients=len(task.datasets.train_data.client_ids),
      loop_implementation=loop, **config.hparams,
  )
  stateful = isinstance(process, stateful_clients.StatefulClientsLearningProcess)
  if stateful and len(config.workers) > 1:
    # TFF's mergeable context splits a round at its aggregation and merges
    # SERVER-placed results; the clients' new states are CLIENTS-placed outputs, a
    # case we have neither built nor tested.
    raise ExperimentError(
        f'--algo={config.algo} keeps per-client state, which runs on one worker only'
        ' (several --workers split rounds with TFF\'s mergeable context, which does'
        ' not return per-client outputs); pass one --workers address or none'
    )
  train_data = task.datasets.train_data
  clients_per_round = min(config.clients_per_round, len(train_data.client_ids))
  sample_clients = tff.simulation.build_uniform_sampling_fn(
      train_data.client_ids, replace=False, random_seed=config.seed
  )

  def training_selection_fn(round_num):
    ids = sample_clients(round_num, clients_per_round)
    datasets = [
        task.train_preprocess_fn_for_seed(_client_seed(config.seed, round_num, i))(
            train_data.create_tf_dataset_for_client(cid)
        )
        for i, cid in enumerate(ids)
    ]
    if stateful:  # The trainer needs the ids to find the clients' states.
      return client_states.ClientSelection(round_num, ids, datasets)
    return datasets

  start = time.monotonic()
  progress = _RoundReleaseManager(config)
  # One process per run from here on: checks made before are made again under the lock.
  with run_directory.locked(config.output_dir):
    if config.overwrite:
      run_directory.clear(config.root_output_dir, config.output_dir)
    else:
      flags_agree = _check_resumable(config)
      run_directory.check_identity(
          config.output_dir, config.checkpoint_dir, identity, legacy_flags_ok=flags_agree,
          read_settings=_lasting_settings,
      )
      _check_total_rounds(config)
    removed = run_directory.remove_interrupted_saves(config.output_dir, config.checkpoint_dir)
    if removed:
      print(f'removed what interrupted saves left: {", ".join(removed)}', flush=True)
    with _stops_say_what_is_kept(config), _execution_context(
        config, progress
    ) as runtime_context:
      print(_runtime_line(config, runtime_context, in_process_threads), flush=True)
      evaluate = _evaluation_fn(config, task, process, runtime_context, in_process_threads)
      print(f'evaluation: {evaluate.held_out.description}', flush=True)
      store = None
      if stateful:
        store = client_states.create_store(
            config.client_state_store,
            os.path.join(config.output_dir, CLIENT_STATES_DIRNAME),
        )
      resumed_from = _check_checkpoint(config, process, store)
      repaired = run_directory.repair_metrics_csv(config.metrics_csv, resumed_from)
      if repaired:
        print(repaired, flush=True)
      progress.set_reference(read_metric(config.metrics_csv, 'evaluation/loss').get(0))
      _say_if_capped(config, train_data)
      run_directory.write_identity(config.checkpoint_dir, identity)
      run_directory.write_json_atomically(
          os.path.join(config.output_dir, FLAGS_FILENAME), config.recorded()
      )
      state_manager = _FiniteStateManager(config, keep_total=3)
      training_process = process
      if stateful:
        # Remote workers may not see this machine's files: their states go in the call.
        training_process = client_states.StatefulClientsTrainer(
            process, store, states_in_worker=not config.workers
        )
        state_manager = client_states.ClientStateCheckpointManager(state_manager, store)
      progress.managers = [
          tff.program.CSVFileReleaseManager(config.metrics_csv),
          tff.program.TensorBoardReleaseManager(
              os.path.join(config.output_dir, TENSORBOARD_DIRNAME)
          ),
      ]
      _thread_event_loop()  # run_training_process asks for it.

      def record_session():
        return _record_session(config, runtime_context, in_process_threads,
                               evaluate.held_out, progress.trained_rounds)

      try:
        tff.simulation.run_training_process(
            training_process=training_process,
            training_selection_fn=training_selection_fn,
            total_rounds=config.total_rounds,
            evaluation_fn=evaluate,
            evaluation_selection_fn=lambda round_num: _evaluation_due(config, round_num),
            rounds_per_evaluation=1,  # Asks every round; `_evaluation_due` decides.
            program_state_manager=state_manager,
            rounds_per_saving_program_state=config.rounds_per_checkpoint,
            metrics_managers=[progress],
        )
      except BaseException:
        with contextlib.suppress(Exception):  # The error that stopped the run is the news.
          record_session()
        raise
      evaluate.close()
      session = record_session()
  wall = time.monotonic() - start
  eval_acc = read_metric(config.metrics_csv, 'evaluation/sparse_categorical_accuracy')
  train_loss = read_metric(config.metrics_csv, 'client_work/train/loss')
  return collections.OrderedDict(
      rounds_completed=max(train_loss, default=0),
      final_eval_accuracy=eval_acc[max(eval_acc)] if eval_acc else None,
      best_eval_accuracy=max(eval_acc.values()) if eval_acc else None,
      wall_time_s=wall,
      output_dir=config.output_dir,
      metrics_csv=config.metrics_csv,
      tensorboard_dir=os.path.join(config.output_dir, TENSORBOARD_DIRNAME),
      runtime=resolved_runtime(config),
      client_devices=session['client_devices'] if session else {},
      evaluation=evaluate.held_out.description,
  )
