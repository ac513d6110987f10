"""ZMG-SGDM: zero-mean-gradient momentum SGD with decoupled weight decay.

The FedZMG client rule (FedZMG paper, eqs. 5-7; specification.md section 2):

    g~ = P(g)                                  (zero-mean projection)
    v  <- mu * v + g~                          (v = 0 on `initialize`)
    w  <- w - lr * v - lr * weight_decay * w   (decoupled decay)

The decay term never enters `g~` or `v`. With `momentum = 0` it is plain
ZMG-SGD and the state holds no accumulator. FedZMG's values are the defaults of
`tff_zmg.algorithms.fedzmg.FedZmgHparams`; without a mask every rank >= 2 tensor is
projected. Implemented by
`projected_sgdm.ProjectedSgdm` with `decoupled_weight_decay=True`.
"""

from collections.abc import Sequence
from typing import Optional

import tensorflow_federated as tff

from tff_zmg.optimizers import projected_sgdm


def build_zmg_sgdm(
    learning_rate: float,
    momentum: float,
    weight_decay: float,
    mask: Optional[Sequence[bool]] = None,
    center_vectors: bool = False,
) -> tff.learning.optimizers.Optimizer:
  """Returns the FedZMG client optimizer (see the module docstring).

  Args:
    learning_rate: Client learning rate `lr`, > 0.
    momentum: Momentum `mu` in [0, 1); 0 gives plain ZMG-SGD.
    weight_decay: Decoupled weight decay, >= 0.
    mask: `None` (project every rank >= 2 tensor) or one bool per weight
      tensor in `tf.nest.flatten` order; unmasked tensors take the plain step.
    center_vectors: Whether rank-1 tensors (biases) are centred too.

  Raises:
    ValueError: If a hyperparameter is out of range.
  """
  return projected_sgdm.ProjectedSgdm(
      learning_rate, momentum, weight_decay, mask, center_vectors,
      decoupled_weight_decay=True,
  )
