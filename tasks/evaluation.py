"""Evaluation of a task's model on its held-out test set, as the papers report it.

Two kinds (`KINDS`), both read the test examples once into pre-batched tensors and run
TFF's own model (`task.model_fn()`: its loss, accuracy and example counts) over them in
this process, on the run's devices:

* `global` (the default): the accuracy and loss over every test example (or a fixed,
  seeded subsample of `num_examples`), the test clients' examples pooled and batched at
  the run's evaluation batch (`batch_size_for`): GC-Fed's "held-out set", FedRKMGC's
  ACC_G, FedZMG's validation accuracy;
* `per_client`: each test client's batches apart (as TFF's federated evaluation batches
  them), reporting the pooled metrics beside the mean and standard deviation of the
  clients' own accuracies (FedRKMGC's ACC_L), over the first `num_clients` sorted test
  clients (None: all). Its pooled numbers are those of `tff.learning.algorithms.
  build_fed_eval` over the same clients (TFF sums every metric's variables over clients,
  then finalizes: accuracy = correct / total, loss = example-weighted mean).

The batch changes no count and no accuracy: TFF sums the correct predictions and the
examples over batches. The loss is TFF's mean of each batch's loss weighted by its
examples, which is the mean over examples wherever an example's loss is one number (the
image tasks); Shakespeare's batch loss is the mean over the batch's real characters, so its
loss moves a little with the batch where sequences are padded. A run therefore records its
batch (`launch.train`'s flags.json) and keeps it when resumed.

The batches are cut into fixed groups (a client, or `_GROUP_BATCHES` batches) that run
`parallel` at a time, each on a model of its own (from the second call: the first traces
the models one after another); the groups' metric sums are added in group order, so the
result does not depend on `parallel` or timing.
"""

import collections
import concurrent.futures
import contextlib
import dataclasses
import math
import os
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import checks
from tasks import registry

GLOBAL, PER_CLIENT = 'global', 'per_client'
KINDS = (GLOBAL, PER_CLIENT)
# The seed of `num_examples`' subsample: one subsample for every algorithm and seed of an
# experiment, so that curves are comparable and paired tests are paired.
SUBSAMPLE_SEED = 0
# The evaluation batches `launch.benchmark` times a bare forward pass at (bounded above by
# the test set: a batch beyond it is the whole set). The largest is the memory bound: one
# batch's activations at 1,024 are ~30 MB for Shakespeare's GRU (1,024 x 80 x 1,024
# floats per gate), ~0.3 GB per convolution of ResNet-18 on 32 x 32 images.
BATCH_CANDIDATES = (16, 64, 256, 1024)
# A new run's evaluation batch on the CPU: the candidate whose bare forward pass was the
# fastest, or within noise of it, in every measurement of `launch.benchmark --task=T` and
# its evaluation contenders (docs/performance.md, "The evaluation": Shakespeare's 16 took
# 1.5-2.1x; 1,024 was slower with 2 threads per op). A task not listed keeps its
# TaskSpec.eval_batch_size, the batch every run used before.
_CPU_BATCH_SIZES = {'shakespeare': 256}
# Batches per group of the global evaluation: large enough that a group's call overhead is
# small, small enough that `parallel` groups keep every slot busy.
_GROUP_BATCHES = 8
# The per-client metrics added to TFF's (pooled) ones.
LOCAL_ACCURACY_MEAN = 'local_accuracy_mean'
LOCAL_ACCURACY_STD = 'local_accuracy_std'
NUM_CLIENTS = 'num_clients'
ACCURACY = 'sparse_categorical_accuracy'


@dataclasses.dataclass(frozen=True)
class HeldOut:
  """Pre-batched test examples: `groups[g]` is a list of batches (dicts of tensors).

  Attributes:
    kind: One of `KINDS`.
    groups: The batches, grouped (a test client each for `per_client`).
    num_examples: The examples in all batches (Shakespeare: 80-character sequences).
    batch_size: The examples per batch (the last, a client's last for `per_client`, may
      hold fewer).
    description: What was read and how it is batched, for logs and the run's record.
  """

  kind: str
  groups: tuple[tuple[collections.OrderedDict, ...], ...]
  num_examples: int
  batch_size: int
  description: str


def _to_tensors(batches, device: Optional[str]) -> tuple:
  with tf.device(device) if device else contextlib.nullcontext():
    return tuple(tf.nest.map_structure(tf.identity, b) for b in batches)


def _batches(dataset: tf.data.Dataset) -> list:
  return [tf.nest.map_structure(np.asarray, b) for b in dataset.as_numpy_iterator()]


def _examples(batches) -> int:
  return sum(len(tf.nest.flatten(b)[0]) for b in batches)


def _rebatched(batches, batch_size: int, chosen: Optional[np.ndarray] = None) -> list:
  """The batches' examples (those at indices `chosen`, None: all), in their order, batched
  at `batch_size`. The preprocessing batches last, so this is what it would give."""
  pooled = tf.nest.map_structure(lambda *parts: np.concatenate(parts), *batches)
  if chosen is None:
    chosen = np.arange(len(tf.nest.flatten(pooled)[0]))
  return [
      tf.nest.map_structure(lambda a: a[chosen[i: i + batch_size]], pooled)
      for i in range(0, len(chosen), batch_size)
  ]


def _subsample(batches, num_examples: int, batch_size: int) -> list:
  """A fixed subsample of `num_examples` of the batches' examples, in their order,
  batched at `batch_size`."""
  total = _examples(batches)
  rng = np.random.default_rng(SUBSAMPLE_SEED)
  chosen = np.sort(rng.choice(total, size=min(num_examples, total), replace=False))
  return _rebatched(batches, batch_size, chosen)


def batch_size_for(task_name: str, executor: str) -> int:
  """A new run's evaluation batch for its task and where it evaluates (`executor`, 'cpu'
  or 'gpu'): on the CPU the fastest measured (`_CPU_BATCH_SIZES`), on a GPU the largest
  candidate (a GPU's time per batch hardly grows with the batch; the memory bound of
  `BATCH_CANDIDATES`). Fixed per task and device kind, so that a run's numbers depend on
  its settings alone."""
  if executor == 'gpu':
    return BATCH_CANDIDATES[-1]
  return _CPU_BATCH_SIZES.get(task_name, registry.SPECS[task_name].eval_batch_size)


def groups_at_once(intra_op_threads: Optional[int]) -> int:
  """How many groups an evaluation on the host runs at once: the cores the clients' threads
  per op leave for each (one when TensorFlow's default threads use every core)."""
  if not intra_op_threads:
    return 1
  return max(1, (os.cpu_count() or 1) // intra_op_threads)


def check_settings(kind: str, num_examples: Optional[int], num_clients: Optional[int]):
  """Raises ValueError (one line) for a bad kind, or a count that does not fit it."""
  if kind not in KINDS:
    raise ValueError(f'evaluation must be one of {list(KINDS)}, got {kind!r}')
  if num_examples is not None and (kind != GLOBAL or num_examples < 1):
    raise ValueError(f'eval_examples must be a positive number and subsamples the {GLOBAL}'
                     f' evaluation only; got {num_examples} with evaluation={kind}')
  if num_clients is not None and (kind != PER_CLIENT or num_clients < 1):
    raise ValueError(f'num_eval_clients must be a positive number and chooses the clients'
                     f' of the {PER_CLIENT} evaluation only; got {num_clients} with'
                     f' evaluation={kind}')


def read_held_out(
    task,
    kind: str = GLOBAL,
    *,
    num_examples: Optional[int] = None,
    num_clients: Optional[int] = None,
    device: Optional[str] = None,
    batch_size: Optional[int] = None,
) -> HeldOut:
  """Reads `task`'s test split once into batches for `Evaluator`.

  Args:
    task: A `tasks.Task` (its test data and evaluation preprocessing).
    kind: One of `KINDS`.
    num_examples: `global` only: a fixed subsample of this many examples (None: all).
    num_clients: `per_client` only: the first this many sorted test clients (None: all).
    device: Where the tensors are kept (None: TensorFlow's default, the host).
    batch_size: The evaluation batch (`batch_size_for` a new run); None: the task's
      TaskSpec.eval_batch_size, which every run used before the batch was chosen for
      speed. The examples are those of the task's evaluation preprocessing, batched
      again.

  Raises:
    ValueError: a bad kind or count, or a test split with no examples.
  """
  check_settings(kind, num_examples, num_clients)
  batch_size = batch_size or task.spec.eval_batch_size
  checks.check_positive('batch_size', batch_size)
  test_data = task.datasets.test_data
  preprocess = task.datasets.eval_preprocess_fn
  if kind == PER_CLIENT:
    ids = sorted(test_data.client_ids)[:num_clients]
    groups = [_batches(preprocess(test_data.create_tf_dataset_for_client(c))) for c in ids]
    groups = [g for g in groups if g]  # A client without examples has no accuracy.
    groups = [_rebatched(g, batch_size) for g in groups]
    described = f'{len(groups)} test clients apart'
  else:
    # Clients in a fixed order (TFF's default shuffles them): one subsample per seed.
    pooled = test_data.create_tf_dataset_from_all_clients(seed=SUBSAMPLE_SEED)
    batches = _batches(preprocess(pooled))
    # A subsample as large as the test set is the test set (and is recorded as such).
    subsampled = num_examples is not None and num_examples < _examples(batches)
    if subsampled:
      batches = _subsample(batches, num_examples, batch_size)
    elif batches:
      batches = _rebatched(batches, batch_size)
    groups = [batches[i: i + _GROUP_BATCHES] for i in range(0, len(batches), _GROUP_BATCHES)]
    described = (f'a fixed subsample (seed {SUBSAMPLE_SEED}) of the test set' if subsampled
                 else 'the whole test set')
  if not groups:
    raise ValueError(f'the test split of {task.name} has no examples to evaluate on')
  groups = tuple(_to_tensors(g, device) for g in groups)
  count = sum(_examples(g) for g in groups)
  return HeldOut(kind=kind, groups=groups, num_examples=count, batch_size=batch_size,
                 description=f'{kind}: {count} examples, {described}, batch {batch_size}')


class Evaluator:
  """Evaluates model weights on a `HeldOut` set: `evaluator(weights) -> metrics`, or
  several at once (`evaluate_many`: the cells of a batched group).

  `weights` is a `tff.learning.models.ModelWeights` (what a learning process's
  `get_model_weights` returns). The metrics are TFF's model metrics (`loss`,
  `sparse_categorical_accuracy`, `num_examples`, `num_batches`), pooled over the held-out
  examples; `per_client` adds `num_clients`, `local_accuracy_mean` and
  `local_accuracy_std` (over clients, population standard deviation).
  """

  def __init__(self, model_fn, held_out: HeldOut, *, parallel: int = 1,
               device: Optional[str] = None):
    self._held_out = held_out
    self._model_fn = model_fn
    self._device = device
    self._parallel = max(1, parallel)
    self._traced = 0  # The first this many models have traced their tf.functions.
    with self._on_device():
      # A model a call of one weights uses; `evaluate_many` makes more as it needs them,
      # and calls each at once: a Keras model made outside a graph is invalid once another
      # is made in one (as tracing a TFF computation does) unless it was called before.
      self._models = [model_fn() for _ in range(min(self._parallel, len(held_out.groups)))]
      # Finalizes pooled sums: TFF's `metric_finalizers` build a Keras metric in a
      # tf.function, which runs once per process only outside TFF's graph mode.
      self._finalizing = {m.name: m for m in model_fn().get_metrics()}
    self._pool = None

  def _on_device(self):
    return tf.device(self._device) if self._device else contextlib.nullcontext()

  def _slot_sums(self, slot: int, pieces: Sequence[tuple[int, int]], weights) -> list:
    """The unfinalized metric sums of `pieces` ((weights index, group index)), in order, on
    slot `slot`'s model."""
    model = self._models[slot]
    assigned = None
    sums = []
    for index, group in pieces:
      if index != assigned:
        weights[index].assign_weights_to(model)
        assigned = index
      model.reset_metrics()
      for batch in self._held_out.groups[group]:
        model.forward_pass(batch, training=False)
      sums.append(tf.nest.map_structure(np.asarray, model.report_local_unfinalized_metrics()))
    return sums

  def _finalize(self, unfinalized) -> dict:
    """Each metric's result from its variables' values (as Keras computes it)."""
    results = {}
    for name, values in unfinalized.items():
      metric = self._finalizing[name]
      for variable, value in zip(metric.variables, values):
        variable.assign(value)
      results[name] = float(metric.result())
    return results

  def __call__(self, weights) -> collections.OrderedDict:
    return self.evaluate_many([weights])[0]

  def evaluate_many(self, weights: Sequence) -> list[collections.OrderedDict]:
    """The metrics of each of `weights`, as `evaluator(w)` gives them: each (weights,
    group) piece is summed on its own and a weights' groups are added in group order, so
    neither `parallel` nor how the pieces share the slots changes a number."""
    num_groups = len(self._held_out.groups)
    pieces = [(i, g) for i in range(len(weights)) for g in range(num_groups)]
    slots = min(self._parallel, len(pieces))
    with self._on_device():
      while len(self._models) < slots:
        self._models.append(self._model_fn())
    per_slot = [pieces[s::slots] for s in range(slots)]
    if slots == 1 or self._traced < slots:
      # A model's first call traces its tf.functions, one model after another: two threads
      # tracing at once crashed TensorFlow 2.14 (SIGSEGV in op creation, once in ~600
      # runs). A model sees the same groups every call, so later calls only run traced
      # graphs, which threads may do at once.
      sums = [self._slot_sums(s, per_slot[s], weights) for s in range(slots)]
      self._traced = max(self._traced, slots)
    else:
      if self._pool is None:
        self._pool = concurrent.futures.ThreadPoolExecutor(
            self._parallel, thread_name_prefix='tff_zmg-evaluation')
      sums = list(self._pool.map(lambda s: self._slot_sums(s, per_slot[s], weights),
                                 range(slots)))
    # Piece p was the (p // slots)-th of slot p % slots.
    by_piece = [sums[p % slots][p // slots] for p in range(len(pieces))]
    return [self._metrics(by_piece[i * num_groups:(i + 1) * num_groups])
            for i in range(len(weights))]

  def _metrics(self, groups: list) -> collections.OrderedDict:
    """One weights' metrics from its groups' sums, in group order."""
    pooled = tf.nest.map_structure(lambda *parts: np.sum(parts, axis=0), *groups)
    metrics = collections.OrderedDict(self._finalize(pooled))
    if self._held_out.kind == PER_CLIENT:
      local = np.array([self._finalize({ACCURACY: g[ACCURACY]})[ACCURACY] for g in groups])
      local = local[np.isfinite(local)]  # A client whose targets are all padding.
      metrics[NUM_CLIENTS] = len(local)
      metrics[LOCAL_ACCURACY_MEAN] = float(np.mean(local)) if len(local) else math.nan
      metrics[LOCAL_ACCURACY_STD] = float(np.std(local)) if len(local) else math.nan
    return metrics

  def close(self) -> None:
    if self._pool is not None:
      self._pool.shutdown(wait=True)
