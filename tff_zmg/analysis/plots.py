"""Figures: validation-accuracy curves with a standard-deviation band, and a grid heatmap.

The figures are drawn on `matplotlib.figure.Figure` objects rendered by the Agg canvas,
never through pyplot, so that nothing here changes the backend of a notebook that
imports the package; each function returns the figure after saving it. matplotlib is
imported on first use to keep `import tff_zmg` light.
"""

import math
import os
from typing import Mapping, Optional, Sequence

import numpy as np


def _figure(width: float, height: float):
  from matplotlib.backends import backend_agg  # pylint: disable=g-import-not-at-top
  from matplotlib import figure  # pylint: disable=g-import-not-at-top

  fig = figure.Figure(figsize=(width, height), layout='constrained')
  backend_agg.FigureCanvasAgg(fig)
  return fig


def _save(fig, path: str):
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=120)
  return fig


def mean_and_std(curves: Sequence[tuple[np.ndarray, np.ndarray]]):
  """(rounds, mean, std) of runs' (rounds, values) on the rounds all runs have.

  std has ddof=1 (the runs are seeds, a sample); it is 0 for a single run.
  """
  if not curves:
    raise ValueError('mean_and_std needs at least one run')
  rounds = sorted(set.intersection(*(set(np.asarray(r).tolist()) for r, _ in curves)))
  matrix = np.empty((len(curves), len(rounds)))
  for i, (r, v) in enumerate(curves):
    lookup = dict(zip(np.asarray(r).tolist(), np.asarray(v, dtype=float).tolist()))
    matrix[i] = [lookup[x] for x in rounds]
  std = matrix.std(axis=0, ddof=1) if len(curves) > 1 else np.zeros(len(rounds))
  return np.array(rounds, dtype=int), matrix.mean(axis=0), std


def accuracy_curves(
    curves: Mapping[str, Sequence[tuple[np.ndarray, np.ndarray]]], path: str, *,
    title: str = '', thresholds: Sequence[float] = (),
    ylabel: str = 'validation accuracy',
):
  """Mean curve and a +-1 standard-deviation band per label, over its runs' (rounds, values).

  Args:
    curves: label (an algorithm) -> one (rounds, values) pair per run (seed).
    path: Where to write the PNG.
    title: Figure title.
    thresholds: Horizontal dashed lines (the task's accuracy thresholds).
    ylabel: The y axis label.

  Returns:
    The saved `matplotlib.figure.Figure`.
  """
  fig = _figure(7, 4.5)
  ax = fig.add_subplot()
  for label, runs in curves.items():
    if not runs:
      continue
    rounds, mean, std = mean_and_std(runs)
    (line,) = ax.plot(rounds, mean, label=f'{label} (n={len(runs)})')
    ax.fill_between(rounds, mean - std, mean + std, color=line.get_color(), alpha=0.2)
  for threshold in thresholds:
    ax.axhline(threshold, color='gray', linestyle='--', linewidth=0.8)
  ax.set_xlabel('round')
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  ax.grid(alpha=0.3)
  if curves:
    ax.legend(loc='lower right')
  return _save(fig, path)


def heatmap(
    values, row_labels: Sequence[str], col_labels: Sequence[str], path: str, *,
    title: str = '', xlabel: str = '', ylabel: str = '', colorbar_label: str = '',
    missing_text: str = 'div.', highlight: Optional[tuple[int, int]] = None,
):
  """A heatmap of a (rows, cols) array with each cell's value written in it.

  NaN cells (diverged or missing grid cells) are grey and marked `missing_text`;
  `highlight` = (row, col) outlines one cell (the best).

  Returns:
    The saved `matplotlib.figure.Figure`.
  """
  values = np.asarray(values, dtype=float)
  if values.shape != (len(row_labels), len(col_labels)):
    raise ValueError(
        f'values shape {values.shape} does not match {len(row_labels)} row and'
        f' {len(col_labels)} column labels'
    )
  import matplotlib  # pylint: disable=g-import-not-at-top

  cmap = matplotlib.colormaps['viridis'].with_extremes(bad='lightgray')
  fig = _figure(max(5.0, 1.8 + 0.75 * len(col_labels)), max(4.0, 1.6 + 0.5 * len(row_labels)))
  ax = fig.add_subplot()
  finite = values[np.isfinite(values)]
  low, high = (finite.min(), finite.max()) if finite.size else (0.0, 1.0)
  if high == low:  # One colour for all; keep the colour bar readable.
    low, high = low - 0.5, high + 0.5
  image = ax.imshow(
      np.ma.masked_invalid(values), cmap=cmap, origin='lower', aspect='auto',
      vmin=low, vmax=high,
  )
  mid = (low + high) / 2
  for i in range(values.shape[0]):
    for j in range(values.shape[1]):
      v = values[i, j]
      text = missing_text if math.isnan(v) else f'{v:.3f}'
      color = 'black' if math.isnan(v) or v > mid else 'white'
      ax.text(j, i, text, ha='center', va='center', fontsize=7, color=color)
  if highlight is not None:
    import matplotlib.patches  # pylint: disable=g-import-not-at-top

    ax.add_patch(matplotlib.patches.Rectangle(
        (highlight[1] - 0.5, highlight[0] - 0.5), 1, 1, fill=False, edgecolor='red',
        linewidth=2,
    ))
  ax.set_xticks(range(len(col_labels)), col_labels, rotation=45, ha='right')
  ax.set_yticks(range(len(row_labels)), row_labels)
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.set_title(title, fontsize=10)
  fig.colorbar(image, ax=ax, label=colorbar_label)
  return _save(fig, path)
