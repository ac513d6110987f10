"""The stop signals of every program, from its first import to its exit: the one module
that handles Ctrl-C (SIGINT), SIGTERM and SIGHUP. Code elsewhere asks it for a stop
(the check `deferred` yields) and never installs a handler of its own. (TFF's C++
workers keep their own life cycle, `tff_zmg/runtime/cpp_worker.py`: they die with the
program that started them.)

A program passes through three ways of stopping:

- **Starting** (`end_at_once_while_starting`, armed by `import launch`): the imports of
  TensorFlow and TFF. A stop ends the process at once, with its one line and status 130.
- **Running** (`install`, by `launch.cli.failures.run_program`): a stop raises
  `errors.Interrupted` (a `KeyboardInterrupt`) where it lands, so `finally` blocks and
  context managers clean up (no TFF worker outlives the program) and training says after
  which round it stopped.
- **At a loop's safe points** (`deferred`): while `launch.train` or a sweep's warm slot
  on this machine trains a run's rounds (`between_rounds`; a Ray actor is Ray's to end,
  by SIGTERM, and batched cells stop where the stop lands) and while a sweep schedules its
  runs, the first stop is only recorded, and the loop raises it at its next safe point:
  before a round's next client (in the in-process runtime; TFF's worker runs a round as one
  call), which drops the round under way, so that the re-run trains it again from the
  checkpoint before it; the next round's start (or the last round's end), once the round
  before is released and its checkpoint under way; the scheduler's next turn. A second
  stop is raised at once, with the same line.

Its children die with the program (`tff_zmg.runtime.children.dying_with_parent`): a
sweep's slot processes, which have sessions of their own (one SIGTERM from the program
stops them, between rounds), and the Ray driver, which has a process group of its own, so
that the terminal's Ctrl-C reaches the program only, and the program closes the driver.

This module imports only the standard library and `launch.run.errors`, which does too:
`import launch` uses it before TensorFlow is imported.
"""

import _weakrefset
import asyncio
import contextlib
import os
import signal
import sys
import threading
import warnings
from typing import Callable

from launch.cli import exit_status
from launch.run import errors

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_SIGNAL_AGAIN_AFTER_S = 0.01
# Code that a stop must not cut short (`_raise_interrupted`): asyncio's and the weak set
# its tasks register in.
_ASYNCIO_BOOKKEEPING = (os.path.dirname(asyncio.__file__) + os.sep, _weakrefset.__file__)


# Starting.


def end_at_once_while_starting(program: str, cleanup: Callable[[], None]) -> None:
  """Until `install`, a stop prints `<program>: error: interrupted by <SIGNAL> while
  starting; nothing was done`, calls `cleanup` and ends the process with status 130.

  Raising here (as `install`'s handler does later) was not reliable: a stop raised in the
  middle of an import may be turned into `ImportError: initialization failed` by an
  extension module's initialization (pybind11's, in TensorFlow), or swallowed by a
  library's handler or a garbage-collector callback, leaving half-imported modules that
  fail later (jax's `version`), or a program that goes on as if not stopped. Nothing of
  the user's has been written yet; `cleanup` removes what the imports made.
  """

  def end(signum, frame) -> None:
    del frame
    print(f'{program}: error: interrupted by {signal.Signals(signum).name} while starting;'
          ' nothing was done', file=sys.stderr, flush=True)
    cleanup()
    os._exit(exit_status.INTERRUPTED)  # pylint: disable=protected-access

  for signum in STOP_SIGNALS:
    signal.signal(signum, end)


# Running.


def _raise_interrupted(signum, frame, what_was_done: str = '') -> None:
  """Raises `Interrupted` (`interrupted by <SIGNAL>[; <what_was_done>]`) where the signal
  landed, unless that is inside asyncio's bookkeeping, where it is signalled again a moment
  later.

  A stop raised there leaves the loop half updated: CI saw one land while a checkpoint's
  `save` task was being registered, so that no cancel could find the task and asyncio
  printed "Task was destroyed but it is pending!" at exit beside the one line. (asyncio's
  own `asyncio.run` cancels its main task on Ctrl-C rather than raise, for the same reason.)
  A loop that waits raises it from `selectors`, outside these files.
  """
  if frame is not None and frame.f_code.co_filename.startswith(_ASYNCIO_BOOKKEEPING):
    _signal_again(signum)
    return
  # A signal landing between a coroutine's creation and its first step (TFF's training
  # loop makes `state_manager.save(...)` and then runs it) leaves that coroutine never
  # awaited: nothing of it ran, so Python's warning about it would only be noise beside
  # the one line.
  warnings.filterwarnings('ignore', message=r"coroutine '.*' was never awaited",
                          category=RuntimeWarning)
  stop = errors.Interrupted(_stop_line(signum, what_was_done))
  stop.signum = signum
  raise stop


def _stop_line(signum: int, what_was_done: str) -> str:
  return '; '.join(filter(None, [f'interrupted by {signal.Signals(signum).name}',
                                 what_was_done]))


def _signal_again(signum: int) -> None:
  """Sends `signum` to this process again in a moment, from another thread: sent from
  here, it would be handled before the caller returns."""
  again = threading.Timer(_SIGNAL_AGAIN_AFTER_S, os.kill, (os.getpid(), signum))
  again.daemon = True
  again.start()


def _signal_swallowed_stops_again(unraisable) -> None:
  """`sys.unraisablehook`: a stop raised where Python cannot pass an exception on (the
  signal landed in a weakref callback or a finalizer, which only print it) is signalled
  again, to be raised in the code that runs after; without this the run went on to exit 0.
  """
  signum = getattr(unraisable.exc_value, 'signum', None)
  if isinstance(unraisable.exc_value, errors.Interrupted) and signum is not None:
    _signal_again(signum)
    return
  _python_unraisablehook(unraisable)


_python_unraisablehook = sys.unraisablehook


def install() -> None:
  """Ctrl-C, SIGTERM and SIGHUP raise `Interrupted` in the main thread, also when they
  land where Python swallows exceptions (`_signal_swallowed_stops_again`) or inside
  asyncio's bookkeeping (`_raise_interrupted`).

  SIGINT too, as a shell that starts a program in the background makes it ignore SIGINT.
  """
  for signum in STOP_SIGNALS:
    signal.signal(signum, _raise_interrupted)
  sys.unraisablehook = _signal_swallowed_stops_again


# At a loop's safe points.


@contextlib.contextmanager
def deferred(what_was_done: str):
  """Around a loop: yields the check the loop calls at each of its safe points, which
  raises `Interrupted` (`interrupted by <SIGNAL>; <what_was_done>`) if a stop was received
  inside. The first stop is only recorded; a second is raised at once, with the same line.

  A handler that raises can lose its exception: Python runs pending handlers inside the
  fork callbacks of a `subprocess.Popen` with a preexec_fn (a library's), where exceptions
  are printed and dropped, and the program would carry on as if never told to stop. A
  second stop raised there and lost is still recorded, and the loop acts on it. Outside
  the main thread, where no handler can be set, the check never raises.
  """
  received = []

  def stop_if_received() -> None:
    if received:
      raise errors.Interrupted(_stop_line(received[0], what_was_done))

  if threading.current_thread() is not threading.main_thread():
    yield stop_if_received
    return

  def record(signum, frame) -> None:
    received.append(signum)
    if len(received) > 1:
      _raise_interrupted(signum, frame, what_was_done)

  previous = {s: signal.signal(s, record) for s in STOP_SIGNALS}
  try:
    yield stop_if_received
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)


def between_rounds():
  """`deferred` around a run's rounds (`launch.train`'s): training calls its check as each
  round starts, before each of a round's clients in the in-process runtime
  (`tff_zmg.runtime.client_slots.between_clients`) and once after the last. A stop is
  raised within one client's time, and the round it landed in is dropped; or, landing
  after the round's last client or in TFF's worker, once that round is released and its
  checkpoint under way. Training then says which checkpoint it keeps, written whole."""
  return deferred('stopped between rounds')
