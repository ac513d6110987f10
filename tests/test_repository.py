"""The checkout is the same on every file system, and its modules are short or say why.

macOS and Windows file systems ignore case, so a checkout of `docs/ALGORITHMS.md` beside
`docs/algorithms.md` keeps one of them (and git then reports the other as modified). The
paths are git's own (`git ls-files`), folders included: `Docs/a.md` and `docs/b.md` clash
too.
"""

import collections
import os
import subprocess

import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _case_clashes(paths):
  """The groups (sorted) of distinct paths or folders that are equal ignoring case."""
  names = set()
  for path in paths:
    parts = path.split('/')
    names.update('/'.join(parts[:i]) for i in range(1, len(parts) + 1))
  groups = collections.defaultdict(set)
  for name in names:
    groups[name.casefold()].add(name)
  return sorted(sorted(group) for group in groups.values() if len(group) > 1)


def _tracked_paths():
  try:
    listed = subprocess.run(
        ['git', 'ls-files', '-z'], cwd=_REPO, capture_output=True, check=True
    )
  except (OSError, subprocess.CalledProcessError) as error:
    pytest.skip(f'not a git checkout ({error})')
  return [p for p in listed.stdout.decode('utf-8').split('\0') if p]


def test_case_clashes_finds_files_and_folders_that_differ_only_in_case():
  """By hand: two spellings of one file, one folder spelt two ways, and no clash."""
  assert _case_clashes([
      'docs/ALGORITHMS.md', 'docs/algorithms.md', 'Tasks/a.py', 'tasks/b.py', 'tasks/c.py',
      'README.md', 'readme_extra.md',
  ]) == [['Tasks', 'tasks'], ['docs/ALGORITHMS.md', 'docs/algorithms.md']]
  assert _case_clashes(['a/b.py', 'a/c.py', 'b.py']) == []


def test_no_two_tracked_paths_differ_only_in_case():
  paths = _tracked_paths()
  assert len(paths) > 100, len(paths)  # The listing is the repository's.
  assert _case_clashes(paths) == []


# A module of the package longer than this opens with the reason ("Why one file of ...").
_MAX_LINES = 500
_REASON = 'Why one file of '


def test_a_module_above_500_lines_says_why_at_its_top():
  unexplained = []
  for folder in ('tff_zmg', 'tasks', 'launch'):
    for root, _, files in os.walk(os.path.join(_REPO, folder)):
      for name in sorted(f for f in files if f.endswith('.py')):
        with open(os.path.join(root, name), encoding='utf-8') as f:
          lines = f.readlines()
        if len(lines) > _MAX_LINES and not any(_REASON in line for line in lines[:10]):
          unexplained.append((os.path.relpath(os.path.join(root, name), _REPO), len(lines)))
  assert unexplained == []
