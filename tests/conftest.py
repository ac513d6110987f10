"""Shared fixtures: small synthetic tasks, a managed TFF context, and the leak check."""

import collections
import functools
import json
import os
import shutil
import tempfile

# TF's C++ start-up lines off the test logs and the programs' stderr, as `launch` does.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

import pytest

import tasks
from tff_zmg.runtime import cpp_worker
import small_runs
import worker_processes

# Small federated datasets in TFF's real SQLite format: enough clients for sampling and
# label skew, few examples so a round takes seconds on two CPU cores.
SMALL_SYNTHETIC = {
    'emnist': dict(num_train_clients=8, num_test_clients=3, mean_examples_per_client=20),
    'cifar100': dict(num_train_clients=8, num_test_clients=3, mean_examples_per_client=20),
    'shakespeare': dict(num_train_clients=8, num_test_clients=3, mean_examples_per_client=6),
}


@pytest.fixture(scope='session')
def synthetic_cache_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp('tff_cache'))


@pytest.fixture(scope='session')
def small_task(synthetic_cache_dir):
  """`small_task(name, **overrides)`: a task on small synthetic data (cached per args)."""

  @functools.lru_cache(maxsize=None)
  def make(name, **kwargs):
    settings = dict(SMALL_SYNTHETIC[name])
    settings.update(kwargs.pop('synthetic_settings', {}))
    return tasks.get(
        name,
        data_source='synthetic',
        cache_dir=synthetic_cache_dir,
        synthetic_settings=settings,
        **kwargs,
    )

  return make


@pytest.fixture
def run_program(capsys):
  """`run_program(module, *flags) -> (rc, out, err)`: a `launch` program's `main` in this
  process (no TensorFlow start-up), its stdout and stderr captured."""
  from absl import flags  # pylint: disable=g-import-not-at-top

  def run(module, *args):
    flags.FLAGS.unparse_flags()
    flags.FLAGS([module.__name__, *args])
    rc = module.main([module.__name__])
    out, err = capsys.readouterr()
    return rc, out, err

  yield run
  flags.FLAGS.unparse_flags()


@pytest.fixture
def run_main(run_program, synthetic_cache_dir, tmp_path):
  """`run_main(*flags, root=None) -> (rc, out, err)`: `launch.train` in this process
  (`run_program`) on the small synthetic runs' data (`small_runs.FLAGS`), its outputs
  under `root` (default: the test's tmp_path)."""
  from launch import train  # pylint: disable=g-import-not-at-top
  import small_runs  # pylint: disable=g-import-not-at-top

  def run(*args, root=None):
    return run_program(train, f'--cache_dir={synthetic_cache_dir}',
                       f'--root_output_dir={root or tmp_path}', *small_runs.FLAGS, *args)

  return run


@pytest.fixture(scope='session')
def tff_context():
  """One managed local TFF worker for the whole session; stopped at the end."""
  with cpp_worker.execution_context() as worker:
    yield worker


# Folders this session made, removed when it ends.
_REMOVE_AT_EXIT = []


def pytest_configure(config):
  """A managed TFF default context in every pytest process, xdist's controller included.

  Importing `tff_zmg` leaves TFF's own default context in place, whose worker can outlive
  the tests and whose clean-up prints a traceback at exit; as in the programs
  (`launch.cli.failures.run_program`), a computation a test runs outside an explicit context
  gets a managed worker, started when first needed.
  """
  del config
  cpp_worker.set_default_execution_context(start=False)
  # One folder of compiled round forms (tff_zmg/runtime/forms.py) for this session's
  # processes, the programs the tests start included (xdist's workers inherit it from the
  # controller), never the user's: each run of the suite starts cold, as on a new machine.
  if 'TFF_ZMG_FORM_CACHE' not in os.environ:
    os.environ['TFF_ZMG_FORM_CACHE'] = tempfile.mkdtemp(prefix='tff_zmg-forms-')
    _REMOVE_AT_EXIT.append(os.environ['TFF_ZMG_FORM_CACHE'])
  # One folder for the runs the session's processes share (`small_runs.made_once_per_session`:
  # each row of the guarantees' matrix, trained once and read by tests in several files).
  if small_runs.SHARED_ENV not in os.environ:
    os.environ[small_runs.SHARED_ENV] = tempfile.mkdtemp(prefix='tff_zmg-tests-')
    _REMOVE_AT_EXIT.append(os.environ[small_runs.SHARED_ENV])


def pytest_unconfigure(config):
  del config
  for path in _REMOVE_AT_EXIT:
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope='session', autouse=True)
def no_worker_outlives_the_session():
  """Fails the session if a TFF worker outlives it."""
  yield
  cpp_worker.stop_all_workers()
  leaked = worker_processes.worker_pids()
  assert not leaked, f'TFF worker processes outlived the tests: {leaked}'
  assert not cpp_worker.live_worker_pids()


# Seconds each test file took in a full run (tests/data/file_seconds.json, written by
# `pytest --durations=0 --write_file_seconds`: each test's setup, call and teardown, summed
# per file). xdist hands whole files (--dist loadfile) to its two workers in order of their
# number of tests; handing out the longest first instead keeps one worker from starting a
# long file as the other ends. Only the order matters: a file not listed goes last.
_FILE_SECONDS_PATH = os.path.join(os.path.dirname(__file__), 'data', 'file_seconds.json')
with open(_FILE_SECONDS_PATH) as _f:
  _FILE_SECONDS = json.load(_f)
_MEASURED_SECONDS = collections.Counter()


def pytest_addoption(parser):
  parser.addoption('--write_file_seconds', action='store_true',
                   help=f'write each test file\'s seconds in this run to {_FILE_SECONDS_PATH}'
                        ' (run the whole suite)')


def pytest_runtest_logreport(report):
  # In xdist's controller too: every worker's reports reach it.
  _MEASURED_SECONDS[os.path.basename(report.nodeid.split('::', 1)[0])] += report.duration


def pytest_sessionfinish(session):
  if (session.config.getoption('write_file_seconds')
      and not hasattr(session.config, 'workerinput')):  # The controller, not a worker.
    with open(_FILE_SECONDS_PATH, 'w') as f:
      json.dump({name: round(seconds) for name, seconds in _MEASURED_SECONDS.most_common()},
                f, indent=0)
      f.write('\n')


def pytest_xdist_make_scheduler(config, log):
  if config.getvalue('dist') != 'loadfile':
    return None
  from xdist.scheduler import LoadFileScheduling  # pylint: disable=g-import-not-at-top

  class LongestFileFirst(LoadFileScheduling):

    def _assign_work_unit(self, node):
      for scope in sorted(self.workqueue, key=_seconds, reverse=True):
        self.workqueue.move_to_end(scope)
      super()._assign_work_unit(node)

  return LongestFileFirst(config, log)


def _seconds(scope: str) -> float:
  return _FILE_SECONDS.get(os.path.basename(scope), 0.0)
