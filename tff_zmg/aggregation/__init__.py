"""How the server aggregates client updates: TFF's DP, compression and robust aggregators.

* `settings`: `AggregatorSettings` (kind: mean, dp_fixed, dp_adaptive, compressed, robust;
  the DP and compression settings), every default and range once, checked.
* `factories`: one function per kind from TFF's own factories; `model_aggregator(settings,
  weighting)` is what a builder takes as `model_aggregator` (`registry.build(...,
  aggregator=settings)` does it for every algorithm, or refuses in one line).
* `seeded_noise`: TF Privacy's Gaussian queries with their noise drawn from a seed kept in
  the aggregator's state (a resumed DP run redraws the same noise).
"""

from tff_zmg.aggregation.factories import client_weighting
from tff_zmg.aggregation.factories import model_aggregator
from tff_zmg.aggregation.settings import AggregatorSettings
from tff_zmg.aggregation.settings import DP_KINDS
from tff_zmg.aggregation.settings import KINDS

__all__ = [
    'AggregatorSettings',
    'DP_KINDS',
    'KINDS',
    'client_weighting',
    'model_aggregator',
]
