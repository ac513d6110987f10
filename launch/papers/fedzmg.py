"""The FedZMG paper: its learning-rate grid, its comparison and its Tables 3-8.

Zantalis, Zervas and Koulouras, "FedZMG: Efficient Client-Side Optimization in Federated
Learning", arXiv:2602.18384.

docs/specification.md section 6. FedZMG has no `--protocol` (its runs use the tasks' own clients
and launch.train's defaults); its protocol is the grid search (every pair of client and
server learning rates 10^-3, 10^-2.5, ..., 10^1, 50 rounds, 10 clients per round, scored
by the mean validation accuracy of the last 10 rounds), then 5 seeds of each algorithm
at its best pair for 1000 rounds.
"""

from launch.papers import base

# The paper's grid axis: 10^-3 ... 10^1 in half decades (section 5.2.1).
HALF_DECADES = tuple(10.0 ** (k / 2) for k in range(-6, 3))
GRID = base.Grid(
    client_learning_rates=HALF_DECADES, server_learning_rates=HALF_DECADES,
    total_rounds=50, clients_per_round=10, score_rounds=10,
)
_TASKS = {t: base.Setting(key=t, task=t) for t in ('emnist', 'cifar100', 'shakespeare')}


def _zmg_summary(*, number, dataset, values, notes=()):
  """FedZMG Tables 3-5: rounds to each threshold and the accuracy after the second."""
  return base.PublishedTable(
      paper='fedzmg', number=number,
      source=f'FedZMG, Table {number} (section 6.1, Algorithms comparison)',
      caption=f'{dataset}: rounds to the two accuracy thresholds and the late-stage'
      ' accuracy after the second, mean over 5 runs',
      columns={'rounds_to_t1': 'Rounds to T1', 'rounds_to_t2': 'Rounds to T2',
               'late_stage_t2': 'Avg Acc Post-T2 (%)'},
      rows=base.rows(('rounds_to_t1', 'rounds_to_t2', 'late_stage_t2'), values),
      notes=(
          'Our copy prints the tables without captions; the dataset is identified by its'
          ' numbers (section 7.1 names CIFAR-100\'s 250/805/420 rounds and Shakespeare\'s'
          ' 55.79%; 98.9% can only be EMNIST) and the tables are numbered in the order'
          ' printed.',
      ) + tuple(notes),
  )


def _zmg_ttest(*, number, dataset, values, notes=()):
  """FedZMG Tables 6-8: paired t-tests over the 5 seeds."""
  return base.PublishedTable(
      paper='fedzmg', number=number,
      source=f'FedZMG, Table {number} (section 6.2, Statistical significance tests)',
      caption=f'{dataset}: paired t-tests over 5 seeds with identical data splits',
      columns={'t': 't-Statistic', 'p': 'p-Value'},
      rows={pair: {'t': t, 'p': None} for pair, t in values.items()},
      notes=(
          'The p-values are not in our copy (inline math was lost); the paper does not'
          ' say which metric is tested: we test the final accuracy.',
      ) + tuple(notes),
  )


_HEADERS_20_33 = (
    'Our copy heads this table "Rounds to 20.0% / 33.0%" like the CIFAR-100 one; we use'
    ' the thresholds of section 5.3 and docs/specification.md section 6 for this dataset.'
)
_TTEST_ORDER = (
    'Which dataset each t-test table belongs to is inferred: section 7.2 says the'
    ' FedZMG-FedAdam difference was less significant on EMNIST and Shakespeare, so the'
    ' table with t = 7.804 is CIFAR-100; the other two are taken in the reverse order of'
    ' Tables 3-5 (EMNIST, Shakespeare), which our copy cannot confirm.'
)

PUBLISHED = base.by_number(
    _zmg_summary(number=3, dataset='CIFAR-100', values={
        'fedzmg': (95, 250, 39.50), 'fedavg': (155, 805, 34.69),
        'fedadam': (135, 420, 37.68)}),
    _zmg_summary(number=4, dataset='Shakespeare', values={
        'fedzmg': (15, 15, 55.79), 'fedavg': (15, 55, 51.92),
        'fedadam': (30, 45, 56.62)}, notes=(_HEADERS_20_33,)),
    _zmg_summary(number=5, dataset='EMNIST', values={
        'fedzmg': (15, 20, 98.91), 'fedavg': (15, 20, 98.43),
        'fedadam': (35, 40, 97.96)}, notes=(_HEADERS_20_33,)),
    _zmg_ttest(number=6, dataset='EMNIST', values={
        'fedzmg vs fedadam': 2.043, 'fedzmg vs fedavg': 4.025}, notes=(_TTEST_ORDER,)),
    _zmg_ttest(number=7, dataset='Shakespeare', values={
        'fedzmg vs fedadam': 1.452, 'fedzmg vs fedavg': 3.854}, notes=(_TTEST_ORDER,)),
    _zmg_ttest(number=8, dataset='CIFAR-100', values={
        'fedzmg vs fedadam': 7.804, 'fedzmg vs fedavg': 20.716}, notes=(_TTEST_ORDER,)),
)

PAPER = base.Paper(
    name='fedzmg',
    title='FedZMG (arXiv 2602.18384; docs/specification.md section 6; paper sections 5.2-6.2)',
    algos=('fedzmg', 'fedavg', 'fedadam'),
    seeds=(0, 1, 2, 3, 4),
    total_rounds=1000,
    flags=dict(clients_per_round=10),
    grid=GRID,
    tables=base.by_number(
        base.TableSpec(number=3, layout='summary', settings=(_TASKS['cifar100'],)),
        base.TableSpec(number=4, layout='summary', settings=(_TASKS['shakespeare'],)),
        base.TableSpec(number=5, layout='summary', settings=(_TASKS['emnist'],)),
        base.TableSpec(number=6, layout='ttest', settings=(_TASKS['emnist'],)),
        base.TableSpec(number=7, layout='ttest', settings=(_TASKS['shakespeare'],)),
        base.TableSpec(number=8, layout='ttest', settings=(_TASKS['cifar100'],)),
    ),
    published=PUBLISHED,
    notes=(
        'Comparison: 1000 rounds (section 5.2.2), 5 seeds (section 5.3). The comparison'
        ' cohort is not legible in our copy of section 5.2.2; we keep the tuning'
        ' cohort, 10.',
        'Tuning: "the epoch size at 4" (section 5.2.1) is ambiguous and docs/specification.md'
        ' leaves it; every run trains 1 local epoch (launch.train\'s default).',
        'Each algorithm is tuned on each task (section 5.2.1), so the grid runs 81'
        ' cells per algorithm and task.',
    ),
)
