"""Keeps the libraries' INFO chatter off a program's terminal."""

from absl import flags
from absl import logging
import tensorflow as tf


def quiet_libraries() -> None:
  """TF and TFF log warnings and errors only, unless the user gave --verbosity."""
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)
  tf.get_logger().setLevel('ERROR')
