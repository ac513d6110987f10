"""`gpu_diagnosis`: why TensorFlow sees no GPU, in one line naming the cause and its fix.

Nothing is stood in for: the checks load real libraries with the system's loader. This
machine has TensorFlow's CUDA build and no NVIDIA driver, so the whole diagnosis says
"no NVIDIA driver"; the library check is asked directly, with names that do not exist.
"""

import _ctypes
import ctypes
import shutil

import pytest
import tensorflow as tf

from tff_zmg.runtime import gpu_diagnosis

_ABSENT = 'libtff_zmg_absent.so.1'


def _driver_loads() -> bool:
  try:
    ctypes.CDLL('libcuda.so.1')
  except OSError:
    return False
  return True


def test_the_library_check_names_the_first_library_that_does_not_load():
  cause = gpu_diagnosis.library_cause(['libc.so.6', _ABSENT, 'libtff_zmg_absent_too.so.2'])
  assert cause.startswith(f'the CUDA library {_ABSENT} cannot be loaded (')
  assert 'libtff_zmg_absent_too' not in cause
  assert cause.endswith(': bash scripts/bootstrap.sh --gpu')
  assert '\n' not in cause


def test_the_library_check_passes_when_every_library_loads():
  assert gpu_diagnosis.library_cause(['libc.so.6', 'libm.so.6']) is None


def test_the_library_check_looks_where_the_cuda_wheels_put_them_first(tmp_path):
  # A real shared object (Python's own _ctypes) under a name the system loader cannot find.
  source = getattr(_ctypes, '__file__', None)
  if source is None:
    pytest.skip('this Python has _ctypes built in: no shared object to copy')
  shutil.copy(source, tmp_path / _ABSENT)
  assert gpu_diagnosis.library_cause([_ABSENT], dirs=[str(tmp_path)]) is None
  assert _ABSENT in gpu_diagnosis.library_cause([_ABSENT], dirs=[])


def test_cuda_visible_devices_is_named_when_set():
  cause = gpu_diagnosis.visible_devices_cause({'CUDA_VISIBLE_DEVICES': ''})
  assert cause.startswith("CUDA_VISIBLE_DEVICES='' leaves this process no GPU")
  assert gpu_diagnosis.visible_devices_cause({}) is None


def test_a_cuda_build_is_no_cause():
  if not tf.sysconfig.get_build_info().get('is_cuda_build'):
    pytest.skip('this TensorFlow is a CPU-only build')
  assert gpu_diagnosis.build_cause() is None


def test_on_this_machine_the_cause_is_the_missing_driver():
  if tf.config.list_physical_devices('GPU') or _driver_loads():
    pytest.skip('this machine has an NVIDIA driver')
  cause = gpu_diagnosis.no_gpu_cause()
  assert cause.startswith('no NVIDIA driver: libcuda.so.1 cannot be loaded'), cause
  assert cause.endswith('install the NVIDIA driver (450.80.02 or newer for CUDA 11)'), cause
  assert '\n' not in cause
