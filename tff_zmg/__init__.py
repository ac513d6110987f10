"""tff_zmg: gradient-projection and gradient-correction federated optimizers for TFF.

Importing the package makes TFF's default execution context a managed one whose C++
worker is stopped at exit (see `tff_zmg.context`).
"""

from tff_zmg import context
from tff_zmg import optimizers
from tff_zmg import projection
from tff_zmg import validation
from tff_zmg.context import execution_context
from tff_zmg.projection import zero_mean_projection
from tff_zmg import algorithms
from tff_zmg.algorithms import ALGORITHMS
from tff_zmg.algorithms import build_fedadam
from tff_zmg.algorithms import build_fedavg
from tff_zmg.algorithms import build_fedzmg
from tff_zmg.algorithms import build_fedzmg_adam
from tff_zmg.algorithms import build_gcfed
from tff_zmg.algorithms import build_global_gc
from tff_zmg.algorithms import build_local_gc
from tff_zmg.algorithms import build_process
from tff_zmg import analysis
