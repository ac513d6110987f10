"""The package's programs (`python -m launch.<program>`).

TensorFlow's C++ start-up lines would bury every program's output, and `--verbosity`
does not reach them: importing `tasks` here, before any program imports TensorFlow, hides
them unless the user set `TF_CPP_MIN_LOG_LEVEL` (`tasks/quiet.py`, which says why level 3);
`TF_CPP_MIN_LOG_LEVEL=0` shows everything.

Importing TensorFlow makes Keras write `~/.keras/keras.json` (`$KERAS_HOME/keras.json`)
when there is none; a program that refuses its flags or settings (exit status 2) removes
the one it made (`remove_new_keras_config`), since it did nothing the user asked for.
"""

import contextlib
import os

# Where Keras 2.14 writes it (the end of keras/src/backend.py), looked at before the import
# of TensorFlow below.
_KERAS_DIR = os.path.expanduser(os.environ.get('KERAS_HOME') or os.path.join('~', '.keras'))
_KERAS_DIR_EXISTED = os.path.lexists(_KERAS_DIR)
_KERAS_CONFIG_EXISTED = os.path.lexists(os.path.join(_KERAS_DIR, 'keras.json'))

# pylint: disable=g-import-not-at-top,wrong-import-position,unused-import
import tasks  # Hides TensorFlow's C++ logs before it loads (tasks/quiet.py).


def remove_new_keras_config() -> None:
  """Removes keras.json (and its folder, when empty) if they appeared since this import."""
  if not _KERAS_CONFIG_EXISTED:
    with contextlib.suppress(OSError):
      os.remove(os.path.join(_KERAS_DIR, 'keras.json'))
  if not _KERAS_DIR_EXISTED:
    with contextlib.suppress(OSError):
      os.rmdir(_KERAS_DIR)
