"""The hyperparameter dataclasses: one source of each default, one validation door, and
the package's folders and the modules of `launch` free of import cycles. Nothing here
builds a process (~1 s)."""

import ast
import collections
import dataclasses
import os
import re

import pytest

from tff_zmg.algorithms import registry
from tff_zmg.templates import hparams as hp

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HPARAMS_CLASSES = {spec.hparams_class for spec in registry.ALGORITHMS.values()}
FIELD_NAMES = {name for cls in HPARAMS_CLASSES for name in cls.names()}
# The optimizers' names for the same hyperparameters.
OPTIMIZER_NAMES = {'learning_rate', 'momentum', 'weight_decay', 'beta_1', 'beta_2', 'epsilon'}


def _python_files(*folders):
  for folder in folders:
    for root, _, files in os.walk(os.path.join(REPO, folder)):
      for name in sorted(files):
        if name.endswith('.py'):
          yield os.path.join(root, name)


def _is_literal(node):
  """A number or a string written in the source (not None, not a bool switch)."""
  return (
      isinstance(node, ast.Constant)
      and isinstance(node.value, (int, float, str))
      and not isinstance(node.value, bool)
  ) or (isinstance(node, ast.UnaryOp) and _is_literal(node.operand))


def _restated_defaults(path):
  """`(line, name)` of each default of a hyperparameter written outside a field."""
  tree = ast.parse(open(path).read(), path)
  found = []
  for node in ast.walk(tree):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
      args = node.args
      positional = args.posonlyargs + args.args
      pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults))
      pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
      found += [
          (d.lineno, a.arg) for a, d in pairs
          if a.arg in FIELD_NAMES | OPTIMIZER_NAMES and _is_literal(d)
      ]
    elif isinstance(node, ast.Dict):
      found += [
          (k.lineno, k.value) for k, v in zip(node.keys, node.values)
          if isinstance(k, ast.Constant) and k.value in FIELD_NAMES and _is_literal(v)
      ]
    elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
      if node.target.id in FIELD_NAMES and node.value is not None and _is_literal(
          node.value
      ):
        found.append((node.lineno, node.target.id))
  return found


def test_every_default_is_written_once_in_its_hparams_field():
  """No builder signature, optimizer signature, rule table or class restates a default:
  each is the first argument of one `hparam(...)` field (or a shared field maker's)."""
  restated = {
      os.path.relpath(path, REPO): found
      for path in _python_files('tff_zmg', 'launch')
      if (found := _restated_defaults(path))
  }
  # The one per-name override: the ablations without relaxation (rho = 1).
  fedrkmgc = os.path.join('tff_zmg', 'algorithms', 'fedrkmgc.py')
  line = next(i for i, text in enumerate(open(os.path.join(REPO, fedrkmgc)), 1)
              if text.startswith('NO_RELAXATION = '))
  assert restated == {fedrkmgc: [(line, 'rho')]}


def test_a_field_declared_by_several_classes_is_one_hyperparameter():
  """Same name, same range and help wherever declared (so one flag describes it)."""
  seen = {}
  for cls in HPARAMS_CLASSES:
    for name, (kind, valid, text) in hp.field_info(cls).items():
      seen.setdefault(name, set()).add((kind, valid.text, text))
  assert {n: s for n, s in seen.items() if len(s) > 1} == {}


def _bad_value(kind):
  return {str: 'nope', bool: 'yes', int: -1, float: -1.0}[kind]


@pytest.mark.parametrize('cls', sorted(HPARAMS_CLASSES, key=lambda c: c.__name__))
def test_each_field_refuses_a_bad_value_in_one_line_naming_its_range(cls):
  for name, (kind, valid, _) in hp.field_info(cls).items():
    bad = _bad_value(kind)
    with pytest.raises(ValueError) as error:
      cls(**{name: bad})
    message = str(error.value)
    assert '\n' not in message
    assert message.startswith(f'{name} must ') and message.endswith(f'got {bad!r}')
    assert valid.text.split(';')[0].removeprefix('unset or ') in message, message


def test_an_unknown_name_is_refused_listing_the_valid_ones():
  with pytest.raises(ValueError, match=r"\['momentum'\] are not hyperparameters of"
                     r" FedZmgHparams; its hyperparameters are \['center_vectors'"):
    registry.get('fedzmg').hparams_class.create(momentum=0.9)


def test_values_are_checked_and_normalized_where_they_are_created():
  fedzmg = registry.get('fedzmg').hparams_class
  hparams = fedzmg.create(client_learning_rate=1, weight_decay=0)
  assert hparams.client_learning_rate == 1.0 and isinstance(hparams.client_learning_rate,
                                                           float)
  with pytest.raises(ValueError, match=r'^client_momentum must be in \[0, 1\), got 1$'):
    dataclasses.replace(hparams, client_momentum=1)


def test_a_range_open_at_its_low_end_and_a_bounded_integer_say_so_in_one_line():
  assert hp.UNIT_INTERVAL_OPEN.text == 'in (0, 1)'
  assert hp.UNIT_INTERVAL_OPEN.check('delta', 1e-5) == 1e-5
  for bad in (0.0, 1.0):
    with pytest.raises(ValueError, match=rf'^delta must be in \(0, 1\), got {bad}$'):
      hp.UNIT_INTERVAL_OPEN.check('delta', bad)
  bits = hp.integer(1, 16)
  assert bits.check('bits', 16) == 16
  for bad in (0, 17, 8.0, True):  # Both ends, and what is not an integer, alike.
    with pytest.raises(ValueError, match=rf'^bits must be an integer in \[1, 16\], got {bad}$'):
      bits.check('bits', bad)


def test_registry_defaults_are_the_dataclass_defaults_but_for_the_named_overrides():
  """Hand values: FedRKMGC's ablations without relaxation average plainly (rho = 1)."""
  overrides = {name: dict(spec.default_overrides)
               for name, spec in registry.ALGORITHMS.items() if spec.default_overrides}
  assert overrides == {n: {'rho': 1.0} for n in (
      'fedrkmgc_raw', 'fedrkmgc_km', 'fedrkmgc_fast_km')}
  for name, spec in registry.ALGORITHMS.items():
    expected = {**dataclasses.asdict(spec.hparams_class()), **spec.default_overrides}
    assert dict(spec.defaults) == expected, name


def _imports(path):
  """The `tff_zmg` modules `path` imports (absolute, as `a.b.c`)."""
  tree = ast.parse(open(path).read(), path)
  names = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names += [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      names += [node.module] + [f'{node.module}.{a.name}' for a in node.names]
  return [n for n in names if n.startswith('tff_zmg.')]


def _folder(module):
  """The sub-folder (or top-level module) of `tff_zmg` a module belongs to."""
  return module.split('.')[1]


def test_no_import_cycle_between_the_package_folders():
  package_dir = os.path.join(REPO, 'tff_zmg')
  edges = collections.defaultdict(set)
  for path in _python_files('tff_zmg'):
    relative = os.path.relpath(path, REPO)[:-3].replace(os.sep, '.')
    if relative == 'tff_zmg.__init__':  # The package's front door imports everything.
      continue
    source = _folder(relative)
    for module in _imports(path):
      target = _folder(module)
      if target != source and (
          os.path.isdir(os.path.join(package_dir, target))
          or os.path.exists(os.path.join(package_dir, target + '.py'))
      ):
        edges[source].add(target)

  edges = dict(edges)
  assert not _cycles(edges)
  # The framework imports no algorithm.
  assert 'algorithms' not in edges.get('templates', ())


def _cycles(edges):
  """`a -> b -> ... -> a` for each import `a -> b` (of `edges`, name -> names) that lies
  on a cycle, sorted."""

  def reachable(start):
    seen, todo = set(), [start]
    while todo:
      for n in edges.get(todo.pop(), ()):
        if n not in seen:
          seen.add(n)
          todo.append(n)
    return seen

  return sorted(f'{a} -> {b} -> ... -> {a}' for a in edges for b in edges[a]
                if a in reachable(b))


def _module_imports(source, package, modules):
  """The modules of `modules` that `source` (a module of `package`) imports, at its top
  or inside a function: `from a import b` is module `a.b` where there is one, else `a`."""
  found = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      found.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ''
      if node.level:  # Relative: `from . import x` is `package.x`.
        parts = package.split('.')[:len(package.split('.')) + 1 - node.level]
        base = '.'.join(parts + ([node.module] if node.module else []))
      found.update(f'{base}.{a.name}' if f'{base}.{a.name}' in modules else base
                   for a in node.names)
  return found & modules


def test_cycles_counts_the_imports_inside_functions():
  """By hand: a lazy import closes a cycle as a top one does; a package's front door
  importing its modules is none."""
  modules = {'p', 'p.a', 'p.b', 'p.c'}
  source = 'import p\nfrom p.b import name\ndef f():\n  from p import c\n  from . import a\n'
  assert _module_imports(source, 'p', modules) == {'p', 'p.a', 'p.b', 'p.c'}
  edges = {'p': {'p.a', 'p.b'}, 'p.a': {'p.b'}, 'p.b': {'p.c'}, 'p.c': set()}
  assert _cycles(edges) == []
  edges['p.c'] = {'p.a'}  # Inside a function of p.c.
  assert _cycles(edges) == ['p.a -> p.b -> ... -> p.a', 'p.b -> p.c -> ... -> p.b',
                            'p.c -> p.a -> ... -> p.c']


def test_no_import_cycle_between_the_modules_of_launch():
  """Imports inside functions count: put off to the first call, a cycle is still one."""
  files = {}
  for path in _python_files('launch'):
    name = os.path.relpath(path, REPO)[:-3].replace(os.sep, '.')
    files[name.removesuffix('.__init__')] = path
  edges = {}
  for name, path in files.items():
    package = name if path.endswith('__init__.py') else name.rpartition('.')[0]
    with open(path, encoding='utf-8') as f:
      edges[name] = _module_imports(f.read(), package, set(files)) - {name}
  assert {'launch', 'launch.train', 'launch.reproduce.plan'} <= set(files)  # The listing.
  assert 'launch.cli.failures' in edges['launch.train']  # The parsing.
  assert _cycles(edges) == []
