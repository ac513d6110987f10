"""How every program of `launch` ends: one line on stderr and a documented exit status.

Each program's `__main__` calls `run_program('<program>', main)`. Whatever stops it, the user
sees one line `<program>: error: <message>` (never a traceback; `--verbose` adds it) and the
program exits with

  0    done;
  1    an unexpected failure, a bug (the line names the exception; --verbose shows where);
  2    bad input: a flag (unknown, malformed, missing, out of range), settings or data
       (missing, corrupt) that the program refuses, an unreachable remote worker;
  3    training diverged (`errors.DivergedError`; the last good checkpoint is kept);
  4    a worker was lost mid-run (`errors.WorkerLostError`: a TFF worker, a sweep's
       warm slot that died twice, its Ray cluster; re-run to resume);
  5    the machine refused: a full disk, a folder that cannot be written, a file where a
       folder belongs (`errors.RunEnvironmentError`, and the `OSError`s, TensorFlow
       and gRPC errors that carry such a cause); re-run once it is fixed;
  130  interrupted by Ctrl-C (SIGINT), SIGTERM or SIGHUP (training says after which round
       and resumes when re-run).

A stop signal raises `Interrupted` (a `KeyboardInterrupt`; `launch.cli.stops` says where
and when), so cleanup code (`finally`, context managers) runs and no TFF worker outlives
the program; TFF's default context is
made a managed worker (`install_managed_tff_context`), since importing `tff_zmg` leaves
TFF's own in place. Besides, each program gets a temporary directory of its own for
TensorFlow's autograph files and TFF's worker logs (`TMPDIR` and `tempfile.tempdir`),
removed when it ends; the ones of programs killed with SIGKILL are removed by the next
program that starts.

TensorFlow's C++ start-up lines stay hidden: importing this module imports `launch` first,
which sets `TF_CPP_MIN_LOG_LEVEL` before anything imports TensorFlow.
"""

import contextlib
import functools
import os
import re
import shutil
import sys
import tempfile
import traceback
from typing import Callable, Optional

from absl import app
from absl import flags

from launch.cli import exit_status
from launch.cli import stops
from launch.run import errors
import tasks
from tff_zmg.runtime import cpp_worker
from tff_zmg.runtime import leftovers

VERBOSE = flags.DEFINE_bool(
    'verbose', False, 'On failure, print the traceback before the one-line error.'
)

_TMP_PREFIX = 'tff_zmg-tmp-'


def _one_line(text: str) -> str:
  lines = errors.message_lines(text)
  # TensorFlow appends op and node lines ("[[{{node SaveV2}}]]"); the cause is first.
  lines = [l for l in lines if not l.startswith(('[[', '{{'))] or lines
  return re.sub(r'\s+', ' ', '; '.join(lines[:3]))


def classify(error: BaseException) -> tuple[int, str]:
  """(exit status, one-line message) for an exception that ended a program."""
  if isinstance(error, KeyboardInterrupt):
    message = str(error) if isinstance(error, errors.Interrupted) and str(error) else ''
    return exit_status.INTERRUPTED, message or 'interrupted; re-run the same command to resume'
  if isinstance(error, flags.Error):
    return exit_status.BAD_INPUT, _one_line(error)
  if isinstance(error, errors.DivergedError):
    return exit_status.DIVERGED, _one_line(error)
  if isinstance(error, errors.WorkerLostError):
    return exit_status.WORKER_LOST, _one_line(error)
  if isinstance(error, errors.RunEnvironmentError):
    return exit_status.ENVIRONMENT, _one_line(error)
  if isinstance(error, (tasks.MissingDataError, tasks.CorruptDataError)):
    return exit_status.BAD_INPUT, _one_line(error)
  if type(error).__name__ == 'DataLossError':  # tf.errors: a damaged data file, read late.
    return exit_status.BAD_INPUT, (
        f'a data file is damaged ({_one_line(error)}); delete it and fetch it again'
    )
  cause = errors.environment_cause(error)
  if cause is not None:
    return exit_status.ENVIRONMENT, (
        f'the machine refused: {cause}. Free some space or fix the permissions, then re-run'
        ' the same command'
    )
  if isinstance(error, (errors.ExperimentError, ValueError)):
    return exit_status.BAD_INPUT, _one_line(error)
  if isinstance(error, FileNotFoundError):
    return exit_status.BAD_INPUT, _one_line(error)
  if isinstance(error, cpp_worker.WorkerStartError):
    return exit_status.ENVIRONMENT, _one_line(error)
  if isinstance(error, errors.RunFailed):
    return error.exit_code, _one_line(error)
  if isinstance(error, OSError):
    return exit_status.ENVIRONMENT, _one_line(error)
  return exit_status.UNEXPECTED, (
      f'unexpected {type(error).__name__}: {_one_line(error)} (a bug: --verbose shows the'
      ' traceback)'
  )


@contextlib.contextmanager
def private_tempdir():
  """This process's own temporary directory (TMPDIR, `tempfile.tempdir`), removed at the end.

  TensorFlow's autograph writes a file per converted function and TFF's worker a log;
  a program killed with SIGKILL leaves them, so its directory (named by pid and start
  time) is removed by the next program that starts. The workers this process started are
  stopped before their logs go.
  """
  parent = tempfile.gettempdir()
  leftovers.remove_if_owner_gone(
      parent, _TMP_PREFIX, functools.partial(shutil.rmtree, ignore_errors=True))
  owner = leftovers.owner_tag()
  if owner is None:  # Not Linux: no way to tell a dead owner; the system's temp dir.
    yield parent
    return
  path = os.path.join(parent, _TMP_PREFIX + owner)
  os.makedirs(path, exist_ok=True)
  saved = tempfile.tempdir, os.environ.get('TMPDIR')
  tempfile.tempdir = path
  os.environ['TMPDIR'] = path  # The TFF worker and other children.
  try:
    yield path
  finally:
    cpp_worker.stop_all_workers(final=True)
    tempfile.tempdir = saved[0]
    if saved[1] is None:
      os.environ.pop('TMPDIR', None)
    else:
      os.environ['TMPDIR'] = saved[1]
    shutil.rmtree(path, ignore_errors=True)


def keep_after_exit(path: str) -> str:
  """Moves a file out of this program's temporary folder (`private_tempdir`), which goes
  when it ends, into the folder that holds it; returns where it is now (`path` itself
  when it is elsewhere)."""
  private = os.environ.get('TMPDIR', '')
  if not os.path.basename(private).startswith(_TMP_PREFIX):
    return path
  if os.path.dirname(os.path.abspath(path)) != os.path.abspath(private):
    return path
  kept = os.path.join(os.path.dirname(private), os.path.basename(path))
  with contextlib.suppress(OSError):
    shutil.move(path, kept)
    return kept
  return path


def report(program: str, error: BaseException, stream=None) -> tuple[int, str]:
  """Prints the one line (after the traceback with --verbose); returns the exit status and
  that line."""
  stream = stream or sys.stderr
  code, message = classify(error)
  verbose = flags.FLAGS.is_parsed() and VERBOSE.value
  if verbose:
    traceback.print_exception(error, file=stream)
  line = f'{program}: error: {message}'
  print(line, file=stream, flush=True)
  return code, line


def guarded_main(program: str, main: Callable[[list], Optional[int]], argv: list) -> int:
  """Runs `main(argv)`; any exception becomes one line and its exit status."""
  try:
    if len(argv) > 1:
      raise ValueError(f'unexpected arguments {argv[1:]}')
    return main(argv) or exit_status.OK
  except SystemExit:
    raise
  except BaseException as e:  # pylint: disable=broad-except
    return report(program, e)[0]


def one_line_errors(program: str):
  """Decorates a program's `main(argv)`: exceptions become one line and an exit status.

  Programs call their decorated `main` through `run_program`; tests call it directly.
  """

  def decorate(main):
    @functools.wraps(main)
    def guarded(argv):
      return guarded_main(program, main, argv)

    return guarded

  return decorate


_HELP_FLAGS = frozenset({'help', 'helpshort', 'helpfull', 'helpxml', '?'})


def _asks_for_help(argv: list) -> bool:
  args = argv[1:argv.index('--')] if '--' in argv else argv[1:]
  return any(a.startswith('-') and a.lstrip('-').split('=')[0] in _HELP_FLAGS for a in args)


def _parse_flags(program: str, argv: list) -> list:
  """absl's parse with this module's statuses: a flag error is one line and status 2, the
  help (absl exits 1 after it) status 0."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    print(f'{program}: error: {_one_line(e)} (--helpfull lists the flags)', file=sys.stderr,
          flush=True)
    sys.exit(exit_status.BAD_INPUT)
  except SystemExit as e:
    if e.code == 1 and _asks_for_help(argv):
      sys.exit(exit_status.OK)
    raise


def install_managed_tff_context() -> None:
  """Makes TFF's default context a managed local worker, started by its first computation.

  A computation a program runs outside the context it chose (`launch.run.experiment` picks one
  per run) then runs on a worker that is stopped when the program ends, not on TFF's own,
  which can outlive it; a program that runs none starts no worker.
  """
  cpp_worker.set_default_execution_context(start=False)


def run_program(
    program: str,
    main: Callable[[list], Optional[int]],
    own_tempdir: bool = True,
    tff_context: bool = True,
) -> None:
  """`absl.app.run` for `main`, with this module's flag errors, signals and exit statuses.

  `own_tempdir`: run in `private_tempdir()` (False for a program whose temporary files,
  such as a worker's log it names on failure, must outlive it).
  `tff_context`: install the managed TFF context (`install_managed_tff_context`) first,
  so that TFF's own never serves, nor, at exit, prints a traceback from its `__del__` (as
  TFF 0.87 does), even after a flag error (False for a program that runs no TFF
  computation itself).
  """
  stops.install()
  if tff_context:
    install_managed_tff_context()

  def run(argv):
    with private_tempdir() if own_tempdir else contextlib.nullcontext():
      code = guarded_main(program, main, argv)
    sys.exit(code)

  app.run(run, flags_parser=lambda argv: _parse_flags(program, argv))
