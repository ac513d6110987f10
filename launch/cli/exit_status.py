"""Every program's exit statuses, defined once.

docs/operations.md ("Exit statuses") shows `TABLE` as it is here (a test compares them);
each program's docstring points there and says only what a status means for it in
particular. A program that runs others (`launch.sweeps.runner`) passes on their status
when it is one of `DOCUMENTED`.
"""

OK = 0
UNEXPECTED = 1
BAD_INPUT = 2
DIVERGED = 3
WORKER_LOST = 4
ENVIRONMENT = 5
INTERRUPTED = 130

# status -> what it means and what to do: a row of the table in docs/operations.md.
TABLE = {
    OK: 'done',
    UNEXPECTED: 'an unexpected failure, a bug: the line names the exception; please report it'
                ' with `--verbose`, which adds the traceback',
    BAD_INPUT: 'bad input: a flag (unknown, malformed, missing, out of range), settings or'
               ' data (missing, damaged) the program refuses, an output folder that is not'
               " the program's own, an unreachable remote worker",
    DIVERGED: 'training diverged; the last good checkpoint is kept',
    WORKER_LOST: 'a worker was lost mid-run (a TFF worker, a sweep\'s warm slot that died'
                 ' twice, its Ray cluster); re-run the same command to resume',
    ENVIRONMENT: 'the machine refused: a full disk, a folder or file that cannot be written'
                 ' (permissions, read-only, immutable), a file where a folder belongs; the'
                 ' line names the cause ("No space left on device"); fix it and re-run the'
                 ' same command to resume',
    INTERRUPTED: 'interrupted by Ctrl-C, SIGTERM or SIGHUP: the line says what is kept'
                 ' (`train: error: interrupted after round K; re-run the same command to'
                 ' resume`, K the checkpoint it resumes from)',
}
DOCUMENTED = frozenset(TABLE) - {OK}


def markdown_table() -> str:
  """`TABLE` as docs/operations.md shows it."""
  rows = ['| status | meaning |', '|---|---|']
  rows += [f'| {status} | {meaning} |' for status, meaning in TABLE.items()]
  return '\n'.join(rows)
