"""Successive halving and the stability check (`launch.sweeps.halving`), on scripted score curves."""

import math

import numpy as np
import pytest

from launch.sweeps import halving

_AXIS = tuple(10.0 ** (k / 2) for k in range(-6, 3))  # The paper's half decades.


def _curve(cell, rounds):
  """A scripted accuracy curve by round for a (client lr, server lr) cell, NaN once diverged.

  acc(r) = plateau (1 - exp(-r c / 3)): a larger client rate c learns faster, the plateau
  is highest at c = 0.1, s = 1. The two largest client rates lead after 5 rounds and
  diverge at round 12 (10^0.5) and 15 (10).
  """
  c, s = cell
  plateau = 0.9 - 0.01 * (math.log10(c) + 1) ** 2 - 0.05 * math.log10(s) ** 2
  r = np.arange(1, rounds + 1)
  acc = plateau * (1 - np.exp(-r * c / 3))
  diverges_at = {10.0 ** 0.5: 12, 10.0: 15}.get(c)
  if diverges_at is not None:
    acc = np.where(r >= diverges_at, np.nan, acc)
  return acc


def _score(cell, rounds, score_rounds=10):
  """The grid's rule by hand: NaN unless all `rounds` trained; mean of the last ones."""
  acc = _curve(cell, rounds)
  if np.isnan(acc).any():
    return math.nan
  return float(np.mean(acc[-min(score_rounds, rounds):]))


def _trainer(log):
  def train_and_score(cells, rounds):
    log.append((len(cells), rounds))
    return {cell: _score(cell, rounds) for cell in cells}
  return train_and_score


def test_halving_picks_the_long_run_best_where_a_five_round_grid_picks_a_diverging_rate():
  cells = [(c, s) for s in _AXIS for c in _AXIS]
  five_round_scores = {cell: _score(cell, 5) for cell in cells}
  assert max(five_round_scores, key=five_round_scores.get)[0] >= 10.0 ** 0.5  # The trap.

  log = []
  rungs = halving.successive_halving(cells, (10, 20, 50), _trainer(log))
  assert log == [(81, 10), (27, 20), (9, 50)]
  order = halving.ranking(rungs)
  exhaustive = {cell: _score(cell, 50) for cell in cells}
  best = max((c for c in cells if not math.isnan(exhaustive[c])), key=exhaustive.get)
  assert order[0] == best and best[0] < 10.0 ** 0.5
  # The diverging rates are never picked nor promoted past the rung where they fail.
  assert all(c < 10.0 ** 0.5 for c, _ in order[:9])
  assert all(c < 10.0 ** 0.5 for c, _ in rungs[2].scores)


def test_rung_sizes_keep_a_third_and_default_rungs_are_fifths_of_the_rounds():
  assert halving.rung_sizes(81, 3) == (81, 27, 9)
  assert halving.rung_sizes(4, 3) == (4, 2, 1)
  assert halving.default_rung_rounds(50) == (10, 20, 50)
  assert halving.default_rung_rounds(2) == (1, 2)
  for bad in ((), (10, 10), (0, 5), (20, 10)):
    with pytest.raises(ValueError, match='positive and increasing'):
      halving.check_rung_rounds(bad)


def test_failed_cells_are_never_promoted_even_when_too_few_are_left():
  scores = {'a': math.nan, 'b': 0.2, 'c': math.inf, 'd': 0.5}
  assert halving.best_cells(scores, 3) == ('d', 'b')
  rungs = halving.successive_halving(
      ['a', 'b'], (1, 2), lambda cells, rounds: {c: math.nan for c in cells})
  assert len(rungs) == 1 and halving.ranking(rungs) == []


def test_ranking_puts_later_rungs_first_then_scores():
  rungs = (halving.Rung(5, {'a': 0.9, 'b': 0.5, 'c': 0.4, 'd': 0.1}),
           halving.Rung(10, {'b': 0.6, 'c': 0.7}))
  assert halving.ranking(rungs) == ['c', 'b', 'a', 'd']
  assert halving.ranking(rungs, ['a', 'b']) == ['b', 'a']


def test_grid_neighbours_are_the_adjacent_half_decades():
  assert halving.grid_neighbours((0.1, 1.0), (_AXIS, _AXIS)) == {
      (c, s) for c in _AXIS[3:6] for s in _AXIS[5:8]} - {(0.1, 1.0)}
  assert halving.grid_neighbours((1e-3, 10.0), (_AXIS, _AXIS)) == {
      (_AXIS[1], 10.0), (1e-3, _AXIS[7]), (_AXIS[1], _AXIS[7])}


def test_a_best_cell_that_diverges_with_another_seed_gives_way_to_its_best_stable_neighbour():
  # Ranking: the best (1, 1) diverges with another seed; (0.316, 1) is its best-ranked
  # neighbour but diverges too; (10, 1) ranks above the rest but is no neighbour;
  # (1, 0.316) is the best stable neighbour.
  order = [(1.0, 1.0), (10.0 ** -0.5, 1.0), (10.0, 1.0), (1.0, 10.0 ** -0.5), (0.1, 1.0)]
  unstable = {(1.0, 1.0), (10.0 ** -0.5, 1.0)}
  waves = []

  def check(cells):
    waves.append(cells)
    return {cell: cell not in unstable for cell in cells}

  picks = halving.stable_picks(
      {'fedavg': order, 'fedzmg': [(0.1, 1.0)]},
      lambda cell: halving.grid_neighbours(cell, (_AXIS, _AXIS)), check)
  avg = picks['fedavg']
  assert avg.best == (1.0, 1.0) and avg.pick == (1.0, 10.0 ** -0.5) and avg.replaced
  assert avg.checked == (((1.0, 1.0), False), ((10.0 ** -0.5, 1.0), False),
                         ((1.0, 10.0 ** -0.5), True))
  assert picks['fedzmg'].pick == (0.1, 1.0) and not picks['fedzmg'].replaced
  # Both searches' candidates go together; a settled search checks nothing more.
  assert waves == [((1.0, 1.0), (0.1, 1.0)), ((10.0 ** -0.5, 1.0),), ((1.0, 10.0 ** -0.5),)]


def test_no_pick_when_the_best_and_every_neighbour_diverge():
  order = [(1.0, 1.0), (10.0, 10.0)]
  (pick,) = halving.stable_picks(
      {None: order}, lambda cell: halving.grid_neighbours(cell, (_AXIS, _AXIS)),
      lambda cells: {c: False for c in cells}).values()
  assert pick.pick is None and pick.checked == (((1.0, 1.0), False),)
