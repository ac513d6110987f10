"""The training protocols of the GC-Fed, FedRKMGC and FedGPS papers, in one place.

`python -m launch.train --protocol=gcfed ...` fills every setting below that the command
line does not set itself (explicit flags win): the population and its Dirichlet split,
participation, local epochs, batch size and the client optimizer's hyperparameters. The
task and model stay the user's choice (the papers use several). Hyperparameters the chosen
--algo does not take (e.g. FedRKMGC's beta with --algo=fedavg) are left out, so that one
protocol can compare several algorithms. Every value names its source in `SOURCES`:
a paper and its section, or 'our choice' where the paper gives none.
"""

import dataclasses
from typing import Mapping


@dataclasses.dataclass(frozen=True)
class Protocol:
  """One paper's training settings.

  Attributes:
    name: The --protocol value.
    num_clients: Clients in the Dirichlet split (N).
    dirichlet_alpha: The default concentration; `dirichlet_alphas` lists the paper's.
    dirichlet_alphas: The concentrations of the paper's main tables.
    clients_per_round: Clients sampled per round.
    client_epochs_per_round: Local epochs E.
    client_batch_size: Local batch size.
    hparams: Algorithm hyperparameters (launch.train's hyperparameter flags).
    sources: Where each value comes from (field or hparam name -> citation).
  """

  name: str
  num_clients: int
  dirichlet_alpha: float
  dirichlet_alphas: tuple[float, ...]
  clients_per_round: int
  client_epochs_per_round: int
  client_batch_size: int
  hparams: Mapping[str, float]
  sources: Mapping[str, str]

  def flag_values(self) -> dict:
    """launch.train flag name -> value, hyperparameters included."""
    return dict(
        partition='dirichlet',
        num_clients=self.num_clients,
        dirichlet_alpha=self.dirichlet_alpha,
        clients_per_round=self.clients_per_round,
        client_epochs_per_round=self.client_epochs_per_round,
        client_batch_size=self.client_batch_size,
        **self.hparams,
    )


_GCFED = 'GC-Fed section 4 (Training and Evaluation)'
_RKM = 'FedRKMGC section 5 (Training Settings)'
_GPS = 'FedGPS section 5 (Federated Settings, Experimental Details)'

PROTOCOLS = {
    'gcfed': Protocol(
        name='gcfed',
        num_clients=100,
        dirichlet_alpha=0.1,
        dirichlet_alphas=(0.05, 0.1),
        clients_per_round=5,
        client_epochs_per_round=5,
        client_batch_size=50,
        hparams=dict(client_learning_rate=0.01, client_momentum=0.9, weight_decay=1e-5),
        sources=dict(
            num_clients=f'{_GCFED} (participation 5/100; also 5/200, 5/500)',
            dirichlet_alpha='our choice of the paper\'s {0.05, 0.1} (its Figure 6 uses 0.1)',
            dirichlet_alphas='GC-Fed Table 5',
            clients_per_round=_GCFED,
            client_epochs_per_round=_GCFED,
            client_batch_size=_GCFED,
            client_learning_rate=_GCFED,
            client_momentum=_GCFED,
            weight_decay=_GCFED,
        ),
    ),
    'fedrkmgc': Protocol(
        name='fedrkmgc',
        num_clients=100,
        dirichlet_alpha=0.3,
        dirichlet_alphas=(0.3, 0.5),
        clients_per_round=10,
        client_epochs_per_round=5,
        client_batch_size=20,
        hparams=dict(
            client_learning_rate=0.01, client_momentum=0.8, beta=0.03, gamma=500.0,
            rho=1.5,
        ),
        sources=dict(
            num_clients=_RKM,
            dirichlet_alpha='our choice of the paper\'s {0.3, 0.5} (its Table 4 uses 0.3)',
            dirichlet_alphas='FedRKMGC section 5, Tables 1-4',
            clients_per_round=_RKM,
            client_epochs_per_round=_RKM,
            client_batch_size=_RKM,
            client_learning_rate=_RKM,
            client_momentum=_RKM,
            beta=_RKM,
            gamma=_RKM,
            rho=_RKM,
        ),
    ),
    'fedgps': Protocol(
        name='fedgps',
        num_clients=10,
        dirichlet_alpha=0.1,
        dirichlet_alphas=(0.1,),
        clients_per_round=5,
        client_epochs_per_round=1,
        client_batch_size=64,
        hparams=dict(client_learning_rate=0.01, client_momentum=0.9, weight_decay=1e-5),
        sources=dict(
            num_clients=f'{_GPS} (cross-silo, Tables 1-3)',
            dirichlet_alpha=_GPS,
            dirichlet_alphas=_GPS,
            clients_per_round=f'{_GPS} (sampling rate 50%)',
            client_epochs_per_round=_GPS,
            client_batch_size='our choice (issue 11; not in the paper text we have)',
            client_learning_rate=_GPS,
            client_momentum=_GPS,
            weight_decay=_GPS,
        ),
    ),
}
PROTOCOL_NAMES = tuple(PROTOCOLS)
# Every flag some protocol sets.
FLAG_NAMES = tuple(sorted({n for p in PROTOCOLS.values() for n in p.flag_values()}))


def get(name: str) -> Protocol:
  if name not in PROTOCOLS:
    raise ValueError(f'Unknown protocol {name!r}; choose one of {list(PROTOCOL_NAMES)}.')
  return PROTOCOLS[name]


def values_for_unset(name: str, given, algo_hparams) -> dict:
  """The protocol's values for the flags a run does not set itself.

  Args:
    name: One of `PROTOCOL_NAMES`.
    given: The names of the flags the run sets (its command line, or a program's
      per-run values such as a grid's); the protocol leaves them alone.
    algo_hparams: The hyperparameter names the chosen algorithm takes; the protocol's
      other hyperparameters are skipped.

  Returns:
    Flag name -> the protocol's value, for the flags not in `given`.
  """
  protocol = get(name)
  return {
      flag: value for flag, value in protocol.flag_values().items()
      if flag not in given and (flag not in protocol.hparams or flag in algo_hparams)
  }
