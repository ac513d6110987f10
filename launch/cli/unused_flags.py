"""Flags a program defines but would not use, refused at its door.

A program gets flags from the modules it imports (every sweep gets `launch.train`'s and
the runner's), and some apply only beside another flag (`--cells_per_gpu` with
`--ray_address`). One given where nothing reads it would be ignored without a word, and the
user would believe it took effect: `refuse` stops the program first, in one line (exit
status 2).
"""

from typing import Iterable

from absl import flags


def refuse(names: Iterable[str], reason: str) -> None:
  """Refuses the first of the flags `names` that the command line gives.

  Raises:
    ValueError: '--<name> <reason>', e.g. reason 'applies only with --ray_address'.
  """
  given = [name for name in names if flags.FLAGS[name].present]
  if given:
    raise ValueError(f'--{given[0]} {reason}')
