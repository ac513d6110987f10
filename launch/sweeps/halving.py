"""Successive halving over a learning-rate grid, and the stability check of its pick.

Pure logic: cells are any hashable keys (e.g. (client lr, server lr)); training and
scoring are the caller's, passed in as functions, so this module runs no training.

Successive halving (Jamieson & Talwalkar 2016, "Non-stochastic best arm identification
and hyperparameter optimization"): every cell trains the first rung's rounds; the best
1/eta of them (by score at that rung) continue to the next rung's rounds, and so on; the
pick is the best cell of the last rung. An exhaustive grid is the one-rung case. With the
FedZMG grid (81 cells), eta = 3 and rungs (r1, r2, 50): 81 cells reach r1, 27 reach r2
and 9 reach 50.

    rungs = successive_halving(cells, (10, 20, 50), train_and_score)
    order = ranking(rungs)            # best first; failed cells left out
    picks = stable_picks({'grid': order}, neighbours_of, check)

A cell that fails at a rung (its run diverged before the rung's rounds: score NaN) is
never promoted and never picked.
"""

import dataclasses
import math
from typing import Callable, Hashable, Mapping, Optional, Sequence

ETA = 3  # Keep the best third at each rung (the paper grid's 81 -> 27 -> 9).
# Rounds of each rung as fractions of the last's: 10, 20, 50 for the paper's 50 rounds.
# The first rung is twice the 5 rounds after which every EMNIST cell still scored below
# 0.12 (issue 27), and it only has to keep the right cells among the best third, not
# pick one; the last rung is the paper's. The cost is a third of the exhaustive grid's.
RUNG_FRACTIONS = (0.2, 0.4, 1.0)


@dataclasses.dataclass(frozen=True)
class Rung:
  """One rung of a search: the cells trained to `rounds` and their scores (NaN: failed)."""

  rounds: int
  scores: Mapping[Hashable, float]


def rung_sizes(num_cells: int, num_rungs: int, eta: int = ETA) -> tuple[int, ...]:
  """Cells trained at each rung: ceil(num_cells / eta^k) for rung k = 0, 1, ..."""
  return tuple(math.ceil(num_cells / eta**k) for k in range(num_rungs))


def default_rung_rounds(final_rounds: int) -> tuple[int, ...]:
  """`RUNG_FRACTIONS` of `final_rounds`, rounded up, repeats dropped (50 -> 10, 20, 50)."""
  return tuple(sorted({max(1, math.ceil(f * final_rounds - 1e-9)) for f in RUNG_FRACTIONS}))


def check_rung_rounds(rung_rounds: Sequence[int]) -> None:
  """Raises ValueError unless the rungs' rounds are positive and strictly increasing."""
  if not rung_rounds or any(r < 1 for r in rung_rounds) or any(
      b <= a for a, b in zip(rung_rounds, rung_rounds[1:])):
    raise ValueError(
        f'rung rounds must be positive and increasing, got {list(rung_rounds)}')


def failed(score: float) -> bool:
  return not math.isfinite(score)


def best_cells(scores: Mapping[Hashable, float], count: int) -> tuple:
  """The `count` cells of highest score, best first; failed cells never (ties: given order)."""
  alive = [cell for cell, s in scores.items() if not failed(s)]
  return tuple(sorted(alive, key=lambda cell: -scores[cell])[:count])


def successive_halving(
    cells: Sequence[Hashable], rung_rounds: Sequence[int],
    train_and_score: Callable[[tuple, int], Mapping[Hashable, float]], eta: int = ETA,
    group: Callable[[Hashable], Hashable] = lambda cell: None,
) -> tuple[Rung, ...]:
  """Runs the rungs; `train_and_score(cells, rounds)` -> each cell's score at `rounds`.

  Cells compete within their `group` only (several grids searched side by side, so that
  each rung's runs of all of them can go in parallel). A promoted cell is the same run
  continued: the caller's `train_and_score` trains only the rounds it has not yet.
  Stops early when no cell is left to promote.
  """
  check_rung_rounds(rung_rounds)
  groups = {}
  for cell in cells:
    groups.setdefault(group(cell), []).append(cell)
  sizes = {g: rung_sizes(len(members), len(rung_rounds), eta) for g, members in groups.items()}
  alive, rungs = tuple(cells), []
  for k, rounds in enumerate(rung_rounds):
    scores = dict(train_and_score(alive, rounds))
    rungs.append(Rung(rounds=rounds, scores=scores))
    if k + 1 < len(rung_rounds):
      alive = tuple(cell for g in groups for cell in best_cells(
          {c: s for c, s in scores.items() if group(c) == g}, sizes[g][k + 1]))
      if not alive:
        break
  return tuple(rungs)


def ranking(rungs: Sequence[Rung], cells: Optional[Sequence[Hashable]] = None) -> list:
  """The cells (default: all) that did not fail at their last rung, best first.

  A cell that reached a later rung ranks above every cell stopped earlier (it beat them
  where they were compared); within a rung, by score.
  """
  final = {}
  for k, rung in enumerate(rungs):
    for cell, score in rung.scores.items():
      final[cell] = (k, score)
  alive = [cell for cell in (final if cells is None else cells)
           if cell in final and not failed(final[cell][1])]
  return sorted(alive, key=lambda cell: (-final[cell][0], -final[cell][1]))


def last_scores(rungs: Sequence[Rung]) -> dict:
  """cell -> (rounds, score) at the last rung it trained at."""
  return {cell: (rung.rounds, score) for rung in rungs for cell, score in rung.scores.items()}


@dataclasses.dataclass(frozen=True)
class StablePick:
  """The outcome of the stability check of one search.

  Attributes:
    best: The search's best cell (None: every cell failed).
    checked: (cell, stable) for every cell re-run with another seed, in order.
    pick: The best cell whose re-run did not diverge: `best`, or its best stable
      neighbour when `best` diverged; None when none of them is stable.
  """

  best: Optional[Hashable]
  checked: tuple[tuple[Hashable, bool], ...]
  pick: Optional[Hashable]

  @property
  def replaced(self) -> bool:
    return self.pick is not None and self.pick != self.best


def candidates(order: Sequence[Hashable], neighbours_of: Callable[[Hashable], set]) -> list:
  """The cells the stability check may try, in order: the best, then its neighbours by rank."""
  if not order:
    return []
  adjacent = neighbours_of(order[0])
  return [order[0]] + [cell for cell in order[1:] if cell in adjacent]


def stable_picks(
    orders: Mapping[Hashable, Sequence[Hashable]], neighbours_of: Callable[[Hashable], set],
    check: Callable[[tuple], Mapping[Hashable, bool]],
) -> dict:
  """The stability check of several searches: search key -> `StablePick`.

  `orders[key]` is a search's `ranking`. Its best cell is re-run with another seed
  (`check(cells)` -> cell -> True if its re-run did not diverge); if that diverges, its
  adjacent cells (`neighbours_of`) are tried in ranking order until one is stable. All
  searches' next candidates are checked together, so they can run in parallel.
  """
  queues = {key: candidates(order, neighbours_of) for key, order in orders.items()}
  checked = {key: [] for key in orders}
  picks = {}
  while True:
    wave = {key: queue.pop(0) for key, queue in queues.items() if key not in picks and queue}
    if not wave:
      break
    stable = check(tuple(wave.values()))
    for key, cell in wave.items():
      checked[key].append((cell, bool(stable[cell])))
      if stable[cell]:
        picks[key] = cell
  return {key: StablePick(best=order[0] if order else None, checked=tuple(checked[key]),
                          pick=picks.get(key)) for key, order in orders.items()}


def grid_neighbours(cell: tuple, axes: Sequence[Sequence]) -> set:
  """The cells adjacent to `cell` on a grid: each coordinate one step along its axis or kept.

  `cell` holds one value of each axis (e.g. (client lr, server lr)); on the half-decade
  grid, the up to 8 cells a half decade away in either or both rates.
  """
  index = [list(axis).index(v) for v, axis in zip(cell, axes)]
  found = {()}
  for i, axis in zip(index, axes):
    found = {c + (axis[j],) for c in found for j in (i - 1, i, i + 1) if 0 <= j < len(axis)}
  return found - {tuple(cell)}
