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

Exit status: as every program's (docs/operations.md, "Exit statuses"); here 1 also when
the two rounds' weights differ by more than `--tolerance` or a device of `--devices` ran no
model op.
"""

import contextlib
import tempfile

from absl import flags
from absl import logging

import tasks
from launch.benchmarking import device_check
from launch.cli import failures
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


def _rounds(devices) -> device_check.Rounds:
  """FedAvg's round in TFF's worker and in this process on `devices`, its synthetic data in
  --cache_dir or a temporary folder."""
  with contextlib.ExitStack() as stack:
    cache_dir = _CACHE_DIR.value or stack.enter_context(
        tempfile.TemporaryDirectory(prefix='check_devices-')
    )
    # On GPUs the model may use GPU-only fused kernels (Shakespeare's GRU as cuDNN's),
    # which TFF's CPU-only worker cannot run: its reference round traces the plain model.
    on_gpus = any('GPU' in d.upper() for d in devices)
    task, process = device_check.fedavg(_TASK.value, _CLIENTS.value, cache_dir, on_gpus)
    reference = (
        device_check.fedavg(_TASK.value, _CLIENTS.value, cache_dir, False)[1]
        if on_gpus else process
    )
    data = device_check.client_datasets(task, _CLIENTS.value)
    return device_check.both_rounds(process, reference, data, devices)


@failures.one_line_errors('check_devices')
def main(argv) -> int:
  del argv
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)
  try:  # Before any output: a round placed there would only fail.
    in_process.check_devices(_DEVICES.value or [])
  except ValueError as e:
    raise ValueError(f'--devices: {e}') from None
  gpus = device_check.tensorflow_lines()
  devices = _DEVICES.value or gpus or [tf_computation.HOST_DEVICE]
  rounds = _rounds(devices)
  print(device_check.round_line(_TASK.value, rounds, devices), flush=True)
  if not _DEVICES.value and not gpus:
    print('no GPU: the in-process round ran on the CPU', flush=True)
  placed = device_check.placement_lines(rounds, devices)
  agree = device_check.weights_lines(rounds, _TOLERANCE.value)
  return 0 if placed and agree else 1


if __name__ == '__main__':
  failures.run_program('check_devices', main)
