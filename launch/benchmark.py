r"""Round time of the package's processes against plain-TF bounds and TFF's FedAvg.

  python -m launch.benchmark --task=emnist --algos=all

On one set of client datasets (`--clients_per_round` clients of exactly
`--examples_per_client` examples each, the task's batch size), it times, alternating
after a warm-up round each, with the median and spread over `--repeats`:

- `plain_tf`: the cheapest plain TensorFlow training of the model on these examples, a
  `tf.function` running TFF's SGD in `dataset.reduce`, every client from the same
  weights: the floor on this hardware;
- `plain_tf_keras`: the loop most users write, Keras SGD in a `for` loop over the
  dataset;
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
  `--workers` can run it (`launch.benchmarking.contenders.worker_contenders`).

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
`launch.benchmarking.contenders`, timed by `launch.benchmarking.timing` and reported by
`launch.benchmarking.report`.

With `--sweep`, only what a sweep's cells cost: `--sweep_cells` FedAvg cells of
`--sweep_rounds` rounds (client learning rates 10^-3 ... 10^-1), each as its own
`launch.train` process (unless --nosweep_cold), then all in one warm slot one after
another, then (with --sweep_batch_cells=K) batched, K at once, in one warm slot
(`launch.benchmarking.sweep`):

  python -m launch.benchmark --sweep --data_source=synthetic
  python -m launch.benchmark --sweep --nosweep_cold --sweep_batch_cells=9 \
      --data_source=synthetic --examples_per_client=40

Exit status: as every program's (docs/operations.md, "Exit statuses").
"""

import contextlib
import statistics
import tempfile
from typing import Optional

from absl import app
from absl import flags
from absl import logging
import numpy as np
import tensorflow as tf

import tasks
from launch.benchmarking import contenders
from launch.benchmarking import report
from launch.benchmarking import sweep
from launch.benchmarking import timing
from launch.cli import failures
from launch.cli import unused_flags
from launch.run import run_directory
from tasks import evaluation
from tff_zmg.algorithms import registry
from tff_zmg.runtime import cpp_worker
from tff_zmg.runtime import in_process

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
_SWEEP = flags.DEFINE_bool(
    'sweep', False,
    'Time only a sweep: its cells as one launch.train process each, then in one warm'
    ' slot (launch.benchmarking.sweep).',
)
_SWEEP_CELLS = flags.DEFINE_integer('sweep_cells', 9, 'With --sweep: the cells.',
                                    lower_bound=2)
_SWEEP_ROUNDS = flags.DEFINE_integer('sweep_rounds', 10, 'With --sweep: rounds per cell.',
                                     lower_bound=1)
_SWEEP_COLD = flags.DEFINE_bool(
    'sweep_cold', True, 'With --sweep: also time each cell as its own launch.train process.')
_SWEEP_BATCH_CELLS = flags.DEFINE_integer(
    'sweep_batch_cells', 0,
    'With --sweep: also time the cells batched, this many at once in one warm slot'
    ' (launch.sweeps.batched_cells); 0: not.', lower_bound=0)
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


def _set_process_threads() -> Optional[int]:
  """Sets this process's threads per TF op (before TensorFlow starts); None: its default."""
  threads = timing.process_intra_op_threads(
      _PROCESS_THREADS.value, _IN_PROCESS.value, _IN_PROCESS_DEVICES.value,
      _IN_PROCESS_CLIENTS_PER_DEVICE.value, _CLIENTS.value,
  )
  if threads is not None and not in_process.set_intra_op_threads(threads):
    raise app.UsageError('TensorFlow started before the threads per op could be set')
  return threads


def _checked_algorithms() -> list[str]:
  """The algorithms to time; every name (--scaling_algo's too) and device is checked here,
  so that a wrong one fails before any timing."""
  if list(_ALGOS.value) == ['all']:
    algos = list(registry.ALGORITHMS)
  else:
    for name in _ALGOS.value:
      registry.get(name)
    algos = list(_ALGOS.value)
  registry.get(_SCALING_ALGO.value)
  if _IN_PROCESS.value and _IN_PROCESS_DEVICES.value:
    try:
      in_process.check_devices(_IN_PROCESS_DEVICES.value)
    except ValueError as e:
      raise ValueError(f'--in_process_devices: {e}') from None
  return algos


def _scaling_clients() -> list[int]:
  return sorted(int(c) for c in _SCALING.value)


def _task():
  """The task; synthetic data with enough clients of enough examples for every table
  (volumes are lognormal)."""
  synthetic = None
  if _DATA_SOURCE.value == 'synthetic':
    synthetic = dict(
        num_train_clients=2 * max([_CLIENTS.value] + _scaling_clients()),
        num_test_clients=_TEST_CLIENTS.value,
        mean_examples_per_client=2 * _EXAMPLES.value,
    )
  return tasks.get(
      _TASK.value, data_source=_DATA_SOURCE.value, cache_dir=_CACHE_DIR.value,
      synthetic_settings=synthetic,
  )


def _worker_threads(clients: int, max_concurrent: int) -> int:
  return timing.worker_intra_op_threads(_INTRA_OP_THREADS.value, clients, max_concurrent)


def _in_process_context() -> Optional[in_process.InProcessContext]:
  if not _IN_PROCESS.value:
    return None
  return in_process.InProcessContext(
      _IN_PROCESS_DEVICES.value or in_process.visible_gpus() or None,
      _IN_PROCESS_CLIENTS_PER_DEVICE.value or None,
  )


def _time_evaluation(task, process_threads) -> dict:
  """The evaluation launch.train runs, its floors and TFF's, timed like the rounds."""
  parallel = evaluation.groups_at_once(process_threads)  # As launch.train runs it.
  executor = 'gpu' if in_process.visible_gpus() else 'cpu'
  batch_size = evaluation.batch_size_for(task.name, executor)  # A new run's.
  evaluation_fns, evaluated = contenders.evaluation_contenders(task, parallel, batch_size)
  print(f'evaluation: {evaluated}, {parallel} group(s) at once', flush=True)
  return timing.time_alternating(evaluation_fns, _REPEATS.value)


def _time_contenders(task, algos, datasets, worker_threads, process_threads):
  """Times every contender's round, then the evaluation's, on workers stopped at the end.

  Returns ({name: (seconds, peak)}, {name: its bound's name}, the evaluation's timings,
  the in-process context or None).
  """
  with contextlib.ExitStack() as stack:
    state_dir = stack.enter_context(tempfile.TemporaryDirectory())
    stack.enter_context(
        cpp_worker.execution_context(_MAX_CONCURRENT.value, intra_op_threads=worker_threads)
    )
    stock_context = contenders.stock_context(stack, _MAX_CONCURRENT.value)
    in_process_context = _in_process_context()
    fns, bounds = contenders.contenders(
        task, algos, datasets, state_dir, stock_context, in_process_context
    )
    if _LOCAL_WORKERS.value:
      workers = contenders.start_local_workers(stack, _LOCAL_WORKERS.value)
      worker_fns, worker_bounds = contenders.worker_contenders(
          task, algos, datasets, state_dir, workers
      )
      fns.update(worker_fns)
      bounds.update(worker_bounds)
    timed = timing.time_alternating(fns, _REPEATS.value)
    evaluation_timed = _time_evaluation(task, process_threads) if _EVALUATION.value else {}
  return timed, bounds, evaluation_timed, in_process_context


def _time_scaling_tables(task, plain_sgd_s: float) -> tuple[list, list]:
  """Prints and returns the rows of the scaling and the concurrency tables, each row
  (clients or --max_concurrent_clients, median seconds of --scaling_algo's round)."""
  repeats = max(2, _REPEATS.value // 2)
  with tempfile.TemporaryDirectory() as state_dir:

    def median_round(clients, max_concurrent):
      return timing.median_round(
          task, _SCALING_ALGO.value, clients, _EXAMPLES.value, repeats, max_concurrent,
          _worker_threads(clients, max_concurrent), state_dir,
      )

    scaling_rows = [(c, median_round(c, _MAX_CONCURRENT.value)) for c in _scaling_clients()]
    report.scaling_lines(_SCALING_ALGO.value, scaling_rows)
    concurrency_rows = []
    for value in (int(c) for c in _CONCURRENCY.value):
      concurrency_rows.append((value, median_round(_CLIENTS.value, value)))
      print(report.concurrency_line(_SCALING_ALGO.value, value, concurrency_rows[-1][1],
                                    plain_sgd_s), flush=True)
  return scaling_rows, concurrency_rows


def _time_sweep() -> dict:
  """The sweep's cells cold and warm (`sweep`), printed; returns the results."""
  data = {'data_source': _DATA_SOURCE.value}
  if _CACHE_DIR.value:
    data['cache_dir'] = _CACHE_DIR.value
  if _DATA_SOURCE.value == 'synthetic':
    data.update(synthetic_examples_per_client=_EXAMPLES.value,
                synthetic_test_clients=_TEST_CLIENTS.value)
  common = {'task': _TASK.value, 'algo': 'fedavg', **data,
            'clients_per_round': _CLIENTS.value}
  client_lrs = np.geomspace(1e-3, 1e-1, _SWEEP_CELLS.value)
  batch = _SWEEP_BATCH_CELLS.value
  print(f'sweep: {len(client_lrs)} cells x {_SWEEP_ROUNDS.value} rounds of {_TASK.value}'
        ' fedavg, ' + ', then '.join(
            (['each as its own launch.train process'] if _SWEEP_COLD.value else [])
            + ['all in one warm slot']
            + ([f'batched, {batch} at once, in one warm slot'] if batch else [])),
        flush=True)
  with tempfile.TemporaryDirectory(prefix='tff_zmg-sweep-') as root:
    cold_cells = sweep.cells(common, client_lrs, _SWEEP_ROUNDS.value, f'{root}/cold')
    warm_cells = sweep.cells(common, client_lrs, _SWEEP_ROUNDS.value, f'{root}/warm')
    # The data is made (or checked) once before any is timed.
    sweep.time_cold(sweep.cells(common, client_lrs[:1], 1, f'{root}/data'), root)
    cold = sweep.time_cold(cold_cells, root) if _SWEEP_COLD.value else []
    warm, warm_whole = sweep.time_warm(warm_cells, root)
    lines, results = sweep.lines(cold_cells, cold, warm_cells, warm, warm_whole)
    if batch:
      batched_cells = sweep.cells(common, client_lrs, _SWEEP_ROUNDS.value, f'{root}/batched')
      walls, whole = sweep.time_batched(batched_cells, root, batch)
      more_lines, more = sweep.batched_lines(batched_cells, walls, whole, batch, warm_whole)
      lines += more_lines
      results.update(more)
  for line in lines:
    print(line, flush=True)
  return results


def _check_flags() -> None:
  """Refuses the flags of the timing --sweep skips, and the sweep's without it."""
  if _SWEEP.value:
    unused_flags.refuse(
        ('algos', 'repeats', 'scaling_clients', 'scaling_algo', 'concurrency',
         'max_concurrent_clients', 'intra_op_threads', 'evaluation', 'in_process',
         'in_process_devices', 'in_process_clients_per_device', 'local_workers',
         'process_intra_op_threads'),
        "does not apply with --sweep, which times only a sweep's cells")
  else:
    unused_flags.refuse(('sweep_cells', 'sweep_rounds', 'sweep_cold', 'sweep_batch_cells'),
                        'applies only with --sweep')


@failures.one_line_errors('benchmark')
def main(argv) -> int:
  del argv
  logging.set_verbosity(logging.WARNING)
  tf.get_logger().setLevel('ERROR')
  _check_flags()
  if _OUTPUT.value:  # Before the timing, not after it.
    run_directory.check_output_file(_OUTPUT.value, 'output')
  if _SWEEP.value:
    results = _time_sweep()
    if _OUTPUT.value:
      report.write_sweep_json(_OUTPUT.value, results)
    return 0
  process_threads = _set_process_threads()
  algos = _checked_algorithms()
  task = _task()
  datasets = contenders.client_datasets(task, _CLIENTS.value, _EXAMPLES.value)
  worker_threads = _worker_threads(_CLIENTS.value, _MAX_CONCURRENT.value)
  print(report.setup_line(
      task, _CLIENTS.value, _EXAMPLES.value, _REPEATS.value, worker_threads, process_threads,
      _IN_PROCESS_DEVICES.value or in_process.visible_gpus() or 'host CPU',
  ), flush=True)
  timed, bounds, evaluation_timed, in_process_context = _time_contenders(
      task, algos, datasets, worker_threads, process_threads
  )
  client_devices = {}
  if in_process_context is not None:
    client_devices = dict(sorted(in_process_context.client_devices.items()))
    print(report.client_devices_line(client_devices), flush=True)
  contender_results = report.contender_lines(timed, bounds)
  evaluation_results = report.evaluation_lines(evaluation_timed, timed, bounds, algos)
  worker_results = report.worker_lines(timed, algos, _LOCAL_WORKERS.value)
  scaling_rows, concurrency_rows = _time_scaling_tables(
      task, statistics.median(timed[contenders.PLAIN_TF][0])
  )
  if _OUTPUT.value:
    report.write_json(
        _OUTPUT.value, contender_results=contender_results, scaling_rows=scaling_rows,
        concurrency_rows=concurrency_rows, worker_threads=worker_threads,
        process_threads=process_threads, client_devices=client_devices,
        evaluation_results=evaluation_results, worker_results=worker_results,
    )
  return 0


if __name__ == '__main__':
  failures.run_program('benchmark', main)
