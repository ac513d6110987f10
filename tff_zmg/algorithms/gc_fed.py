"""LocalGC, GlobalGC, GC-Fed: gradient centralization on clients and/or server.

Seo et al., "GC-Fed: Gradient Centralized Federated Learning with Partial
Client Participation" (arXiv 2503.13180); ALGORITHMS.md sections 1-4. `P`
centres every output column of a weight matrix (biases as is); the layers are
split by the borderline `gc_lambda` into feature layers (the first
`floor(gc_lambda * L)`) and classifier layers (the rest), default: every layer
but the last is a feature layer. Client updates are averaged uniformly
(Algorithm 1, line 13).

Defaults from the paper's training setup (section 4.1): client SGD with
`eta_l = 0.01`, momentum 0.9, weight decay 1e-5 (5 local epochs, batch 50:
task settings, not algorithm ones), and `eta_g = 1` (Algorithm 1, line 15:
`w^{t+1} = w^t + P(Delta)`).
"""

from typing import Optional

import tensorflow_federated as tff

from tff_zmg.algorithms import compose

_DATASET_REDUCE = tff.learning.LoopImplementation.DATASET_REDUCE


def build_local_gc(
    model_fn: compose.ModelFn,
    *,
    client_learning_rate: float = 0.01,
    server_learning_rate: float = 1.0,
    client_momentum: float = 0.9,
    weight_decay: float = 1e-5,
    local_gc_layers: str = 'all',
    gc_lambda: Optional[float] = None,
    center_vectors: bool = False,
    loop_implementation: tff.learning.LoopImplementation = _DATASET_REDUCE,
) -> tff.learning.templates.LearningProcess:
  """LocalGC: projected client SGDM with coupled L2; server SGD; uniform mean.

      client k:  d = M(P(g)) + lambda_wd w_k     (M: `local_gc_layers`)
                 v <- mu v + d ;  w_k <- w_k - eta_l v
      server:    u = mean_k (w^t - w_k) ;  w^{t+1} = w^t - eta_g * u

  GC-Fed paper, section 3.3, Definition 1 ("Local GC"), in the authors'
  order (L2 added after the projection). Defaults: see the module docstring;
  every layer projected.

  Args:
    model_fn: A no-arg function returning a new
      `tff.learning.models.VariableModel`.
    client_learning_rate: `eta_l`, > 0.
    server_learning_rate: `eta_g`, > 0.
    client_momentum: `mu` in [0, 1).
    weight_decay: `lambda_wd`, >= 0, coupled L2.
    local_gc_layers: 'all' or 'feature': the layers clients project.
    gc_lambda: The borderline in [0, 1] for 'feature'; `None`: all layers but
      the last. Unused with 'all'.
    center_vectors: Whether projected layers' rank-1 biases are centred too.
    loop_implementation: The client training loop.

  Returns:
    A `tff.learning.templates.LearningProcess`.

  Raises:
    ValueError: If a hyperparameter is out of range (checked before any model
      is built).
  """
  return compose.build_process(
      model_fn,
      client_rule='local_gc',
      server_rule='sgd',
      client_weighting=tff.learning.ClientWeighting.UNIFORM,
      client_learning_rate=client_learning_rate,
      server_learning_rate=server_learning_rate,
      client_momentum=client_momentum,
      weight_decay=weight_decay,
      local_gc_layers=local_gc_layers,
      gc_lambda=gc_lambda,
      center_vectors=center_vectors,
      loop_implementation=loop_implementation,
  )


def build_global_gc(
    model_fn: compose.ModelFn,
    *,
    client_learning_rate: float = 0.01,
    server_learning_rate: float = 1.0,
    client_momentum: float = 0.9,
    global_gc_layers: str = 'all',
    gc_lambda: Optional[float] = None,
    center_vectors: bool = False,
    loop_implementation: tff.learning.LoopImplementation = _DATASET_REDUCE,
) -> tff.learning.templates.LearningProcess:
  """GlobalGC: client SGDM; the server projects the uniform mean update.

      client k:  v <- mu v + g ;  w_k <- w_k - eta_l v
      server:    u = mean_k (w^t - w_k)
                 w^{t+1} = w^t - eta_g * M'(P(u))   (M': `global_gc_layers`)

  GC-Fed paper, section 3.3, Definition 2 ("Global GC"). Defaults: see the
  module docstring; every layer projected. The client rule is TFF's momentum
  SGD, which has no weight decay: the paper's 1e-5 is left out (ALGORITHMS.md
  section 4 names the client rule SGDM).

  Args:
    model_fn: A no-arg function returning a new
      `tff.learning.models.VariableModel`.
    client_learning_rate: `eta_l`, > 0.
    server_learning_rate: `eta_g`, > 0.
    client_momentum: `mu` in [0, 1).
    global_gc_layers: 'all' or 'classifier': the layers the server projects.
    gc_lambda: The borderline in [0, 1] for 'classifier'; `None`: the last
      layer. Unused with 'all'.
    center_vectors: Whether projected layers' rank-1 biases are centred too.
    loop_implementation: The client training loop.

  Returns:
    A `tff.learning.templates.LearningProcess`.

  Raises:
    ValueError: If a hyperparameter is out of range (checked before any model
      is built).
  """
  return compose.build_process(
      model_fn,
      client_rule='sgdm',
      server_rule='global_gc',
      client_weighting=tff.learning.ClientWeighting.UNIFORM,
      client_learning_rate=client_learning_rate,
      server_learning_rate=server_learning_rate,
      client_momentum=client_momentum,
      global_gc_layers=global_gc_layers,
      gc_lambda=gc_lambda,
      center_vectors=center_vectors,
      loop_implementation=loop_implementation,
  )


def build_gcfed(
    model_fn: compose.ModelFn,
    *,
    client_learning_rate: float = 0.01,
    server_learning_rate: float = 1.0,
    client_momentum: float = 0.9,
    weight_decay: float = 1e-5,
    gc_lambda: Optional[float] = None,
    local_gc_layers: str = 'feature',
    global_gc_layers: str = 'classifier',
    center_vectors: bool = False,
    loop_implementation: tff.learning.LoopImplementation = _DATASET_REDUCE,
) -> tff.learning.templates.LearningProcess:
  """GC-Fed: LocalGC on the feature layers, GlobalGC on the classifier layers.

      client k:  d = M(P(g)) + lambda_wd w_k     (M: feature layers)
                 v <- mu v + d ;  w_k <- w_k - eta_l v
      server:    u = mean_k (w^t - w_k)
                 w^{t+1} = w^t - eta_g * M'(P(u))   (M': classifier layers)

  GC-Fed paper, Algorithm 1 and section 3.3. Defaults: see the module
  docstring; `gc_lambda = None` puts the last layer on the classifier side,
  as the paper does for its CNNs. The authors' code projects every layer on
  the server: `global_gc_layers='all'`.

  Args:
    model_fn: A no-arg function returning a new
      `tff.learning.models.VariableModel`.
    client_learning_rate: `eta_l`, > 0.
    server_learning_rate: `eta_g`, > 0.
    client_momentum: `mu` in [0, 1).
    weight_decay: `lambda_wd`, >= 0, coupled L2.
    gc_lambda: The layer borderline in [0, 1]; `None`: all layers but the
      last are feature layers.
    local_gc_layers: 'feature' or 'all': the layers clients project.
    global_gc_layers: 'classifier' or 'all': the layers the server projects.
    center_vectors: Whether projected layers' rank-1 biases are centred too.
    loop_implementation: The client training loop.

  Returns:
    A `tff.learning.templates.LearningProcess`.

  Raises:
    ValueError: If a hyperparameter is out of range (checked before any model
      is built).
  """
  return compose.build_process(
      model_fn,
      client_rule='local_gc',
      server_rule='global_gc',
      client_weighting=tff.learning.ClientWeighting.UNIFORM,
      client_learning_rate=client_learning_rate,
      server_learning_rate=server_learning_rate,
      client_momentum=client_momentum,
      weight_decay=weight_decay,
      local_gc_layers=local_gc_layers,
      gc_lambda=gc_lambda,
      global_gc_layers=global_gc_layers,
      center_vectors=center_vectors,
      loop_implementation=loop_implementation,
  )
