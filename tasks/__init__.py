"""Federated tasks: EMNIST-62, CIFAR-100, Shakespeare, and tfds CIFAR-10/100 partitioned."""

from tasks import quiet

quiet.quiet_tensorflow()  # Before anything below imports TensorFlow (tasks/quiet.py).

# pylint: disable=g-import-not-at-top,wrong-import-position
from tasks.registry import CENTRALIZED_TASK_NAMES
from tasks.registry import get
from tasks.registry import MODEL_NAMES
from tasks.registry import MODELS
from tasks.registry import SPECS
from tasks.registry import Task
from tasks.registry import TASK_NAMES
from tasks.registry import TFF_TASK_NAMES
from tasks.registry import training_volumes
from tasks.registry import TaskSpec
from tasks.sources import CorruptDataError
from tasks.sources import MissingDataError

quiet.register_tff_cleanup()
