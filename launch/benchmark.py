r"""Round time of the package's processes against the plain-TF lower bound and TFF's FedAvg.

  python -m launch.benchmark --task=emnist --algos=fedavg,fedzmg,gcfed,fedrkmgc

On one set of client datasets (`--clients_per_round` clients of exactly
`--examples_per_client` examples each, the task's batch size), it times, alternating
after a warm-up round each, with the median and spread over `--repeats`:

- `plain_tf`: a `tf.function` SGD loop over the same datasets with the same Keras model
  (every client restarts from the same weights), the lower bound on this hardware;
- `plain_tf/<rule>`: the same loop running an algorithm's client rule (e.g. ZMG-SGDM)
  at its defaults: the algorithm's arithmetic without federation, its own lower bound;
- `tff_fedavg`: TFF's own `tff.learning.algorithms.build_weighted_fed_avg`;
- each algorithm of `--algos`, as `launch.train` builds and runs it (FedRKMGC with the
  disk client-state store, whose files TFF's worker reads and writes itself).

One parseable line per contender (`ratio` to its own plain-TF bound, `ratio_plain_sgd`
to plain-TF SGD, `ratio_tff_fedavg` to TFF's FedAvg, all ratios of medians; the
`paired_bound`, `paired_tff_fedavg` and `paired_fedavg` medians of per-repeat ratios,
steadier on a noisy machine; peak resident memory of this process and its TFF worker
while it ran), then how a round's time scales with the
clients per round (`--scaling_clients`) and with the number of client computations
TFF's worker runs at once (`--concurrency`); an empty list skips either table.
"""

import collections
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

import tasks
from launch import resources
from tff_zmg import client_states
from tff_zmg import context
from tff_zmg.algorithms import compose
from tff_zmg.algorithms import registry
from tff_zmg.algorithms import stateful_clients

_TASK = flags.DEFINE_enum('task', 'emnist', list(tasks.TASK_NAMES), 'The task.')
_ALGOS = flags.DEFINE_list(
    'algos', ['fedavg', 'fedzmg', 'gcfed', 'fedrkmgc'], 'Algorithms to time.'
)
_DATA_SOURCE = flags.DEFINE_enum(
    'data_source', 'synthetic', ['tff', 'synthetic'], 'Where the client data comes from.'
)
_CACHE_DIR = flags.DEFINE_string('cache_dir', None, 'Data directory (see launch.train).')
_CLIENTS = flags.DEFINE_integer('clients_per_round', 10, 'Clients per timed round.')
_EXAMPLES = flags.DEFINE_integer(
    'examples_per_client', 240, 'Examples each client trains on per round.'
)
_REPEATS = flags.DEFINE_integer('repeats', 5, 'Timed rounds per contender.')
_SCALING = flags.DEFINE_list(
    'scaling_clients', ['10', '20', '50'], 'Clients per round for the scaling table.'
)
_SCALING_ALGO = flags.DEFINE_string(
    'scaling_algo', 'fedavg', 'The algorithm whose scaling is measured.'
)
_CONCURRENCY = flags.DEFINE_list(
    'concurrency', ['1', '2', '-1'],
    'Values of --max_concurrent_clients to compare (-1: no limit).',
)
_MAX_CONCURRENT = flags.DEFINE_integer(
    'max_concurrent_clients', -1, 'TFF worker concurrency for the main comparison.'
)
_OUTPUT = flags.DEFINE_string('output', None, 'Also write the results as JSON here.')

PLAIN_TF = 'plain_tf'
TFF_FEDAVG = 'tff_fedavg'
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


def plain_tf_round_fn(task, datasets, client_optimizer=None):
  """The lower bound: one pass per client, from the same weights, in one tf.function.

  Args:
    task: The task (its Keras model and loss).
    datasets: The clients' batched datasets.
    client_optimizer: None for Keras SGD (`plain_tf`), or a TFF optimizer (a client
      rule of `compose.CLIENT_RULES`), whose state starts afresh for every client as in
      TFF's client work: the same arithmetic as the algorithm, without federation.
  """
  model = task.keras_model_fn()
  loss_fn = task.spec.loss_fn()
  variables = model.trainable_variables
  initial = [tf.Variable(v) for v in variables]
  if client_optimizer is None:
    keras_sgd = tf.keras.optimizers.SGD(_CLIENT_LR)
    keras_sgd.build(variables)
  specs = tuple(tf.TensorSpec(v.shape, v.dtype) for v in variables)  # reduce() packs lists.

  def gradients(batch):
    with tf.GradientTape() as tape:
      loss = loss_fn(batch['y'], model(batch['x'], training=True))
    return tuple(tape.gradient(loss, variables))

  def rule_step(state, batch):
    state, new_weights = client_optimizer.next(state, tuple(variables), gradients(batch))
    for v, w in zip(variables, new_weights):
      v.assign(w)
    return state

  @tf.function
  def train_client(dataset):
    for v, w in zip(variables, initial):
      v.assign(w)
    if client_optimizer is None:
      for batch in dataset:
        keras_sgd.apply_gradients(zip(gradients(batch), variables))
    else:
      dataset.reduce(client_optimizer.initialize(specs), rule_step)

  def run_round():
    for dataset in datasets:
      train_client(dataset)

  return run_round


def client_rule_optimizer(algo: str, task):
  """(rule name, TFF optimizer) of `algo`'s client rule at its defaults.

  FedRKMGC's corrected step (SGDM on `g - D_n`) is bounded by plain SGDM, which leaves out
  its two vector updates per round; FedGPS's surrogate batches have no plain counterpart.
  """
  spec = registry.get(algo)
  rule_name = 'sgdm' if spec.client_rule == 'corrected_sgdm' else spec.client_rule
  if rule_name not in compose.CLIENT_RULES:
    return None, None
  rule = compose.CLIENT_RULES[rule_name]
  hparams = {k: spec.defaults.get(k, default) for k, default in rule.hparams.items()}
  variables = compose.trainable_variables(task.model_fn)  # For the rule's mask.
  return rule_name, rule.build(spec.defaults['client_learning_rate'], variables, **hparams)


def _process_round_fn(process, datasets, state_dir):
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


def plain_contenders(task, algos, datasets) -> tuple[dict, dict]:
  """({name: plain-TF round function, traced}, {algo: its plain-TF bound's name}).

  Plain TF (Keras SGD) and plain TF with each client rule of `algos` (`plain_tf/<rule>`).
  """
  # Each plain loop is made and traced before the next Keras model is built anywhere
  # (rule masks, TFF processes): with six algorithms' masks built in graphs between
  # them, Keras refused to trace a model made eagerly before them.
  rule_optimizers = {algo: client_rule_optimizer(algo, task) for algo in algos}
  fns = collections.OrderedDict()
  fns[PLAIN_TF] = plain_tf_round_fn(task, datasets)
  fns[PLAIN_TF]()
  bounds = {}
  for algo, (rule_name, optimizer) in rule_optimizers.items():
    bounds[algo] = PLAIN_TF if rule_name in (None, 'sgd') else f'{PLAIN_TF}/{rule_name}'
    if bounds[algo] not in fns:
      fns[bounds[algo]] = plain_tf_round_fn(task, datasets, optimizer)
      fns[bounds[algo]]()
  return fns, bounds


def contenders(task, algos, datasets, state_dir) -> tuple[dict, dict]:
  """({name: round function}, {algo: its plain-TF bound's name}).

  The contenders: the plain-TF loops (`plain_contenders`), TFF's FedAvg, and each
  algorithm.
  """
  fns, bounds = plain_contenders(task, algos, datasets)
  tff_fedavg = tff.learning.algorithms.build_weighted_fed_avg(
      task.model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(_CLIENT_LR),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(_SERVER_LR),
  )
  fns[TFF_FEDAVG] = _process_round_fn(tff_fedavg, datasets, None)
  for algo in algos:
    process = registry.build(algo, task.model_fn)
    fns[algo] = _process_round_fn(process, datasets, os.path.join(state_dir, algo))
  return fns, bounds


def time_alternating(fns: dict, repeats: int) -> dict:
  """{name: (seconds per round, peak bytes)}: warm-up, then rounds in turn."""
  peaks = {}
  for name, fn in fns.items():
    sampler = resources.PeakMemorySampler()
    start = time.perf_counter()
    fn()  # Tracing and compilation: not timed.
    peaks[name] = sampler.stop()
    print(f'  warm-up {name}: {time.perf_counter() - start:.1f} s', flush=True)
  times = collections.defaultdict(list)
  for repeat in range(repeats):
    order = list(fns) if repeat % 2 == 0 else list(reversed(fns))
    for name in order:
      sampler = resources.PeakMemorySampler()
      start = time.perf_counter()
      fns[name]()
      times[name].append(time.perf_counter() - start)
      peaks[name] = max(peaks[name], sampler.stop())
  return {name: (times[name], peaks[name]) for name in fns}


def paired_ratio(seconds, reference_seconds) -> float:
  """The median over repeats of a contender's round time over the reference's, same repeat.

  Contenders run in turn within each repeat, so a slow spell of the machine slows both
  rounds of a pair: far steadier than the ratio of medians when rounds spread by 20%.
  """
  return statistics.median(s / r for s, r in zip(seconds, reference_seconds, strict=True))


def summary_line(name, seconds, peak, bound, plain_sgd, tff_fedavg, paired) -> str:
  """One parseable line: `ratio` to the contender's own plain-TF bound (same arithmetic,
  no federation), `ratio_plain_sgd` to plain-TF SGD, `ratio_tff_fedavg` to TFF's FedAvg
  (ratios of medians), then `paired_<name>=` per-repeat ratios (`paired`)."""
  median = statistics.median(seconds)
  return (
      f'{name:<18} median_s={median:.3f} min_s={min(seconds):.3f}'
      f' max_s={max(seconds):.3f} ratio={median / bound:.2f}'
      f' ratio_plain_sgd={median / plain_sgd:.2f}'
      f' ratio_tff_fedavg={median / tff_fedavg:.2f}'
      + ''.join(f' paired_{k}={v:.2f}' for k, v in paired.items())
      + f' peak_rss_mib={peak / 2**20:.0f}'
  )


def _median_round(task, algo, num_clients, examples, repeats, max_concurrent, state_dir):
  datasets = client_datasets(task, num_clients, examples)
  with context.execution_context(max_concurrent):
    fn = _process_round_fn(
        registry.build(algo, task.model_fn), datasets, os.path.join(state_dir, algo)
    )
    fn()
    times = []
    for _ in range(repeats):
      start = time.perf_counter()
      fn()
      times.append(time.perf_counter() - start)
  return statistics.median(times)


def main(argv) -> int:
  del argv
  logging.set_verbosity(logging.WARNING)
  tf.get_logger().setLevel('ERROR')
  scaling = sorted(int(c) for c in _SCALING.value)
  num_clients = max([_CLIENTS.value] + scaling)
  synthetic = None
  if _DATA_SOURCE.value == 'synthetic':
    # Enough clients with enough examples for every table (volumes are lognormal).
    synthetic = dict(
        num_train_clients=2 * num_clients,
        num_test_clients=2,
        mean_examples_per_client=2 * _EXAMPLES.value,
    )
  task = tasks.get(
      _TASK.value, data_source=_DATA_SOURCE.value, cache_dir=_CACHE_DIR.value,
      synthetic_settings=synthetic,
  )
  for algo in _ALGOS.value:
    registry.get(algo)
  datasets = client_datasets(task, _CLIENTS.value, _EXAMPLES.value)
  print(
      f'task={_TASK.value} clients={_CLIENTS.value} examples_per_client={_EXAMPLES.value}'
      f' batch={task.spec.batch_size} repeats={_REPEATS.value}'
      f' cpus={os.cpu_count()} tf_threads=default',
      flush=True,
  )
  results = collections.OrderedDict()
  with tempfile.TemporaryDirectory() as state_dir:
    with context.execution_context(_MAX_CONCURRENT.value):
      fns, bounds = contenders(task, _ALGOS.value, datasets, state_dir)
      timed = time_alternating(fns, _REPEATS.value)
    medians = {name: statistics.median(seconds) for name, (seconds, _) in timed.items()}
    bound = medians[PLAIN_TF]
    tff_fedavg = medians[TFF_FEDAVG]
    # Per-repeat ratios to the references the targets name: each contender's
    # own bound, TFF's FedAvg and (when timed) the package's FedAvg.
    references = [TFF_FEDAVG] + (['fedavg'] if 'fedavg' in timed else [])
    for name, (seconds, peak) in timed.items():
      own = bounds.get(name, PLAIN_TF)
      paired = {'bound': paired_ratio(seconds, timed[own][0])}
      paired.update({ref: paired_ratio(seconds, timed[ref][0]) for ref in references})
      line = summary_line(name, seconds, peak, medians[own], bound, tff_fedavg, paired)
      print(line, flush=True)
      results[name] = dict(
          seconds=seconds, median_s=medians[name], bound=own,
          ratio=medians[name] / medians[own], ratio_plain_sgd=medians[name] / bound,
          paired=paired, peak_rss_mib=peak / 2**20,
      )

    scaling_rows = []
    for clients in scaling:
      median = _median_round(
          task, _SCALING_ALGO.value, clients, _EXAMPLES.value, max(2, _REPEATS.value // 2),
          _MAX_CONCURRENT.value, state_dir,
      )
      scaling_rows.append((clients, median))
    base_clients, base = scaling_rows[0] if scaling_rows else (1, 1.0)
    for clients, median in scaling_rows:
      print(
          f'scaling algo={_SCALING_ALGO.value} clients={clients} median_s={median:.3f}'
          f' per_client_s={median / clients:.4f}'
          f' growth={median / base:.2f} (clients x{clients / base_clients:g})',
          flush=True,
      )
    concurrency_rows = []
    for value in (int(c) for c in _CONCURRENCY.value):
      median = _median_round(
          task, _SCALING_ALGO.value, _CLIENTS.value, _EXAMPLES.value,
          max(2, _REPEATS.value // 2), value, state_dir,
      )
      concurrency_rows.append((value, median))
      print(
          f'concurrency algo={_SCALING_ALGO.value} max_concurrent_clients={value}'
          f' median_s={median:.3f} ratio={median / bound:.2f}',
          flush=True,
      )
  if _OUTPUT.value:
    with open(_OUTPUT.value, 'w') as f:
      json.dump(
          dict(contenders=results, scaling=scaling_rows, concurrency=concurrency_rows),
          f, indent=2,
      )
  return 0


if __name__ == '__main__':
  app.run(lambda argv: sys.exit(main(argv)))
