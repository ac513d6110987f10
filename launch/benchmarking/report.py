"""What `launch.benchmark` prints and writes: one parseable line per contender with its
ratios, the evaluation's and the workers' lines, the scaling and concurrency tables, and
the same figures as the JSON of its --output (which scripts/benchmark_table.py renders).

Each `*_lines` function prints its lines and returns their figures for the JSON.
"""

import collections
import os
import statistics
import sys
import time

from launch.benchmarking import contenders
from launch.benchmarking.contenders import EVALUATION
from launch.benchmarking.contenders import IN_PROCESS
from launch.benchmarking.contenders import PLAIN_TF
from launch.benchmarking.contenders import PLAIN_TF_FORWARD
from launch.benchmarking.contenders import TFF_FEDAVG
from launch.benchmarking.contenders import TFF_FED_EVAL
from launch.benchmarking.timing import paired_ratio
from launch.run import run_directory


def setup_line(
    task, clients, examples, repeats, worker_threads, process_threads, in_process_devices
) -> str:
  """The first line: what is timed, and on how many threads and devices."""
  return (
      f'task={task.name} clients={clients} examples_per_client={examples}'
      f' batch={task.spec.batch_size} repeats={repeats}'
      f' cpus={os.cpu_count()} worker_intra_op_threads={worker_threads}'
      f' process_intra_op_threads={process_threads or "default"}'
      f' in_process_devices={in_process_devices}'
  )


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


def contender_lines(timed: dict, bounds: dict) -> dict:
  """Prints and returns a `summary_line` per contender of `timed` ({name: (seconds, peak)};
  `bounds`: {name: its bound's name}, the floor where it has none)."""
  medians = {name: statistics.median(seconds) for name, (seconds, _) in timed.items()}
  # Per-repeat ratios to the references the targets name: each contender's own
  # bound, the floor, TFF's FedAvg and (when timed) the package's FedAvg.
  references = {'plain_sgd': PLAIN_TF, 'tff_fedavg': TFF_FEDAVG}
  if 'fedavg' in timed:
    references['fedavg'] = 'fedavg'
  results = collections.OrderedDict()
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
  return results


def evaluation_lines(evaluation_timed: dict, timed: dict, bounds: dict, algos) -> dict:
  """Prints and returns the evaluation's lines: the bare forward pass at each batch, the
  fastest the floor, and each contender's `ratio` to that floor (not to the floor at its
  own batch: the evaluation's batch is a choice); then one `round_as_run/<algo>` line per
  algorithm: its round's training (in process where timed) plus the evaluation, against
  the floors of both parts (`ratio_floor`) and against the same training with TFF's
  federated evaluation (`ratio_tff_fed_eval`)."""
  if not evaluation_timed:
    return {}
  medians = {name: statistics.median(s) for name, (s, _) in evaluation_timed.items()}
  floors = [name for name in evaluation_timed if name.startswith(f'{PLAIN_TF_FORWARD}/')]
  fastest = min(floors, key=medians.get)
  floor = medians[fastest]
  print(f'evaluation floor: {fastest}, the fastest bare forward pass of batches'
        f' {", ".join(name.split("/")[1] for name in floors)}', flush=True)
  results = collections.OrderedDict()
  for name, (seconds, peak) in evaluation_timed.items():
    paired = paired_ratio(seconds, evaluation_timed[fastest][0])
    print(f'{name:<24} median_s={medians[name]:.3f} min_s={min(seconds):.3f}'
          f' max_s={max(seconds):.3f} ratio={medians[name] / floor:.2f}'
          f' paired_bound={paired:.2f} peak_rss_mib={peak / 2**20:.0f}', flush=True)
    results[name] = dict(seconds=seconds, median_s=medians[name], bound=fastest,
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


def worker_lines(timed: dict, algos, local_workers: int) -> dict:
  """Per stateless algorithm timed on `local_workers` workers: the in-process split over
  TFF's mergeable context, paired by repeat (below 1: the in-process split is faster)."""
  results = {}
  for algo in algos:
    mergeable = timed.get(f'{contenders.WORKERS}/{algo}')
    split = timed.get(f'{contenders.WORKERS_IN_PROCESS}/{algo}')
    if mergeable is None or split is None:
      continue
    results[algo] = dict(
        mergeable_median_s=statistics.median(mergeable[0]),
        in_process_median_s=statistics.median(split[0]),
        paired_in_process_over_mergeable=paired_ratio(split[0], mergeable[0]),
    )
    print(f'workers algo={algo} local_workers={local_workers}'
          + ''.join(f' {k}={v:.3f}' if k.endswith('_s') else f' {k}={v:.2f}'
                    for k, v in results[algo].items()), flush=True)
  return results


def client_devices_line(client_devices: dict) -> str:
  """Where the in-process clients ran, read from the tensors they returned."""
  return f'in_process client computations per device: {client_devices}'


def scaling_lines(algo: str, rows) -> None:
  """Prints how a round grows with its clients: `rows` of (clients, median seconds), the
  first the base of `growth`."""
  base_clients, base = rows[0] if rows else (1, 1.0)
  for clients, median in rows:
    print(
        f'scaling algo={algo} clients={clients} median_s={median:.3f}'
        f' per_client_s={median / clients:.4f}'
        f' growth={median / base:.2f} (clients x{clients / base_clients:g})',
        flush=True,
    )


def concurrency_line(algo: str, max_concurrent: int, median: float, plain_sgd: float) -> str:
  """A round's median with TFF's worker running at most `max_concurrent` clients at once
  (-1: no limit), and its ratio to the floor's median `plain_sgd`."""
  return (
      f'concurrency algo={algo} max_concurrent_clients={max_concurrent}'
      f' median_s={median:.3f} ratio_plain_sgd={median / plain_sgd:.2f}'
  )


def write_json(
    path, *, contender_results, scaling_rows, concurrency_rows, worker_threads,
    process_threads, client_devices, evaluation_results, worker_results,
) -> None:
  """The figures of the printed lines as JSON at `path`, with the command that made them."""
  run_directory.write_json_atomically(
      path,
      # command, date and cpus: what scripts/benchmark_table.py prints above the table.
      dict(command=sys.argv[1:], date=time.strftime('%Y-%m-%d'), cpus=os.cpu_count(),
           contenders=contender_results, scaling=scaling_rows, concurrency=concurrency_rows,
           worker_intra_op_threads=worker_threads, process_intra_op_threads=process_threads,
           in_process_client_devices=client_devices,
           evaluation=evaluation_results, workers=worker_results),
      sort_keys=False,  # The contenders in the order scripts/benchmark_table.py prints.
  )


def write_sweep_json(path, results: dict) -> None:
  """`launch.benchmark --sweep`'s figures as JSON at `path`, with the command that made them."""
  run_directory.write_json_atomically(
      path, dict(command=sys.argv[1:], date=time.strftime('%Y-%m-%d'), cpus=os.cpu_count(),
                 sweep=results))
