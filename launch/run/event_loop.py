"""The asyncio loop a run's rounds go through, and how a stopped run says what it keeps.

TFF's training loop and its program state managers run their coroutines in the calling
thread's event loop (`thread_event_loop`), and a checkpoint is written in a thread of that
loop's default executor. A run trains inside `stops_say_what_is_kept`, which waits for such
a write before it says which round a stopped run (a stop signal, or the machine refusing a
write) resumes from.
"""

import asyncio
import concurrent.futures
import contextlib

from launch.run import errors
from launch.run import run_directory


def thread_event_loop() -> asyncio.AbstractEventLoop:
  """This thread's asyncio loop, made and set if there is none.

  TFF's training loop and program state managers call `asyncio.get_event_loop()`, which
  fails once an earlier `asyncio.run` in the same thread (a notebook cell, a test) has
  unset the loop.
  """
  try:
    loop = asyncio.get_event_loop()
  except RuntimeError:
    loop = None
  if loop is None or loop.is_closed():
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
  return loop


@contextlib.contextmanager
def stops_say_what_is_kept(checkpoint_dir: str):
  """A stop signal, or the machine refusing a write, ends a run saying what it resumes from.

  Raises:
    errors.Interrupted: Ctrl-C, SIGTERM or SIGHUP (a `KeyboardInterrupt`).
    errors.RunEnvironmentError: a write failed for want of space or permission (an `OSError`,
      TensorFlow's error from saving a checkpoint, or the TFF worker's gRPC error).
  """
  # TFF's state manager writes a checkpoint in a thread of the event loop's default
  # executor: a signal stops this thread, not that write, so what is kept is known only
  # once the write has ended (the message would otherwise name the round before).
  writes = concurrent.futures.ThreadPoolExecutor(thread_name_prefix='tff_zmg-writes')
  loop = thread_event_loop()
  loop.set_default_executor(writes)
  try:
    yield
  except KeyboardInterrupt as e:
    writes.shutdown(wait=True, cancel_futures=True)
    _cancel_pending_tasks(loop)
    kept = run_directory.newest_checkpoint_round(checkpoint_dir)
    if kept is None:
      message = 'interrupted before the first checkpoint; re-run the same command to start'
    else:
      message = f'interrupted after round {kept}; re-run the same command to resume'
    raise errors.Interrupted(message) from e
  except errors.ExperimentError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    cause = errors.environment_cause(e)
    if cause is None:
      raise
    writes.shutdown(wait=True, cancel_futures=True)
    _cancel_pending_tasks(loop)
    kept = run_directory.newest_checkpoint_round(checkpoint_dir)
    kept_text = (
        'no checkpoint was saved yet' if kept is None
        else f'the checkpoint of round {kept} is kept'
    )
    raise errors.RunEnvironmentError(
        f'the machine refused a write ({cause}); {kept_text}. Free some space (or fix the'
        ' permissions) and re-run the same command to resume'
    ) from e
  finally:
    writes.shutdown(wait=True)
    loop.set_default_executor(concurrent.futures.ThreadPoolExecutor())  # For what follows.


def _cancel_pending_tasks(loop: asyncio.AbstractEventLoop) -> None:
  """Cancels what a stopped round left in the loop (e.g. a checkpoint's save, whose write
  has ended), so that no task is destroyed pending at exit: asyncio logs each on stderr."""
  pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
  for task in pending:
    task.cancel()
  if pending and not loop.is_running():
    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
