"""Federated algorithms as TFF learning processes (ALGORITHMS.md section 4).

Each `build_*` composes a client rule and a server rule with
`compose.build_process` (or, for clients that keep state, with
`stateful_clients.compose_stateful_clients_process`); `registry` maps `--algo`
names to them.
"""

from tff_zmg.algorithms import compose
from tff_zmg.algorithms import registry
from tff_zmg.algorithms.compose import build_process
from tff_zmg.algorithms.compose import CLIENT_RULES
from tff_zmg.algorithms.compose import SERVER_RULES
from tff_zmg.algorithms.fedavg import build_fedadam
from tff_zmg.algorithms.fedavg import build_fedavg
from tff_zmg.algorithms.fedgps import build_fedgps
from tff_zmg.algorithms.fedrkmgc import build_fed_rkmgc
from tff_zmg.algorithms.fedzmg import build_fedzmg
from tff_zmg.algorithms.fedzmg import build_fedzmg_adam
from tff_zmg.algorithms.gc_fed import build_gcfed
from tff_zmg.algorithms.gc_fed import build_global_gc
from tff_zmg.algorithms.gc_fed import build_local_gc
from tff_zmg.algorithms.registry import AlgorithmSpec
from tff_zmg.algorithms.registry import ALGORITHMS
from tff_zmg.algorithms.stateful_clients import compose_stateful_clients_process
from tff_zmg.algorithms.stateful_clients import SharedState
from tff_zmg.algorithms.stateful_clients import StatefulClientsLearningProcess
from tff_zmg.algorithms.stateful_clients import StatefulClientsOutput
from tff_zmg.algorithms.stateful_clients import StatefulClientWork

__all__ = [
    'ALGORITHMS',
    'AlgorithmSpec',
    'CLIENT_RULES',
    'SERVER_RULES',
    'build_fedadam',
    'build_fed_rkmgc',
    'build_fedavg',
    'build_fedgps',
    'build_fedzmg',
    'build_fedzmg_adam',
    'build_gcfed',
    'build_global_gc',
    'build_local_gc',
    'build_process',
    'SharedState',
    'StatefulClientWork',
    'StatefulClientsLearningProcess',
    'StatefulClientsOutput',
    'compose',
    'compose_stateful_clients_process',
    'registry',
]
