"""The package's programs (`python -m launch.<program>`), and the machinery they run on.

Here, one file each, the programs: `train`, `grid_search`, `compare`, `data_stats`,
`benchmark`, `memory_benchmark`, `worker`, `check_devices`, and `reproduce/` (a program in
a folder of its own: plan, estimate, report). Each is its flags and a short `main`; no
module imports a program. Their machinery, by job:

  run/           one training run: its settings and flags, its folder, identity and
                 resumption, its rounds, who runs them, what it spends, its errors
  sweeps/        many runs: running them some at a time, learning-rate grids and their
                 halving search, comparisons over seeds, the dry run's estimates
  cli/           how every program starts and ends: stop signals, exit statuses,
                 one-line failures
  benchmarking/  what the benchmarks time and measure
  papers/        one file per paper: its protocol, tables and published numbers

TensorFlow's C++ start-up lines would bury every program's output, and `--verbosity`
does not reach them: importing `tasks` here, before any program imports TensorFlow, hides
them unless the user set `TF_CPP_MIN_LOG_LEVEL` (`tasks/quiet.py`, which says why level 3);
`TF_CPP_MIN_LOG_LEVEL=0` shows everything.

Importing TensorFlow makes Keras write `~/.keras/keras.json` (`$KERAS_HOME/keras.json`)
when there is none, its defaults and nothing of the user's; a program removes the one its
import made when it exits, however it exits but by SIGKILL (`remove_new_keras_config`),
so that no run leaves it in the user's home. A keras.json that was there, or a
`KERAS_HOME` of the user's, is theirs: read by Keras and left alone.

A program's first seconds go to imports (TensorFlow's, TFF's). Started as `python -m
launch.<program>`, the import of this package first makes a stop end it at once with its
one line and status 130 (`launch.cli.stops.end_at_once_while_starting`): nothing has been
written yet, but keras.json, which is removed first.
"""

import atexit
import contextlib
import os
import sys

from launch.cli import stops  # Imports only the standard library: safe before TensorFlow.

# Where Keras 2.14 writes it (the end of keras/src/backend.py), looked at before the import
# of TensorFlow below.
_KERAS_DIR = os.path.expanduser(os.environ.get('KERAS_HOME') or os.path.join('~', '.keras'))
_KERAS_DIR_EXISTED = os.path.lexists(_KERAS_DIR)
_KERAS_CONFIG_EXISTED = os.path.lexists(os.path.join(_KERAS_DIR, 'keras.json'))

# Python sets sys.argv to ['-m'] while it finds the module `-m` names (its documented
# behaviour): this package is then being imported on the way to running a program.
_PROGRAM = (sys.orig_argv[sys.orig_argv.index('-m') + 1].rpartition('.')[2]
            if sys.argv[:1] == ['-m'] and '-m' in sys.orig_argv[:-1] else None)


def remove_new_keras_config() -> None:
  """Removes keras.json (and its folder, when empty) if they appeared since this import."""
  if not _KERAS_CONFIG_EXISTED:
    with contextlib.suppress(OSError):
      os.remove(os.path.join(_KERAS_DIR, 'keras.json'))
  if not _KERAS_DIR_EXISTED:
    with contextlib.suppress(OSError):
      os.rmdir(_KERAS_DIR)


if _PROGRAM is not None:
  stops.end_at_once_while_starting(_PROGRAM, remove_new_keras_config)
  atexit.register(remove_new_keras_config)

# pylint: disable=g-import-not-at-top,wrong-import-position,unused-import
import tasks  # Hides TensorFlow's C++ logs before it loads (tasks/quiet.py).
