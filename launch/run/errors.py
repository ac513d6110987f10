"""The errors that stop the package's programs, each meaning one exit status.

`launch.cli.failures` turns each into one line on stderr and its status: an `ExperimentError`
is bad input (2), unless it is one of its kinds below: `DivergedError` (3),
`WorkerLostError` (4), `RunEnvironmentError` (5); a `RunFailed` passes on the status of
the run that failed. They live here, apart from the code that raises them, so that every
module of `launch` can raise or tell them apart without importing training (or
TensorFlow): nothing here imports more than the standard library. `Interrupted` and
`environment_cause` are here for the same reason: a run stops with them, and the programs
end with them.
"""

import contextlib
import errno
import os
import re
from typing import Optional

# errno values that mean the machine, not the user's settings, refused an operation.
_ENVIRONMENT_ERRNOS = frozenset(
    {
        errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EPERM, errno.EROFS,
        errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.EIO, errno.EMFILE, errno.ENFILE,
        errno.ENOTEMPTY, errno.EXDEV,
    }
)
# The same causes as TensorFlow's and gRPC's messages spell them (strerror texts): those
# errors carry a status code, not the errno.
_ENVIRONMENT_TEXTS = tuple(
    os.strerror(e)
    for e in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EPERM,
              errno.EROFS, errno.ENOTDIR, errno.EISDIR)
)


class ExperimentError(Exception):
  """A run cannot start or continue; the message says why and what to do."""


class DivergedError(ExperimentError):
  """Training produced a non-finite loss or update."""


class WorkerLostError(ExperimentError):
  """A remote TFF worker stopped answering during a round; the last checkpoint is kept."""


class RunEnvironmentError(ExperimentError):
  """The machine, not the settings, stops the run: a full disk, a folder that cannot be
  written, a file where a folder belongs."""


class RunFailed(Exception):
  """A training run that a program started (`launch.sweeps.runner`) ended with an error other
  than divergence.

  `exit_code` is the status this program passes on (launch/cli/exit_status.py): the run's own
  when it is one of the documented ones, else 1 (`exit_status.UNEXPECTED`).
  """

  def __init__(self, message: str, exit_code: int = 1):
    super().__init__(message)
    self.exit_code = exit_code


class Interrupted(KeyboardInterrupt):
  """A stop signal (Ctrl-C, SIGTERM, SIGHUP); the message says what is kept, if known."""


def environment_cause(error: BaseException) -> Optional[str]:
  """The machine's refusal carried by `error` ('No space left on device: <path>'), else None.

  Looks at `OSError.errno` and, for TensorFlow and gRPC errors (which carry a status code,
  not the errno), at the strerror text in their message; follows `__cause__` chains.
  """
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.errno in _ENVIRONMENT_ERRNOS:
      where = error.filename or ''
      return f'{error.strerror or os.strerror(error.errno)}{": " + str(where) if where else ""}'
    text = error_text(error)
    for cause in _ENVIRONMENT_TEXTS:
      if cause in text:
        return _cause_line(text, cause)
    error = error.__cause__ or error.__context__
  return None


def _cause_line(text: str, cause: str) -> str:
  """The line of an error's message that names `cause`, cut after it: TensorFlow's and
  TFF's messages wrap it in node names, traceback lines and hints ('/x/y.tmp; No space
  left on device' of dozens of lines)."""
  line = next(l for l in message_lines(text) if cause in l)
  return line[:line.index(cause) + len(cause)]


def message_lines(text: str) -> list[str]:
  # TensorFlow wraps an op's error in "{{function_node ...}} ... [Op:SaveV2]": only noise.
  text = re.sub(r'\{\{function_node [^}]*\}\}\s*|\s*\[Op:\w+\]( name: \S*)?', '', str(text))
  return [l.strip() for l in text.strip().splitlines() if l.strip()]


def error_text(error: BaseException) -> str:
  details = getattr(error, 'details', None)  # grpc.RpcError
  if callable(details):
    with contextlib.suppress(Exception):
      return str(details() or '')
  message = getattr(error, 'message', None)  # tf.errors.OpError
  return str(message if isinstance(message, str) else error)
