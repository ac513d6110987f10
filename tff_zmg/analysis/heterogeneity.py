"""Statistical heterogeneity of a federated dataset (FedZMG paper, section 5.1; specification.md 6).

Every statistic is a plain function of one client's class counts c = (c_1, ..., c_C) over
all C classes of the task (zeros included), with p = c / sum(c):

  volume              V = sum_i c_i
  label diversity     D = #{i : c_i > 0}
  normalized entropy  H(p) / ln C, H(p) = -sum_i p_i ln p_i (0 ln 0 = 0); 1 = uniform
  Gini coefficient    G = sum_i sum_j |c_i - c_j| / (2 C sum_i c_i); 0 = uniform,
                      (C - 1) / C = one class only
  KL divergence       KL(p || q) = sum_i p_i ln(p_i / q_i) in nats, q the global label
                      distribution (all clients of the split pooled)
  dominant class      max_i p_i

    counts = np.array([[5, 5, 0], [1, 0, 9]])
    rows = client_table(['a', 'b'], counts, counts.sum(axis=0))
    summary(rows)   # mean and std of each statistic over the clients
"""

import math
from typing import Sequence

import numpy as np
import scipy.stats

STATISTICS = (
    'volume', 'label_diversity', 'normalized_entropy', 'gini', 'kl_divergence',
    'dominant_class_fraction',
)


def _counts(counts) -> np.ndarray:
  counts = np.asarray(counts, dtype=float)
  if counts.ndim != 1 or counts.size == 0:
    raise ValueError(f'counts must be a non-empty 1-D sequence, got shape {counts.shape}')
  if np.any(counts < 0) or not np.all(np.isfinite(counts)):
    raise ValueError('counts must be finite and >= 0')
  return counts


def _nonempty(counts) -> np.ndarray:
  counts = _counts(counts)
  if counts.sum() == 0:
    raise ValueError('counts are all zero: the client holds no examples')
  return counts


def label_counts(labels: Sequence[int], num_classes: int) -> np.ndarray:
  """Class counts (length `num_classes`) of integer labels in [0, num_classes)."""
  labels = np.asarray(labels, dtype=np.int64).ravel()
  if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
    raise ValueError(
        f'labels must lie in [0, {num_classes}), got [{labels.min()}, {labels.max()}]'
    )
  return np.bincount(labels, minlength=num_classes)


def volume(counts) -> int:
  """V = sum_i c_i, the number of labelled examples."""
  return int(_counts(counts).sum())


def label_diversity(counts) -> int:
  """D = the number of classes present."""
  return int(np.count_nonzero(_counts(counts)))


def normalized_entropy(counts) -> float:
  """H(p) / ln C over all C = len(counts) classes; 0 for a single-class task."""
  counts = _nonempty(counts)
  if counts.size == 1:
    return 0.0
  return float(scipy.stats.entropy(counts) / math.log(counts.size))


def gini(counts) -> float:
  """G = sum_i sum_j |c_i - c_j| / (2 C sum_i c_i), the mean absolute difference / 2 mean."""
  counts = _nonempty(counts)
  pairwise = np.abs(counts[:, None] - counts[None, :]).sum()
  return float(pairwise / (2 * counts.size * counts.sum()))


def kl_divergence(counts, reference_counts) -> float:
  """KL(p || q) in nats, p and q the normalized `counts` and `reference_counts`.

  Infinite when the client holds a class the reference lacks.
  """
  p, q = _nonempty(counts), _nonempty(reference_counts)
  if p.shape != q.shape:
    raise ValueError(f'counts and reference_counts differ in length: {p.size} vs {q.size}')
  return float(scipy.stats.entropy(p, q))


def dominant_class_fraction(counts) -> float:
  """max_i p_i, the share of the most frequent class."""
  counts = _nonempty(counts)
  return float(counts.max() / counts.sum())


def client_statistics(counts, reference_counts) -> dict:
  """Every statistic of `STATISTICS` for one client."""
  return {
      'volume': volume(counts),
      'label_diversity': label_diversity(counts),
      'normalized_entropy': normalized_entropy(counts),
      'gini': gini(counts),
      'kl_divergence': kl_divergence(counts, reference_counts),
      'dominant_class_fraction': dominant_class_fraction(counts),
  }


def client_table(client_ids: Sequence[str], counts, reference_counts) -> list[dict]:
  """One row per client: `client_id` and its statistics; `counts` is (clients, classes)."""
  counts = np.asarray(counts)
  if counts.ndim != 2 or counts.shape[0] != len(client_ids):
    raise ValueError(
        f'counts must be (len(client_ids), num_classes), got {counts.shape} for'
        f' {len(client_ids)} clients'
    )
  return [
      {'client_id': cid, **client_statistics(row, reference_counts)}
      for cid, row in zip(client_ids, counts)
  ]


def summary(rows: Sequence[dict], columns: Sequence[str] = STATISTICS) -> dict:
  """Mean and standard deviation (ddof=1: the clients are a sample) of each column.

  Returns:
    {'num_clients': n, '<column>_mean': ..., '<column>_std': ...}; std is NaN for n = 1.
  """
  if not rows:
    raise ValueError('summary needs at least one client row')
  out = {'num_clients': len(rows)}
  for name in columns:
    values = np.array([r[name] for r in rows], dtype=float)
    out[f'{name}_mean'] = float(values.mean())
    out[f'{name}_std'] = float(values.std(ddof=1)) if values.size > 1 else math.nan
  return out
