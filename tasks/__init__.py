"""Federated tasks: EMNIST-62, CIFAR-100 and Shakespeare with the papers' models."""

from tasks.registry import get
from tasks.registry import SPECS
from tasks.registry import Task
from tasks.registry import TASK_NAMES
from tasks.registry import TaskSpec
from tasks.sources import CorruptDataError
from tasks.sources import MissingDataError
