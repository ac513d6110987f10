"""Keras's GRU over a whole sequence, with its weight gradients summed over time in one product.

The math is that of `tf.keras.layers.GRU` with its defaults (`reset_after=True`, tanh and
sigmoid, no mask), per step t with h_0 the initial state:

    [x_z, x_r, x_h] = x_t W + b_in          [u_z, u_r, u_h] = h_{t-1} U + b_rec
    z = sigmoid(x_z + u_z)    r = sigmoid(x_r + u_r)    c = tanh(x_h + r * u_h)
    h_t = z * h_{t-1} + (1 - z) * c

Why not Keras's own loop: TensorFlow differentiates a while loop step by step, and for a weight
the loop reads at every step that means adding a full-size gradient of W and of U at each of
the T steps (80 for Shakespeare, U being 1024 x 3072): the backward pass of the papers'
Shakespeare GRU took 14x its forward pass, bound by memory traffic. Here the backward loop
only carries the per-step gradients of the gate pre-activations (batch x 3H each) and the
weight gradients are two matrix products after the loop:

    dU = sum_t h_{t-1}^T du_t        dW = sum_t x_t^T dx_t
    db_rec = sum_t du_t              db_in = sum_t dx_t

where du_t = [da_z, da_r, dc * (1 - c^2) * r] and dx_t = [da_z, da_r, dc * (1 - c^2)] with
da_z = dh_t (h_{t-1} - c) z (1 - z), da_r = dc (1 - c^2) u_h r (1 - r), dc = dh_t (1 - z); and
dh_{t-1} = dh_t z + du_t U^T (+ the gradient arriving at output t-1).
"""

import tensorflow as tf


def _gates(matrix_x, matrix_inner):
  """(z, r, c, u_h) from x W + b_in and h_prev U + b_rec (gates on the last axis)."""
  x_z, x_r, x_h = tf.split(matrix_x, 3, axis=-1)
  u_z, u_r, u_h = tf.split(matrix_inner, 3, axis=-1)
  z = tf.sigmoid(x_z + u_z)
  r = tf.sigmoid(x_r + u_r)
  return z, r, tf.tanh(x_h + r * u_h), u_h


def _time_loop(step, length, initial, sequences_out):
  """Runs `step(t, carry) -> (carry, per-step outputs)` for t in [0, length), stacking outputs.

  Every per-step output is a matrix. Saying so gives each array's shape input a rank: an
  array of unknown rank has the scalar -1 there, which the in-process runtime's import of a
  client loop over an iterator (lowered while loops, ops copied one at a time) cannot read.
  """
  arrays = tuple(
      tf.TensorArray(dtype, size=length, element_shape=tf.TensorShape([None, None]))
      for dtype in sequences_out
  )

  def body(t, carry, arrays):
    carry, outs = step(t, carry)
    return t + 1, carry, tuple(a.write(t, o) for a, o in zip(arrays, outs))

  _, carry, arrays = tf.while_loop(
      lambda t, *_: t < length, body, (tf.constant(0), initial, arrays)
  )
  return carry, tuple(a.stack() for a in arrays)


@tf.custom_gradient
def gru_sequence(inputs, initial_h, kernel, recurrent_kernel, bias):
  """Keras's GRU (reset_after) over time-major `inputs` [T, B, I] from `initial_h` [B, H].

  Args:
    inputs: [T, B, I] inputs, time first.
    initial_h: [B, H] state before the first step.
    kernel: W, [I, 3H], gates in Keras's order (z, r, h).
    recurrent_kernel: U, [H, 3H].
    bias: [2, 3H]: b_in and b_rec.

  Returns:
    The states h_1..h_T, [T, B, H]; its gradient is the module's formulas.
  """
  length = tf.shape(inputs)[0]
  batch = tf.shape(inputs)[1]
  units = tf.shape(recurrent_kernel)[0]
  input_bias, recurrent_bias = bias[0], bias[1]
  # All steps' input projections in one product (Keras makes one per step).
  matrix_x = tf.reshape(
      tf.matmul(tf.reshape(inputs, [length * batch, -1]), kernel) + input_bias,
      [length, batch, 3 * units],
  )

  def forward_step(t, h_prev):
    z, _, c, _ = _gates(matrix_x[t], tf.matmul(h_prev, recurrent_kernel) + recurrent_bias)
    h = z * h_prev + (1 - z) * c
    return h, (h,)

  dtype = inputs.dtype
  _, (states,) = _time_loop(forward_step, length, initial_h, (dtype,))

  def grad(d_states):
    previous = tf.concat([initial_h[tf.newaxis], states[:-1]], axis=0)  # h_{t-1}, [T, B, H]
    # The gates again, for all steps in one product: the forward pass keeps only the states,
    # so that a forward pass alone (an evaluation) stores nothing else.
    matrix_inner = tf.reshape(
        tf.matmul(tf.reshape(previous, [length * batch, units]), recurrent_kernel)
        + recurrent_bias,
        [length, batch, 3 * units],
    )
    z, r, c, u_h = _gates(matrix_x, matrix_inner)
    # U^T once: a product with transpose_b inside the loop transposes U at every step.
    recurrent_kernel_t = tf.transpose(recurrent_kernel)

    def backward_step(i, dh_next):
      t = length - 1 - i
      dh = dh_next + d_states[t]
      dc = dh * (1 - z[t])
      da_h = dc * (1 - tf.square(c[t]))
      da_z = dh * (previous[t] - c[t]) * z[t] * (1 - z[t])
      da_r = da_h * u_h[t] * r[t] * (1 - r[t])
      d_inner = tf.concat([da_z, da_r, da_h * r[t]], axis=1)
      d_matrix_x = tf.concat([da_z, da_r, da_h], axis=1)
      dh_prev = dh * z[t] + tf.matmul(d_inner, recurrent_kernel_t)
      return dh_prev, (d_inner, d_matrix_x)

    d_initial, (d_inner, d_matrix_x) = _time_loop(
        backward_step, length, tf.zeros_like(initial_h), (dtype, dtype)
    )
    # The loop ran t = T-1 .. 0; put the steps back in time order.
    d_inner = tf.reshape(tf.reverse(d_inner, [0]), [length * batch, 3 * units])
    d_matrix_x = tf.reshape(tf.reverse(d_matrix_x, [0]), [length * batch, 3 * units])
    flat_inputs = tf.reshape(inputs, [length * batch, -1])
    d_kernel = tf.matmul(flat_inputs, d_matrix_x, transpose_a=True)
    d_recurrent = tf.matmul(
        tf.reshape(previous, [length * batch, units]), d_inner, transpose_a=True
    )
    d_bias = tf.stack([tf.reduce_sum(d_matrix_x, 0), tf.reduce_sum(d_inner, 0)])
    d_inputs = tf.reshape(
        tf.matmul(d_matrix_x, kernel, transpose_b=True), tf.shape(inputs)
    )
    return d_inputs, d_initial, d_kernel, d_recurrent, d_bias

  return states, grad
