"""What importing `tasks` (and so `tff_zmg` and the programs, which import it) does to keep
TensorFlow and TFF quiet, here once because `tasks` is the lowest package that loads them.

- TensorFlow's C++ start-up lines (CUDA stubs, three "Unable to register cuDNN factory"
  ERROR lines this CUDA build logs on every machine, Grappler's "Starting new session")
  are hidden unless the user set `TF_CPP_MIN_LOG_LEVEL` (`=0` shows them): `quiet_tensorflow`,
  which `tasks/__init__.py` calls before anything imports TensorFlow. Errors that matter
  reach Python as exceptions.
- TFF's own default context (the one `import tensorflow_federated` makes) is dropped at
  exit while Python is whole, if it is still the default (`release_tff_default_context`).
  Left to interpreter shutdown, TFF 0.87's `ServiceManager.__del__` runs once the
  `subprocess` module is gone and prints "Exception ignored in ... AttributeError" (with
  or without a worker); run at exit, it stops TFF's worker if one was started. A context
  the program chose stays as it is.
- That worker is ended at exit by this module, not by TFF's `ServiceManager.__del__`,
  which sends it SIGINT and waits without a timeout: a program started with SIGINT
  ignored (a background job of a non-interactive shell) passes that on to the worker,
  which then never ends, and the program hung at exit (`stop_tff_worker`).
"""

import os
import subprocess

# The level: 3, not 2, for the cuDNN ERROR lines above.
TF_CPP_MIN_LOG_LEVEL = '3'
# How long TFF's worker may take to end on SIGTERM at exit before it is killed.
TFF_WORKER_STOP_GRACE_S = 2.0


def quiet_tensorflow() -> None:
  """Hides TensorFlow's C++ logs unless the user chose a level; works only before
  TensorFlow is first imported."""
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', TF_CPP_MIN_LOG_LEVEL)


def register_tff_cleanup() -> None:
  """Registers `release_tff_default_context` at exit, for TFF's default context now."""
  # Imported here, not at the top: this module is loaded before TensorFlow, whose log
  # level it sets first.
  # pylint: disable=g-import-not-at-top
  import atexit
  import weakref

  from tensorflow_federated.python.core.impl.context_stack import context_stack_impl

  tff_own = weakref.ref(context_stack_impl.context_stack._stack[0])  # pylint: disable=protected-access
  atexit.register(release_tff_default_context, tff_own)


def release_tff_default_context(tff_own) -> None:
  """Drops TFF's default context `tff_own()` (a weak reference) if it is still the
  default, and collects it now (its reference cycles hold TFF's service manager)."""
  # pylint: disable=g-import-not-at-top
  import gc

  from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
  from tensorflow_federated.python.core.impl.context_stack import set_default_context

  stop_tff_worker(tff_own())
  stack = context_stack_impl.context_stack._stack  # pylint: disable=protected-access
  if tff_own() is not None and stack and stack[0] is tff_own():
    set_default_context.set_no_default_context()
    gc.collect()


def stop_tff_worker(context) -> None:
  """Ends the worker of TFF's own context `context`, if it started one: SIGTERM, then
  SIGKILL after `TFF_WORKER_STOP_GRACE_S`; TFF's `__del__` is left nothing to wait for."""
  # TFF 0.87 keeps the worker in a `ServiceManager` that only the closure of its executor
  # stack function holds; a TFF that keeps it elsewhere is left to its own clean-up.
  stack_fn = getattr(getattr(context, 'executor_factory', None), '_executor_stack_fn', None)
  code = getattr(stack_fn, '__code__', None)
  if code is None or 'service_manager' not in code.co_freevars:
    return
  manager = stack_fn.__closure__[code.co_freevars.index('service_manager')].cell_contents
  process = getattr(manager, '_process', None)
  if not isinstance(process, subprocess.Popen):
    return
  manager._process = None  # pylint: disable=protected-access
  if process.poll() is None:
    process.terminate()
    try:
      process.wait(TFF_WORKER_STOP_GRACE_S)
    except subprocess.TimeoutExpired:
      process.kill()
      process.wait()
