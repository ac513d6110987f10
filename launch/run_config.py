"""A run's settings (`ExperimentConfig`), the names of what it writes, and their checks.

`launch.train` fills an `ExperimentConfig` from its flags; the grid search, the comparison
and the benchmarks make theirs the same way. `validate` refuses settings that cannot run,
one line each, before anything is read or written; `resolve_evaluation` settles the one
setting whose default depends on the run already in the folder.
"""

import contextlib
import dataclasses
import functools
import os
from typing import Optional

import tasks
from tasks import evaluation
from launch import errors
from launch import run_directory
from launch import runtime_choice
from tff_zmg import analysis
from tff_zmg import client_states
from tff_zmg import validation
from tff_zmg.algorithms import registry
from tff_zmg.runtime import cpp_worker

FLAGS_FILENAME = 'flags.json'
METRICS_FILENAME = 'metrics.csv'
CHECKPOINT_DIRNAME = 'checkpoints'
TENSORBOARD_DIRNAME = 'tensorboard'
CLIENT_STATES_DIRNAME = 'client_states'
RUNTIME_FILENAME = analysis.runs.RUNTIME_FILENAME
# A round whose training or evaluation loss is above this multiple of round 0's evaluation
# loss (an untrained model's, about the uniform prediction's log(classes): 4.1 on EMNIST's
# 62) diverged, as one whose loss is not finite did (`rounds.divergence`); --divergence_factor.
DIVERGENCE_FACTOR = 10.0


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
  validation.check_non_negative('intra_op_threads', config.intra_op_threads)
  if not config.divergence_factor > 1:
    raise errors.ExperimentError(
        f'divergence_factor must be > 1 (inf: only a non-finite loss is divergence), got'
        f' {config.divergence_factor!r}'
    )
  evaluation.check_settings(config.evaluation, config.eval_examples, config.num_eval_clients)
  for name in ('client_batch_size', 'max_elements_per_client'):  # None: no setting.
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
  """`config` with its evaluation settled: as given; for a run whose flags.json predates
  the setting, the per-client evaluation of the test clients it recorded, so that it
  resumes with the numbers it started with; otherwise 'global'."""
  if config.evaluation is not None:
    return config
  recorded = None
  if not config.overwrite:
    # What is wrong with an unreadable record, `resumption.check_resumable` says.
    with contextlib.suppress(OSError, ValueError):
      recorded = analysis.runs.read_flags(config.output_dir)
  if not isinstance(recorded, dict) or 'evaluation' in recorded:
    return dataclasses.replace(config, evaluation=evaluation.GLOBAL)
  clients = config.num_eval_clients
  if clients is None:
    clients = recorded.get('num_eval_clients') or None  # 0 was all.
  return dataclasses.replace(config, evaluation=evaluation.PER_CLIENT, num_eval_clients=clients)
