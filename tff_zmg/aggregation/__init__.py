"""How the server aggregates client updates, what it costs in privacy and in bytes.

* `settings`: `AggregatorSettings` (kind: mean, dp_fixed, dp_adaptive, compressed, robust;
  the DP and compression settings), every default and range once, checked; `READS`, the
  fields each kind reads.
* `factories`: one function per kind from TFF's own factories; `model_aggregator(settings,
  weighting)` is what a builder takes as `model_aggregator` (`registry.build(...,
  aggregator=settings)` does it for every algorithm, or refuses in one line).
* `seeded_noise`: TF Privacy's Gaussian queries with their noise drawn from a seed kept in
  the aggregator's state (a resumed DP run redraws the same noise).
* `privacy`: `epsilon(...)` after `n` rounds, from dp_accounting's RDP accountant.
* `communication`: `client_bytes(process)`, the bytes broadcast to and uploaded by one client
  per round, from the round's MapReduceForm types.

docs/privacy_and_communication.md has the formulas and the choices.
"""

from tff_zmg.aggregation.communication import client_bytes
from tff_zmg.aggregation.communication import ClientBytes
from tff_zmg.aggregation.factories import client_weighting
from tff_zmg.aggregation.factories import model_aggregator
from tff_zmg.aggregation.privacy import epsilon
from tff_zmg.aggregation.settings import AggregatorSettings
from tff_zmg.aggregation.settings import DP_KINDS
from tff_zmg.aggregation.settings import KINDS
from tff_zmg.aggregation.settings import READS

__all__ = [
    'AggregatorSettings',
    'ClientBytes',
    'DP_KINDS',
    'KINDS',
    'READS',
    'client_bytes',
    'client_weighting',
    'epsilon',
    'model_aggregator',
]
