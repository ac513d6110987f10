"""What becomes of each round a run trains: judged, released, saved if sound, evaluated.

TFF's training loop (`tff.simulation.run_training_process`) hands each round's metrics to
a release manager, then saves the round's state. The run's `RoundReleaseManager` judges
the round first (`divergence`, against a `LossLimit` that round 0's evaluation loss sets)
and stops a diverged run (`diverged_error`) before anything of the round is written; it
then releases the metrics to metrics.csv and TensorBoard and prints one progress line.
`FiniteStateManager` saves only a state whose floats are all finite. The run's held-out
evaluation (`evaluation_fn`) runs in the rounds `evaluation_due` asks for.
"""

import asyncio
import collections
import concurrent.futures
import dataclasses
import math
import sys
import time
from typing import Callable, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
import tree

from launch.run import errors
from launch.run import run_config
from launch.run import run_directory
from tasks import evaluation
from tff_zmg.algorithms import registry


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


def diverged_error(
    config: run_config.ExperimentConfig, round_num: int, reason: str
) -> errors.DivergedError:
  """Says which round diverged and why, what is kept, and how to train with other settings.

  The same command would resume and diverge again; other settings are a new run, which
  the run's folder refuses without --overwrite (or another --experiment_name).
  """
  kept = run_directory.newest_checkpoint_round(config.checkpoint_dir)
  kept_text = ('no checkpoint was kept' if kept is None
               else f'the checkpoint of round {kept} is kept')
  rates = [f'--{n}' for n in ('client_learning_rate', 'server_learning_rate')
           if n in registry.get(config.algo).defaults]
  return errors.DivergedError(
      f'training diverged in round {round_num}: {reason}. Nothing of round {round_num} was'
      f' saved; {kept_text}. To train with other settings (e.g. a smaller'
      f' {" or ".join(rates) or "learning rate"}), re-run with them and --overwrite, or'
      ' with another --experiment_name'
  )


class CheckpointReader(tff.program.FileProgramStateManager):
  """TFF's file manager, whose `load` also reads a checkpoint whose sequences differ from
  the state's only in kind (a list where the state has a tuple: FedGPS's mean update in
  checkpoints written before 2026-11-29) into the state's containers, rather than refuse
  it as unreadable and resume from round 0."""

  async def load(self, version: int, structure):
    try:
      return await super().load(version, structure)
    except TypeError:
      path = self._get_path_for_version(version)
      saved = await asyncio.get_running_loop().run_in_executor(
          None, lambda: tf.saved_model.load(path)())
      tree.assert_same_structure(structure, saved, check_types=False)  # Else: unreadable.
      return tree.unflatten_as(structure, [np.asarray(v) for v in tree.flatten(saved)])


class FiniteStateManager(CheckpointReader):
  """Saves a program state only if every float in it is finite, with `in_background`
  while the next round trains.

  So the kept checkpoint is always one a run can continue from: a state with an
  infinite weight (a round without evaluation, whose loss did not show it yet) stops
  the run before it is written. Writing TFF's SavedModel is about 0.13 s of Python a
  save, most of a small round's time outside its training and evaluation; in the
  background the saves still run one at a time, in order, each written under a
  temporary name and renamed when whole, and `wait` (which the next round's release and
  the run's end call, however it ends) returns when the last is on the disk, and `close`
  when its writer has ended too (a warm slot runs many runs).
  """

  def __init__(self, config: run_config.ExperimentConfig, keep_total: int,
               in_background: bool = False):
    super().__init__(config.checkpoint_dir, keep_total=keep_total)
    self._config = config
    self._writer = (
        concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix='tff_zmg-checkpoint')
        if in_background else None)
    self._pending: Optional[concurrent.futures.Future] = None

  async def save(self, program_state, version: int) -> None:
    where = non_finite_leaf(program_state)
    if where is not None:
      raise diverged_error(
          self._config, version, f'the state holds non-finite values ({where})')
    if self._writer is None:
      await super().save(program_state, version)
      return
    self.wait()  # The save before: one at a time, and its error is this round's.
    self._pending = self._writer.submit(asyncio.run, super().save(program_state, version))

  def wait(self) -> None:
    """Returns when every save asked for is written; raises the error of one that failed."""
    pending = self._pending
    if pending is None:
      return
    try:
      pending.result()
    finally:
      # A stop signal raised while this waits leaves the save to wait for again (`close`,
      # before the run says which checkpoint it keeps).
      if pending.done():
        self._pending = None

  def close(self) -> None:
    """`wait`, then ends the writer."""
    try:
      self.wait()
    finally:
      if self._writer is not None:
        self._writer.shutdown()


_EVALUATION_PREFIX = 'evaluation/'
# A DP run's epsilon after the round (`accounting.epsilon_after`): metrics.csv's column.
EPSILON_METRIC = 'privacy/epsilon'
_EVALUATION_TIME = 'evaluation/evaluation_time_in_seconds'


class RoundReleaseManager(tff.program.ReleaseManager):
  """Judges each round, then releases its metrics and prints one progress line.

  A diverged round (`divergence`, against the limit round 0's evaluation loss sets)
  raises `errors.DivergedError` before anything of it is written (metrics, TensorBoard,
  checkpoint: TFF's training loop releases a round's metrics before it saves the round's
  state). Otherwise the metrics, with a DP run's `privacy/epsilon` after the round, go to
  `managers` in order, then one line: metrics, rounds per second, ETA.
  """

  def __init__(self, config: run_config.ExperimentConfig, stream=None,
               epsilon_after: Optional[Callable[[int], float]] = None):
    self._config = config
    # A DP run's `rounds -> epsilon` (`accounting.epsilon_after`), released with each round.
    self._epsilon_after = epsilon_after
    self._total_rounds = config.total_rounds
    self.managers = []  # The run's CSV and TensorBoard managers, once it has made them.
    # The run's `FiniteStateManager`: a round is written only once the checkpoint before it
    # is, so a round in metrics.csv or printed means at most that round is lost to a kill.
    self.checkpoints: Optional[FiniteStateManager] = None
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
    if evaluation == [_EVALUATION_TIME]:  # A round `evaluation_due` skipped.
      value = collections.OrderedDict((k, v) for k, v in value.items() if k != _EVALUATION_TIME)
    if self._epsilon_after is not None:  # Round `key` is the key-th round trained.
      group, name = EPSILON_METRIC.split('/')
      value = collections.OrderedDict(
          value, **{group: collections.OrderedDict({name: self._epsilon_after(key)})})
    flat = _flatten(value)
    reason = divergence(flat, self.limit)
    if reason is not None:
      raise diverged_error(self._config, key, reason)
    if key == 0 and 'evaluation/loss' in flat:
      self.set_reference(float(flat['evaluation/loss']))
    if self.checkpoints is not None:
      self.checkpoints.wait()
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
        (EPSILON_METRIC, 'epsilon'),
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


def evaluation_due(config: run_config.ExperimentConfig, round_num: int) -> bool:
  """Round 0, every `rounds_per_eval`-th round, and the last: a finished run's final
  accuracy is always that of its final weights; with `eval_last_rounds`, of those only
  round 0 (the divergence limit's reference) and the last `eval_last_rounds`."""
  if round_num == 0:
    return True
  if config.eval_last_rounds and round_num <= config.total_rounds - config.eval_last_rounds:
    return False
  return round_num % config.rounds_per_eval == 0 or round_num == config.total_rounds


class Evaluation:
  """TFF's `evaluation_fn`: the run's held-out evaluation (tasks.evaluation) of a state's
  model weights, in rounds `evaluation_due` asks for (the selection is True)."""

  def __init__(self, held_out, evaluator, training_process, kept: bool = False):
    self.held_out = held_out
    self._evaluator = evaluator
    self._process = training_process
    self._kept = kept  # A warm slot's: the next run uses it again.

  def __call__(self, state, due: bool) -> collections.OrderedDict:
    if not due:
      return collections.OrderedDict()
    return self._evaluator(self._process.get_model_weights(state))

  def with_evaluator(self, wrap: Callable) -> 'Evaluation':
    """This evaluation, its evaluator `wrap(evaluator)` (which `close` closes)."""
    return Evaluation(self.held_out, wrap(self._evaluator), self._process, self._kept)

  def close(self) -> None:
    if not self._kept:
      self._evaluator.close()


def evaluation_fn(config, task, training_process, runtime_context, in_process_threads,
                  builds=None, task_arguments=None):
  """The run's evaluation, its test examples read once: on the first GPU under
  --executor=gpu (the data kept there), else on the host, as many groups at once as the
  in-process clients' threads per op leave cores for. With a warm slot's `builds`, the
  examples and evaluator of an earlier run of the same task and settings (its `task`
  built from `task_arguments`) are used again, and stay open for the next."""
  device, parallel = None, 1
  if config.executor == 'gpu':
    device = runtime_context.devices[0]
  elif runtime_context is not None:
    parallel = evaluation.groups_at_once(in_process_threads)

  def build():
    held_out = evaluation.read_held_out(
        task, config.evaluation, num_examples=config.eval_examples,
        num_clients=config.num_eval_clients, device=device,
        batch_size=config.eval_batch_size,
    )
    return held_out, evaluation.Evaluator(task.model_fn, held_out, parallel=parallel,
                                          device=device)

  if builds is None:
    return Evaluation(*build(), training_process)
  held_out, evaluator = builds.get('evaluation', dict(
      task=task_arguments, evaluation=config.evaluation, eval_examples=config.eval_examples,
      num_eval_clients=config.num_eval_clients, batch_size=config.eval_batch_size,
      device=device, parallel=parallel), build)
  return Evaluation(held_out, evaluator, training_process, kept=True)
