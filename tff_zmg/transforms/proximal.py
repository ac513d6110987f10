"""The proximal term of FedProx (Li et al., "Federated Optimization in Heterogeneous
Networks", MLSys 2020, eq. 2).

A client minimizes `h_k(w) = F_k(w) + (mu / 2) ||w - w^t||^2`, the round's starting
model `w^t` the anchor, so a local step's gradient is

    grad h_k(w) = g + mu (w - w^t)

which pulls the client back towards `w^t` (`mu >= 0`; `mu = 0` leaves `g`).
"""

import tensorflow as tf


def proximal_gradient(gradient, weights, anchor, proximal_strength):
  """`g + mu (w - w^t)`, for one tensor (a dense result: the pull touches every entry).

  Args:
    gradient: `g`, a tensor or `tf.IndexedSlices`.
    weights: `w`, the current weights.
    anchor: `w^t`, the weights the round started from.
    proximal_strength: `mu >= 0`.
  """
  return tf.convert_to_tensor(gradient) + proximal_strength * (weights - anchor)
