"""The floor plan: `launch/` shows its programs, their machinery lives in folders named for
its job, no module imports a program or closes an import cycle, each name of a run folder's
files is typed once, no child process runs Python before its `exec`, every program keeps
the flags and defaults it had, and the docs name only flags that exist.

The import graph is read from the source (`ast`), so these tests import nothing of the
package but the flags test, which imports each program in one child interpreter.
"""

import ast
import json
import os
import re
import subprocess
import sys

import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = ('launch.train', 'launch.grid_search', 'launch.compare', 'launch.data_stats',
            'launch.benchmark', 'launch.memory_benchmark', 'launch.worker',
            'launch.check_devices', 'launch.reproduce')
_PACKAGES = ('launch', 'tff_zmg', 'tasks')


def _modules() -> dict[str, str]:
  """Every module of the three packages: dotted name -> path."""
  found = {}
  for package in _PACKAGES:
    for folder, _, files in os.walk(os.path.join(_REPO, package)):
      for name in files:
        if name.endswith('.py'):
          rel = os.path.relpath(os.path.join(folder, name), _REPO)[:-3].split(os.sep)
          if rel[-1] == '__init__':
            rel = rel[:-1]
          found['.'.join(rel)] = os.path.join(folder, name)
  return found


def _imports(path: str, modules) -> set[str]:
  """The package modules `path` imports anywhere in it (`from a import b` names `a.b` when
  that is a module, else `a`)."""
  out = set()
  for node in ast.walk(ast.parse(open(path).read())):
    if isinstance(node, ast.Import):
      out.update(a.name for a in node.names if a.name in modules)
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      for alias in node.names:
        child = f'{node.module}.{alias.name}'
        out.add(child if child in modules else node.module)
  return {m for m in out if m in modules}


def _graph() -> dict[str, set[str]]:
  modules = _modules()
  return {name: _imports(path, modules) for name, path in modules.items()}


def test_launch_lists_its_programs_and_init_only():
  top = sorted(n[:-3] for n in os.listdir(os.path.join(_REPO, 'launch')) if n.endswith('.py'))
  programs = [p.split('.')[1] for p in PROGRAMS if p != 'launch.reproduce']
  assert top == sorted(['__init__'] + programs)


def test_each_folder_of_launch_says_in_its_init_what_lives_there():
  launch = os.path.join(_REPO, 'launch')
  folders = [f for f in os.listdir(launch)
             if os.path.isfile(os.path.join(launch, f, '__init__.py'))]
  assert {'run', 'sweeps', 'cli', 'benchmarking', 'papers', 'reproduce'} <= set(folders)
  for folder in folders:
    doc = ast.get_docstring(ast.parse(open(os.path.join(launch, folder, '__init__.py')).read()))
    assert doc and doc.strip(), folder


def test_no_module_imports_a_program():
  """A program's own package (`launch.reproduce`'s modules) may import its parts."""
  offenders = []
  for module, imported in _graph().items():
    for target in imported:
      program = next((p for p in PROGRAMS if target == p or target.startswith(p + '.')), None)
      if program and not (module == program or module.startswith(program + '.')):
        offenders.append(f'{module} imports {target}')
  assert offenders == []


def _cycle(graph) -> list[str]:
  """One import cycle of `graph`, or []: a depth-first search for a back edge."""
  state, stack = {}, []

  def visit(node):
    state[node] = 'open'
    stack.append(node)
    for nxt in sorted(graph.get(node, ())):
      if state.get(nxt) == 'open':
        return stack[stack.index(nxt):] + [nxt]
      if nxt not in state:
        found = visit(nxt)
        if found:
          return found
    state[node] = 'done'
    stack.pop()
    return []

  for node in sorted(graph):
    if node not in state:
      found = visit(node)
      if found:
        return found
  return []


def test_cycle_finder_finds_a_cycle_and_only_one():
  assert _cycle({'a': {'b'}, 'b': {'c'}, 'c': {'a'}}) == ['a', 'b', 'c', 'a']
  assert _cycle({'a': {'b', 'c'}, 'b': {'c'}, 'c': set()}) == []


def test_no_import_cycles_in_launch_tff_zmg_tasks():
  """A package imports its own modules from its `__init__`, so the edges from a package
  to its own modules are left out (importing `a.b` runs `a` first by Python's rule)."""
  graph = {m: {t for t in targets if not t.startswith(m + '.')} for m, targets in _graph().items()}
  assert _cycle(graph) == []


def test_no_child_process_runs_python_between_fork_and_exec():
  """No call passes a `preexec_fn`: Python run in the forked copy of a process with
  TensorFlow's threads segfaulted a TFF worker's start. Children that must die with the
  program are started through `tff_zmg.runtime.children.dying_with_parent`."""
  found = [
      (module, node.lineno)
      for module, path in _modules().items()
      for node in ast.walk(ast.parse(open(path).read()))
      if isinstance(node, ast.Call) and any(k.arg == 'preexec_fn' for k in node.keywords)
  ]
  assert found == []


_RUN_FOLDER_NAMES = ('metrics.csv', 'flags.json', 'runtime.json', 'communication.json',
                     'best.json', 'diverged.txt', 'run_identity.json', 'checkpoints',
                     'tensorboard', 'client_states')


def test_each_run_folder_name_is_a_string_literal_once_in_launch_and_tff_zmg():
  counts = dict.fromkeys(_RUN_FOLDER_NAMES, 0)
  for module, path in _modules().items():
    if module.split('.')[0] == 'tasks':
      continue
    for node in ast.walk(ast.parse(open(path).read())):
      if isinstance(node, ast.Constant) and node.value in counts:
        counts[node.value] += 1
  assert counts == dict.fromkeys(_RUN_FOLDER_NAMES, 1)


# Imports each program in turn in one interpreter, listing the flags our packages define,
# then forgets the program's modules and flags before the next (absl refuses a flag
# defined twice).
_LIST_FLAGS = r'''
import importlib, json, sys
from absl import flags
out = {}
for program in sys.argv[1:]:
  importlib.import_module(program)
  ours = {}
  for name, flag in flags.FLAGS._flags().items():
    owner = flags.FLAGS.find_module_defining_flag(name) or ''
    if name == flag.name and owner.split('.')[0] in ('launch', 'tasks', 'tff_zmg'):
      ours[name] = flag.default_as_str
  out[program] = ours
  for name in [n for n, f in flags.FLAGS._flags().items() if n == f.name]:
    if (flags.FLAGS.find_module_defining_flag(name) or '').startswith('launch'):
      delattr(flags.FLAGS, name)
  for module in [m for m in sys.modules if m == 'launch' or m.startswith('launch.')]:
    del sys.modules[module]
print(json.dumps(out))
'''


@pytest.fixture(scope='module')
def program_flags() -> dict[str, dict[str, str]]:
  """Each program's flags (those our packages define) and their defaults, as the program
  itself defines them (each imported in turn in one child interpreter)."""
  proc = subprocess.run([sys.executable, '-c', _LIST_FLAGS, *[
      p + '.run' if p == 'launch.reproduce' else p for p in PROGRAMS]],
      cwd=_REPO, capture_output=True, text=True, timeout=300, check=True)
  listed = json.loads(proc.stdout.strip().splitlines()[-1])
  listed['launch.reproduce'] = listed.pop('launch.reproduce.run')
  return listed


def test_every_program_keeps_its_flags_and_their_defaults(program_flags):
  """The list in tests/data/program_flags.json was taken from each program before launch/
  was laid out in folders (a program may have gained flags since); `launch.reproduce` has
  since stopped accepting the flags of `launch.compare` and `launch.grid_search` it
  ignored (--algos, --tuned_from, --search, ...), which it imported with their modules."""
  with open(os.path.join(_REPO, 'tests', 'data', 'program_flags.json')) as f:
    expected = json.load(f)
  for program in PROGRAMS:
    kept = {name: program_flags[program].get(name, 'gone') for name in expected[program]}
    assert kept == expected[program], program


# An absl-style flag as the docs write one (`--name`, `--name=...`; not pip's `--no-deps`).
_FLAG = re.compile(r'(?<![\w-])--([a-z][a-z0-9_]*)(?![\w-])')
# The flags the docs quote of other tools: absl's own, scripts/bootstrap.sh's, Ray's CLI's
# (`ray start`), ipykernel's and Docker's.
_OTHER_TOOLS_FLAGS = {'help', 'helpfull', 'gpu', 'head', 'address', 'port', 'user', 'name',
                      'gpus'}


def _doc_commands(text: str):
  """Each command line of a doc (joined across its continuation backslashes) or sentence
  line, and the program it runs (`launch.x` of `-m launch.x`, or None)."""
  for line in text.replace('\\\n', ' ').splitlines():
    program = re.search(r'-m (launch\.\w+)', line)
    yield line, program.group(1) if program else None


def test_the_docs_name_only_flags_that_exist(program_flags):
  """Every flag README.md and docs/ name is one of a program's or a script's (or another
  tool's the docs quote), and a flag on a `python -m launch.x` command line is that
  program's, so that no doc teaches a flag that was renamed, removed or never built."""
  def flag_names(flags_: set[str]) -> set[str]:
    return flags_ | {'no' + name for name in flags_}

  ours = set().union(*map(set, program_flags.values()))
  for script in os.listdir(os.path.join(_REPO, 'scripts')):
    if script.endswith('.py'):
      ours |= set(re.findall(r"add_argument\('--(\w+)'",
                             open(os.path.join(_REPO, 'scripts', script)).read()))
  known = flag_names(ours | _OTHER_TOOLS_FLAGS)
  by_program = {program: flag_names(set(names) | {'help', 'helpfull'})
                for program, names in program_flags.items()}
  docs = ['README.md'] + [os.path.join('docs', n)
                          for n in sorted(os.listdir(os.path.join(_REPO, 'docs')))]
  unknown, elsewhere = [], []
  for doc in docs:
    for line, program in _doc_commands(open(os.path.join(_REPO, doc)).read()):
      for name in _FLAG.findall(line):
        if name.endswith('_') and any(flag.startswith(name) for flag in ours):
          continue  # A family of flags: `--synthetic_*`.
        if name not in known:
          unknown.append(f'{doc}: --{name}')
        elif program in by_program and name not in by_program[program]:
          elsewhere.append(f'{doc}: {program} --{name}')
  assert unknown == [] and elsewhere == [], (unknown, elsewhere)


def test_reproduce_refuses_the_comparison_flags_it_would_ignore():
  proc = subprocess.run(
      [sys.executable, '-m', 'launch.reproduce', '--paper=fedzmg', '--tuned_from=/tmp/x',
       '--dry_run'], cwd=_REPO, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 2, proc.stderr
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and re.search(r'tuned_from', lines[0]), proc.stderr
