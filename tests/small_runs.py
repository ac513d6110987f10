"""Flags of the small synthetic `launch.train` runs the program tests start."""

import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Six EMNIST-shaped clients of twelve examples, three a round, two for evaluation: a round
# takes seconds.
FLAGS = [
    '--data_source=synthetic',
    '--synthetic_train_clients=6',
    '--synthetic_test_clients=2',
    '--synthetic_examples_per_client=12',
    '--clients_per_round=3',
]
