"""FedRKMGC's gradient correction: the raw correction and the Krasnosel'skii-Mann steps.

Each client `n` keeps two correction vectors, `D_n` (applied) and `Dt_n` (raw), zero
at the start (specification.md, "FedRKMGC corrected SGD(M)"). Every function here is
elementwise on one tensor and works on NumPy arrays and TF tensors alike; the client
work maps them over the model's trainable tensors.

Example (one tensor, round `t = 0`, `gamma = 500`):

    d_raw_new = raw_correction(d, delta, beta=0.03)
    d_new = fast_km_step(d_raw_new, d, d_raw, t=0, gamma=500.0)
"""

# How `D_new` is computed from the raw correction: the FedRKMGC ablations' kinds.
CORRECTION_UPDATES = ('raw', 'km', 'fast_km')
# Deprecated name of `CORRECTION_UPDATES`, kept for a while.
CORRECTIONS = CORRECTION_UPDATES


def corrected_gradient(gradient, correction):
  """The corrected local gradient `g~ = g - D_n`."""
  return gradient - correction


def raw_correction(correction, delta, beta: float):
  """The raw correction `Dt_new = D_n - beta * delta_n`.

  Args:
    correction: `D_n`, the correction the client applied this round.
    delta: `delta_n = w_n - w^t`, the client's positive model delta.
    beta: The correction rate, > 0.
  """
  return correction - beta * delta


def km_coefficients(t, gamma: float):
  """The fast KM coefficients `(a_t, b_t)` of round `t` (counted from 0).

      a_t = (2(t+1) + gamma) / (2(t+1+gamma)),   b_t = (t+1) / (t+1+gamma)

  `t` may be a Python number or a float tensor.
  """
  return (2.0 * (t + 1.0) + gamma) / (2.0 * (t + 1.0 + gamma)), (t + 1.0) / (
      t + 1.0 + gamma
  )


def fast_km_step(raw_new, correction, raw, t, gamma: float):
  """The fast KM update `D_new = a_t * (Dt_new + D_n) - b_t * Dt_n`.

  Args:
    raw_new: `Dt_new` (see `raw_correction`).
    correction: `D_n`.
    raw: `Dt_n`, the client's previous raw correction.
    t: The KM clock (global round index or the client's participation count).
    gamma: The KM parameter (>= 2 recommended).
  """
  a_t, b_t = km_coefficients(t, gamma)
  return a_t * (raw_new + correction) - b_t * raw


def standard_km_step(raw_new, correction, t, gamma: float):
  """The standard KM update `D_new = a_t * D_n + gamma / (2(t+1+gamma)) * Dt_new`.

  The two coefficients sum to 1: a convex combination of the old and the raw
  correction.
  """
  a_t, _ = km_coefficients(t, gamma)
  return a_t * correction + (gamma / (2.0 * (t + 1.0 + gamma))) * raw_new


def next_correction(kind: str, raw_new, correction, raw, t, gamma: float):
  """`D_new` by the correction update `kind` in `CORRECTION_UPDATES` ('raw': `D_new =
  Dt_new`)."""
  if kind == 'raw':
    return raw_new
  if kind == 'km':
    return standard_km_step(raw_new, correction, t, gamma)
  if kind == 'fast_km':
    return fast_km_step(raw_new, correction, raw, t, gamma)
  raise ValueError(f'correction_update must be one of {CORRECTION_UPDATES}, got {kind!r}')
