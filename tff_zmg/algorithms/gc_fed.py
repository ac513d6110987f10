"""Deprecated module name: use `tff_zmg.algorithms.gcfed`.

Modules and builders are spelt after the `--algo` name (`gcfed.py`, `build_gcfed`); this
alias keeps `from tff_zmg.algorithms import gc_fed` and its public names working for a
while and will be removed.
"""

# pylint: disable=unused-import
from tff_zmg.algorithms.fedavg import client_sgdm
from tff_zmg.algorithms.gcfed import build_gcfed
from tff_zmg.algorithms.gcfed import build_global_gc
from tff_zmg.algorithms.gcfed import build_local_gc
from tff_zmg.algorithms.gcfed import GcFedHparams
from tff_zmg.algorithms.gcfed import global_gc
from tff_zmg.algorithms.gcfed import GlobalGcHparams
from tff_zmg.algorithms.gcfed import local_gc
from tff_zmg.algorithms.gcfed import LocalGcHparams
