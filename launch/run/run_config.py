"""A run's settings (`ExperimentConfig`), the names of what it writes, and their checks.

`launch.train` fills an `ExperimentConfig` from its flags; the grid search, the comparison
and the benchmarks make theirs the same way. `validate` refuses settings that cannot run,
one line each, before anything is read or written; `resolve_evaluation` settles the
evaluation's settings whose defaults depend on the run already in the folder.
"""

import contextlib
import dataclasses
import functools
import os
from typing import Optional

import tensorflow_federated as tff

from launch.run import errors
from launch.run import run_directory
from launch.run import runtime_choice
import tasks
from tasks import evaluation
from tff_zmg import aggregation
from tff_zmg.algorithms import registry
from tff_zmg import analysis
from tff_zmg import client_states
from tff_zmg import run_files
from tff_zmg.runtime import cpp_worker
from tff_zmg.templates import hparams as hparams_lib
from tff_zmg import validation

# A round whose training or evaluation loss is above this multiple of round 0's evaluation
# loss (an untrained model's, about the uniform prediction's log(classes): 4.1 on EMNIST's
# 62) diverged, as one whose loss is not finite did (`rounds.divergence`); --divergence_factor.
DIVERGENCE_FACTOR = 10.0
# The aggregator's settings a run sets itself rather than by flag: the clients it samples
# each round (--clients_per_round, at most the training clients) and its --seed, which
# seeds the DP noise so that a run, and its resumption, draws the same noise.
RUN_AGGREGATOR_SETTINGS = ('clients_per_round', 'noise_seed')
# The loop a run's clients step in, on every device: a dataset cannot be reduced on an
# accelerator, and on this CPU the iterator's loop made rounds 0.43x (EMNIST), 0.58x
# (CIFAR-100) and 0.99x (Shakespeare) of dataset.reduce's (docs/performance.md).
CLIENT_LOOP = tff.learning.LoopImplementation.DATASET_ITERATOR


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
  eval_last_rounds: Optional[int] = None
  # One of evaluation.KINDS; None: 'global', or for a run recorded before this setting
  # existed, the per-client evaluation it was started with (`resolve_evaluation`).
  evaluation: Optional[str] = None
  # global evaluation: a fixed subsample of this many test examples (None: all).
  eval_examples: Optional[int] = None
  # per_client evaluation: the first this many sorted test clients (None: all).
  num_eval_clients: Optional[int] = None
  # Test examples per evaluation batch. None: a new run's `evaluation.batch_size_for` its
  # task and executor, or for a run in the folder the batch it recorded, its task's
  # TaskSpec.eval_batch_size if it recorded none (`resolve_evaluation`).
  eval_batch_size: Optional[int] = None
  rounds_per_checkpoint: int = 1
  executor: str = 'cpu'
  # Who runs the rounds: 'in_process' (this process's TensorFlow, the only way to a GPU),
  # 'tff_worker' (TFF's C++ worker, CPU only) or 'auto'
  # (`runtime_choice.resolved_runtime`).
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
  # How the server aggregates client updates: fields of `aggregation.AggregatorSettings`
  # as given (kind, the DP and compression settings; {}: the algorithm's own mean), not
  # RUN_AGGREGATOR_SETTINGS, which the run sets (`aggregator_settings`).
  aggregator: dict = dataclasses.field(default_factory=dict)

  @property
  def output_dir(self) -> str:
    return os.path.join(self.root_output_dir, self.experiment_name)

  @property
  def checkpoint_dir(self) -> str:
    return os.path.join(self.output_dir, run_files.CHECKPOINTS)

  @property
  def metrics_csv(self) -> str:
    return os.path.join(self.output_dir, run_files.METRICS)

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
    values['eval_batch_size'] = self.eval_batch_size or evaluation.batch_size_for(
        self.task, self.executor)
    values['hparams'] = dict(self._resolved_hparams)
    values['aggregator'] = dict(self._recorded_aggregator)
    return values

  def aggregator_settings(
      self, num_train_clients: Optional[int] = None
  ) -> aggregation.AggregatorSettings:
    """The run's aggregator: its given settings, the clients it samples each round (at
    most `num_train_clients`, once the data is known) and its seed for the noise.

    Raises:
      ValueError: (one line) a setting out of its range, one its kind does not read, one
        the run sets, or an aggregator the algorithm refuses (`registry.check_aggregator`).
    """
    clients = self.clients_per_round
    if num_train_clients is not None:
      clients = min(clients, num_train_clients)
    return checked_aggregator(self.algo, self.aggregator, clients, self.seed)

  @functools.cached_property
  def _resolved_hparams(self) -> dict:
    # Once per config: a run records and compares its settings several times, and each
    # resolution checks every value again (and repeats FedRKMGC's small-gamma warning).
    return registry.resolve(self.algo, self.hparams)

  @functools.cached_property
  def _recorded_aggregator(self) -> dict:
    # What the kind reads, as flags give it: the run records the others apart.
    used = self.aggregator_settings().used()
    return {k: v for k, v in used.items() if k not in RUN_AGGREGATOR_SETTINGS}


def aggregator_flag(field: str) -> str:
  """The `launch.train` flag of an `aggregation.AggregatorSettings` field."""
  return 'aggregator' if field == 'kind' else field


def checked_aggregator(
    algo: str, given: dict, clients_per_round: int, seed: int
) -> aggregation.AggregatorSettings:
  """`AggregatorSettings` of the `given` fields, the run's clients per round and seed.

  Raises:
    ValueError: (one line, naming the flag) as `ExperimentConfig.aggregator_settings`.
  """
  fields = hparams_lib.field_info(aggregation.AggregatorSettings)
  for field, value in given.items():
    if field in RUN_AGGREGATOR_SETTINGS or field not in fields:
      raise ValueError(
          f'{field} is not an aggregator setting of a run (the run samples'
          ' clients_per_round clients a round and seeds the noise with its seed); they are'
          f' {[f for f in fields if f not in RUN_AGGREGATOR_SETTINGS]}'
      )
    fields[field][1].check(aggregator_flag(field), value)  # The flag's name in the error.
  settings = aggregation.AggregatorSettings(
      **given, clients_per_round=clients_per_round, noise_seed=seed
  )
  ignored = [f for f in given if f != 'kind' and f not in aggregation.READS[settings.kind]]
  if ignored:
    flags_read = [f'--{f}' for f in aggregation.READS[settings.kind]
                  if f not in RUN_AGGREGATOR_SETTINGS]
    raise ValueError(
        f'--{ignored[0]} does not apply to --aggregator={settings.kind}, which reads'
        f' {", ".join(flags_read) or "no other flag"}'
    )
  try:
    registry.check_aggregator(algo, settings)
  except ValueError as e:  # Which flag the algorithm refuses, then what would escape.
    raise ValueError(f'--algo={algo} refuses --aggregator={settings.kind}: {e}') from None
  return settings


def validate(config: ExperimentConfig) -> None:
  """Refuses settings that cannot run: one line saying which and why.

  Raises:
    errors.ExperimentError, ValueError: the first bad setting.
  """
  if config.task not in tasks.TASK_NAMES:
    raise errors.ExperimentError(
        f'unknown task {config.task!r}; choose one of {list(tasks.TASK_NAMES)}'
    )
  run_directory.check_name(config.experiment_name)
  for name in (
      'total_rounds', 'clients_per_round', 'client_epochs_per_round', 'rounds_per_eval',
      'rounds_per_checkpoint',
  ):
    validation.check_positive(name, getattr(config, name))
  if config.eval_last_rounds is not None:
    validation.check_positive('eval_last_rounds', config.eval_last_rounds)
  validation.check_non_negative('intra_op_threads', config.intra_op_threads)
  validation.check_integer('seed', config.seed, 0)  # It becomes an int64 tensor.
  if not config.divergence_factor > 1:
    raise errors.ExperimentError(
        f'divergence_factor must be > 1 (inf: only a non-finite loss is divergence), got'
        f' {config.divergence_factor!r}'
    )
  evaluation.check_settings(config.evaluation, config.eval_examples, config.num_eval_clients)
  config.aggregator_settings()  # Before the data is read: the flags, and a refusal.
  for name in ('client_batch_size', 'max_elements_per_client', 'eval_batch_size'):
    # None: no setting (or a default).
    if getattr(config, name) is not None:
      validation.check_positive(name, getattr(config, name))
  if config.executor not in ('cpu', 'gpu'):
    raise errors.ExperimentError(f"executor must be 'cpu' or 'gpu', got {config.executor!r}")
  if config.runtime not in runtime_choice.RUNTIMES:
    raise errors.ExperimentError(
        f'runtime must be one of {list(runtime_choice.RUNTIMES)}, got {config.runtime!r}')
  runtime_choice.check_runtime(config)
  if config.client_state_store not in client_states.STORES:
    raise errors.ExperimentError(
        f'client_state_store must be one of {list(client_states.STORES)}, got'
        f' {config.client_state_store!r}'
    )
  _validate_workers(config)


def _validate_workers(config: ExperimentConfig) -> None:
  if isinstance(config.workers, str):
    raise errors.ExperimentError(
        f"workers must be a sequence of 'host:port' strings, got the string {config.workers!r}"
    )
  for address in config.workers:
    cpp_worker.parse_worker_address(address)  # ValueError says what is allowed.
  validation.check_positive('worker_timeout_s', config.worker_timeout_s)
  if config.workers and config.max_concurrent_clients > 0:
    raise errors.ExperimentError(
        'max_concurrent_clients limits the local worker; with workers, give each its limit:'
        ' python -m launch.worker --port=PORT --max_concurrent_computation_calls=N'
    )
  if config.workers and config.intra_op_threads > 0:
    raise errors.ExperimentError(
        'intra_op_threads sets the local worker; with workers, give each its own:'
        ' python -m launch.worker --port=PORT --intra_op_parallelism_threads=N'
    )


def resolve_evaluation(config: ExperimentConfig) -> ExperimentConfig:
  """`config` with its evaluation settled, so that a run resumes with the numbers it
  started with:

  - the kind: as given; for a run whose flags.json predates the setting, the per-client
    evaluation of the test clients it recorded; otherwise 'global';
  - the batch: as given; for a run in the folder, the batch its flags.json records (it may
    resume on another executor), or where it records none, its task's
    TaskSpec.eval_batch_size, the batch of every run before the choice; for a new run,
    `evaluation.batch_size_for` its task and executor.
  """
  recorded = None
  if not config.overwrite:
    # What is wrong with an unreadable record, `resumption.check_resumable` says.
    with contextlib.suppress(OSError, ValueError):
      recorded = analysis.runs.read_flags(config.output_dir)
  if not isinstance(recorded, dict):
    recorded = None
  return dataclasses.replace(config, **_resolved_kind(config, recorded),
                             eval_batch_size=_resolved_batch(config, recorded))


def _resolved_kind(config: ExperimentConfig, recorded: Optional[dict]) -> dict:
  if config.evaluation is not None:
    return {}
  if recorded is None or 'evaluation' in recorded:
    return dict(evaluation=evaluation.GLOBAL)
  clients = config.num_eval_clients
  if clients is None:
    clients = recorded.get('num_eval_clients') or None  # 0 was all.
  return dict(evaluation=evaluation.PER_CLIENT, num_eval_clients=clients)


def _resolved_batch(config: ExperimentConfig, recorded: Optional[dict]) -> Optional[int]:
  if config.eval_batch_size is not None or config.task not in tasks.SPECS:
    return config.eval_batch_size  # An unknown task: `validate` says so.
  if recorded is None:
    return evaluation.batch_size_for(config.task, config.executor)
  return recorded.get('eval_batch_size') or tasks.SPECS[config.task].eval_batch_size
