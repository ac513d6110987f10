r"""Round time of the package's processes against plain-TF bounds and TFF's FedAvg.

  python -m launch.benchmark --task=emnist --algos=all

On one set of client datasets (`--clients_per_round` clients of exactly
`--examples_per_client` examples each, the task's batch size), it times, alternating
after a warm-up round each, with the median and spread over `--repeats`:

- `plain_tf`: the cheapest plain TensorFlow training of the model on these examples, a
  `tf.function` running TFF's SGD in `dataset.reduce`, every client from the same
  weights: the floor on this hardware;
- `plain_tf_keras`: the loop most users write, Keras SGD in a `for` loop over the
  dataset (the reference issue 8 was first measured against);
- `plain_tf/<algo>`: each algorithm's client arithmetic without federation, its bound:
  a stateless algorithm's client rule stepped in `plain_tf`'s loop (so
  `plain_tf/fedavg` is `plain_tf`; Mime-Lite's after a pass that sums the gradients
  at the round's weights, its full-batch gradient); a stateful algorithm's
  `build_local_update()`, the
  very `tf.function` TFF's worker runs for one client, its states kept in memory; the
  clients in turn, in this process;
- `tff_fedavg`: TFF's own `tff.learning.algorithms.build_weighted_fed_avg` on the
  package's execution context, and `tff_fedavg_stock` the same on TFF's stock executor
  and thread settings (what the context saves);
- each algorithm of `--algos` (`all`: the whole registry), as `launch.train` builds and
  runs it (stateful clients with the disk client-state store, whose files TFF's worker
  reads and writes itself; the worker's threads per op as `launch.train` picks them);
- with `--in_process` (the default), `in_process/tff_fedavg` and `in_process/<algo>`:
  the same processes on the in-process runtime (`tff_zmg.runtime.in_process`, this
  process's TensorFlow, `--in_process_clients_per_device` clients at once), timed in
  the same repeats as the worker's, so `paired_*` compares the two runtimes directly;
- with `--local_workers=N`, each algorithm on N TFF workers of this machine both ways
  `--workers` can run it (`benchmark_contenders.worker_contenders`).

With `--evaluation` (the default), the evaluation `launch.train` runs (`evaluation`: the
global one over the whole test set, `tasks.evaluation`), its floor (`plain_tf_forward`: a
bare forward pass over the same batches at the same batch size) and TFF's federated
evaluation of the same test clients (`tff_fed_eval`), each with `ratio` to the floor; then
per algorithm `round_as_run/<algo>`: its training round plus the evaluation, `ratio_floor`
to the floors of both parts and `ratio_tff_fed_eval` to the same round evaluated by TFF.

One parseable line per contender: `ratio` to its own bound, `ratio_plain_sgd` to the
floor, `ratio_tff_fedavg` to TFF's FedAvg (ratios of medians); `paired_bound`,
`paired_plain_sgd`, `paired_tff_fedavg` and `paired_fedavg`, medians of per-repeat ratios
(steadier on a noisy machine); the peak resident memory of this process and its TFF
worker while it ran. Then how a round's time scales with the clients per round
(`--scaling_clients`) and with the number of client computations TFF's worker runs at
once (`--concurrency`); an empty list skips either table. The contenders' rounds are made in
`launch.benchmarking.contenders`; this program times them and reports.

Exit status (launch/cli/failures.py): 0 done, 1 an unexpected failure (a bug), 2 bad flags or
data, 4 the TFF worker lost, 5 the machine refused (disk full, permissions), 130
interrupted. Every failure is one line `benchmark: error: ...` on stderr; --verbose adds
the traceback.
"""

import collections
import contextlib
import os
import statistics
import sys
import tempfile
import time
from typing import Optional

from absl import app
from absl import flags
from absl import logging
import tensorflow as tf

import tasks
from launch.benchmarking import contenders as benchmark_contenders
from launch.cli import failures
from launch.benchmarking import resources
from launch.run import run_directory
from tasks import evaluation
from tff_zmg.runtime import cpp_worker
from tff_zmg.runtime import in_process
from tff_zmg.runtime import tf_computation
from tff_zmg.algorithms import registry
# The contenders' names in the lines and the JSON.
from launch.benchmarking.contenders import EVALUATION
from launch.benchmarking.contenders import IN_PROCESS
from launch.benchmarking.contenders import PLAIN_TF
from launch.benchmarking.contenders import PLAIN_TF_FORWARD
from launch.benchmarking.contenders import TFF_FEDAVG
from launch.benchmarking.contenders import TFF_FED_EVAL

_TASK = flags.DEFINE_enum('task', 'emnist', list(tasks.TASK_NAMES), 'The task.')
_ALGOS = flags.DEFINE_list(
    'algos', ['fedavg', 'fedzmg', 'gcfed', 'fedrkmgc'],
    'Algorithms to time (`all`: every algorithm of the registry).',
)
_DATA_SOURCE = flags.DEFINE_enum(
    'data_source', 'synthetic', ['tff', 'synthetic'], 'Where the client data comes from.'
)
_CACHE_DIR = flags.DEFINE_string('cache_dir', None, 'Data directory (see launch.train).')
_CLIENTS = flags.DEFINE_integer(
    'clients_per_round', 10, 'Clients per timed round.', lower_bound=1)
_EXAMPLES = flags.DEFINE_integer(
    'examples_per_client', 240, 'Examples each client trains on per round.'
)
_REPEATS = flags.DEFINE_integer('repeats', 5, 'Timed rounds per contender.', lower_bound=1)
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


def _integers(values, minimum=None) -> bool:
  try:
    return all(minimum is None or int(v) >= minimum for v in values)
  except ValueError:
    return False


flags.register_validator('scaling_clients', lambda v: _integers(v, 1),
                         '--scaling_clients must be a comma list of integers >= 1')
flags.register_validator('concurrency', _integers,
                         '--concurrency must be a comma list of integers')
_MAX_CONCURRENT = flags.DEFINE_integer(
    'max_concurrent_clients', -1, 'TFF worker concurrency for the main comparison.'
)
_INTRA_OP_THREADS = flags.DEFINE_integer(
    'intra_op_threads', 0,
    'Threads per TF op in the TFF worker; 0: as launch.train picks them (cores // clients'
    ' run at once).',
    lower_bound=0,
)
_OUTPUT = flags.DEFINE_string('output', None, 'Also write the results as JSON here.')
_EVALUATION = flags.DEFINE_bool(
    'evaluation', True,
    'Also time the evaluation launch.train runs (the global one over the whole test set)'
    ' beside its floor, a bare forward pass over the same batches, and TFF\'s federated'
    ' evaluation of the same clients; and a round as users run it (training +'
    ' evaluation) beside the floors of both parts.',
)
_TEST_CLIENTS = flags.DEFINE_integer(
    'synthetic_test_clients', 20,
    'Test clients of the synthetic data (the evaluation\'s examples).', lower_bound=1,
)
_IN_PROCESS = flags.DEFINE_bool(
    'in_process', True,
    'Also time TFF\'s FedAvg and each algorithm on the in-process runtime (on the devices'
    ' of --in_process_devices).',
)
_IN_PROCESS_DEVICES = flags.DEFINE_list(
    'in_process_devices', None,
    'Devices the in-process contenders run clients on (default: every GPU, else the CPU).',
)
_IN_PROCESS_CLIENTS_PER_DEVICE = flags.DEFINE_integer(
    'in_process_clients_per_device', 0,
    'Clients each device runs at once in process; 0: the runtime\'s default (one per core'
    ' on the CPU, one per GPU), as launch.train runs it.',
    lower_bound=0,
)
_LOCAL_WORKERS = flags.DEFINE_integer(
    'local_workers', 0,
    'With N >= 2, also time each algorithm on N TFF workers of this machine, both ways'
    ' --workers can run it: TFF\'s mergeable context (`workers/<algo>`, stateless'
    ' algorithms) and the rounds in this process with each worker sent its slice of the'
    ' clients (`workers_in_process/<algo>`); 0: not timed.',
    lower_bound=0,
)
flags.register_validator('local_workers', lambda n: n != 1,
                         '--local_workers must be 0 (not timed) or at least 2')
_PROCESS_THREADS = flags.DEFINE_integer(
    'process_intra_op_threads', 0,
    'Threads per TF op in this process, where the plain-TF floors and the in-process'
    ' contenders run; 0: as launch.train sets them for an in-process run on the CPU'
    ' (cores // clients at once; TensorFlow\'s default when the contenders run on GPUs),'
    ' -1: TensorFlow\'s default (every core).',
    lower_bound=-1,
)

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
  """One parseable line: `ratio` to the contender's own bound (same arithmetic, no
  federation), `ratio_plain_sgd` to the floor, `ratio_tff_fedavg` to TFF's FedAvg
  (ratios of medians), then `paired_<name>=` per-repeat ratios (`paired`)."""
  median = statistics.median(seconds)
  return (
      f'{name:<24} median_s={median:.3f} min_s={min(seconds):.3f}'
      f' max_s={max(seconds):.3f} ratio={median / bound:.2f}'
      f' ratio_plain_sgd={median / plain_sgd:.2f}'
      f' ratio_tff_fedavg={median / tff_fedavg:.2f}'
      + ''.join(f' paired_{k}={v:.2f}' for k, v in paired.items())
      + f' peak_rss_mib={peak / 2**20:.0f}'
  )


def worker_intra_op_threads(clients: int, max_concurrent: int) -> int:
  """The worker's threads per op for a round of `clients`, as `launch.train` picks them."""
  if _INTRA_OP_THREADS.value:
    return _INTRA_OP_THREADS.value
  return cpp_worker.intra_op_threads_for(clients, max_concurrent_clients=max_concurrent)


def _median_round(task, algo, num_clients, examples, repeats, max_concurrent, state_dir):
  datasets = benchmark_contenders.client_datasets(task, num_clients, examples)
  threads = worker_intra_op_threads(num_clients, max_concurrent)
  with cpp_worker.execution_context(max_concurrent, intra_op_threads=threads):
    fn = benchmark_contenders.process_round_fn(
        benchmark_contenders.build(algo, task),
        datasets, os.path.join(state_dir, algo),
    )
    fn()
    times = []
    for _ in range(repeats):
      start = time.perf_counter()
      fn()
      times.append(time.perf_counter() - start)
  return statistics.median(times)


def set_process_threads() -> Optional[int]:
  """Sets this process's threads per TF op (before TensorFlow starts); None: its default."""
  threads = _PROCESS_THREADS.value
  if threads == 0:
    devices = _IN_PROCESS_DEVICES.value or []
    # Physical devices: listing logical ones would start TensorFlow's runtime.
    on_cpu = all(tf_computation.is_cpu(d) for d in devices) and (
        bool(devices) or not tf.config.list_physical_devices('GPU')
    )
    if not (_IN_PROCESS.value and on_cpu):
      return None
    concurrent = _IN_PROCESS_CLIENTS_PER_DEVICE.value or os.cpu_count() or 1
    threads = cpp_worker.intra_op_threads_for(
        _CLIENTS.value, max_concurrent_clients=concurrent * max(1, len(devices))
    )
  if threads < 0:
    return None
  if not in_process.set_intra_op_threads(threads):
    raise app.UsageError('TensorFlow started before the threads per op could be set')
  return threads


def evaluation_lines(evaluation_timed: dict, timed: dict, bounds: dict, algos) -> dict:
  """Prints and returns the evaluation's lines (`ratio` to the bare forward pass), then
  one `round_as_run/<algo>` line per algorithm: its round's training (in process where
  timed) plus the evaluation, against the floors of both parts (`ratio_floor`) and
  against the same training with TFF's federated evaluation (`ratio_tff_fed_eval`)."""
  if not evaluation_timed:
    return {}
  medians = {name: statistics.median(s) for name, (s, _) in evaluation_timed.items()}
  floor = medians[PLAIN_TF_FORWARD]
  results = collections.OrderedDict()
  for name, (seconds, peak) in evaluation_timed.items():
    paired = paired_ratio(seconds, evaluation_timed[PLAIN_TF_FORWARD][0])
    print(f'{name:<24} median_s={medians[name]:.3f} min_s={min(seconds):.3f}'
          f' max_s={max(seconds):.3f} ratio={medians[name] / floor:.2f}'
          f' paired_bound={paired:.2f} peak_rss_mib={peak / 2**20:.0f}', flush=True)
    results[name] = dict(seconds=seconds, median_s=medians[name], bound=PLAIN_TF_FORWARD,
                         ratio=medians[name] / floor, paired=dict(bound=paired))
  for algo in algos:
    trained = f'{IN_PROCESS}/{algo}' if f'{IN_PROCESS}/{algo}' in timed else algo
    train_s = statistics.median(timed[trained][0])
    floor_s = statistics.median(timed[bounds[trained]][0]) + floor
    total = train_s + medians[EVALUATION]
    line = dict(train_s=train_s, evaluation_s=medians[EVALUATION], total_s=total,
                floor_s=floor_s, ratio_floor=total / floor_s)
    text = (f'round_as_run/{algo:<12} train_s={train_s:.3f}'
            f' evaluation_s={medians[EVALUATION]:.3f} total_s={total:.3f}'
            f' floor_s={floor_s:.3f} ratio_floor={total / floor_s:.2f}')
    before = train_s + medians[TFF_FED_EVAL]
    line['ratio_tff_fed_eval'] = total / before
    text += f' ratio_tff_fed_eval={total / before:.2f}'
    print(text, flush=True)
    results[f'round_as_run/{algo}'] = line
  return results


def _start_local_workers(stack, count: int) -> list:
  """`count` TFF workers on this machine, the cores shared among them, stopped with `stack`."""
  workers = []
  for _ in range(count):
    worker = cpp_worker.LocalWorker(intra_op_threads=max(1, (os.cpu_count() or 1) // count))
    stack.callback(worker.stop)
    worker.stub()  # Starts it.
    workers.append(worker)
  return workers


def worker_lines(timed: dict, algos) -> dict:
  """Per stateless algorithm timed on --local_workers: the in-process split over TFF's
  mergeable context, paired by repeat (below 1: the in-process split is faster)."""
  results = {}
  for algo in algos:
    mergeable = timed.get(f'{benchmark_contenders.WORKERS}/{algo}')
    split = timed.get(f'{benchmark_contenders.WORKERS_IN_PROCESS}/{algo}')
    if mergeable is None or split is None:
      continue
    results[algo] = dict(
        mergeable_median_s=statistics.median(mergeable[0]),
        in_process_median_s=statistics.median(split[0]),
        paired_in_process_over_mergeable=paired_ratio(split[0], mergeable[0]),
    )
    print(f'workers algo={algo} local_workers={_LOCAL_WORKERS.value}'
          + ''.join(f' {k}={v:.3f}' if k.endswith('_s') else f' {k}={v:.2f}'
                    for k, v in results[algo].items()), flush=True)
  return results


def _algorithms(names) -> list[str]:
  if list(names) == ['all']:
    return list(registry.ALGORITHMS)
  for name in names:
    registry.get(name)  # An unknown name fails here, before any timing.
  return list(names)


@failures.one_line_errors('benchmark')
def main(argv) -> int:
  del argv
  logging.set_verbosity(logging.WARNING)
  tf.get_logger().setLevel('ERROR')
  if _OUTPUT.value:  # Before the timing, not after it.
    run_directory.check_output_file(_OUTPUT.value, 'output')
  process_threads = set_process_threads()
  algos = _algorithms(_ALGOS.value)
  registry.get(_SCALING_ALGO.value)  # An unknown name fails here, before any timing.
  if _IN_PROCESS.value and _IN_PROCESS_DEVICES.value:
    try:
      in_process.check_devices(_IN_PROCESS_DEVICES.value)
    except ValueError as e:
      raise ValueError(f'--in_process_devices: {e}') from None
  scaling = sorted(int(c) for c in _SCALING.value)
  num_clients = max([_CLIENTS.value] + scaling)
  synthetic = None
  if _DATA_SOURCE.value == 'synthetic':
    # Enough clients with enough examples for every table (volumes are lognormal).
    synthetic = dict(
        num_train_clients=2 * num_clients,
        num_test_clients=_TEST_CLIENTS.value,
        mean_examples_per_client=2 * _EXAMPLES.value,
    )
  task = tasks.get(
      _TASK.value, data_source=_DATA_SOURCE.value, cache_dir=_CACHE_DIR.value,
      synthetic_settings=synthetic,
  )
  datasets = benchmark_contenders.client_datasets(task, _CLIENTS.value, _EXAMPLES.value)
  threads = worker_intra_op_threads(_CLIENTS.value, _MAX_CONCURRENT.value)
  print(
      f'task={_TASK.value} clients={_CLIENTS.value} examples_per_client={_EXAMPLES.value}'
      f' batch={task.spec.batch_size} repeats={_REPEATS.value}'
      f' cpus={os.cpu_count()} worker_intra_op_threads={threads}'
      f' process_intra_op_threads={process_threads or "default"}'
      f' in_process_devices={_IN_PROCESS_DEVICES.value or in_process.visible_gpus() or "host CPU"}',
      flush=True,
  )
  results = collections.OrderedDict()
  with contextlib.ExitStack() as stack:
    state_dir = stack.enter_context(tempfile.TemporaryDirectory())
    stack.enter_context(
        cpp_worker.execution_context(_MAX_CONCURRENT.value, intra_op_threads=threads)
    )
    stock_worker = cpp_worker.LocalWorker(_MAX_CONCURRENT.value)
    stack.callback(stock_worker.stop)
    stock_worker.stub()
    stock_context = cpp_worker.create_sync_context(
        [stock_worker], cache_computations=False
    )
    in_process_context = None
    if _IN_PROCESS.value:
      in_process_context = in_process.InProcessContext(
          _IN_PROCESS_DEVICES.value or in_process.visible_gpus() or None,
          _IN_PROCESS_CLIENTS_PER_DEVICE.value or None,
      )
    fns, bounds = benchmark_contenders.contenders(
        task, algos, datasets, state_dir, stock_context, in_process_context
    )
    if _LOCAL_WORKERS.value:
      workers = _start_local_workers(stack, _LOCAL_WORKERS.value)
      worker_fns, worker_bounds = benchmark_contenders.worker_contenders(
          task, algos, datasets, state_dir, workers
      )
      fns.update(worker_fns)
      bounds.update(worker_bounds)
    timed = time_alternating(fns, _REPEATS.value)
    evaluation_timed = {}
    if _EVALUATION.value:
      parallel = evaluation.groups_at_once(process_threads)  # As launch.train runs it.
      evaluation_fns, evaluated = benchmark_contenders.evaluation_contenders(task, parallel)
      print(f'evaluation: {evaluated}, batch {task.spec.eval_batch_size},'
            f' {parallel} group(s) at once', flush=True)
      evaluation_timed = time_alternating(evaluation_fns, _REPEATS.value)
  in_process_devices = {}
  if in_process_context is not None:
    # Where the in-process clients ran, read from the tensors they returned.
    in_process_devices = dict(sorted(in_process_context.client_devices.items()))
    print(f'in_process client computations per device: {in_process_devices}', flush=True)
  medians = {name: statistics.median(seconds) for name, (seconds, _) in timed.items()}
  # Per-repeat ratios to the references the targets name: each contender's own
  # bound, the floor, TFF's FedAvg and (when timed) the package's FedAvg.
  references = {'plain_sgd': PLAIN_TF, 'tff_fedavg': TFF_FEDAVG}
  if 'fedavg' in timed:
    references['fedavg'] = 'fedavg'
  for name, (seconds, peak) in timed.items():
    own = bounds.get(name, PLAIN_TF)
    paired = {'bound': paired_ratio(seconds, timed[own][0])}
    paired.update(
        {key: paired_ratio(seconds, timed[ref][0]) for key, ref in references.items()}
    )
    line = summary_line(
        name, seconds, peak, medians[own], medians[PLAIN_TF], medians[TFF_FEDAVG], paired
    )
    print(line, flush=True)
    results[name] = dict(
        seconds=seconds, median_s=medians[name], bound=own,
        ratio=medians[name] / medians[own],
        ratio_plain_sgd=medians[name] / medians[PLAIN_TF],
        paired=paired, peak_rss_mib=peak / 2**20,
    )

  evaluation_results = evaluation_lines(evaluation_timed, timed, bounds, algos)
  worker_results = worker_lines(timed, algos)

  with tempfile.TemporaryDirectory() as state_dir:
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
          f' median_s={median:.3f} ratio_plain_sgd={median / medians[PLAIN_TF]:.2f}',
          flush=True,
      )
  if _OUTPUT.value:
    run_directory.write_json_atomically(
        _OUTPUT.value,
        # command, date and cpus: what scripts/benchmark_table.py prints above the table.
        dict(command=sys.argv[1:], date=time.strftime('%Y-%m-%d'), cpus=os.cpu_count(),
             contenders=results, scaling=scaling_rows, concurrency=concurrency_rows,
             worker_intra_op_threads=threads, process_intra_op_threads=process_threads,
             in_process_client_devices=in_process_devices,
             evaluation=evaluation_results, workers=worker_results),
        sort_keys=False,  # The contenders in the order scripts/benchmark_table.py prints.
    )
  return 0


if __name__ == '__main__':
  failures.run_program('benchmark', main)
