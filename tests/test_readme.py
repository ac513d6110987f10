"""The README is a front door that holds: small, its links lead somewhere, its commands and
its Python example work as written, and CI runs the test command it shows.

The example runs in a fresh process, as a user would paste it, with HOME in a temporary
folder so that its synthetic data goes to a fresh `~/.tff`.
"""

import importlib.util
import os
import re
import shlex
import subprocess
import sys

from absl import flags

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_README = os.path.join(_REPO, 'README.md')
_DOCS = os.path.join(_REPO, 'docs')
_COMMAND_PREFIX = 'bash scripts/bootstrap.sh && .venv/bin/python -m '


def _read(path):
  with open(path, encoding='utf-8') as f:
    return f.read()


def _commands(prefix):
  """The README's indented command lines that start with `prefix`."""
  return [
      line.strip() for line in _read(_README).splitlines()
      if line.startswith('    ') and line.strip().startswith(prefix)
  ]


def _slug(heading):
  """GitHub's anchor for a Markdown heading."""
  return re.sub(r'[^\w\- ]', '', heading.strip().lower()).replace(' ', '-')


def test_readme_is_at_most_6_kb_and_every_link_into_docs_resolves():
  assert os.path.getsize(_README) <= 6 * 1024
  pages = {_README: _read(_README)}
  pages.update(
      (os.path.join(_DOCS, name), _read(os.path.join(_DOCS, name)))
      for name in os.listdir(_DOCS) if name.endswith('.md')
  )
  readme_links = re.findall(r'\]\((docs/[^)]*)\)', pages[_README])
  assert len(readme_links) >= 6, readme_links
  checked = 0
  for page, text in pages.items():
    for target in re.findall(r'\]\(([^)]+)\)', text):
      if re.match(r'[a-z]+:', target):
        continue  # A web address.
      path, _, anchor = target.partition('#')
      path = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
      assert os.path.isfile(path), f'{page}: {target}'
      if anchor:
        headings = re.findall(r'^#+ (.*)$', pages.get(path) or _read(path), re.MULTILINE)
        assert anchor in {_slug(h) for h in headings}, f'{page}: {target}'
      checked += 1
  assert checked >= len(readme_links)


# An absolute path of one machine: its work tree, temporary files or home folders. A
# reader's machine has none of them; a page gives paths relative to the checkout, `~/...`,
# or an example such as `/shared/runs` that says it is one.
_MACHINE_PATH = re.compile(r'(?<![\w.~$/-])/(?:work|tmp|root|home|Users|mnt)(?:/|\b)')


def test_the_readme_and_docs_name_no_path_of_one_machine():
  assert _MACHINE_PATH.findall('--output=/work/notes/b.json, /tmp, ~/.tff, a/tmp/b, /home/x')
  assert len(_MACHINE_PATH.findall('--output=/work/notes/b.json, /tmp, ~/.tff, a/tmp/b')) == 2
  pages = [_README] + sorted(
      os.path.join(_DOCS, name) for name in os.listdir(_DOCS) if name.endswith('.md'))
  found = [
      f'{os.path.relpath(page, _REPO)}:{number}: {line.strip()}'
      for page in pages for number, line in enumerate(_read(page).splitlines(), 1)
      if _MACHINE_PATH.search(line)
  ]
  assert not found, '\n'.join(found)


def test_ci_runs_exactly_the_readmes_test_command():
  (test_command,) = _commands(_COMMAND_PREFIX + 'pytest')
  assert test_command == _COMMAND_PREFIX + 'pytest tests'
  ci_lines = [
      line.strip() for line in _read(os.path.join(_REPO, '.ci', 'run')).splitlines()
      if line.strip() and not line.startswith('#')
  ]
  assert ci_lines[-1] == test_command


def test_the_readmes_train_command_names_flags_launch_train_takes():
  (command,) = _commands(_COMMAND_PREFIX + 'launch.train')
  from launch import train  # pylint: disable=g-import-not-at-top,unused-import
  settings = [a for a in shlex.split(command.split('&&')[1]) if a.startswith('--')]
  assert {'--task=emnist', '--data_source=synthetic'} <= set(settings)
  for setting in settings:
    name, _, value = setting[2:].partition('=')
    assert name in flags.FLAGS, setting
    flags.FLAGS[name].parser.parse(value)  # Raises on a value the flag refuses.


def test_the_benchmark_table_replaces_only_the_marked_section_of_performance_md():
  spec = importlib.util.spec_from_file_location(
      'benchmark_table', os.path.join(_REPO, 'scripts', 'benchmark_table.py')
  )
  benchmark_table = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(benchmark_table)
  report = {
      'command': ['--algos=fedavg', '--output=/home/me/bench.json', '--cache_dir', '/data'],
      'date': '2026-01-02', 'cpus': 2,
      'contenders': {
          'plain_tf': dict(median_s=1.0, bound='plain_tf', peak_rss_mib=900.0,
                           paired=dict(bound=1.0, plain_sgd=1.0, tff_fedavg=0.9)),
          'fedavg': dict(median_s=1.5, bound='plain_tf', peak_rss_mib=2048.4,
                         paired=dict(bound=1.5, plain_sgd=1.5, tff_fedavg=1.2, fedavg=1.0)),
      },
      'scaling': [[10, 1.5], [20, 2.8]], 'concurrency': [[1, 2.0], [-1, 1.5]],
  }
  table = benchmark_table.render(report)
  assert '`python -m launch.benchmark --algos=fedavg`.' in table  # No path of the machine.
  assert '| fedavg | 1.50 s | 1.50 | 1.50 (`plain_tf`) | 1.00 | 2,048 MiB |' in table
  assert '| 20 | 2.80 s | 0.140 s |' in table and '| unlimited | 1.50 s |' in table
  page = _read(os.path.join(_DOCS, 'performance.md'))
  updated = benchmark_table.replace_between_markers(page, table)
  head, tail = page.split(benchmark_table.BEGIN)[0], page.split(benchmark_table.END)[1]
  assert updated == f'{head}{benchmark_table.BEGIN}\n{table}{benchmark_table.END}{tail}'


def test_the_readmes_python_example_runs_as_written(tmp_path):
  (example,) = re.findall(r'```python\n(.*?)```', _read(_README), re.DOTALL)
  assert len(example.splitlines()) <= 10
  # As a user runs it: TF_CPP_MIN_LOG_LEVEL unset, so that TensorFlow's C++ lines and TFF's
  # clean-up at exit would show (issue 28: 41 lines of logs around the two results).
  env = {k: v for k, v in os.environ.items() if k != 'TF_CPP_MIN_LOG_LEVEL'}
  env['HOME'] = str(tmp_path)
  result = subprocess.run(
      [sys.executable, '-c', example], cwd=_REPO, env=env, capture_output=True, text=True,
      timeout=600,
  )
  assert result.returncode == 0, result.stderr
  assert result.stderr == '', result.stderr
  # On a loaded machine writing the data takes long enough for a progress line (by design).
  rounds = [line for line in result.stdout.splitlines()
            if not line.startswith('synthetic emnist data: ')]
  assert [r[:2] for r in rounds] == ['0 ', '1 '], result.stdout
  assert all('sparse_categorical_accuracy' in r for r in rounds), result.stdout
  assert os.path.isdir(tmp_path / '.tff' / 'synthetic')
