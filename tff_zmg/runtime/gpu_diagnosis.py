"""Why TensorFlow sees no GPU, in one line that names the cause and the command that fixes it.

    cause = gpu_diagnosis.no_gpu_cause()
    # 'no NVIDIA driver: libcuda.so.1 cannot be loaded, no /dev/nvidia* device, no nvidia-smi
    #  on PATH; install the NVIDIA driver (450.80.02 or newer for CUDA 11)'

The causes, checked in this order (an earlier one hides the later ones):

1. a CPU-only TensorFlow build (`tf.test.is_built_with_cuda()` false);
2. no NVIDIA driver: its library, libcuda.so.1, does not load;
3. a CUDA library TensorFlow loads at GPU start-up does not load (`CUDA_LIBRARIES`, tried as
   TensorFlow tries them: first where the CUDA wheels put them, then the loader's own path);
4. `CUDA_VISIBLE_DEVICES` set;
5. the driver's own refusal (`cuInit`'s error, e.g. CUDA_ERROR_NO_DEVICE).

Each check is a function of its own, so a caller (or a test) can ask one directly, e.g.
`library_cause(['libcudart.so.11.0', 'libmissing.so.1'])`. The checks load the libraries
TensorFlow itself would load; callers ask once TensorFlow has seen no GPU.
"""

import ctypes
import glob
import os
import shutil
from typing import Mapping, Optional, Sequence

import tensorflow as tf

# What TensorFlow 2.14.1 dlopens before it uses a GPU (tsl's DsoLoader::TryDlopenCUDALibraries
# in libtensorflow_framework.so.2: cudart 11.0, cublas 11, cublasLt 11, cufft 10, cusolver 11,
# cusparse 11, cudnn 8; it has no cuRAND loader); the names are the sonames of the wheels in
# requirements/gpu.txt. A missing one makes TensorFlow skip every GPU.
CUDA_LIBRARIES = (
    'libcudart.so.11.0', 'libcublas.so.11', 'libcublasLt.so.11', 'libcufft.so.10',
    'libcusolver.so.11', 'libcusparse.so.11', 'libcudnn.so.8',
)
DRIVER_LIBRARY = 'libcuda.so.1'
INSTALL_CUDA_WHEELS = 'bash scripts/bootstrap.sh --gpu'
# The oldest driver CUDA 11.x runs on (CUDA's minor-version compatibility).
_MIN_DRIVER = '450.80.02'
_CUDA_SUCCESS = 0


def _wheel_library_dirs() -> list[str]:
  """site-packages/nvidia/*/lib: TensorFlow's run paths lead there (requirements/gpu.txt)."""
  site_packages = os.path.dirname(os.path.dirname(os.path.abspath(tf.__file__)))
  return sorted(glob.glob(os.path.join(site_packages, 'nvidia', '*', 'lib')))


def _load(name: str, dirs: Sequence[str] = ()) -> ctypes.CDLL:
  """Loads `name` from the first of `dirs` holding it, else from the loader's own path."""
  for directory in dirs:
    path = os.path.join(directory, name)
    if os.path.exists(path):
      return ctypes.CDLL(path)
  return ctypes.CDLL(name)


def build_cause() -> Optional[str]:
  if tf.test.is_built_with_cuda():
    return None
  return (
      f'TensorFlow {tf.__version__} is a CPU-only build; install the pinned CUDA build:'
      ' .venv/bin/python -m pip install --force-reinstall --no-deps -c'
      ' requirements/constraints.txt tensorflow'
  )


def driver_cause() -> Optional[str]:
  try:
    _load(DRIVER_LIBRARY)
  except OSError:
    pass
  else:
    return None
  devices = sorted(glob.glob('/dev/nvidia[0-9]*'))
  if devices:  # A GPU the kernel driver serves, without its user-space library here.
    return (
        f'the NVIDIA driver\'s {DRIVER_LIBRARY} cannot be loaded though {devices[0]} exists:'
        ' install the driver\'s user-space libraries matching the kernel module (in a'
        ' container, start it with the GPU runtime: docker run --gpus all ...)'
    )
  smi = 'nvidia-smi is on PATH' if shutil.which('nvidia-smi') else 'no nvidia-smi on PATH'
  return (
      f'no NVIDIA driver: {DRIVER_LIBRARY} cannot be loaded, no /dev/nvidia* device, {smi};'
      f' install the NVIDIA driver ({_MIN_DRIVER} or newer for CUDA 11)'
  )


def library_cause(
    libraries: Sequence[str] = CUDA_LIBRARIES, dirs: Optional[Sequence[str]] = None
) -> Optional[str]:
  """The first of `libraries` that does not load, with the loader's reason and the fix.

  Each is tried in `dirs` first (default: where the CUDA wheels put their libraries), then
  on the loader's own path (LD_LIBRARY_PATH, ld.so.cache: a system CUDA).
  """
  dirs = _wheel_library_dirs() if dirs is None else dirs
  for name in libraries:
    try:
      _load(name, dirs)
    except OSError as e:
      reason = ' '.join(str(e).split())  # The loader's message, on one line.
      return (
          f'the CUDA library {name} cannot be loaded ({reason}); install the CUDA'
          f' wheels TensorFlow {tf.__version__} was built against: {INSTALL_CUDA_WHEELS}'
      )
  return None


def visible_devices_cause(environ: Mapping[str, str] = os.environ) -> Optional[str]:
  value = environ.get('CUDA_VISIBLE_DEVICES')
  if value is None:
    return None
  return (
      f'CUDA_VISIBLE_DEVICES={value!r} leaves this process no GPU; unset it, or name GPUs'
      ' that nvidia-smi -L lists'
  )


def driver_refusal_cause() -> Optional[str]:
  """The driver's own answer to `cuInit`, when it is not success."""
  try:
    cuda = _load(DRIVER_LIBRARY)
  except OSError:
    return None  # No driver at all: `driver_cause` says so.
  status = cuda.cuInit(0)
  if status == _CUDA_SUCCESS:
    return None
  name = ctypes.c_char_p()
  cuda.cuGetErrorName(status, ctypes.byref(name))
  return (
      'the NVIDIA driver refuses CUDA: cuInit returned'
      f' {name.value.decode() if name.value else status}; nvidia-smi shows the GPUs and'
      f' the driver version (CUDA 11 needs {_MIN_DRIVER} or newer)'
  )


def no_gpu_cause() -> str:
  """Why TensorFlow sees no GPU in this process: the first cause found, in one line."""
  for check in (build_cause, driver_cause, library_cause, visible_devices_cause,
                driver_refusal_cause):
    cause = check()
    if cause:
      return cause
  return (
      'the driver and the CUDA libraries load, yet TensorFlow found no GPU;'
      ' TF_CPP_MIN_LOG_LEVEL=0 shows its reason'
  )
