"""The learning rates a grid search picked, and where a run's rates came from.

`launch.grid_search` (and `launch.reproduce`, per setting and algorithm) writes the pick of
each search to `<grid>/best.json`: its task, algorithm, hyperparameters (the client and
server learning rates, and a third axis' value when the grid had one), its score and a
record of the search. A notebook takes a comparison's rates from there as
`launch.compare --tuned_from` does:

    from tff_zmg import analysis
    picks = analysis.find_tuned('runs/grid_emnist_fedzmg')
    picks['emnist', 'fedzmg'].hparams   # {'client_learning_rate': 0.1, ...}
"""

import dataclasses
import json
import os
from typing import Mapping, Optional

from tff_zmg import run_files

# Fields of best.json that describe the search, not a hyperparameter of its pick.
RECORD_FIELDS = frozenset({
    'task', 'algo', 'score', 'score_rounds', 'total_rounds', 'search', 'rungs',
    'stability', 'cost', 'run_dir'})
TUNED, DEFAULTS, GIVEN, PAPER = 'tuned', 'untuned defaults', 'given', "the paper's"


@dataclasses.dataclass(frozen=True)
class TunedRates:
  """One grid search's pick.

  Attributes:
    task, algo: What was searched.
    hparams: The pick's hyperparameters (`launch.train` flag names).
    score: Its score in the search.
    path: The best.json it was read from.
    run_dir: The picked cell's run directory (its flags.json says what data the search
      used); None in records written before best.json named it.
  """

  task: str
  algo: str
  hparams: Mapping[str, object]
  score: float
  path: str
  run_dir: Optional[str] = None

  def describe(self) -> str:
    """'client_learning_rate=0.1, server_learning_rate=1 (grid: <path>)'."""
    return f'{format_hparams(self.hparams)} (grid: {self.path})'


def format_hparams(hparams: Mapping[str, object]) -> str:
  return ', '.join(
      f'{k}={v:g}' if isinstance(v, float) else f'{k}={v}' for k, v in sorted(hparams.items())
  )


def hparams_of(best: Mapping[str, object]) -> dict:
  """The pick's hyperparameters in a best.json record (the rest describes the search)."""
  return {k: v for k, v in best.items() if k not in RECORD_FIELDS}


def read_best(path: str) -> TunedRates:
  """The pick a best.json records.

  Raises:
    ValueError: the file is not a grid search's best.json.
  """
  try:
    with open(path) as f:
      best = json.load(f)
    task, algo = best['task'], best['algo']
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ValueError(f'{path} is not a grid search\'s {run_files.BEST}: {e}') from None
  run_dir = best.get('run_dir')
  return TunedRates(
      task=task, algo=algo,
      hparams=hparams_of(best),
      score=best.get('score', float('nan')), path=path,
      # Relative to the grid, so that a grid moved as a whole still finds its runs.
      run_dir=None if run_dir is None else os.path.join(os.path.dirname(path), run_dir),
  )


def find_tuned(path: str) -> dict[tuple[str, str], TunedRates]:
  """Every grid search's pick under `path`, by (task, algo).

  `path` is a grid's directory (`launch.grid_search`'s output), a `launch.reproduce`
  directory (one grid per setting and algorithm) or any folder holding such directories.
  Run directories (those with a flags.json) are not searched.

  Raises:
    ValueError: `path` is not a directory, holds no best.json, or holds two picks for one
      task and algorithm (a reproduce directory of several settings of one task: pass the
      one grid's directory).
  """
  if not os.path.isdir(path):
    raise ValueError(f'{path} is not a directory (a grid search\'s or launch.reproduce\'s)')
  found = {}
  for folder, subfolders, files in os.walk(path):
    if run_files.FLAGS in files:
      subfolders.clear()
      continue
    subfolders.sort()
    if run_files.BEST in files:
      pick = read_best(os.path.join(folder, run_files.BEST))
      key = (pick.task, pick.algo)
      if key in found:
        raise ValueError(
            f'two grid results for {pick.algo} on {pick.task}: {found[key].path} and'
            f' {pick.path}; pass the directory of the one to use'
        )
      found[key] = pick
  if not found:
    raise ValueError(f'no grid search result ({run_files.BEST}) under {path}')
  return found


def rates_source(
    hparams: Mapping[str, object], defaults: Mapping[str, object],
    tuned: Optional[TunedRates] = None, paper: Optional[Mapping[str, object]] = None,
) -> str:
  """Where a run's learning rates came from: TUNED, PAPER, DEFAULTS or GIVEN.

  TUNED when they are the grid's pick `tuned`, whatever their values (a pick may equal the
  defaults); PAPER when they are the rates a paper fixes for every method (`paper`; the
  others at their defaults); DEFAULTS when every learning rate is the algorithm's default
  (`defaults`, its registry Hparams); GIVEN otherwise (set by hand).
  """
  rates = [k for k in defaults if k.endswith('learning_rate')]
  if tuned is not None and all(hparams.get(k) == v for k, v in tuned.hparams.items()):
    return TUNED
  if paper is not None and all(
      hparams.get(k, defaults[k]) == paper.get(k, defaults[k]) for k in rates):
    return PAPER
  if all(hparams.get(k, defaults[k]) == defaults[k] for k in rates):
    return DEFAULTS
  return GIVEN
