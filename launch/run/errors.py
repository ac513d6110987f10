"""The errors that stop the package's programs, each meaning one exit status.

`launch.cli.failures` turns each into one line on stderr and its status: an `ExperimentError`
is bad input (2), unless it is one of its kinds below: `DivergedError` (3),
`WorkerLostError` (4), `RunEnvironmentError` (5); a `RunFailed` passes on the status of
the run that failed. They live here, apart from the code that raises them, so that every
module of `launch` can raise or tell them apart without importing training (or
TensorFlow): nothing here imports anything.
"""


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

  `exit_code` is the status this program passes on (launch/cli/failures.py): the run's own
  when it is one of the documented ones, else 1 (`failures.EXIT_UNEXPECTED`).
  """

  def __init__(self, message: str, exit_code: int = 1):
    super().__init__(message)
    self.exit_code = exit_code
