"""One federated training run: data, process, TFF's training loop, outputs, resumption.

`launch.train` fills an `ExperimentConfig` from its flags and calls `run`; the grid search
and comparison programs call `run` the same way, one directory per run. Everything that
can be rejected (task, algorithm, hyperparameters, data, an existing run with other
settings) is checked before anything is written to the output directory.
"""

import asyncio
import collections
import contextlib
import csv
import dataclasses
import json
import math
import os
import re
import shutil
import sys
import time
from typing import Optional

import grpc
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

import tasks
from launch import failures
from tff_zmg import client_states
from tff_zmg.runtime import cpp_worker
from tff_zmg.runtime import in_process
from tff_zmg import validation
from tff_zmg.algorithms import registry
from tff_zmg.algorithms import stateful_clients

FLAGS_FILENAME = 'flags.json'
METRICS_FILENAME = 'metrics.csv'
CHECKPOINT_DIRNAME = 'checkpoints'
TENSORBOARD_DIRNAME = 'tensorboard'
CLIENT_STATES_DIRNAME = 'client_states'
RUNTIME_FILENAME = 'runtime.json'
IN_PROCESS, TFF_WORKER = 'in_process', 'tff_worker'
RUNTIMES = ('auto', IN_PROCESS, TFF_WORKER)
# `--executor=cpu --runtime=auto` runs in TFF's worker: on this 2-core CPU it ran FedAvg's
# EMNIST round faster than the in-process runtime (README "Runtimes"; launch.benchmark's
# `in_process` contender re-measures it).
CPU_RUNTIME = TFF_WORKER
# Settings that may change between a run and its resumption without changing its results.
_RESUMABLE_CHANGES = frozenset(
    {
        'total_rounds', 'executor', 'runtime', 'max_concurrent_clients',
        'intra_op_threads', 'rounds_per_checkpoint', 'workers', 'worker_timeout_s',
    }
)


class ExperimentError(Exception):
  """A run cannot start or continue; the message says why and what to do."""


class DivergedError(ExperimentError):
  """Training produced a non-finite loss or update."""


class WorkerLostError(ExperimentError):
  """A remote TFF worker stopped answering during a round; the last checkpoint is kept."""


class RunEnvironmentError(ExperimentError):
  """The machine, not the settings, stops the run: a full disk, a folder that cannot be
  written, a file where a folder belongs."""


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
  num_eval_clients: int = 100
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
    """The settings as saved in flags.json (what a resumed run must agree with)."""
    values = dataclasses.asdict(self)
    values.pop('overwrite')
    return values


def _validate(config: ExperimentConfig) -> None:
  if config.task not in tasks.TASK_NAMES:
    raise ExperimentError(
        f'unknown task {config.task!r}; choose one of {list(tasks.TASK_NAMES)}'
    )
  for name in (
      'total_rounds', 'clients_per_round', 'client_epochs_per_round', 'rounds_per_eval',
      'rounds_per_checkpoint',
  ):
    validation.check_positive(name, getattr(config, name))
  validation.check_non_negative('num_eval_clients', config.num_eval_clients)
  validation.check_non_negative('intra_op_threads', config.intra_op_threads)
  if config.client_batch_size is not None:
    validation.check_positive('client_batch_size', config.client_batch_size)
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
  if runtime == IN_PROCESS and config.intra_op_threads > 0:
    raise ExperimentError(
        '--intra_op_threads sets TFF\'s worker; the in-process runtime uses this process\'s'
        ' TensorFlow threads (set TF_NUM_INTRAOP_THREADS in the environment instead)'
    )


def local_intra_op_threads(config: ExperimentConfig) -> int:
  """The local worker's threads per TF op: the setting, or one for the clients at once."""
  if config.intra_op_threads > 0:
    return config.intra_op_threads
  return cpp_worker.intra_op_threads_for(
      config.clients_per_round, max_concurrent_clients=config.max_concurrent_clients
  )


def _check_workers_reachable(config: ExperimentConfig) -> None:
  """Fails before anything is written if a remote worker does not answer."""
  try:
    workers = cpp_worker.connect_workers(config.workers, config.worker_timeout_s)
  except (ValueError, cpp_worker.WorkerUnavailableError) as e:
    raise ExperimentError(str(e)) from e
  for worker in workers:
    worker.close()


@contextlib.contextmanager
def _execution_context(config: ExperimentConfig, progress: '_ProgressReleaseManager'):
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


def _check_resumable(config: ExperimentConfig) -> None:
  """Refuses to continue a run recorded with different settings."""
  path = os.path.join(config.output_dir, FLAGS_FILENAME)
  if not os.path.exists(path):
    return
  try:
    with open(path) as f:
      recorded = json.load(f)
  except (OSError, ValueError) as e:
    raise ExperimentError(
        f'{path} is unreadable ({e}); pass --overwrite to start this experiment afresh'
    ) from e
  now = json.loads(json.dumps(config.recorded()))
  changed = sorted(
      k for k in set(recorded) | set(now)
      if k not in _RESUMABLE_CHANGES and recorded.get(k) != now.get(k)
  )
  if changed:
    details = ', '.join(f'{k}: {recorded.get(k)!r} -> {now.get(k)!r}' for k in changed)
    raise ExperimentError(
        f'{config.output_dir} holds a run with other settings ({details}); pass'
        ' --overwrite to replace it or choose another --experiment_name'
    )


def _newest_checkpoint(config: ExperimentConfig) -> Optional[int]:
  """The round of the newest complete checkpoint (what a re-run resumes from), or None.

  TFF writes a checkpoint under a temporary name and renames it when complete, so only
  `program_state_<round>` directories count.
  """
  try:
    names = os.listdir(config.checkpoint_dir)
  except OSError:
    return None
  rounds = [int(m.group(1)) for m in map(re.compile(r'program_state_(\d+)').fullmatch, names) if m]
  return max(rounds, default=None)


@contextlib.contextmanager
def _stops_say_what_is_kept(config: ExperimentConfig):
  """A stop signal, or the machine refusing a write, ends a run saying what it resumes from.

  Raises:
    failures.Interrupted: Ctrl-C, SIGTERM or SIGHUP (a `KeyboardInterrupt`).
    RunEnvironmentError: a write failed for want of space or permission (an `OSError`,
      TensorFlow's error from saving a checkpoint, or the TFF worker's gRPC error).
  """
  try:
    yield
  except KeyboardInterrupt as e:
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
    kept = _newest_checkpoint(config)
    kept_text = (
        'no checkpoint was saved yet' if kept is None
        else f'the checkpoint of round {kept} is kept'
    )
    raise RunEnvironmentError(
        f'the machine refused a write ({cause}); {kept_text}. Free some space (or fix the'
        ' permissions) and re-run the same command to resume'
    ) from e


class _ProgressReleaseManager(tff.program.ReleaseManager):
  """Prints one line per round: metrics, rounds per second, ETA; stops on divergence."""

  def __init__(self, total_rounds: int, stream=None):
    self._total_rounds = total_rounds
    self._stream = stream
    self._start = None
    self._first_key = None
    self.last_key = None

  async def release(self, value, key):
    flat = _flatten(value)
    loss = flat.get('client_work/train/loss')
    non_finite = flat.get('finalizer/update_non_finite', 0)
    if loss is not None and (not math.isfinite(float(loss)) or non_finite):
      raise DivergedError(
          f'training diverged in round {key}: loss={loss}, non-finite update'
          f' {bool(non_finite)}. The last good checkpoint is kept; try a smaller learning'
          ' rate.'
      )
    self.last_key = key
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


def _evaluation_fn(task, training_process):
  eval_process = tff.learning.algorithms.build_fed_eval(task.model_fn)
  eval_state = eval_process.initialize()

  def evaluate(state, data):
    weights = training_process.get_model_weights(state)
    output = eval_process.next(eval_process.set_model_weights(eval_state, weights), data)
    return collections.OrderedDict(output.metrics['client_work']['eval']['current_round_metrics'])

  return evaluate


def _check_checkpoint(config: ExperimentConfig, process) -> None:
  """Fails clearly if the latest checkpoint cannot be read into this process's state."""
  if not os.path.isdir(config.checkpoint_dir):
    return
  manager = tff.program.FileProgramStateManager(config.checkpoint_dir)
  try:
    _thread_event_loop().run_until_complete(manager.load_latest(process.initialize()))
  except Exception as e:  # pylint: disable=broad-except
    raise ExperimentError(
        f'the checkpoint in {config.checkpoint_dir} cannot be restored into this'
        f' experiment ({type(e).__name__}: {e}); pass --overwrite to start afresh'
    ) from e


def _record_runtime(config: ExperimentConfig, runtime_context) -> dict:
  """Writes `runtime.json`: the runtime and where the clients' computations ran.

  In process, the devices are read from the tensors each client's computation returned
  (with how many client computations, training and evaluation, ran on each); TFF's
  worker returns NumPy values, and its pip build has only a CPU device.
  """
  runtime = resolved_runtime(config)
  if runtime_context is not None:
    client_devices = dict(sorted(runtime_context.client_devices.items()))
  else:
    where = 'remote TFF workers' if config.workers else "TFF's local worker_binary"
    client_devices = {f'CPU of {where} (a build without CUDA)': None}
  record = collections.OrderedDict(runtime=runtime, client_devices=client_devices)
  with open(os.path.join(config.output_dir, RUNTIME_FILENAME), 'w') as f:
    json.dump(record, f, indent=2)
  return record


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
  _check_resumable(config)
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
    tasks.MissingDataError, tasks.CorruptDataError: the data is not usable.
    ValueError: a hyperparameter out of its range.
  """
  _validate(config)
  if not config.overwrite:
    _check_resumable(config)
  if config.executor == 'gpu' and not in_process.visible_gpus():
    raise ExperimentError(
        '--executor=gpu but TensorFlow sees no GPU in this process (CUDA build:'
        f' {tf.test.is_built_with_cuda()}, CUDA_VISIBLE_DEVICES='
        f'{os.environ.get("CUDA_VISIBLE_DEVICES", "unset")}); use --executor=cpu'
    )
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
  loop = (
      tff.learning.LoopImplementation.DATASET_ITERATOR
      if config.executor == 'gpu'
      else tff.learning.LoopImplementation.DATASET_REDUCE
  )
  process = registry.build(
      config.algo, task.model_fn, keras_model_fn=task.keras_model_fn,
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
  if config.overwrite and os.path.exists(config.output_dir):
    shutil.rmtree(config.output_dir)

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

  # The same test clients at every evaluation and for every algorithm and seed, so that
  # curves are comparable and paired tests are paired.
  test_data = task.datasets.test_data
  eval_ids = sorted(test_data.client_ids)
  if config.num_eval_clients:
    eval_ids = eval_ids[: config.num_eval_clients]
  eval_datasets = [
      task.datasets.eval_preprocess_fn(test_data.create_tf_dataset_for_client(cid))
      for cid in eval_ids
  ]

  start = time.monotonic()
  progress = _ProgressReleaseManager(config.total_rounds)
  with _stops_say_what_is_kept(config), _execution_context(config, progress) as runtime_context:
    _check_checkpoint(config, process)
    os.makedirs(config.output_dir, exist_ok=True)
    with open(os.path.join(config.output_dir, FLAGS_FILENAME), 'w') as f:
      json.dump(config.recorded(), f, indent=2, sort_keys=True)
    state_manager = tff.program.FileProgramStateManager(config.checkpoint_dir, keep_total=3)
    training_process = process
    if stateful:
      store = client_states.create_store(
          config.client_state_store,
          os.path.join(config.output_dir, CLIENT_STATES_DIRNAME),
      )
      # Remote workers may not see this machine's files: their states go in the call.
      training_process = client_states.StatefulClientsTrainer(
          process, store, states_in_worker=not config.workers
      )
      state_manager = client_states.ClientStateCheckpointManager(state_manager, store)
    metrics_managers = [
        progress,
        tff.program.CSVFileReleaseManager(config.metrics_csv),
        tff.program.TensorBoardReleaseManager(
            os.path.join(config.output_dir, TENSORBOARD_DIRNAME)
        ),
    ]
    _thread_event_loop()  # run_training_process asks for it.
    tff.simulation.run_training_process(
        training_process=training_process,
        training_selection_fn=training_selection_fn,
        total_rounds=config.total_rounds,
        evaluation_fn=_evaluation_fn(task, process),
        evaluation_selection_fn=lambda round_num: eval_datasets,
        rounds_per_evaluation=config.rounds_per_eval,
        program_state_manager=state_manager,
        rounds_per_saving_program_state=config.rounds_per_checkpoint,
        metrics_managers=metrics_managers,
    )
    runtime_record = _record_runtime(config, runtime_context)
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
      runtime=runtime_record['runtime'],
      client_devices=runtime_record['client_devices'],
  )
