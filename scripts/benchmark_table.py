"""Renders launch.benchmark's JSON (its --output) as the tables of docs/performance.md.

  .venv/bin/python -m launch.benchmark --algos=all --repeats=7 --output=bench.json
  .venv/bin/python scripts/benchmark_table.py bench.json                  # prints them
  .venv/bin/python scripts/benchmark_table.py bench.json --write=docs/performance.md

`--write` replaces what lies between the lines `<!-- benchmark-table: begin -->` and
`<!-- benchmark-table: end -->` of that file (with `--section=NAME`, between
`<!-- benchmark-table NAME: begin -->` and `... NAME: end -->`: a second table from another
run), so the published figures are the measured ones, never copied by hand. The command shown
above them leaves out `--output` and `--cache_dir`, paths of the machine that measured them.
Pure Python: reading the JSON needs neither TensorFlow nor TFF.
"""

import argparse
import json
import sys

BEGIN = '<!-- benchmark-table: begin -->'
END = '<!-- benchmark-table: end -->'
# Where one machine kept its data and wrote its report: nothing a reader re-runs needs them,
# and a published page names no path of the machine that measured it.
_MACHINE_FLAGS = ('--output', '--cache_dir')


def _ratio(value) -> str:
  return '' if value is None else f'{value:.2f}'


def shown_command(command) -> list[str]:
  """`command` without the flags that name this machine's paths (`_MACHINE_FLAGS`), in
  either of absl's forms, `--flag=value` and `--flag value`."""
  shown, skip = [], False
  for arg in command:
    if skip:
      skip = False
    elif arg in _MACHINE_FLAGS:
      skip = True
    elif arg.partition('=')[0] not in _MACHINE_FLAGS:
      shown.append(arg)
  return shown


def render(report: dict) -> str:
  """The Markdown tables of one benchmark report (the dict its --output holds)."""
  lines = []
  if report.get('command'):
    lines.append(
        f"Measured {report.get('date', '(date not recorded)')} on {report.get('cpus', '?')}"
        f" CPUs: `python -m launch.benchmark {' '.join(shown_command(report['command']))}`."
    )
    lines.append('')
  lines += [
      '| contender | median round | to the floor (paired) | to own bound (paired)'
      ' | to our fedavg (paired) | peak RSS |',
      '|---|---|---|---|---|---|',
  ]
  for name, result in report['contenders'].items():
    paired = result['paired']
    lines.append(
        f"| {name} | {result['median_s']:.2f} s | {_ratio(paired.get('plain_sgd'))}"
        f" | {_ratio(paired.get('bound'))} (`{result['bound']}`)"
        f" | {_ratio(paired.get('fedavg'))} | {result['peak_rss_mib']:,.0f} MiB |"
    )
  if report.get('scaling'):
    lines += ['', '| clients per round | median round | per client |', '|---|---|---|']
    lines += [f'| {c} | {s:.2f} s | {s / c:.3f} s |' for c, s in report['scaling']]
  if report.get('concurrency'):
    lines += ['', '| `--max_concurrent_clients` | median round |', '|---|---|']
    lines += [
        f"| {'unlimited' if c < 0 else c} | {s:.2f} s |" for c, s in report['concurrency']
    ]
  return '\n'.join(lines) + '\n'


def markers(section=None) -> tuple[str, str]:
  """The BEGIN and END lines of the table (of `section`, a second table, if given)."""
  if section is None:
    return BEGIN, END
  return (f'<!-- benchmark-table {section}: begin -->',
          f'<!-- benchmark-table {section}: end -->')


def replace_between_markers(text: str, table: str, section=None) -> str:
  """`text` with the lines between its BEGIN and END markers replaced by `table`."""
  first, last = markers(section)
  begin, end = text.find(first), text.find(last)
  if begin < 0 or end < begin:
    raise ValueError(f'the file needs the lines {first} and {last}, in that order')
  head = text[:begin + len(first)]
  return f'{head}\n{table}{text[end:]}'


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('report', help='the JSON file launch.benchmark --output wrote')
  parser.add_argument('--write', help='a Markdown file whose marked section to replace')
  parser.add_argument('--section', help='the name of a second marked table in --write')
  args = parser.parse_args(argv)
  with open(args.report) as f:
    table = render(json.load(f))
  if not args.write:
    sys.stdout.write(table)
    return 0
  with open(args.write) as f:
    text = replace_between_markers(f.read(), table, args.section)
  with open(args.write, 'w') as f:
    f.write(text)
  return 0


if __name__ == '__main__':
  sys.exit(main())
