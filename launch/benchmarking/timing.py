"""How `launch.benchmark` times rounds: contenders in turn, ratios paired by repeat, and
the threads per TF op chosen as `launch.train` chooses them."""

import collections
import os
import statistics
import time
from typing import Optional

import tensorflow as tf

from launch.benchmarking import contenders
from launch.benchmarking import resources
from tff_zmg.runtime import cpp_worker
from tff_zmg.runtime import tf_computation


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


def median_round(
    task, algo, num_clients, examples, repeats, max_concurrent, intra_op_threads, state_dir
) -> float:
  """The median round of `algo` on TFF's worker, `num_clients` clients, after a warm-up."""
  datasets = contenders.client_datasets(task, num_clients, examples)
  with cpp_worker.execution_context(max_concurrent, intra_op_threads=intra_op_threads):
    fn = contenders.process_round_fn(
        contenders.build(algo, task), datasets, os.path.join(state_dir, algo),
    )
    fn()
    times = []
    for _ in range(repeats):
      start = time.perf_counter()
      fn()
      times.append(time.perf_counter() - start)
  return statistics.median(times)


def worker_intra_op_threads(requested: int, clients: int, max_concurrent: int) -> int:
  """The worker's threads per op for a round of `clients`: `requested`, or as
  `launch.train` picks them when it is 0."""
  if requested:
    return requested
  return cpp_worker.intra_op_threads_for(clients, max_concurrent_clients=max_concurrent)


def process_intra_op_threads(
    requested: int, in_process_timed: bool, devices, clients_per_device: int, clients: int
) -> Optional[int]:
  """This process's threads per TF op; None: TensorFlow's default (every core).

  `requested` > 0 is taken as it is, -1 is the default; 0 chooses as `launch.train` does
  for an in-process run on the CPU (cores // clients at once), and the default where no
  in-process contender runs on the CPU (`devices`: --in_process_devices, empty for every
  GPU, else the CPU; `clients_per_device` 0: one client per core).
  """
  threads = requested
  if threads == 0:
    devices = devices or []
    # Physical devices: listing logical ones would start TensorFlow's runtime.
    on_cpu = all(tf_computation.is_cpu(d) for d in devices) and (
        bool(devices) or not tf.config.list_physical_devices('GPU')
    )
    if not (in_process_timed and on_cpu):
      return None
    concurrent = clients_per_device or os.cpu_count() or 1
    threads = cpp_worker.intra_op_threads_for(
        clients, max_concurrent_clients=concurrent * max(1, len(devices))
    )
  if threads < 0:
    return None
  return threads
