"""Federated algorithms as TFF learning processes (specification.md section 4).

One file per family, each holding its `Hparams` dataclass, its client and server steps
and its `build_*` functions: `fedavg` (FedAvg, FedAdam, FedYogi, FedAdagrad), `fedzmg`
(FedZMG, FedZMG-Adam, FedZMG-Yogi), `fedprox` (FedProx, FedZMG-Prox), `mime_lite`,
`scaffold` (SCAFFOLD, FedZMG-SCAFFOLD), `gcfed` (LocalGC, GlobalGC, GC-Fed), `fedrkmgc`
(FedRKMGC and its ablations), `fedgps` (FedGPS, FedGPS-CF). `registry` maps `--algo` names
to them; `rules.build_process` composes any client step with any server step by name.

One spelling: a builder is `build_` + its `--algo` name (`build_gcfed`, `build_fedrkmgc`),
a family's module the `--algo` name of its first algorithm (`gcfed.py`, `fedrkmgc.py`).
Deprecated, kept importable for a while: the module `gc_fed` (now `gcfed`) and
`build_fed_rkmgc` (now `build_fedrkmgc`).
"""

from tff_zmg.algorithms import registry
from tff_zmg.algorithms import rules
from tff_zmg.algorithms.fedavg import build_fedadagrad
from tff_zmg.algorithms.fedavg import build_fedadam
from tff_zmg.algorithms.fedavg import build_fedavg
from tff_zmg.algorithms.fedavg import build_fedyogi
from tff_zmg.algorithms.fedavg import FedAdagradHparams
from tff_zmg.algorithms.fedavg import FedAdamHparams
from tff_zmg.algorithms.fedavg import FedAvgHparams
from tff_zmg.algorithms.fedavg import FedYogiHparams
from tff_zmg.algorithms.fedgps import build_fedgps
from tff_zmg.algorithms.fedgps import FedGpsHparams
from tff_zmg.algorithms.fedprox import build_fedprox
from tff_zmg.algorithms.fedprox import build_fedzmg_prox
from tff_zmg.algorithms.fedprox import FedProxHparams
from tff_zmg.algorithms.fedprox import FedZmgProxHparams
from tff_zmg.algorithms.fedrkmgc import build_fed_rkmgc  # Deprecated: build_fedrkmgc.
from tff_zmg.algorithms.fedrkmgc import build_fedrkmgc
from tff_zmg.algorithms.fedrkmgc import FedRkmgcHparams
from tff_zmg.algorithms.fedzmg import build_fedzmg
from tff_zmg.algorithms.fedzmg import build_fedzmg_adam
from tff_zmg.algorithms.fedzmg import build_fedzmg_yogi
from tff_zmg.algorithms.fedzmg import FedZmgAdamHparams
from tff_zmg.algorithms.fedzmg import FedZmgHparams
from tff_zmg.algorithms.fedzmg import FedZmgYogiHparams
from tff_zmg.algorithms.gcfed import build_gcfed
from tff_zmg.algorithms.gcfed import build_global_gc
from tff_zmg.algorithms.gcfed import build_local_gc
from tff_zmg.algorithms.gcfed import GcFedHparams
from tff_zmg.algorithms.gcfed import GlobalGcHparams
from tff_zmg.algorithms.gcfed import LocalGcHparams
from tff_zmg.algorithms.mime_lite import build_mime_lite
from tff_zmg.algorithms.mime_lite import MimeLiteHparams
from tff_zmg.algorithms.registry import AlgorithmSpec
from tff_zmg.algorithms.registry import ALGORITHMS
from tff_zmg.algorithms.rules import build_process
from tff_zmg.algorithms.rules import CLIENT_RULES
from tff_zmg.algorithms.rules import SERVER_RULES
from tff_zmg.algorithms.scaffold import build_fedzmg_scaffold
from tff_zmg.algorithms.scaffold import build_scaffold
from tff_zmg.algorithms.scaffold import FedZmgScaffoldHparams
from tff_zmg.algorithms.scaffold import ScaffoldHparams
# The framework parts, where they were before `tff_zmg.templates`.
from tff_zmg.templates.stateful_clients import compose_stateful_clients_process
from tff_zmg.templates.stateful_clients import SharedState
from tff_zmg.templates.stateful_clients import StatefulClientsLearningProcess
from tff_zmg.templates.stateful_clients import StatefulClientsOutput
from tff_zmg.templates.stateful_clients import StatefulClientWork

__all__ = [
    'ALGORITHMS',
    'AlgorithmSpec',
    'CLIENT_RULES',
    'FedAdamHparams',
    'FedAvgHparams',
    'FedGpsHparams',
    'FedRkmgcHparams',
    'FedZmgAdamHparams',
    'FedZmgHparams',
    'GcFedHparams',
    'GlobalGcHparams',
    'LocalGcHparams',
    'SERVER_RULES',
    'FedZmgScaffoldHparams',
    'ScaffoldHparams',
    'build_fedzmg_scaffold',
    'build_scaffold',
    'FedAdagradHparams',
    'FedYogiHparams',
    'FedProxHparams',
    'FedZmgProxHparams',
    'FedZmgYogiHparams',
    'MimeLiteHparams',
    'build_fedadagrad',
    'build_fedyogi',
    'build_fedprox',
    'build_fedzmg_prox',
    'build_fedzmg_yogi',
    'build_mime_lite',
    'build_fedadam',
    'build_fed_rkmgc',
    'build_fedrkmgc',
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
    'compose_stateful_clients_process',
    'registry',
    'rules',
]
