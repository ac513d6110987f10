"""The framework code: how parts become TFF processes, with no algorithm in it.

`compose.compose_process(model_fn, client_optimizer, server_optimizer, weighting)`: TFF's
four-part composition; `stateful_clients`: processes whose clients keep state across
rounds; `cells`: K cells of one composed process (a learning-rate grid's) trained as one
computation; `hparams`: the hyperparameter dataclasses' fields, ranges and validation.
Nothing here imports `tff_zmg.algorithms`.
"""

from tff_zmg.templates import cells
from tff_zmg.templates import compose
from tff_zmg.templates import hparams
from tff_zmg.templates import stateful_clients
from tff_zmg.templates.compose import compose_process

__all__ = ['cells', 'compose', 'compose_process', 'hparams', 'stateful_clients']
