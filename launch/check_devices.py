r"""Which devices TensorFlow, TFF's worker and the in-process runtime see and use.

  python -m launch.check_devices                 # every GPU, else the CPU
  python -m launch.check_devices --devices=/device:GPU:0,/device:GPU:1

One labelled line each:

- `tf_build`: TensorFlow's version, whether it is a CUDA build, its CUDA and cuDNN versions;
- `tf_gpus`: the GPUs TensorFlow sees (physical and logical), `tf_logical_devices`: all;
- `no_gpu_cause`, when it sees none: why, and the command that fixes it
  (`tff_zmg.runtime.gpu_diagnosis`: a CPU-only TensorFlow, no NVIDIA driver, the first CUDA
  library that does not load, CUDA_VISIBLE_DEVICES, the driver's refusal);
- `tff_worker`: the device lines TFF's C++ `worker_binary` logs when it creates its first
  session ('Found devices: ...', 'Found: N GPUs ...'); TFF 0.87's pip worker is built without
  CUDA, so it lists the CPU only;
- `round`: one FedAvg round of a small synthetic task (DATASET_ITERATOR loop) run in this
  process (`tff_zmg.runtime.in_process`) on `--devices`, and `ops` lines: per device, the
  nodes TensorFlow placed there in that round's functions and how many of them are model
  ops (MatMul, Conv2D, BiasAdd, ...), read from TensorFlow's run metadata (the partition
  graphs of the functions the round ran). A device is said to have run model ops only when
  that count is above zero;
- the same round in TFF's C++ worker, and `weights`: the largest absolute difference of the
  two rounds' model weights, PASS within `--tolerance`, else FAIL.

Exit status: 0 when the weights agree and every device of `--devices` ran model ops, 1 when
they do not (or an unexpected failure); as every program (launch/cli/failures.py): 2 bad flags, 5
the machine refused, 130 interrupted, each a one-line `check_devices: error: ...` on stderr
(--verbose adds the traceback).
"""

import collections
import contextlib
import os
import re
import tempfile
import time

from absl import flags
from absl import logging
import numpy as np
import psutil
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow.python.eager import context as eager_context

import tasks
from launch.cli import failures
from tff_zmg.algorithms import registry
from tff_zmg.runtime import cpp_worker
from tff_zmg.runtime import gpu_diagnosis
from tff_zmg.runtime import in_process
from tff_zmg.runtime import tf_computation

_DEVICES = flags.DEFINE_list(
    'devices', None,
    'Devices the in-process round runs its clients on, e.g. /device:GPU:0,/device:GPU:1'
    ' (default: every GPU TensorFlow sees, else the CPU).',
)
_TASK = flags.DEFINE_enum('task', 'emnist', list(tasks.TFF_TASK_NAMES), 'The task.')
_CLIENTS = flags.DEFINE_integer('clients', 4, 'Clients in the round.', lower_bound=1)
_CACHE_DIR = flags.DEFINE_string(
    'cache_dir', None, 'Where the synthetic data is written (default: a temporary directory).'
)
_TOLERANCE = flags.DEFINE_float(
    'tolerance', 1e-5, 'Largest absolute weight difference between the two rounds that passes.',
    lower_bound=0,
)

# Model arithmetic (oneDNN renames MatMul to _MklMatMul, _MklNativeFusedMatMul, ...;
# `--task=shakespeare` on a GPU runs the GRU as CudnnRNN).
MODEL_OP = re.compile(r'MatMul|Conv2D|BiasAdd|Softmax|MaxPool|Relu|_FusedConv|CudnnRNN')
# The worker's start-up device lines (tensorflow_federated/.../session_provider.cc).
_WORKER_DEVICE_LINE = re.compile(
    r'Found devices|Skipping device|Found:|\bGPUs\b|\bTPUS\b|device', re.I
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


def client_datasets(task, count: int) -> list[tf.data.Dataset]:
  """The first `count` training clients (sorted ids), preprocessed as for training."""
  train = task.datasets.train_data
  ids = sorted(train.client_ids)[:count]
  return [task.datasets.train_preprocess_fn(train.create_tf_dataset_for_client(i)) for i in ids]


@failures.one_line_errors('check_devices')
def main(argv) -> int:
  del argv
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)
  try:  # Before any output: a round placed there would only fail.
    in_process.check_devices(_DEVICES.value or [])
  except ValueError as e:
    raise ValueError(f'--devices: {e}') from None
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

  devices = _DEVICES.value or gpus or [tf_computation.HOST_DEVICE]

  with contextlib.ExitStack() as stack:
    cache_dir = _CACHE_DIR.value or stack.enter_context(
        tempfile.TemporaryDirectory(prefix='check_devices-')
    )
    def fedavg(gpu_kernels):
      task = tasks.get(
          _TASK.value,
          data_source='synthetic',
          synthetic_settings=dict(
              num_train_clients=_CLIENTS.value, num_test_clients=2, mean_examples_per_client=20
          ),
          cache_dir=cache_dir,
          gpu_kernels=gpu_kernels,
      )
      process = registry.build(
          'fedavg', task.model_fn,
          loop_implementation=tff.learning.LoopImplementation.DATASET_ITERATOR,
      )
      return task, process

    # On GPUs the model may use GPU-only fused kernels (Shakespeare's GRU as cuDNN's),
    # which TFF's CPU-only worker cannot run: its reference round traces the plain model.
    on_gpus = any('GPU' in d.upper() for d in devices)
    task, process = fedavg(on_gpus)
    reference = fedavg(False)[1] if on_gpus else process
    data = client_datasets(task, _CLIENTS.value)

    # TFF's C++ worker: its device lines, the initial state and the reference round.
    with _worker_logging_devices() as worker:
      context = cpp_worker.create_sync_context([worker])
      with tff.framework.get_context_stack().install(context):
        initial = reference.initialize()
        start = time.perf_counter()
        expected = reference.next(initial, data).state
        worker_s = time.perf_counter() - start
      lines = _worker_device_lines(worker.log_path)
      print(
          f'tff_worker: binary={cpp_worker.worker_binary_path()}'
          + ''.join(f'\ntff_worker_log: {line}' for line in lines)
          + ('' if lines else ' no device lines found in its log'),
          flush=True,
      )

    # The same round in this process, with TensorFlow's run metadata on.
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
  print(
      f'round: task={_TASK.value} clients={len(data)} fedavg DATASET_ITERATOR'
      f' in_process_devices={",".join(devices)} in_process_s={in_process_s:.2f}'
      f' tff_worker_s={worker_s:.2f}',
      flush=True,
  )
  if not _DEVICES.value and not gpus:
    print('no GPU: the in-process round ran on the CPU', flush=True)
  counts = op_counts(metadata)
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

  leaves = list(zip(tf.nest.flatten(actual_weights), tf.nest.flatten(expected_weights)))
  diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(e)), initial=0.0)) for a, e in leaves)
  passed = diff <= _TOLERANCE.value
  ok = ok and passed
  print(
      f'weights: max_abs_diff={diff:.3g} in_process vs tff_worker tolerance={_TOLERANCE.value:g}'
      f' {"PASS" if passed else "FAIL"}',
      flush=True,
  )
  return 0 if ok else 1


if __name__ == '__main__':
  failures.run_program('check_devices', main)
