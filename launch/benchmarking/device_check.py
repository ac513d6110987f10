"""What `launch.check_devices` runs and reads: the devices TensorFlow sees, one FedAvg round
in TFF's worker and the same round in this process with TensorFlow's run metadata on, the
nodes each device ran, and the labelled lines that say so.

Each `*_lines` function prints its lines and returns what the program's exit status needs.
"""

import collections
import contextlib
import dataclasses
import os
import re
import time

import numpy as np
import psutil
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow.python.eager import context as eager_context

from launch.run import run_config
import tasks
from tff_zmg.algorithms import registry
from tff_zmg.runtime import cpp_worker
from tff_zmg.runtime import gpu_diagnosis
from tff_zmg.runtime import in_process

# Model arithmetic (oneDNN renames MatMul to _MklMatMul, _MklNativeFusedMatMul, ...;
# `--task=shakespeare` on a GPU runs the GRU as CudnnRNN).
MODEL_OP = re.compile(r'MatMul|Conv2D|BiasAdd|Softmax|MaxPool|Relu|_FusedConv|CudnnRNN')
# The worker's start-up device lines (tensorflow_federated/.../session_provider.cc).
_WORKER_DEVICE_LINE = re.compile(
    r'Found devices|Skipping device|Found:|\bGPUs\b|\bTPUS\b|device', re.I
)

def tensorflow_lines() -> list[str]:
  """Prints TensorFlow's build, the GPUs it sees (or why none), and every logical device;
  returns the logical GPUs."""
  info = tf.sysconfig.get_build_info()
  print(
      f'tf_build: version={tf.__version__} is_cuda_build={info.get("is_cuda_build", False)}'
      f' cuda_version={info.get("cuda_version", "none")}'
      f' cudnn_version={info.get("cudnn_version", "none")}',
      flush=True,
  )
  physical_gpus = [d.name for d in tf.config.list_physical_devices('GPU')]
  gpus = in_process.visible_gpus()
  print(f'tf_gpus: physical={physical_gpus or "none"} logical={gpus or "none"}', flush=True)
  if not gpus:
    print(f'no_gpu_cause: {gpu_diagnosis.no_gpu_cause()}', flush=True)
  print(
      'tf_logical_devices: '
      + ' '.join(f'{d.name}({d.device_type})' for d in tf.config.list_logical_devices()),
      flush=True,
  )
  return gpus


def fedavg(task_name: str, clients: int, cache_dir: str, gpu_kernels: bool):
  """(task, FedAvg process) on a small synthetic task, its clients run as a DATASET_ITERATOR
  loop; `gpu_kernels`: the model may use GPU-only fused kernels (`tasks.get`)."""
  task = tasks.get(
      task_name,
      data_source='synthetic',
      synthetic_settings=dict(
          num_train_clients=clients, num_test_clients=2, mean_examples_per_client=20
      ),
      cache_dir=cache_dir,
      gpu_kernels=gpu_kernels,
  )
  process = registry.build(
      'fedavg', task.model_fn,
      loop_implementation=run_config.CLIENT_LOOP,
  )
  return task, process


def client_datasets(task, count: int) -> list[tf.data.Dataset]:
  """The first `count` training clients (sorted ids), preprocessed as for training."""
  train = task.datasets.train_data
  ids = sorted(train.client_ids)[:count]
  return [task.datasets.train_preprocess_fn(train.create_tf_dataset_for_client(i)) for i in ids]


@dataclasses.dataclass(frozen=True)
class Rounds:
  """The same round in TFF's C++ worker and in this process.

  Attributes:
    clients: Clients in the round.
    worker_s, in_process_s: Each round's seconds.
    worker_weights, in_process_weights: Each round's model weights.
    run_metadata: TensorFlow's run metadata of the in-process round.
  """

  clients: int
  worker_s: float
  in_process_s: float
  worker_weights: object
  in_process_weights: object
  run_metadata: object


def both_rounds(process, reference, data, devices) -> Rounds:
  """`reference`'s round from its initial state in TFF's worker (printing the worker's device
  lines), then `process`'s from the same state in this process on `devices`."""
  with _worker_logging_devices() as worker:
    context = cpp_worker.create_sync_context([worker])
    with tff.framework.get_context_stack().install(context):
      initial = reference.initialize()
      start = time.perf_counter()
      expected = reference.next(initial, data).state
      worker_s = time.perf_counter() - start
    _worker_lines(worker)

  tf_context = eager_context.context()
  tf_context.enable_run_metadata()
  try:
    with in_process.in_process_context(devices):
      start = time.perf_counter()
      actual = process.next(initial, data).state
      in_process_s = time.perf_counter() - start
      expected_weights = process.get_model_weights(expected)
      actual_weights = process.get_model_weights(actual)
  finally:
    metadata = tf_context.export_run_metadata()
    tf_context.disable_run_metadata()
  return Rounds(
      clients=len(data), worker_s=worker_s, in_process_s=in_process_s,
      worker_weights=expected_weights, in_process_weights=actual_weights,
      run_metadata=metadata,
  )


@contextlib.contextmanager
def _worker_logging_devices():
  """Starts TFF's worker with TF's INFO log on, so its log names the devices it finds."""
  saved = os.environ.get('TF_CPP_MIN_LOG_LEVEL')
  os.environ['TF_CPP_MIN_LOG_LEVEL'] = '0'
  try:
    worker = cpp_worker.LocalWorker()
    worker.stub()
  finally:
    if saved is None:
      os.environ.pop('TF_CPP_MIN_LOG_LEVEL', None)
    else:
      os.environ['TF_CPP_MIN_LOG_LEVEL'] = saved
  try:
    yield worker
  finally:
    pid = worker.pid
    worker.stop()
    gone = pid is None or not psutil.pid_exists(pid)
    print(f'tff_worker pid={pid} stopped={"yes" if gone else "NO"}', flush=True)


def _worker_lines(worker) -> None:
  """Prints the worker's binary and the device lines of its log."""
  lines = _worker_device_lines(worker.log_path)
  print(
      f'tff_worker: binary={cpp_worker.worker_binary_path()}'
      + ''.join(f'\ntff_worker_log: {line}' for line in lines)
      + ('' if lines else ' no device lines found in its log'),
      flush=True,
  )


def _worker_device_lines(log_path: str) -> list[str]:
  with open(log_path, errors='replace') as f:
    text = f.read()
  # 'Found:\n\t0 GPUs\n\t0 TPUS\nin total' is one message over several lines: join them.
  text = re.sub(r'\n\s+', ' ', text)
  lines = []
  for line in text.splitlines():
    if _WORKER_DEVICE_LINE.search(line):
      lines.append(re.sub(r'^.*?\] ', '', line).strip())
  return lines


def round_line(task_name: str, rounds: Rounds, devices) -> str:
  return (
      f'round: task={task_name} clients={rounds.clients} fedavg DATASET_ITERATOR'
      f' in_process_devices={",".join(devices)} in_process_s={rounds.in_process_s:.2f}'
      f' tff_worker_s={rounds.worker_s:.2f}'
  )


def op_counts(run_metadata) -> dict[str, tuple[int, int]]:
  """Per device: (nodes, model ops) in the partition graphs of the functions run."""
  nodes = collections.Counter()
  model = collections.Counter()
  for function_graph in run_metadata.function_graphs:
    for graph in function_graph.partition_graphs:
      for node in graph.node:
        device = in_process.device_name(node.device)
        nodes[device] += 1
        model[device] += bool(MODEL_OP.search(node.op))
  return {device: (nodes[device], model[device]) for device in sorted(nodes)}


def placement_lines(rounds: Rounds, devices) -> bool:
  """Prints the nodes and model ops each device ran in the in-process round, then per
  device of `devices` whether it ran model ops; returns whether each of them did."""
  counts = op_counts(rounds.run_metadata)
  for device, (nodes, model_ops) in counts.items():
    print(f'ops: device={device} nodes={nodes} model_ops={model_ops}', flush=True)
  ok = True
  for device in devices:
    model_ops = sum(m for d, (_, m) in counts.items() if d == in_process.device_name(device))
    if model_ops:
      print(f'placement: {device} ran {model_ops} model ops', flush=True)
    else:
      ok = False
      print(f'placement: FAIL {device} ran no model op (run metadata)', flush=True)
  return ok


def weights_lines(rounds: Rounds, tolerance: float) -> bool:
  """Prints the largest absolute difference of the two rounds' weights; returns whether it
  is within `tolerance`."""
  leaves = list(zip(tf.nest.flatten(rounds.in_process_weights),
                    tf.nest.flatten(rounds.worker_weights)))
  diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(e)), initial=0.0)) for a, e in leaves)
  passed = diff <= tolerance
  print(
      f'weights: max_abs_diff={diff:.3g} in_process vs tff_worker tolerance={tolerance:g}'
      f' {"PASS" if passed else "FAIL"}',
      flush=True,
  )
  return passed
