"""The installed set is the one `scripts/bootstrap.sh` promises (`requirements/`).

The GPU set (`--gpu`, `requirements/gpu.txt`) is checked with pip's resolver against this
venv (`pip install --dry-run`, which reads the wheels' metadata from the index, never the
2 GB of wheels) and the script's choices with a stand-in `.venv/bin/python` that only logs
what it is asked to do.
"""

import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

from google.protobuf.internal import api_implementation
import google.protobuf
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
import pytest

from tff_zmg.runtime import gpu_diagnosis

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_OVERRIDES = os.path.join(_REPO, 'requirements', 'overrides.txt')
_GPU = os.path.join(_REPO, 'requirements', 'gpu.txt')
_CONSTRAINTS = os.path.join(_REPO, 'requirements', 'constraints.txt')


def test_protobuf_is_the_override_and_runs_its_c_implementation():
  # Pure-Python protobuf (3.20 on Python 3.11) compiles TFF's computations several times
  # slower: the suite and every run's start would quietly take twice as long.
  with open(_OVERRIDES) as f:
    pinned, = [l.strip().split('==')[1] for l in f if l.startswith('protobuf==')]
  assert google.protobuf.__version__ == pinned
  assert api_implementation.Type() == 'upb'


# --- The GPU set: `bash scripts/bootstrap.sh --gpu` (requirements/gpu.txt) ---

# What pip prints when it cannot reach the index (urllib3's and pip's own words).
_OFFLINE = re.compile(
    r'NewConnectionError|Max retries exceeded|Temporary failure in name resolution'
    r'|Network is unreachable|ConnectTimeout|ProxyError|No route to host'
)


def _gpu_pins() -> dict[str, str]:
  pins = {}
  with open(_GPU) as f:
    for line in f:
      requirement = line.split('#', 1)[0].strip()
      if requirement:
        name, version = requirement.split('==')
        pins[canonicalize_name(name)] = version
  return pins


def test_gpu_pins_are_tensorflows_and_cuda_extra_without_tensorrt():
  extra = {}
  for text in importlib.metadata.requires('tensorflow'):
    requirement = Requirement(text)
    if requirement.marker and requirement.marker.evaluate({'extra': 'and-cuda'}) and not (
        requirement.marker.evaluate({'extra': ''})
    ):
      pinned, = requirement.specifier
      assert pinned.operator == '==', text
      extra[canonicalize_name(requirement.name)] = pinned.version
  assert extra.pop('tensorrt') == '8.5.3.1'  # Left out: no CPython 3.11 wheel (gpu.txt).
  assert _gpu_pins() == extra


# Where each library TensorFlow loads at GPU start-up comes from: the wheel of gpu.txt and its
# folder (the wheels' file lists: nvidia/<folder>/lib/<soname>).
_WHEEL_OF_LIBRARY = {
    'libcudart.so.11.0': ('nvidia-cuda-runtime-cu11', 'cuda_runtime'),
    'libcublas.so.11': ('nvidia-cublas-cu11', 'cublas'),
    'libcublasLt.so.11': ('nvidia-cublas-cu11', 'cublas'),
    'libcufft.so.10': ('nvidia-cufft-cu11', 'cufft'),
    'libcusolver.so.11': ('nvidia-cusolver-cu11', 'cusolver'),
    'libcusparse.so.11': ('nvidia-cusparse-cu11', 'cusparse'),
    'libcudnn.so.8': ('nvidia-cudnn-cu11', 'cudnn'),
}


def test_tensorflow_finds_the_wheels_libraries_without_ld_library_path():
  # TensorFlow's libraries carry run paths to site-packages/nvidia/<folder>/lib ($ORIGIN is
  # site-packages/tensorflow), so a dlopen of a library's soname finds the wheel's file.
  if shutil.which('readelf') is None:
    pytest.skip('readelf (binutils) is not installed')
  assert set(gpu_diagnosis.CUDA_LIBRARIES) == set(_WHEEL_OF_LIBRARY)
  tensorflow_dir = os.path.dirname(importlib.util.find_spec('tensorflow').origin)
  for binary in ('libtensorflow_framework.so.2', 'libtensorflow_cc.so.2'):
    dynamic = subprocess.run(['readelf', '-d', os.path.join(tensorflow_dir, binary)],
                             capture_output=True, text=True, check=True).stdout
    runpath = re.search(r'\(RUNPATH\)\s+Library runpath: \[(.*)\]', dynamic)[1].split(':')
    for library, (wheel, folder) in _WHEEL_OF_LIBRARY.items():
      assert wheel in _gpu_pins(), library
      assert f'$ORIGIN/../nvidia/{folder}/lib' in runpath, (binary, library, runpath)


@pytest.fixture(scope='module')
def gpu_dry_run(tmp_path_factory):
  """What pip would install for the GPU set into this venv, as bootstrap runs it."""
  report = tmp_path_factory.mktemp('gpu') / 'report.json'
  completed = subprocess.run(
      [sys.executable, '-m', 'pip', '--disable-pip-version-check', 'install', '--dry-run',
       '--retries=1', '--timeout=60', '--report', str(report), '-q',
       '-c', _CONSTRAINTS, '-r', _GPU],
      capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
  )
  if completed.returncode and _OFFLINE.search(completed.stderr):
    pytest.skip(f'the package index is unreachable: {_OFFLINE.search(completed.stderr)[0]}')
  assert completed.returncode == 0, completed.stderr[-3000:]
  with open(report) as f:
    return {canonicalize_name(i['metadata']['name']): i['metadata']['version']
            for i in json.load(f)['install']}


def test_pip_accepts_the_gpu_set_under_the_constraints(gpu_dry_run):
  # Every wheel resolves, for this Python and platform, at its pin (or is installed already).
  installed = {name: _installed_version(name) for name in _gpu_pins()}
  for name, version in _gpu_pins().items():
    assert gpu_dry_run.get(name, installed[name]) == version, (name, gpu_dry_run)


def test_the_gpu_set_installs_only_its_wheels(gpu_dry_run):
  # Nothing else is added, upgraded or downgraded (TensorFlow, protobuf, ... stay as they are).
  missing = {name: version for name, version in _gpu_pins().items()
             if _installed_version(name) != version}
  assert gpu_dry_run == missing


def _installed_version(name: str):
  try:
    return importlib.metadata.version(name)
  except importlib.metadata.PackageNotFoundError:
    return None


def _run_bootstrap(tmp_path, stamp: str, *args) -> tuple[subprocess.CompletedProcess, str]:
  """scripts/bootstrap.sh on a copy of the repository whose .venv/bin/python only logs."""
  for path in ('scripts/bootstrap.sh', 'scripts/expected_pip_conflicts.awk', 'setup.py',
               'requirements'):
    copy = shutil.copytree if os.path.isdir(os.path.join(_REPO, path)) else shutil.copy
    os.makedirs(tmp_path / os.path.dirname(path), exist_ok=True)
    copy(os.path.join(_REPO, path), tmp_path / path)
  log = tmp_path / 'python.log'
  python = tmp_path / '.venv' / 'bin' / 'python'
  python.parent.mkdir(parents=True)
  python.write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
  python.chmod(0o755)
  (tmp_path / '.venv' / '.tff_zmg-installed').write_text(stamp)
  completed = subprocess.run(
      ['bash', 'scripts/bootstrap.sh', *args], cwd=tmp_path, capture_output=True, text=True,
      timeout=60, stdin=subprocess.DEVNULL, env=dict(os.environ, PYTHON=sys.executable),
  )
  return completed, log.read_text() if log.exists() else ''


def _stamps(tmp_path) -> tuple[str, str]:
  """The stamps of a finished plain run and of a finished --gpu run."""
  completed, _ = _run_bootstrap(tmp_path / 'plain', '')
  assert completed.returncode == 0, completed.stderr
  completed, _ = _run_bootstrap(tmp_path / 'gpu', '', '--gpu')
  assert completed.returncode == 0, completed.stderr
  return tuple((tmp_path / d / '.venv' / '.tff_zmg-installed').read_text().strip()
               for d in ('plain', 'gpu'))


def test_bootstrap_gpu_installs_gpu_txt_and_plain_does_not(tmp_path):
  completed, plain = _run_bootstrap(tmp_path / 'plain', '')
  assert completed.returncode == 0, completed.stderr
  assert 'requirements/requirements.txt' in plain and 'gpu.txt' not in plain
  completed, gpu = _run_bootstrap(tmp_path / 'gpu', '', '--gpu')
  assert completed.returncode == 0, completed.stderr
  assert re.search(r'^-m pip .*install -c requirements/constraints.txt -r requirements/gpu.txt$',
                   gpu, re.M), gpu


def test_bootstrap_stamp_includes_the_gpu_set(tmp_path):
  plain_stamp, gpu_stamp = _stamps(tmp_path)
  assert plain_stamp != gpu_stamp
  # After a plain set-up `--gpu` installs; after `--gpu` both commands return at once.
  completed, log = _run_bootstrap(tmp_path / 'a', plain_stamp, '--gpu')
  assert completed.returncode == 0 and 'gpu.txt' in log, completed.stderr
  for args in ((), ('--gpu',)):
    completed, log = _run_bootstrap(tmp_path / f'b{len(args)}', gpu_stamp, *args)
    assert completed.returncode == 0 and log == '', (args, log, completed.stderr)
  completed, log = _run_bootstrap(tmp_path / 'c', plain_stamp)
  assert completed.returncode == 0 and log == ''


def test_bootstrap_refuses_an_unknown_argument(tmp_path):
  completed, log = _run_bootstrap(tmp_path, '', '--cuda')
  assert completed.returncode == 2 and log == ''
  assert completed.stderr.strip() == (
      "bootstrap: unknown argument '--cuda' (the only one is --gpu)"
  )
