"""Tests for the optimizers against NumPy versions of specification.md."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_zmg import optimizers

SHAPES = ((4, 3), (3, 3, 2, 4), (4,))  # Dense kernel, Conv2D kernel, bias.
NUM_STEPS = 4
RTOL, ATOL = 1e-5, 1e-6


def _problem(seed=0):
  """Random float32 weights and NUM_STEPS gradients (or updates)."""
  rng = np.random.default_rng(seed)
  weights = [rng.normal(size=s).astype(np.float32) for s in SHAPES]
  grads = [[rng.normal(size=s).astype(np.float32) for s in SHAPES]
           for _ in range(NUM_STEPS)]
  return weights, grads


def _run(optimizer, weights, grads, container=tuple, compile_next=False):
  """Runs `optimizer` from `initialize`; returns final weights and state."""
  w = container(tf.constant(x) for x in weights)
  specs = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), w)
  state = optimizer.initialize(specs)
  step = optimizer.next
  if compile_next:
    # As TFF does: hyperparameters arrive as tensors, `next` runs as a graph.
    state = tf.nest.map_structure(tf.convert_to_tensor, state)
    step = tf.function(optimizer.next)
  for g in grads:
    state, w = step(state, w, container(tf.constant(x) for x in g))
  assert isinstance(w, container)
  return [t.numpy() for t in w], state


# NumPy re-implementations, written from specification.md in float64.


def _np_project(g, selected=True, center_vectors=False):
  if not selected:
    return g
  if g.ndim >= 2:
    return g - g.mean(axis=tuple(range(g.ndim - 1)), keepdims=True)
  if g.ndim == 1 and center_vectors:
    return g - g.mean()
  return g


def _np_mask(mask):
  return mask if mask is not None else (True,) * len(SHAPES)


def _np_zmg_sgdm(weights, grads, lr, momentum=0.9, weight_decay=1e-4,
                 mask=None, center_vectors=False):
  w = [x.astype(np.float64) for x in weights]
  v = [np.zeros_like(x) for x in w]
  for g in grads:
    for i, selected in enumerate(_np_mask(mask)):
      g_tilde = _np_project(g[i].astype(np.float64), selected, center_vectors)
      v[i] = momentum * v[i] + g_tilde
      w[i] = w[i] - lr * v[i] - lr * weight_decay * w[i]
  return w, v


def _np_local_gc_sgdm(weights, grads, lr=0.01, momentum=0.9,
                      weight_decay=1e-5, mask=None, center_vectors=False):
  w = [x.astype(np.float64) for x in weights]
  v = [np.zeros_like(x) for x in w]
  for g in grads:
    for i, selected in enumerate(_np_mask(mask)):
      d = (_np_project(g[i].astype(np.float64), selected, center_vectors)
           + weight_decay * w[i])
      v[i] = momentum * v[i] + d
      w[i] = w[i] - lr * v[i]
  return w, v


def _np_proximal_sgd(weights, grads, lr, proximal_strength=0.3):
  """SGD along FedProx's `g + mu (w - w0)`, `w0` the weights of the first step."""
  anchor = [x.astype(np.float64) for x in weights]
  w = [x.copy() for x in anchor]
  for g in grads:
    w = [wi - lr * (gi + proximal_strength * (wi - ai)) for wi, gi, ai in zip(w, g, anchor)]
  return w


def _np_server_adam(weights, updates, lr, beta_1=0.9, beta_2=0.99,
                    epsilon=1e-3, bias_correction=False):
  w = [x.astype(np.float64) for x in weights]
  m = [np.zeros_like(x) for x in w]
  v = [np.zeros_like(x) for x in w]
  for t, u in enumerate(updates, start=1):
    for i in range(len(w)):
      m[i] = beta_1 * m[i] + (1 - beta_1) * u[i]
      v[i] = beta_2 * v[i] + (1 - beta_2) * u[i].astype(np.float64) ** 2
      m_hat, v_hat = m[i], v[i]
      if bias_correction:
        m_hat, v_hat = m[i] / (1 - beta_1**t), v[i] / (1 - beta_2**t)
      w[i] = w[i] - lr * m_hat / (np.sqrt(v_hat) + epsilon)
  return w


def _np_global_gc_sgd(weights, updates, lr, mask=None, center_vectors=False):
  w = [x.astype(np.float64) for x in weights]
  for u in updates:
    for i, selected in enumerate(_np_mask(mask)):
      w[i] = w[i] - lr * _np_project(u[i].astype(np.float64), selected,
                                     center_vectors)
  return w


def _assert_all_close(actual, expected):
  assert len(actual) == len(expected)
  for a, e in zip(actual, expected):
    np.testing.assert_allclose(a, e, rtol=RTOL, atol=ATOL)


def _assert_not_close(actual, expected):
  assert any(not np.allclose(a, e, rtol=1e-3, atol=1e-5)
             for a, e in zip(actual, expected))


# The optimizers take every hyperparameter (their defaults are the algorithms', in
# `tff_zmg.algorithms`); these tests use the spec's values where they give none.
def build_zmg_sgdm(learning_rate, momentum=0.9, weight_decay=1e-4, **kwargs):
  return optimizers.build_zmg_sgdm(learning_rate, momentum, weight_decay, **kwargs)


def build_local_gc_sgdm(learning_rate=0.01, momentum=0.9, weight_decay=1e-5, **kwargs):
  return optimizers.build_local_gc_sgdm(learning_rate, momentum, weight_decay, **kwargs)


def build_server_adam(learning_rate, beta_1=0.9, beta_2=0.99, epsilon=1e-3, **kwargs):
  return optimizers.build_server_adam(learning_rate, beta_1, beta_2, epsilon, **kwargs)


build_global_gc_sgd = optimizers.build_global_gc_sgd


def build_sgdm_coupled_decay(learning_rate, momentum=0.9, weight_decay=1e-5):
  """TFF's SGDM with coupled decay: `torch.optim.SGD`, the GC-Fed and FedGPS papers' client
  optimizer for every method (FedAvg's `client_sgd` with a decay)."""
  return optimizers.build_coupled_weight_decay(
      tff.learning.optimizers.build_sgdm(learning_rate, momentum=momentum), weight_decay)


# ZMG-SGDM.


@pytest.mark.parametrize('momentum', [0.0, 0.9])
def test_zmg_sgdm_matches_numpy(momentum):
  weights, grads = _problem()
  hparams = dict(learning_rate=0.1, momentum=momentum, weight_decay=0.05)
  actual, _ = _run(build_zmg_sgdm(**hparams), weights, grads)
  expected, _ = _np_zmg_sgdm(weights, grads, lr=0.1, momentum=momentum,
                             weight_decay=0.05)
  _assert_all_close(actual, expected)


def test_zmg_sgdm_momentum_changes_the_trajectory():
  weights, grads = _problem()
  without, _ = _run(build_zmg_sgdm(0.1, momentum=0.0), weights,
                    grads)
  with_momentum, _ = _np_zmg_sgdm(weights, grads, lr=0.1, momentum=0.9)
  _assert_not_close(without, with_momentum)


def test_zmg_sgdm_weight_decay_never_enters_the_momentum():
  weights, grads = _problem()
  _, state = _run(build_zmg_sgdm(0.1, weight_decay=0.5), weights,
                  grads)
  # v is the momentum sum of projected gradients alone.
  v = [np.zeros(s) for s in SHAPES]
  for g in grads:
    v = [0.9 * vi + _np_project(gi.astype(np.float64))
         for vi, gi in zip(v, g)]
  _assert_all_close([x.numpy() for x in state['accumulator']], v)


def test_zmg_decoupled_and_local_gc_coupled_decay_differ_on_same_inputs():
  weights, grads = _problem()
  hparams = dict(learning_rate=0.1, momentum=0.9, weight_decay=0.5)
  zmg, _ = _run(build_zmg_sgdm(**hparams), weights, grads)
  local_gc, _ = _run(build_local_gc_sgdm(**hparams), weights,
                     grads)
  np_hparams = dict(lr=0.1, momentum=0.9, weight_decay=0.5)
  _assert_all_close(zmg, _np_zmg_sgdm(weights, grads, **np_hparams)[0])
  _assert_all_close(local_gc,
                    _np_local_gc_sgdm(weights, grads, **np_hparams)[0])
  _assert_not_close(zmg, local_gc)


def test_zmg_sgdm_mask_and_center_vectors_match_numpy():
  weights, grads = _problem()
  mask = (False, True, True)
  opt = build_zmg_sgdm(0.1, mask=mask, center_vectors=True)
  actual, _ = _run(opt, weights, grads)
  expected, _ = _np_zmg_sgdm(weights, grads, lr=0.1, mask=mask,
                             center_vectors=True)
  _assert_all_close(actual, expected)
  # The unmasked kernel follows plain SGDM with decoupled decay.
  plain, _ = _np_zmg_sgdm(weights, grads, lr=0.1, mask=(False,) * 3)
  _assert_all_close(actual[:1], plain[:1])


def test_zmg_sgdm_momentum_starts_at_zero():
  specs = [tf.TensorSpec(s, tf.float32) for s in SHAPES]
  state = build_zmg_sgdm(0.1).initialize(specs)
  for v, shape in zip(state['accumulator'], SHAPES):
    np.testing.assert_array_equal(v.numpy(), np.zeros(shape))


def test_zmg_sgdm_projects_indexed_slices_embedding_gradient():
  table = np.random.default_rng(1).normal(size=(10, 4)).astype(np.float32)
  grad = tf.IndexedSlices(tf.ones([2, 4]), tf.constant([1, 6]),
                          tf.constant([10, 4]))
  opt = build_zmg_sgdm(0.5, momentum=0.0, weight_decay=0.0)
  state = opt.initialize([tf.TensorSpec([10, 4], tf.float32)])
  _, (out,) = opt.next(state, [tf.constant(table)], [grad])
  dense = np.zeros((10, 4))
  dense[[1, 6]] = 1.0
  np.testing.assert_allclose(out.numpy(), table - 0.5 * (dense - 0.2),
                             rtol=RTOL, atol=ATOL)


# LocalGC SGDM.


@pytest.mark.parametrize('momentum', [0.0, 0.9])
@pytest.mark.parametrize('mask', [None, (True, False, True)])
def test_local_gc_sgdm_matches_numpy(momentum, mask):
  weights, grads = _problem(seed=1)
  opt = build_local_gc_sgdm(0.05, momentum=momentum,
                                       weight_decay=0.01, mask=mask)
  actual, _ = _run(opt, weights, grads)
  expected, _ = _np_local_gc_sgdm(weights, grads, lr=0.05, momentum=momentum,
                                  weight_decay=0.01, mask=mask)
  _assert_all_close(actual, expected)


def test_local_gc_sgdm_unmasked_tensor_keeps_raw_gradient():
  weights, grads = _problem(seed=1)
  opt = build_local_gc_sgdm(mask=(False, True, True))
  actual, _ = _run(opt, weights, grads)
  projected, _ = _np_local_gc_sgdm(weights, grads)
  raw, _ = _np_local_gc_sgdm(weights, grads, mask=(False,) * 3)
  _assert_all_close(actual[:1], raw[:1])
  _assert_not_close(actual[:1], projected[:1])


# Server Adam.


@pytest.mark.parametrize('bias_correction', [False, True])
def test_server_adam_matches_numpy(bias_correction):
  weights, updates = _problem(seed=2)
  opt = build_server_adam(0.01, bias_correction=bias_correction)
  actual, state = _run(opt, weights, updates)
  expected = _np_server_adam(weights, updates, lr=0.01,
                             bias_correction=bias_correction)
  _assert_all_close(actual, expected)
  assert int(state['step']) == NUM_STEPS


def test_server_adam_bias_correction_changes_the_update():
  weights, updates = _problem(seed=2)
  corrected, _ = _run(
      build_server_adam(0.01, bias_correction=True), weights,
      updates)
  _assert_not_close(corrected, _np_server_adam(weights, updates, lr=0.01))


def test_server_adam_non_default_betas_and_epsilon_match_numpy():
  weights, updates = _problem(seed=3)
  hparams = dict(beta_1=0.5, beta_2=0.8, epsilon=0.1)
  actual, _ = _run(build_server_adam(0.3, **hparams), weights,
                   updates)
  _assert_all_close(actual,
                    _np_server_adam(weights, updates, lr=0.3, **hparams))


# Global GC.


def test_global_gc_with_mask_matches_numpy():
  weights, updates = _problem(seed=4)
  mask = (True, False, True)
  opt = build_global_gc_sgd(0.7, mask=mask, center_vectors=True)
  actual, _ = _run(opt, weights, updates)
  _assert_all_close(actual, _np_global_gc_sgd(
      weights, updates, lr=0.7, mask=mask, center_vectors=True))
  plain = _np_global_gc_sgd(weights, updates, lr=0.7, mask=(False,) * 3)
  _assert_not_close(actual[:1], plain[:1])
  _assert_all_close(actual[1:2], plain[1:2])


def test_global_gc_default_projects_every_kernel():
  weights, updates = _problem(seed=4)
  actual, _ = _run(build_global_gc_sgd(1.0), weights, updates)
  _assert_all_close(actual, _np_global_gc_sgd(weights, updates, lr=1.0))


# Behaviour shared by all the optimizers.

CASES = {
    'zmg_sgdm': (
        lambda lr: build_zmg_sgdm(lr, mask=(True, False, True)),
        lambda w, g, lr: _np_zmg_sgdm(w, g, lr, mask=(True, False, True))[0],
    ),
    'local_gc_sgdm': (
        lambda lr: build_local_gc_sgdm(lr, weight_decay=0.1),
        lambda w, g, lr: _np_local_gc_sgdm(w, g, lr, weight_decay=0.1)[0],
    ),
    'server_adam': (
        lambda lr: build_server_adam(lr, bias_correction=True),
        lambda w, g, lr: _np_server_adam(w, g, lr, bias_correction=True),
    ),
    'global_gc_sgd': (
        lambda lr: build_global_gc_sgd(lr, mask=(True, True, False)),
        lambda w, g, lr: _np_global_gc_sgd(w, g, lr, mask=(True, True, False)),
    ),
    # LocalGC's rule projecting nothing is torch.optim.SGD's: d = g + wd w inside v.
    'sgdm_coupled_decay': (
        lambda lr: build_sgdm_coupled_decay(lr, weight_decay=0.1),
        lambda w, g, lr: _np_local_gc_sgdm(w, g, lr, weight_decay=0.1,
                                           mask=(False,) * len(SHAPES))[0],
    ),
    'proximal_sgd': (
        lambda lr: optimizers.build_proximal(tff.learning.optimizers.build_sgdm(lr), 0.3),
        _np_proximal_sgd,
    ),
}


@pytest.mark.parametrize(
    'seed, run_kwargs',
    [(5, dict(compile_next=True)), (6, dict(container=list))],
    ids=['next_under_tf_function', 'list_weights'],
)
@pytest.mark.parametrize('name', CASES)
def test_run_variant_matches_numpy(name, seed, run_kwargs):
  build, reference = CASES[name]
  weights, grads = _problem(seed=seed)
  actual, _ = _run(build(0.05), weights, grads, **run_kwargs)
  _assert_all_close(actual, reference(weights, grads, 0.05))


@pytest.mark.parametrize('name', CASES)
def test_hparams_round_trip_and_new_learning_rate_is_used(name):
  build, reference = CASES[name]
  weights, grads = _problem(seed=7)
  opt = build(0.05)
  specs = tuple(tf.TensorSpec(s, tf.float32) for s in SHAPES)
  state = opt.initialize(specs)
  hparams = opt.get_hparams(state)
  assert isinstance(hparams, collections.OrderedDict)
  assert hparams['learning_rate'] == pytest.approx(0.05)
  hparams['learning_rate'] = 0.2
  state = opt.set_hparams(state, hparams)
  assert opt.get_hparams(state) == hparams
  w = tuple(tf.constant(x) for x in weights)
  for g in grads:
    state, w = opt.next(state, w, tuple(tf.constant(x) for x in g))
  _assert_all_close([x.numpy() for x in w], reference(weights, grads, 0.2))


@pytest.mark.parametrize('name', CASES)
def test_set_hparams_rejects_unknown_key(name):
  opt = CASES[name][0](0.05)
  state = opt.initialize(tuple(tf.TensorSpec(s, tf.float32) for s in SHAPES))
  with pytest.raises(ValueError, match='not_a_hparam'):
    opt.set_hparams(state, {'not_a_hparam': 1.0})


def test_coupled_decay_hparams_are_sgdms_and_the_decay():
  opt = build_sgdm_coupled_decay(0.1, momentum=0.8, weight_decay=0.01)
  hparams = opt.get_hparams(opt.initialize([tf.TensorSpec([2], tf.float32)]))
  assert dict(hparams) == pytest.approx(
      {'learning_rate': 0.1, 'weight_decay': 0.01, 'momentum': 0.8})


def test_coupled_decay_enters_the_momentum_unlike_zmgs_decoupled_one():
  """With no projection the two rules differ only in where the decay goes."""
  weights, grads = _problem(seed=8)
  coupled, _ = _run(build_sgdm_coupled_decay(0.05, weight_decay=0.5), weights, grads)
  decoupled, _ = _run(build_zmg_sgdm(0.05, weight_decay=0.5, mask=(False,) * len(SHAPES)),
                      weights, grads)
  _assert_all_close(coupled, _np_local_gc_sgdm(
      weights, grads, 0.05, weight_decay=0.5, mask=(False,) * len(SHAPES))[0])
  _assert_not_close(coupled, decoupled)


def test_zmg_hparams_include_momentum_and_weight_decay():
  opt = build_zmg_sgdm(0.1, momentum=0.8, weight_decay=0.01)
  hparams = opt.get_hparams(opt.initialize([tf.TensorSpec([2], tf.float32)]))
  assert dict(hparams) == pytest.approx(
      {'learning_rate': 0.1, 'weight_decay': 0.01, 'momentum': 0.8})


BAD_HPARAMS = [
    (build_zmg_sgdm, dict(learning_rate=0.0), 'learning_rate'),
    (build_zmg_sgdm, dict(learning_rate=-1.0), 'learning_rate'),
    (build_zmg_sgdm, dict(learning_rate=0.1, momentum=1.0),
     'momentum'),
    (build_zmg_sgdm, dict(learning_rate=0.1, momentum=-0.1),
     'momentum'),
    (build_zmg_sgdm, dict(learning_rate=0.1, weight_decay=-1e-4),
     'weight_decay'),
    (build_zmg_sgdm, dict(learning_rate=0.1, mask=(True, 'yes')),
     'mask'),
    (build_local_gc_sgdm, dict(learning_rate=0.0), 'learning_rate'),
    (build_local_gc_sgdm, dict(momentum=1.0), 'momentum'),
    (build_local_gc_sgdm, dict(weight_decay=-1.0), 'weight_decay'),
    (build_server_adam, dict(learning_rate=-0.1), 'learning_rate'),
    (build_server_adam, dict(learning_rate=0.1, beta_1=1.0),
     'beta_1'),
    (build_server_adam, dict(learning_rate=0.1, beta_1=-0.5),
     'beta_1'),
    (build_server_adam, dict(learning_rate=0.1, beta_2=1.5),
     'beta_2'),
    (build_server_adam, dict(learning_rate=0.1, epsilon=0.0),
     'epsilon'),
    (build_server_adam, dict(learning_rate=0.1, epsilon=-1e-3),
     'epsilon'),
    (build_global_gc_sgd, dict(learning_rate=0.0), 'learning_rate'),
    (build_global_gc_sgd, dict(learning_rate=1.0, mask=[1, 0]),
     'mask'),
    (build_sgdm_coupled_decay, dict(learning_rate=0.1, weight_decay=-1.0), 'weight_decay'),
]


@pytest.mark.parametrize('build, kwargs, name', BAD_HPARAMS)
def test_bad_hyperparameter_raises_naming_it(build, kwargs, name):
  with pytest.raises(ValueError, match=name):
    build(**kwargs)


def test_momentum_error_states_the_valid_range():
  message = r'momentum must be in \[0, 1\), got 1.5'
  with pytest.raises(ValueError, match=message):
    build_zmg_sgdm(0.1, momentum=1.5)
