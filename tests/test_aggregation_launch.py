"""The aggregators through the programs: `launch.train`'s flags, a DP run's epsilon in
metrics.csv and its summary, its kill -9 and resume, the refusals, and the bytes columns of
`launch.compare` (docs/privacy_and_communication.md, issue 31).

Real runs on tiny synthetic EMNIST (`small_runs`: six clients, three a round). The DP run
is trained once, uninterrupted, in a process of its own (`dp_run`: as fresh as the killed
run, whose threads per op, and so the evaluation's sums to the last bit, a test process
would not share), and read by the epsilon test and the resume test; epsilon is checked
against `dp_accounting` driven here, the bytes against a hand count of the EMNIST CNN's
parameters. A 1-round FedAvg run, trained once in this process (`fedavg_run`), is copied
by the test that resumes a run from before the aggregator setting and by the comparison,
which finds it finished, as FedZMG's, and trains SCAFFOLD's in a process of its own.
"""

import csv
import json
import os
import shutil
import subprocess
import sys

from absl import flags
import dp_accounting
import numpy as np
import pytest
import tensorflow as tf

from launch.run import accounting
from launch import compare
from launch.run import rounds
from launch.run import run_config
from launch.run import settings as run_settings
from launch.sweeps import runner
from tff_zmg import aggregation
from tff_zmg.templates import hparams as hparams_lib
import small_runs

_TRAIN_CLIENTS, _CLIENTS_PER_ROUND = 6, 3  # small_runs.FLAGS.
_TIME_COLUMNS = ('training_time_in_seconds', 'evaluation/evaluation_time_in_seconds')
_TIMEOUT_S = 900
# The DP run: four rounds, a checkpoint every two, so that a kill after round 3 leaves a
# round that metrics.csv has and no checkpoint holds.
_DP_FLAGS = ('--task=emnist', '--algo=fedzmg', '--total_rounds=4', '--rounds_per_checkpoint=2',
             '--aggregator=dp_fixed', '--noise_multiplier=0.8', '--clip=0.05',
             '--target_delta=1e-4', '--seed=3', '--runtime=in_process')
_DP_RUN = 'emnist_fedzmg_seed3'
# The EMNIST CNN by hand (specification.md section 5): 5x5 convolutions of 32 and 64
# filters with biases, a dense layer of 512 on the 7x7x64 features, 62 classes.
_EMNIST_PARAMETERS = ((5 * 5 * 1 * 32 + 32) + (5 * 5 * 32 * 64 + 64)
                      + (7 * 7 * 64 * 512 + 512) + (512 * 62 + 62))
_FLOAT32 = 4


def _train_command(cache_dir, root, *args):
  return [sys.executable, '-m', 'launch.train', f'--cache_dir={cache_dir}',
          f'--root_output_dir={root}', *small_runs.FLAGS, *args]


def _run(command, timeout=_TIMEOUT_S):
  return subprocess.run(command, capture_output=True, text=True, cwd=small_runs.REPO,
                        timeout=timeout)


def _rows(path):
  with open(path, newline='') as f:
    return list(csv.DictReader(f))


def _without_times(rows):
  return [{k: v for k, v in r.items() if k not in _TIME_COLUMNS} for r in rows]


def _summary(stdout):
  return json.loads(stdout.split('summary: ')[1])


def _one_error_line(err):
  lines = err.strip().splitlines()
  assert len(lines) == 1 and 'Traceback' not in err, err
  assert lines[0].startswith('train: error: '), err
  return lines[0]


@pytest.fixture(scope='module')
def dp_run(synthetic_cache_dir, tmp_path_factory):
  """(folder, stdout) of the DP run, trained uninterrupted in its own process."""
  root = tmp_path_factory.mktemp('dp_uninterrupted')
  done = _run(_train_command(synthetic_cache_dir, root, *_DP_FLAGS))
  assert done.returncode == 0 and done.stderr == '', done.stderr
  return root / _DP_RUN, done.stdout


# The FedAvg run: one round, the aggregator left at its default; in the comparison's terms
# (its --runtime, and a name and place `launch.compare` gives the run of fedavg, seed 0).
_FEDAVG_FLAGS = ('--task=emnist', '--algo=fedavg', '--total_rounds=1', '--runtime=in_process')
_FEDAVG_RUN = 'emnist_fedavg_seed0'


@pytest.fixture
def fedavg_run(run_main, tmp_path_factory):
  """(folder, (exit status, stdout, stderr)) of the FedAvg run, trained in this process
  (`run_main`) once, for the first test that asks; tests copy it (`_copy`)."""

  def train_fedavg():
    root = tmp_path_factory.mktemp('fedavg')
    return root / _FEDAVG_RUN, run_main(*_FEDAVG_FLAGS, root=root)

  return small_runs.made_once(('test_aggregation_launch', 'fedavg'), train_fedavg)


def _copy(run_dir, root):
  """A copy of a run folder in `root` (a copied run resumes)."""
  copy = root / run_dir.name
  shutil.copytree(run_dir, copy)
  return copy


# The flags.


def test_each_aggregator_setting_has_a_flag_with_its_range_and_default():
  """One flag per field but those the run sets (clients_per_round: --clients_per_round,
  noise_seed: --seed); none clashes with an algorithm's hyperparameter."""
  fields = hparams_lib.field_info(aggregation.AggregatorSettings)
  defaults = aggregation.AggregatorSettings()
  expected = {run_config.aggregator_flag(f): f for f in fields
              if f not in ('clients_per_round', 'noise_seed')}
  assert expected == run_settings._AGGREGATOR_FLAGS  # pylint: disable=protected-access
  assert set(expected) == {
      'aggregator', 'noise_multiplier', 'clip', 'target_unclipped_quantile',
      'clip_learning_rate', 'target_delta', 'compression_bits', 'compression_threshold'}
  assert not set(expected) & set(run_settings._HPARAMS)  # pylint: disable=protected-access
  for flag, field in expected.items():
    kind, valid, text = fields[field]
    assert flags.FLAGS[flag].default is None, flag  # Unset: the field's default.
    assert text.rstrip('.') in flags.FLAGS[flag].help and valid.text in flags.FLAGS[flag].help
    assert f'Default: {getattr(defaults, field)!r}.' in flags.FLAGS[flag].help


@pytest.mark.parametrize('args, message', [
    (['--noise_multiplier=-1'], 'noise_multiplier must be in [0, 1e+06], got -1.0'),
    # Issue 47: both passed and were reported as divergence (exit 3).
    (['--noise_multiplier=1e30'], 'noise_multiplier must be in [0, 1e+06], got 1e+30'),
    (['--noise_multiplier=1', '--clip=1e300'],
     'clip must be at most 3.40282e+38 in magnitude (a float32), got 1e+300'),
    (['--clip=0'], 'clip must be > 0, got 0.0'),
    (['--clip=-0.5'], 'clip must be > 0, got -0.5'),
    (['--target_delta=0'], 'target_delta must be in (0, 1), got 0.0'),
    (['--target_delta=1'], 'target_delta must be in (0, 1), got 1.0'),
    (['--target_delta=1.5'], 'target_delta must be in (0, 1), got 1.5'),
    (['--aggregator=private'], "aggregator must be one of ['mean', 'dp_fixed',"),
    (['--aggregator=mean', '--noise_multiplier=1'],
     '--noise_multiplier does not apply to --aggregator=mean, which reads no other flag'),
    (['--aggregator=compressed', '--clip=0.5'], '--clip does not apply to'
     ' --aggregator=compressed, which reads --compression_bits, --compression_threshold'),
    (['--aggregator=dp_adaptive'], 'dp_adaptive with noise_multiplier=1 needs'
     ' clients_per_round > 10'),
])
def test_a_bad_aggregator_setting_ends_in_one_line_and_writes_nothing(run_main, tmp_path, args,
                                                                     message):
  if not any(a.startswith('--aggregator=') for a in args):
    args = ['--aggregator=dp_fixed', *args]
  rc, out, err = run_main('--task=emnist', '--algo=fedavg', *args, root=tmp_path / 'runs')
  assert rc == 2 and message in _one_error_line(err) and out == ''
  assert not os.path.exists(tmp_path / 'runs')


def test_scaffold_refuses_dp_in_one_line_before_reading_data(tmp_path):
  """The program's own exit: status 2, one line naming what would escape the noise, and
  nothing written, not even the synthetic data it would have made."""
  cache, root = tmp_path / 'cache', tmp_path / 'runs'
  done = _run(_train_command(cache, root, '--task=emnist', '--algo=scaffold',
                             '--aggregator=dp_fixed'))
  assert done.returncode == 2 and done.stdout == ''
  assert _one_error_line(done.stderr) == (
      'train: error: --algo=scaffold refuses --aggregator=dp_fixed: scaffold takes no'
      ' model_aggregator: its clients also upload their control-variate deltas c_i+ - c_i,'
      ' which would escape it (it aggregates the model updates only)')
  assert not os.path.exists(cache) and not os.path.exists(root)


def test_grid_search_and_compare_pass_the_aggregator_flags_to_each_run():
  """Both describe each run by `runner.train_run`: the flags given reach the run's
  command line and its config; a refused pair is refused there, before any run starts."""
  flags.FLAGS.unparse_flags()
  try:
    flags.FLAGS(['compare', '--task=emnist', '--aggregator=dp_fixed', '--noise_multiplier=2',
                 '--clip=0.5'])
    run = runner.train_run(run_settings.settings_from_flags(), 'r', {'algo': 'fedzmg', 'seed': 1})
    assert {'--aggregator=dp_fixed', '--noise_multiplier=2.0', '--clip=0.5'} <= set(run.args)
    assert run.config.aggregator == {'kind': 'dp_fixed', 'noise_multiplier': 2.0, 'clip': 0.5}
    assert run.config.recorded()['aggregator'] == {
        'kind': 'dp_fixed', 'noise_multiplier': 2.0, 'clip': 0.5, 'target_delta': 1e-5}
    with pytest.raises(ValueError, match='--algo=scaffold refuses --aggregator=dp_fixed'):
      runner.train_run(run_settings.settings_from_flags(), 'r',
                       {'algo': 'scaffold', 'seed': 1}).config.recorded()
  finally:
    flags.FLAGS.unparse_flags()


# A DP run: epsilon after each round, its summary, its resumption.


def _dp_accounting_epsilon(rounds_trained):
  """Fixed-size sampling of m of the N clients (replace-one: the clipped sum moves by up to
  2C, so the Gaussian's multiplier per unit of sensitivity is z / 2), composed."""
  accountant = dp_accounting.rdp.RdpAccountant(
      neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
  accountant.compose(dp_accounting.SampledWithoutReplacementDpEvent(
      _TRAIN_CLIENTS, _CLIENTS_PER_ROUND, dp_accounting.GaussianDpEvent(0.8 / 2)),
      rounds_trained)
  return accountant.get_epsilon(1e-4)


def test_a_dp_run_writes_epsilon_after_each_round_and_sums_up_what_it_spent(dp_run):
  run_dir, out = dp_run
  epsilons = {int(r['key']): float(r[rounds.EPSILON_METRIC]) for r in _rows(
      run_dir / 'metrics.csv')}
  assert sorted(epsilons) == [0, 1, 2, 3, 4] and epsilons[0] == 0.0
  for key in range(1, 5):
    assert epsilons[key] == pytest.approx(_dp_accounting_epsilon(key), rel=1e-9), key
  assert epsilons[1] < epsilons[2] < epsilons[3] < epsilons[4]
  summary = _summary(out)
  aggregator = {'kind': 'dp_fixed', 'noise_multiplier': 0.8, 'clip': 0.05,
                'target_delta': 1e-4}
  assert summary['aggregator'] == aggregator
  assert json.loads((run_dir / 'flags.json').read_text())['aggregator'] == aggregator
  assert summary['epsilon'] == epsilons[4]
  assert summary['upload_tensor_bytes_per_client'] == _FLOAT32 * _EMNIST_PARAMETERS
  assert json.loads((run_dir / 'communication.json').read_text()) == {
      k: summary[k] for k in ('broadcast_bytes_per_client', 'upload_bytes_per_client',
                              'broadcast_tensor_bytes_per_client',
                              'upload_tensor_bytes_per_client')}
  aggregator_line, = [line for line in out.splitlines() if line.startswith('aggregator:')]
  assert aggregator_line == (
      'aggregator: dp_fixed (noise_multiplier=0.8, clip=0.05, target_delta=0.0001); 3 of 6'
      ' clients a round, noise seeded by --seed, accounted for fixed_size sampling; uniform'
      ' weights in place of fedzmg\'s weights by examples')
  assert 'round 4/4' in out and f'epsilon={epsilons[4]:.4f}' in out


def _checkpoint_leaves(run_dir, version):
  module = tf.saved_model.load(str(run_dir / 'checkpoints' / f'program_state_{version}'))
  return [np.asarray(v) for v in tf.nest.flatten(module())]


def test_a_killed_dp_run_resumes_to_the_uninterrupted_run_bit_for_bit(
    dp_run, synthetic_cache_dir, tmp_path):
  """SIGKILL after round 3 is in metrics.csv, whose checkpoint was not due: the resumed run
  trains round 3 again from checkpoint 2, drawing its noise again from the seed in the
  state, and ends where the uninterrupted one ends, to the bit."""
  whole_dir, _ = dp_run
  command = _train_command(synthetic_cache_dir, tmp_path, *_DP_FLAGS)
  small_runs.kill_when(command, 'round 3/4')
  killed_dir = tmp_path / _DP_RUN
  assert max(int(r['key']) for r in _rows(killed_dir / 'metrics.csv')) == 3
  resumed = _run(command)
  assert resumed.returncode == 0 and resumed.stderr == '', resumed.stderr
  assert 'round 3/4' in resumed.stdout and 'round 2/4' not in resumed.stdout
  assert _without_times(_rows(killed_dir / 'metrics.csv')) == _without_times(
      _rows(whole_dir / 'metrics.csv'))
  for whole, again in zip(_checkpoint_leaves(whole_dir, 4), _checkpoint_leaves(killed_dir, 4),
                          strict=True):
    np.testing.assert_array_equal(again, whole)


def test_a_dp_run_without_noise_sums_up_in_json_with_epsilon_null_and_infinite(tmp_path):
  """Issue 47: `--noise_multiplier=0` printed `"epsilon": Infinity`, which is not JSON.
  A clipping aggregator without noise guarantees nothing: null, and said to be infinite;
  with noise, the accountant's finite number, and nothing more."""
  for noise, expected in ((0.0, {'epsilon': None, 'epsilon_infinite': True}),
                          (1.0, {'epsilon': aggregation.epsilon(
                              noise_multiplier=1.0, clients_per_round=3, num_clients=6,
                              rounds=2, target_delta=1e-5, sampling='fixed_size')})):
    config = run_config.ExperimentConfig(
        task='emnist', algo='fedavg', root_output_dir=str(tmp_path), experiment_name='x',
        clients_per_round=3,
        aggregator={'kind': 'dp_fixed', 'noise_multiplier': noise, 'clip': 0.1})
    epsilon = accounting.epsilon_after(config.aggregator_settings(6), 6)
    summary = json.loads(json.dumps(accounting.summary(config, epsilon, 2, None),
                                    allow_nan=False))
    assert {k: v for k, v in summary.items() if k.startswith('epsilon')} == expected


def test_a_run_from_before_the_aggregator_setting_resumes_as_mean(
    fedavg_run, run_main, tmp_path):
  """Its flags.json and checkpoint identity have no aggregator: the same command resumes
  it; another aggregator is another run, refused."""
  base = list(_FEDAVG_FLAGS)
  rc, out, err = fedavg_run[1]  # The first command, `run_main(*base)`, elsewhere.
  assert rc == 0, err
  assert 'aggregator: mean; fedavg\'s weights by examples' in out
  summary = _summary(out)
  assert summary['aggregator'] == {'kind': 'mean'} and summary['epsilon'] is None
  run_dir = _copy(fedavg_run[0], tmp_path)
  for path, settings_of in ((run_dir / 'flags.json', lambda r: r),
                            (run_dir / 'checkpoints' / 'run_identity.json',
                             lambda r: r['settings'])):
    record = json.loads(path.read_text())
    assert settings_of(record).pop('aggregator') == {'kind': 'mean'}
    path.write_text(json.dumps(record))
  rc, out, err = run_main(*base[:2], '--total_rounds=2', *base[3:])
  assert rc == 0 and 'round 2/2' in out, err
  rc, _, err = run_main(*base[:2], '--total_rounds=3', *base[3:], '--aggregator=robust')
  assert rc == 2 and 'holds a run with other settings (aggregator:' in err


# launch.compare: the bytes each algorithm sends, measured.


def test_compare_shows_the_bytes_each_algorithm_sends_fedzmg_as_fedavg_scaffold_twice(
    fedavg_run, run_main, synthetic_cache_dir, tmp_path, run_program):
  root, report_dir = tmp_path / 'runs', tmp_path / 'report'
  # FedAvg's run is the shared one and FedZMG's is trained here, in this process, with the
  # comparison's flags (both finished: the comparison does not train them again);
  # SCAFFOLD's is a launch.train process the comparison starts. The comparison in this
  # process: its case is its report, not its process.
  root.mkdir()
  _copy(fedavg_run[0], root)
  rc, _, err = run_main('--task=emnist', '--algo=fedzmg', '--total_rounds=1',
                        '--runtime=in_process', root=root)
  assert rc == 0, err
  rc, _, err = run_program(
      compare, f'--cache_dir={synthetic_cache_dir}', f'--root_output_dir={root}',
      f'--report_dir={report_dir}', *small_runs.FLAGS, '--task=emnist',
      '--algos=fedavg,fedzmg,scaffold', '--seeds=0', '--total_rounds=1',
      '--runtime=in_process')
  assert rc == 0, err
  # Trained by the comparison: SCAFFOLD's run only.
  # The run's log, and the warm slots' own logs.
  assert sorted(os.listdir(report_dir / 'logs')) == ['emnist_scaffold_seed0.log', 'workers']
  summary = {r['algo']: r for r in _rows(report_dir / 'summary.csv')}
  model = _FLOAT32 * _EMNIST_PARAMETERS
  for algo, copies in (('fedavg', 1), ('fedzmg', 1), ('scaffold', 2)):  # w (and c) each way.
    assert int(summary[algo]['broadcast_tensor_bytes_per_client']) == copies * model, algo
    assert int(summary[algo]['upload_tensor_bytes_per_client']) == copies * model, algo
    assert summary[algo]['aggregator'] == 'mean'
  assert summary['fedzmg']['upload_bytes_per_client'] == summary['fedavg'][
      'upload_bytes_per_client']
  report = (report_dir / 'report.md').read_text()
  assert '| aggregator | bytes broadcast per client and round | bytes uploaded per client and' \
         ' round |' in report
  scaffold = summary['scaffold']
  assert (f"| mean | {int(scaffold['broadcast_bytes_per_client']):,} |"
          f" {int(scaffold['upload_bytes_per_client']):,} |") in report
