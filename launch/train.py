r"""Trains one federated algorithm on one task: `python -m launch.train --task=... --algo=...`.

Any client rule with any server rule instead of a named algorithm (docs/algorithms.md,
"Composing rules"), recorded as algorithm `zmg_sgdm+adam`:

  python -m launch.train --task=emnist --client_rule=zmg_sgdm --server_rule=adam \
      --data_source=synthetic

Offline, on synthetic data in TFF's format (a few rounds, seconds per round on a CPU):

  python -m launch.train --task=emnist --algo=fedzmg --data_source=synthetic --total_rounds=5

Under differential privacy, epsilon after each round in metrics.csv (the other
aggregators: --aggregator=dp_adaptive|compressed|robust; docs/privacy_and_communication.md):

  python -m launch.train --task=emnist --algo=fedzmg --data_source=synthetic \
      --aggregator=dp_fixed --noise_multiplier=1 --clip=0.1

On TFF's published data (`<cache_dir>/emnist_all.sqlite` etc.):

  python -m launch.train --task=shakespeare --algo=fedzmg --total_rounds=1500

Outputs go to `<root_output_dir>/<experiment_name>/`: flags.json, metrics.csv, tensorboard/
and checkpoints/ (with run_identity.json, the settings and data the checkpoints belong to).
Re-running the same command resumes from the newest intact checkpoint (a copied or renamed
run folder too); other settings, or a second process on the same run, are refused;
--overwrite starts afresh. Before the first round the output and cache folders must be
writable and the disk must have room for a checkpoint. `--helpfull` lists every flag.

On several machines, each running `python -m launch.worker --port=8000`:

  python -m launch.train --task=emnist --algo=fedzmg --workers=hostA:8000,hostB:8000

Ctrl-C, SIGTERM or SIGHUP stops a run as its next round starts, or in process before a
round's next client (that round is trained again on resuming); a second one at once. It
says which round's checkpoint it resumes from: `train: error: interrupted after
round K; re-run the same command to resume`.

Exit status: as every program's (docs/operations.md, "Exit statuses").
"""

from absl import flags

from launch.cli import failures
from launch.cli import quiet
from launch.cli import stops
from launch.run import settings as run_settings
from launch.run import training

flags.adopt_module_key_flags(run_settings)


@failures.one_line_errors('train')
def main(argv) -> int:
  del argv
  quiet.quiet_libraries()
  training.train(run_settings.settings_from_flags(), stops.between_rounds)
  return 0


if __name__ == '__main__':
  # Required only here: the programs that start many runs set --algo per run, or take --algos.
  # A rule pair (--client_rule with --server_rule) stands for --algo; which of them go
  # together is the settings' to say (`run_settings.Settings`), so here only that one is.
  flags.mark_flags_as_required(['task'])
  flags.register_multi_flags_validator(
      ['algo', 'client_rule', 'server_rule'],
      lambda given: any(value is not None for value in given.values()),
      message='give --algo, or --client_rule with --server_rule')
  failures.run_program('train', main)
