"""LocalGC SGDM: projected momentum SGD with coupled L2, GC-Fed's client rule.

The GC-Fed authors' order (specification.md section 2):

    d = M(P(g)) + weight_decay * w     (L2 added after the projection)
    v <- mu * v + d                    (v = 0 on `initialize`)
    w <- w - lr * v

`M` applies the zero-mean projection `P` only to masked tensors (GC-Fed's
feature layers, see `tff_zmg.transforms.projection.layer_borderline_mask`); the other
tensors keep their raw gradient. Unlike ZMG-SGDM the decay is part of `d` and
so of the momentum. The GC-Fed paper's values are the defaults of
`tff_zmg.algorithms.gcfed.LocalGcHparams`; without a mask every rank >= 2 tensor is
projected. Implemented by
`projected_sgdm.ProjectedSgdm` with `decoupled_weight_decay=False`.
"""

from collections.abc import Sequence
from typing import Optional

import tensorflow_federated as tff

from tff_zmg.optimizers import projected_sgdm


def build_local_gc_sgdm(
    learning_rate: float,
    momentum: float,
    weight_decay: float,
    mask: Optional[Sequence[bool]] = None,
    center_vectors: bool = False,
) -> tff.learning.optimizers.Optimizer:
  """Returns GC-Fed's LocalGC client optimizer (see the module docstring).

  Args:
    learning_rate: Client learning rate `lr`, > 0.
    momentum: Momentum `mu` in [0, 1); 0 drops the accumulator.
    weight_decay: Coupled L2 coefficient, >= 0, added after the projection.
    mask: `None` (project every rank >= 2 tensor) or one bool per weight
      tensor in `tf.nest.flatten` order, True for feature-layer tensors.
    center_vectors: Whether masked rank-1 tensors (biases) are centred too.

  Raises:
    ValueError: If a hyperparameter is out of range.
  """
  return projected_sgdm.ProjectedSgdm(
      learning_rate, momentum, weight_decay, mask, center_vectors,
      decoupled_weight_decay=False,
  )
