"""tff_zmg: gradient-projection and gradient-correction federated optimizers for TFF.

Importing the package runs nothing: TFF's default execution context stays TFF's own, and no
worker or signal handler is installed (the one exit hook, of `tasks`, lets TFF's own clean-up
run quietly: `tasks/quiet.py`). `tff_zmg.set_default_execution_context()`
makes a managed local worker, stopped at exit, the default for the rest of the program
(`with tff_zmg.execution_context():` for a block); without either, computations run on
TFF's own context, whose worker may outlive the program (see `tff_zmg.runtime.cpp_worker`).

The public API, everything a notebook or script needs (see notebooks/):

* composing processes: `build_process(model_fn, client_rule, server_rule, ...)` with the
  rules of `CLIENT_RULES` and `SERVER_RULES`; the named algorithms' builders, each
  `build_` + its `--algo` name (`build_fedavg`, `build_fedzmg`, `build_gcfed`,
  `build_fedrkmgc`, ...; `build_fed_rkmgc`, the deprecated name of `build_fedrkmgc`, is
  kept for a while) and `registry` (`registry.build(name, model_fn, **hparams)`,
  `ALGORITHMS`);
* running them: `execution_context()` (a managed local TFF worker, stopped on exit),
  `set_default_execution_context()`, `in_process_context()` (this process's TensorFlow, on
  its CPU or GPUs), `runtime`;
* the blocks: `zero_mean_projection`, `optimizers`;
* aggregating: `aggregation` (DP, compressed and robust aggregators for every algorithm,
  `registry.build(..., aggregator=aggregation.AggregatorSettings(...))`; epsilon; the
  bytes each client sends and receives);
* results: `analysis` (metrics, paired t-tests, tables, plots, reading runs).

Tasks (data and models) are the sibling package `tasks` (`tasks.get(name, ...)`).
"""

# First: hides TensorFlow's C++ logs before it loads and makes TFF's clean-up quiet at exit
# (tasks/quiet.py).
import tasks  # pylint: disable=unused-import

from tff_zmg import runtime
from tff_zmg.runtime import cpp_worker
from tff_zmg import optimizers
from tff_zmg.transforms import projection
from tff_zmg import validation
from tff_zmg.runtime.cpp_worker import execution_context
from tff_zmg.runtime.cpp_worker import set_default_execution_context
from tff_zmg.runtime.in_process import in_process_context
from tff_zmg.transforms.projection import zero_mean_projection
from tff_zmg import algorithms
from tff_zmg.algorithms import ALGORITHMS
from tff_zmg.algorithms import build_fed_rkmgc  # Deprecated: build_fedrkmgc.
from tff_zmg.algorithms import build_fedadam
from tff_zmg.algorithms import build_fedavg
from tff_zmg.algorithms import build_fedgps
from tff_zmg.algorithms import build_fedrkmgc
from tff_zmg.algorithms import build_fedzmg
from tff_zmg.algorithms import build_fedzmg_adam
from tff_zmg.algorithms import build_gcfed
from tff_zmg.algorithms import build_global_gc
from tff_zmg.algorithms import build_local_gc
from tff_zmg.algorithms import build_fedadagrad
from tff_zmg.algorithms import build_fedprox
from tff_zmg.algorithms import build_fedyogi
from tff_zmg.algorithms import build_fedzmg_prox
from tff_zmg.algorithms import build_fedzmg_scaffold
from tff_zmg.algorithms import build_fedzmg_yogi
from tff_zmg.algorithms import build_mime_lite
from tff_zmg.algorithms import build_scaffold
from tff_zmg.algorithms import build_process
from tff_zmg.algorithms import CLIENT_RULES
from tff_zmg.algorithms import registry
from tff_zmg.algorithms import SERVER_RULES
from tff_zmg import aggregation
from tff_zmg import analysis

__all__ = [
    'ALGORITHMS',
    'CLIENT_RULES',
    'SERVER_RULES',
    'aggregation',
    'algorithms',
    'analysis',
    'build_fed_rkmgc',
    'build_fedadam',
    'build_fedavg',
    'build_fedgps',
    'build_fedrkmgc',
    'build_fedzmg',
    'build_fedzmg_adam',
    'build_gcfed',
    'build_global_gc',
    'build_local_gc',
    'build_fedadagrad',
    'build_fedprox',
    'build_fedyogi',
    'build_fedzmg_prox',
    'build_fedzmg_scaffold',
    'build_fedzmg_yogi',
    'build_mime_lite',
    'build_scaffold',
    'build_process',
    'runtime',
    'execution_context',
    'in_process_context',
    'optimizers',
    'projection',
    'registry',
    'set_default_execution_context',
    'validation',
    'zero_mean_projection',
]
