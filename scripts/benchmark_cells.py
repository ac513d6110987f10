"""Times a round of one process against K batched cells of it, with each client loop.

  .venv/bin/python scripts/benchmark_cells.py [--task=emnist] [--examples=40] [--cells=9]
      [--clients=10] [--repeats=3] [--algo=fedavg]

On synthetic data of `--clients` clients of `--examples` examples, it builds `--algo`'s process
with each of TFF's client loops (`dataset.reduce`, DATASET_REDUCE, and a loop over the
dataset's iterator, DATASET_ITERATOR) and `tff_zmg.templates.cells`' process of `--cells` cells
of each, then times, repeat after repeat in turn after an untimed round of each: one round of
the process (the cells' states at other client rates) and one round of the K cells. It prints
each median and the ratios measured in this run: batched / (K x one round) per loop, and the
iterator's round / reduce's. Rounds only: no evaluation, checkpoint or run folder
(`launch.benchmark --sweep --sweep_batch_cells=K` times whole runs).
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# pylint: disable=g-import-not-at-top,wrong-import-position
import tasks
import tensorflow_federated as tff
from tff_zmg.algorithms import registry
from tff_zmg.runtime import in_process
from tff_zmg.templates import cells
from tff_zmg.templates import state_hparams

_LOOPS = ('DATASET_REDUCE', 'DATASET_ITERATOR')


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--task', default='emnist', choices=tasks.TASK_NAMES)
  parser.add_argument('--algo', default='fedavg')
  parser.add_argument('--examples', type=int, default=40)
  parser.add_argument('--clients', type=int, default=10)
  parser.add_argument('--cells', type=int, default=9)
  parser.add_argument('--repeats', type=int, default=3)
  args = parser.parse_args()
  task = tasks.get(args.task, data_source='synthetic', cache_dir=tempfile.mkdtemp(),
                   synthetic_settings=dict(num_train_clients=args.clients, num_test_clients=2,
                                           mean_examples_per_client=args.examples))
  train_data = task.datasets.train_data
  ids = train_data.client_ids[:args.clients]

  def clients(round_num):
    # As a run makes them (launch/run/experiment.py): from the clients held in memory.
    return [task.train_preprocess_fn_for_seed(round_num * 1000 + i).from_tensors(
        task.train_client_tensors(c)) for i, c in enumerate(ids)]

  with in_process.in_process_context():
    processes, batched, states = {}, {}, {}
    for loop in _LOOPS:
      processes[loop] = registry.build(
          args.algo, task.model_fn, keras_model_fn=task.keras_model_fn,
          num_clients=args.clients,
          loop_implementation=getattr(tff.learning.LoopImplementation, loop))
      batched[loop] = cells.build_cells_process(processes[loop], args.cells)
      initial = processes[loop].initialize()
      states[loop] = tuple(
          state_hparams.set_in_state(processes[loop], initial,
                                     dict(client_learning_rate=0.01 * (1 + k)))
          for k in range(args.cells))
    seconds = {}
    for repeat in range(args.repeats + 1):
      for loop in _LOOPS:
        for kind, run in (('one', lambda: processes[loop].next(states[loop][0], data)),
                          ('batched', lambda: batched[loop].next(states[loop], data))):
          data = clients(repeat)
          start = time.monotonic()
          run()
          if repeat:  # The first is untimed: it compiles.
            seconds.setdefault((loop, kind), []).append(time.monotonic() - start)
  median = {key: statistics.median(values) for key, values in seconds.items()}
  what = f'{args.task} {args.algo}, {args.clients} clients x {args.examples} examples'
  for (loop, kind), value in median.items():
    print(f'{what}, {loop}: {"a round" if kind == "one" else f"{args.cells} batched cells"}'
          f' {value:.2f} s (median of {args.repeats})')
  for loop in _LOOPS:
    ratio = median[(loop, 'batched')] / (args.cells * median[(loop, 'one')])
    print(f'{what}, {loop}: batched / ({args.cells} x a round) = {ratio:.2f}')
  print(f'{what}: DATASET_ITERATOR / DATASET_REDUCE (a round) ='
        f' {median[("DATASET_ITERATOR", "one")] / median[("DATASET_REDUCE", "one")]:.2f}')


if __name__ == '__main__':
  main()
