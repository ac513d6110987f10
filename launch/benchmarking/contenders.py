"""What `launch.benchmark` times: each contender's round, as a function of no arguments.

The same clients' data (`client_datasets`) go through every contender: the plain-TF floors
(`plain_tf_round_fn`), each algorithm's bound, its client arithmetic without federation
(`local_update_round_fn`), TFF's FedAvg on the package's context and on TFF's stock one,
and each algorithm as `launch.train` builds it (`process_round_fn`), on TFF's worker and in
process (`contenders`); and the evaluation `launch.train` runs beside its floor and TFF's
federated evaluation (`evaluation_contenders`). The names here (`PLAIN_TF`, ...) are the
contenders' names in the benchmark's lines and JSON.
"""

import collections
import os
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

from launch.run import run_config
from tasks import evaluation
from tasks import keyed_randomness
from tff_zmg import client_states
from tff_zmg.algorithms import registry
from tff_zmg.algorithms import rules
from tff_zmg.runtime import cpp_worker
from tff_zmg.runtime import in_process
from tff_zmg.templates import compose
from tff_zmg.templates import stateful_clients

PLAIN_TF = 'plain_tf'
PLAIN_TF_KERAS = 'plain_tf_keras'
TFF_FEDAVG = 'tff_fedavg'
TFF_FEDAVG_STOCK = 'tff_fedavg_stock'
IN_PROCESS = 'in_process'
WORKERS = 'workers'
WORKERS_IN_PROCESS = 'workers_in_process'
EVALUATION = 'evaluation'
PLAIN_TF_FORWARD = 'plain_tf_forward'
TFF_FED_EVAL = 'tff_fed_eval'
_SERVER_LR = 1.0
_CLIENT_LR = 0.1


def client_datasets(task, num_clients: int, examples: int) -> list[tf.data.Dataset]:
  """`num_clients` datasets of exactly `examples` examples each, batched like training.

  Takes the first clients (sorted ids) that have at least `examples` examples, the
  first `examples` of each, unshuffled, so every contender sees the same batches.
  """
  train = task.datasets.train_data
  batch_size = task.spec.batch_size
  preprocess = task.spec.preprocess_fn(batch_size, 1, shuffle_seed=None, max_elements=examples)
  chosen = []
  for client_id in sorted(train.client_ids):
    raw = train.create_tf_dataset_for_client(client_id)
    if int(raw.take(examples).reduce(0, lambda n, _: n + 1)) >= examples:
      chosen.append(preprocess(raw.take(examples)))
    if len(chosen) == num_clients:
      return chosen
  raise ValueError(
      f'only {len(chosen)} clients have {examples} examples; use'
      ' --examples_per_client lower or more data'
  )


def plain_tf_round_fn(
    task, datasets, optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
    keras_loop: bool = False, full_gradient_pass: bool = False,
):
  """One pass per client from the same weights, in one tf.function, nothing else.

  Args:
    task: The task (its Keras model and loss).
    datasets: The clients' batched datasets.
    optimizer: The TFF optimizer stepped in `dataset.reduce`: `None` is SGD
      (`plain_tf`, the floor), a stateless algorithm's client rule its bound.
    keras_loop: True: Keras SGD in a `for` loop over the dataset (`plain_tf_keras`),
      which autograph turns into a while loop over an iterator and which was 1.5x
      slower here.
    full_gradient_pass: First sum the gradients over the dataset at the initial
      weights (Mime-Lite's full-batch gradient), then train.
  """
  model = task.keras_model_fn()
  loss_fn = task.spec.loss_fn()
  variables = model.trainable_variables
  initial = [tf.Variable(v) for v in variables]
  if keras_loop:
    keras_sgd = tf.keras.optimizers.SGD(_CLIENT_LR)
    keras_sgd.build(variables)
  if optimizer is None:
    optimizer = tff.learning.optimizers.build_sgdm(_CLIENT_LR)
  specs = tuple(tf.TensorSpec(v.shape, v.dtype) for v in variables)  # reduce() packs lists.

  def gradients(batch):
    with tf.GradientTape() as tape, keyed_randomness.key(batch.get(keyed_randomness.KEY)):
      loss = loss_fn(batch['y'], model(batch['x'], training=True))
    return tuple(tape.gradient(loss, variables))

  def step(state, batch):
    state, new_weights = optimizer.next(state, tuple(variables), gradients(batch))
    for v, w in zip(variables, new_weights):
      v.assign(w)
    return state

  @tf.function
  def train_client(dataset):
    for v, w in zip(variables, initial):
      v.assign(w)
    if full_gradient_pass:
      dataset.reduce(
          tuple(tf.zeros(s.shape, s.dtype) for s in specs),
          lambda total, batch: tuple(t + g for t, g in zip(total, gradients(batch))),
      )
    if keras_loop:
      for batch in dataset:
        keras_sgd.apply_gradients(zip(gradients(batch), variables))
    else:
      dataset.reduce(optimizer.initialize(specs), step)

  def run_round():
    for dataset in datasets:
      train_client(dataset)

  return run_round


def build(algo: str, task):
  """Algorithm `algo` at its defaults, as `launch.train` builds it for `task`."""
  return registry.build(
      algo, task.model_fn, keras_model_fn=task.keras_model_fn,
      num_clients=len(task.datasets.train_data.client_ids),
      loop_implementation=run_config.CLIENT_LOOP,
  )


def client_rule_optimizer(algo: str, task) -> tff.learning.optimizers.Optimizer:
  """The TFF optimizer of a stateless algorithm's client rule at the algorithm's defaults."""
  spec = registry.get(algo)
  variables = compose.trainable_variables(task.model_fn)  # For the rule's mask.
  return rules.CLIENT_RULES[spec.client_rule].build(spec.hparams(), variables)


def local_update_round_fn(algo: str, task, process, state, datasets):
  """The bound `plain_tf/<algo>`: the algorithm's client arithmetic, clients in turn.

  A stateless algorithm's is its client rule stepped in the plain loop of `plain_tf`;
  a stateful one's, its `build_local_update()` (the function TFF's worker runs for
  one client), every client from the weights of `state` and keeping its state from
  call to call, in memory.
  """
  spec = registry.get(algo)
  if not spec.stateful:
    return plain_tf_round_fn(
        task, datasets, client_rule_optimizer(algo, task),
        full_gradient_pass=spec.full_gradient_pass,
    )
  weights = process.get_model_weights(state)
  local_update = process.build_local_update()
  round_input = process.round_input(state)
  states = [process.initial_client_state() for _ in datasets]

  def run_stateful_round():
    for i, dataset in enumerate(datasets):
      _, states[i], *_ = local_update(weights, dataset, states[i], round_input)

  return run_stateful_round


def process_round_fn(process, datasets, state_dir):
  """One round of a (stateful or not) process on `datasets`, state carried across calls."""
  if isinstance(process, stateful_clients.StatefulClientsLearningProcess):
    trainer = client_states.StatefulClientsTrainer(
        process, client_states.DiskClientStateStore(state_dir)
    )
  else:
    trainer = process
  holder = {'state': trainer.initialize(), 'round': 0}
  ids = [f'client{i}' for i in range(len(datasets))]

  def run_round():
    data = datasets
    if trainer is not process:
      data = client_states.ClientSelection(holder['round'], ids, datasets)
    holder['state'] = trainer.next(holder['state'], data).state
    holder['round'] += 1

  return run_round


def _in_context(execution_context, fn):
  """`fn` run with `execution_context` installed (the stock TFF contender's)."""

  def run():
    with tff.framework.get_context_stack().install(execution_context):
      fn()

  return run


def _tff_fedavg(task):
  return tff.learning.algorithms.build_weighted_fed_avg(
      task.model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(_CLIENT_LR),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(_SERVER_LR),
  )


def stock_context(stack, max_concurrent: int):
  """TFF's stock execution context on a TFF worker of its own, stopped with `stack`: TFF's
  executor and thread settings, what the `tff_fedavg_stock` contender runs on."""
  worker = cpp_worker.LocalWorker(max_concurrent)
  stack.callback(worker.stop)
  worker.stub()  # Starts it.
  return cpp_worker.create_sync_context([worker], cache_computations=False)


def start_local_workers(stack, count: int) -> list:
  """`count` TFF workers on this machine, the cores shared among them, stopped with `stack`."""
  workers = []
  for _ in range(count):
    worker = cpp_worker.LocalWorker(intra_op_threads=max(1, (os.cpu_count() or 1) // count))
    stack.callback(worker.stop)
    worker.stub()  # Starts it.
    workers.append(worker)
  return workers


def contenders(
    task, algos, datasets, state_dir, stock_context, in_process_context=None
) -> tuple[dict, dict]:
  """({name: round function, traced}, {algo: its bound's name}).

  The floors, TFF's FedAvg (on the current context and on `stock_context`), then each
  algorithm and its bound `plain_tf/<algo>`; with an `in_process_context`, TFF's
  FedAvg and each algorithm again on it, as `in_process/<name>` (same bound). Each
  plain loop is made and traced at once: with many algorithms' rule masks built in
  graphs between them, Keras once refused to trace a model made eagerly before them.
  """

  def on_context(context, process, directory):
    with tff.framework.get_context_stack().install(context):  # initialize() there too.
      return _in_context(context, process_round_fn(process, datasets, directory))

  fns = collections.OrderedDict()
  fns[PLAIN_TF] = plain_tf_round_fn(task, datasets)
  fns[PLAIN_TF]()
  fns[PLAIN_TF_KERAS] = plain_tf_round_fn(task, datasets, keras_loop=True)
  fns[PLAIN_TF_KERAS]()
  fns[TFF_FEDAVG] = process_round_fn(_tff_fedavg(task), datasets, None)
  fns[TFF_FEDAVG_STOCK] = on_context(stock_context, _tff_fedavg(task), None)
  if in_process_context is not None:
    fns[f'{IN_PROCESS}/{TFF_FEDAVG}'] = on_context(in_process_context, _tff_fedavg(task), None)
  bounds = {}
  for algo in algos:
    process = build(algo, task)
    bounds[algo] = f'{PLAIN_TF}/{algo}'
    fns[bounds[algo]] = local_update_round_fn(
        algo, task, process, process.initialize(), datasets
    )
    fns[bounds[algo]]()
    fns[algo] = process_round_fn(process, datasets, os.path.join(state_dir, algo))
    if in_process_context is not None:
      bounds[f'{IN_PROCESS}/{algo}'] = bounds[algo]
      fns[f'{IN_PROCESS}/{algo}'] = on_context(
          in_process_context, process, os.path.join(state_dir, IN_PROCESS, algo)
      )
  return fns, bounds


def worker_contenders(task, algos, datasets, state_dir, workers) -> tuple[dict, dict]:
  """({name: round function, traced}, {name: its bound's name}) on several TFF workers.

  The two ways a round can use `workers` (issue 30: stateless algorithms take whichever
  is faster): `workers/<algo>`, TFF's mergeable context, which gives each worker a slice
  of the clients and the aggregation up to its merge (stateless algorithms only: it
  returns no per-client states); and `workers_in_process/<algo>`, the rounds in this
  process with only the clients' work sent to the workers, a contiguous slice each
  (`in_process_context(workers=...)`, what `launch.train --workers` runs for stateful
  algorithms). The bound is the algorithm's own `plain_tf/<algo>`.
  """
  runs = {WORKERS: cpp_worker.create_sync_context(workers, len(datasets)),
          WORKERS_IN_PROCESS: in_process.InProcessContext(workers=workers)}
  fns, bounds = collections.OrderedDict(), {}
  for algo in algos:
    for way, context in runs.items():
      if way == WORKERS and registry.get(algo).stateful:
        continue
      name = f'{way}/{algo}'
      with tff.framework.get_context_stack().install(context):  # initialize() there too.
        round_fn = process_round_fn(build(algo, task), datasets, os.path.join(state_dir, name))
      fns[name] = _in_context(context, round_fn)
      bounds[name] = f'{PLAIN_TF}/{algo}'
  return fns, bounds


def forward_floor_name(batch_size: int) -> str:
  """The name of the bare forward pass at `batch_size` (`evaluation_contenders`)."""
  return f'{PLAIN_TF_FORWARD}/{batch_size}'


def floor_batch_sizes(num_examples: int) -> list[int]:
  """The candidate batches (`evaluation.BATCH_CANDIDATES`) up to the first that holds all
  `num_examples` in one batch: a larger one gives the same batches."""
  sizes = []
  for size in evaluation.BATCH_CANDIDATES:
    sizes.append(size)
    if size >= num_examples:
      break
  return sizes


def evaluation_contenders(task, parallel: int, batch_size: int) -> tuple[dict, str]:
  """({name: evaluation function}, what is evaluated) at the model's initial weights:

  - `plain_tf_forward/<B>` for each of `floor_batch_sizes`: the floors, a bare
    `tf.function` Keras forward pass over the test examples in batches of B, one after
    another (no loss, no metrics); the fastest is the evaluation's floor;
  - `evaluation`: `tasks.evaluation`'s global evaluation at `batch_size`, as `launch.train`
    runs it (`parallel` groups at once), its data read once before;
  - `tff_fed_eval`: TFF's `build_fed_eval` over every test client in TFF's worker (what
    `launch.train` ran before, for its first 100 test clients; in TFF's worker so that the
    in-process contenders' device counts stay theirs), at the task's preprocessing batch.
  """
  # Built first: TFF builds its models in graph mode, which invalidates Keras models made
  # eagerly before.
  fed_eval = tff.learning.algorithms.build_fed_eval(task.model_fn)
  test = task.datasets.test_data
  clients = [task.datasets.eval_preprocess_fn(test.create_tf_dataset_for_client(c))
             for c in sorted(test.client_ids)]

  def tff_round():
    state = fed_eval.set_model_weights(fed_eval.initialize(), weights)
    fed_eval.next(state, clients)

  held_out = evaluation.read_held_out(task, batch_size=batch_size)
  model = task.model_fn()
  weights = tf.nest.map_structure(
      lambda v: v.numpy(), tff.learning.models.ModelWeights.from_model(model))
  evaluator = evaluation.Evaluator(task.model_fn, held_out, parallel=parallel)
  keras_model = task.keras_model_fn()
  weights.assign_weights_to(keras_model)
  forward = tf.function(lambda x: keras_model(x, training=False))
  inputs = tf.concat([b['x'] for group in held_out.groups for b in group], 0)

  def plain_forward(size):
    batches = [inputs[i: i + size] for i in range(0, len(inputs), size)]

    def run():
      for x in batches:
        out = forward(x)
      out.numpy()

    return run

  fns = collections.OrderedDict(
      (forward_floor_name(size), plain_forward(size))
      for size in floor_batch_sizes(held_out.num_examples)
  )
  fns[EVALUATION] = lambda: evaluator(weights)
  fns[TFF_FED_EVAL] = tff_round
  return fns, held_out.description
