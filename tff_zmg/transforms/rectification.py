"""FedGPS's non-self gradient rectification (specification.md section 2; paper eq. 7).

Last round's `K` clients produced positive deltas `delta_k = w_k - w^{t-1}`; the
server broadcasts their mean `Dbar`. A client takes every local gradient at a point
shifted towards what the *other* clients did:

    d   = non_self_direction(Dbar, delta_own, K, took_part)
    g   = grad F_k(w + lambda_g * d / ||d||)        (||.||: global L2 norm)
    w  <- optimizer step from w with g

    d, p = non_self_direction(...), look_ahead_offset(d, 0.5)
"""

import tensorflow as tf


def non_self_direction(mean_update, own_update, num_clients, took_part):
  """The mean update of last round's clients other than this one.

      d = (K * Dbar - delta_own) / (K - 1)   took part last round, K >= 2
      d = 0                                   took part and was the only client
      d = Dbar                                did not take part (or K = 0)

  Args:
    mean_update: `Dbar`, a structure of tensors (zeros before round 1).
    own_update: `delta_own`, the client's own positive delta of last round,
      same structure (ignored unless `took_part`).
    num_clients: `K`, how many clients `Dbar` averages (scalar).
    took_part: Whether the client was one of them (scalar bool).

  Returns:
    `d`, the structure of `mean_update`.
  """
  k = tf.cast(num_clients, tf.float32)
  exclude = tf.logical_and(tf.convert_to_tensor(took_part), k >= 2.0)
  alone = tf.logical_and(tf.convert_to_tensor(took_part), k < 2.0)

  def direction(mean, own):
    others = tf.math.divide_no_nan(k * mean - own, k - 1.0)
    return tf.where(exclude, others, tf.where(alone, tf.zeros_like(mean), mean))

  return tf.nest.map_structure(direction, mean_update, own_update)


def look_ahead_offset(direction, lambda_g: float):
  """`p = lambda_g * d / ||d||` (global L2 norm over all tensors); 0 if `d = 0`."""
  tensors = tf.nest.flatten(direction)
  scale = tf.math.divide_no_nan(
      tf.constant(lambda_g, tf.float32), tf.linalg.global_norm(tensors)
  )
  return tf.nest.map_structure(lambda t: scale * t, direction)
