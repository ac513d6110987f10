"""Importing `tasks` or `tff_zmg` runs nothing, and `tasks` imports nothing of `tff_zmg`.

The runtime is opt-in: a program installs a TFF context, signal handler or worker by a
call (`tff_zmg.set_default_execution_context()`, `launch.cli.failures.run_program`), never by
an import. One fresh interpreter imports `tasks`, every module of `tasks`, then every module
of `tff_zmg`, and reports what changed; it then makes the call that does install the runtime,
so the same probes are seen to notice it.
"""

import json
import os
import subprocess
import sys
import textwrap

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_OURS = ('tff_zmg', 'tasks', 'launch')

_PROGRAM = textwrap.dedent("""
    import atexit, importlib, json, pkgutil, signal, sys

    hooks = []  # Module of each function registered with atexit from here on.
    _register = atexit.register
    def _recording_register(func, *args, **kwargs):
      hooks.append(getattr(getattr(func, 'func', func), '__module__', None) or '?')
      return _register(func, *args, **kwargs)
    atexit.register = _recording_register

    import psutil
    import tensorflow_federated as tff  # Its own import installs TFF's default context.

    STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    stack = tff.framework.get_context_stack()
    tff_default = stack.current
    handlers = [signal.getsignal(s) for s in STOP_SIGNALS]

    def ours(prefix):
      return sorted(m for m in sys.modules if m == prefix or m.startswith(prefix + '.'))

    def workers():
      return [p.pid for p in psutil.Process().children(recursive=True)
              if 'worker_binary' in ' '.join(p.cmdline())]

    def state():
      return dict(
          tff_zmg_modules=ours('tff_zmg'),
          context_replaced=stack.current is not tff_default,
          changed_signals=[s.name for s, h in zip(STOP_SIGNALS, handlers)
                           if signal.getsignal(s) != h],
          exit_hooks=sorted({m for m in hooks if m.split('.')[0] in %(ours)r}),
          workers=workers(),
      )

    report = {}
    import tasks
    report['import tasks'] = state()
    for module in pkgutil.iter_modules(tasks.__path__):
      importlib.import_module('tasks.' + module.name)
    report['every tasks module'] = state()
    import tff_zmg
    report['import tff_zmg'] = state()
    for module in pkgutil.walk_packages(tff_zmg.__path__, 'tff_zmg.'):
      importlib.import_module(module.name)
    report['every tff_zmg module'] = state()
    report['started workers'] = tff_zmg.runtime.cpp_worker.started_worker_pids()
    # The opt-in call (its worker starts at the first computation): the probes see it.
    tff_zmg.set_default_execution_context(start=False)
    report['installed'] = state()
    print(json.dumps(report))
""") % {'ours': _OURS}


def test_importing_tasks_and_tff_zmg_installs_nothing():
  completed = subprocess.run(
      [sys.executable, '-c', _PROGRAM],
      cwd=_REPO_ROOT,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'),
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert completed.returncode == 0, completed.stderr[-3000:]
  report = json.loads(completed.stdout.strip().splitlines()[-1])
  nothing = dict(context_replaced=False, changed_signals=[], exit_hooks=[], workers=[])

  # One exit hook, of `tasks`: it drops TFF's own default context, if still the default,
  # while Python is whole, so that TFF's clean-up prints nothing (tasks/quiet.py).
  nothing = dict(nothing, exit_hooks=['tasks.quiet'])
  for step in ('import tasks', 'every tasks module'):
    assert report[step] == dict(nothing, tff_zmg_modules=[]), step
  for step in ('import tff_zmg', 'every tff_zmg module'):
    found = report[step]
    assert 'tff_zmg.runtime.cpp_worker' in found.pop('tff_zmg_modules')
    assert found == nothing, step
  assert report['started workers'] == []

  installed = report['installed']
  assert installed['context_replaced']
  assert installed['changed_signals'] == ['SIGTERM']
  assert installed['exit_hooks'] == ['tasks.quiet', 'tff_zmg.runtime.cpp_worker']
  assert installed['workers'] == []  # Started by the first computation, not by the call.
