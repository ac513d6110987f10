"""SCAFFOLD's control variates (Karimireddy et al., "SCAFFOLD: Stochastic Controlled
Averaging for Federated Learning", ICML 2020, Algorithm 1 with option II).

Each client `i` keeps `c_i`, the server keeps `c` (both zero at the start). With `x` the
round's model and `y_i` the client's model after its `K_i` local steps of rate `eta_l`:

    local step:      y <- y - eta_l (g(y) - c_i + c)
    client, after:   c_i+ = c_i - c + (x - y_i) / (K_i eta_l)        (option II)
    server:          c <- c + (|S| / N) mean_{i in S}(c_i+ - c_i) = c + sum_S(c_i+ - c_i) / N

`N` the number of clients, `S` the round's. Every function is elementwise on one tensor
(NumPy arrays and TF tensors alike).
"""


def controlled_gradient(gradient, client_control, server_control):
  """The direction of a local step, `g - c_i + c`."""
  return gradient - client_control + server_control


def next_client_control(client_control, server_control, delta, steps, learning_rate):
  """Option II: `c_i+ = c_i - c - delta / (K eta_l)`, `delta = y_i - x`, `K >= 1` steps.

  A client that ran no step (`K = 0`) keeps `c_i`; the caller selects that case.
  """
  return client_control - server_control - delta / (steps * learning_rate)


def next_server_control(server_control, control_delta_sum, num_clients):
  """`c + sum_{i in S}(c_i+ - c_i) / N`: `c` stays the mean of all `N` clients' `c_i`."""
  return server_control + control_delta_sum / num_clients
