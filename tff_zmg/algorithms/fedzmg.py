"""FedZMG and FedZMG-Adam: zero-mean-gradient client momentum SGD.

ALGORITHMS.md section 2 (ZMG-SGDM) and section 4. The client projects every
weight matrix's gradient onto the zero-mean hyperplane before a momentum step
with decoupled weight decay; nothing extra is stored across rounds or sent.
"""

import tensorflow_federated as tff

from tff_zmg.algorithms import compose

_DATASET_REDUCE = tff.learning.LoopImplementation.DATASET_REDUCE


def build_fedzmg(
    model_fn: compose.ModelFn,
    *,
    client_learning_rate: float = 0.01,
    server_learning_rate: float = 1.0,
    client_momentum: float = 0.9,
    weight_decay: float = 1e-4,
    center_vectors: bool = False,
    loop_implementation: tff.learning.LoopImplementation = _DATASET_REDUCE,
) -> tff.learning.templates.LearningProcess:
  """FedZMG: ZMG-SGDM clients with decoupled decay; server SGD; example weights.

      client k:  g~ = P(g)                   (every weight matrix; biases as is)
                 v  <- mu v + g~             (v = 0 at the start of a round)
                 w_k <- w_k - eta_l v - eta_l lambda_wd w_k
      server:    u = sum_k n_k (w^t - w_k) / sum_k n_k
                 w^{t+1} = w^t - eta_g * u

  with `P(G) = G - mean(G, all axes but the last)`. FedZMG paper, eqs. 5-8.

  Defaults: `mu = 0.9`, `lambda_wd = 1e-4` (ALGORITHMS.md section 2),
  `eta_g = 1` (the paper's plain weighted average). `eta_l = 0.01` is our
  choice: its effective step `eta_l / (1 - mu) = 0.1` matches FedAvg's default
  (the paper tunes both rates per task; its values were lost in conversion).

  Args:
    model_fn: A no-arg function returning a new
      `tff.learning.models.VariableModel`.
    client_learning_rate: `eta_l`, > 0.
    server_learning_rate: `eta_g`, > 0.
    client_momentum: `mu` in [0, 1); 0 gives ZMG-SGD.
    weight_decay: `lambda_wd`, >= 0, decoupled (never projected).
    center_vectors: Whether rank-1 biases are centred too.
    loop_implementation: The client training loop.

  Returns:
    A `tff.learning.templates.LearningProcess`.

  Raises:
    ValueError: If a hyperparameter is out of range (checked before any model
      is built).
  """
  return compose.build_process(
      model_fn,
      client_rule='zmg_sgdm',
      server_rule='sgd',
      client_weighting=tff.learning.ClientWeighting.NUM_EXAMPLES,
      client_learning_rate=client_learning_rate,
      server_learning_rate=server_learning_rate,
      client_momentum=client_momentum,
      weight_decay=weight_decay,
      center_vectors=center_vectors,
      loop_implementation=loop_implementation,
  )


def build_fedzmg_adam(
    model_fn: compose.ModelFn,
    *,
    client_learning_rate: float = 0.01,
    server_learning_rate: float = 0.01,
    client_momentum: float = 0.9,
    weight_decay: float = 1e-4,
    center_vectors: bool = False,
    adam_beta_1: float = 0.9,
    adam_beta_2: float = 0.99,
    adam_epsilon: float = 1e-3,
    adam_bias_correction: bool = False,
    loop_implementation: tff.learning.LoopImplementation = _DATASET_REDUCE,
) -> tff.learning.templates.LearningProcess:
  """FedZMG-Adam: FedZMG's clients with FedAdam's server, weighted by examples.

      client k:  as `build_fedzmg`
      server:    u = sum_k n_k (w^t - w_k) / sum_k n_k
                 m <- b1 m + (1 - b1) u ;  v <- b2 v + (1 - b2) u^2
                 w^{t+1} = w^t - eta_g * m / (sqrt(v) + eps)

  The hybrid the FedZMG paper suggests as future work (its discussion).

  Defaults: the client's of `build_fedzmg`, the server's of `build_fedadam`.

  Args:
    model_fn: A no-arg function returning a new
      `tff.learning.models.VariableModel`.
    client_learning_rate: `eta_l`, > 0.
    server_learning_rate: `eta_g`, > 0.
    client_momentum: `mu` in [0, 1).
    weight_decay: `lambda_wd`, >= 0, decoupled.
    center_vectors: Whether rank-1 biases are centred too.
    adam_beta_1: `b1` in [0, 1).
    adam_beta_2: `b2` in [0, 1).
    adam_epsilon: `eps`, > 0.
    adam_bias_correction: Whether to use `m / (1 - b1^t)`, `v / (1 - b2^t)`.
    loop_implementation: The client training loop.

  Returns:
    A `tff.learning.templates.LearningProcess`.

  Raises:
    ValueError: If a hyperparameter is out of range (checked before any model
      is built).
  """
  return compose.build_process(
      model_fn,
      client_rule='zmg_sgdm',
      server_rule='adam',
      client_weighting=tff.learning.ClientWeighting.NUM_EXAMPLES,
      client_learning_rate=client_learning_rate,
      server_learning_rate=server_learning_rate,
      client_momentum=client_momentum,
      weight_decay=weight_decay,
      center_vectors=center_vectors,
      adam_beta_1=adam_beta_1,
      adam_beta_2=adam_beta_2,
      adam_epsilon=adam_epsilon,
      adam_bias_correction=adam_bias_correction,
      loop_implementation=loop_implementation,
  )
