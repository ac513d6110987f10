"""The papers we reproduce, one module each: protocol, table layouts, published numbers.

A paper's module (`fedzmg`, `gc_fed`, `fedrkmgc`, `fedgps`) holds everything we know of
it, each value with its source (a paper and its section, or 'our choice' where the paper
gives none):

- `PROTOCOL` (GC-Fed, FedRKMGC, FedGPS): its training settings. `python -m launch.train
  --protocol=gcfed ...` fills every one of them that the command line does not set
  itself (explicit flags win): the population and its Dirichlet split, participation,
  local epochs, batch size, the client optimizer the paper trains every method with
  (SGD, momentum, weight decay) and its own method's hyperparameters. The task and model
  stay the user's choice (the papers use several). An --algo that cannot train with the
  client optimizer (no momentum, no weight decay, a decay of the other kind) is refused
  in one line; the method's own hyperparameters (FedRKMGC's beta) go to the algorithms
  that take them, so that one protocol can compare several algorithms.
- `PAPER`: what `launch.reproduce` runs for its tables (algorithms, seeds, rounds, the
  `launch.train` flags, the learning-rate grid where the paper tuned, per table the
  settings of its columns) and the numbers the paper published in them.
"""

from launch.papers import base
from launch.papers import fedgps
from launch.papers import fedrkmgc
from launch.papers import fedzmg
from launch.papers import gc_fed

_MODULES = (fedzmg, gc_fed, fedrkmgc, fedgps)
PAPERS = {m.PAPER.name: m.PAPER for m in _MODULES}
PAPER_NAMES = tuple(PAPERS)
PROTOCOLS = {m.PROTOCOL.name: m.PROTOCOL for m in _MODULES if hasattr(m, 'PROTOCOL')}
PROTOCOL_NAMES = tuple(PROTOCOLS)


def get(name: str) -> base.Paper:
  if name not in PAPERS:
    raise ValueError(f'unknown --paper {name!r}; choose one of {list(PAPER_NAMES)}')
  return PAPERS[name]


def get_protocol(name: str) -> base.Protocol:
  if name not in PROTOCOLS:
    raise ValueError(f'Unknown protocol {name!r}; choose one of {list(PROTOCOL_NAMES)}.')
  return PROTOCOLS[name]


def get_published(paper: str, number: int) -> base.PublishedTable:
  """The numbers `paper` (a key of `PAPERS`) published in its table `number`."""
  published = get(paper).published
  if number not in published:
    raise ValueError(
        f'no published table {number} of {paper!r}; we hold tables {sorted(published)}'
    )
  return published[number]


def values_for_unset(name: str, given, algo) -> dict:
  """Protocol `name`'s values for the flags a run does not set itself.

  Args:
    name: One of `PROTOCOL_NAMES`.
    given: The names of the flags the run sets (its command line, or a program's
      per-run values such as a grid's); the protocol leaves them alone.
    algo: The run's `registry.AlgorithmSpec` (`Protocol.hparams_for`).

  Returns:
    Flag name -> the protocol's value, for the flags not in `given`.

  Raises:
    ValueError: (one line) `algo` cannot train with the protocol's client optimizer.
  """
  protocol = get_protocol(name)
  values = {**protocol.flag_values(), **protocol.hparams_for(algo, given)}
  return {flag: value for flag, value in values.items() if flag not in given}


def tables(paper: base.Paper, numbers) -> list[base.TableSpec]:
  """The chosen tables (all of the paper's when `numbers` is empty), in the given order."""
  if not numbers:
    return list(paper.tables.values())
  out = []
  for n in numbers:
    try:
      number = int(n)
    except (TypeError, ValueError):
      number = None
    if number not in paper.tables:
      raise ValueError(
          f'--table={n} is not a table we reproduce of {paper.name}; choose from'
          f' {sorted(paper.tables)}'
      )
    out.append(paper.tables[number])
  return out
