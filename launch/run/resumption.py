"""Whether a run's folder may be trained, and from which round: a new run, or one resumed.

A run continues what its folder holds only with the settings that made it: flags.json
and the identity beside the checkpoints must agree with today's settings
(`check_resumable`, `check_identity`; where it runs, the rounds to go and where its files are
may change: `lasting_settings`), and a run is never cut back (`check_total_rounds`).
`check_run_directory` makes every check that can refuse the folder before any
computation, `rewind` deletes the checkpoints metrics.csv does not reach,
`check_checkpoint` picks the newest checkpoint that can be restored, and `missing`
(`is_finished`) says what the folder lacks of the whole run (`analysis.runs` reads
metrics.csv).

A folder holds the whole run when metrics.csv records every round whole, with the
evaluations the run is scored by (`score_rounds`), and the last checkpoint the run writes
is on the disk. Checkpoints are written while the next round trains, and a round is
recorded once the checkpoint before it is on the disk, so metrics.csv may hold one round
more than the checkpoints: the round is trained again, and evaluated again where it was.
"""

import json
import os
import shutil
from typing import Optional

from launch.run import errors
from launch.run import event_loop
from launch.run import rounds
from launch.run import run_config
from launch.run import run_directory
from launch.run import run_identity
import tasks
from tasks import evaluation
from tasks import sources
from tasks import tfds_source
from tff_zmg import aggregation
from tff_zmg import analysis
from tff_zmg.algorithms import registry
from tff_zmg import run_files

# Settings that may change between a run and its resumption without changing its results.
_RESUMABLE_CHANGES = frozenset(
    {
        'total_rounds', 'executor', 'runtime', 'max_concurrent_clients',
        'intra_op_threads', 'rounds_per_checkpoint', 'workers', 'worker_timeout_s',
        'divergence_factor', 'eval_last_rounds',
    }
)
# Where a run and its data are, not what they are: a run folder may be copied or renamed
# and the data moved (the data's identity is checked instead, `identity`).
_LOCATION_SETTINGS = frozenset({'root_output_dir', 'experiment_name', 'cache_dir'})
_IDENTITY_PATH = f'{run_files.CHECKPOINTS}/{run_files.IDENTITY}'


def _rounds_with(rows: list[dict], name: str) -> set[int]:
  return {int(r['key']) for r in rows if r.get(name) not in (None, '')}


def score_rounds(config: run_config.ExperimentConfig) -> list[int]:
  """The rounds whose evaluations a finished run is judged by: those `evaluation_due`
  asks for among its last `eval_last_rounds` rounds (a grid cell's score), else its last
  round's (a comparison's final accuracy)."""
  last = config.total_rounds
  first = last - config.eval_last_rounds + 1 if config.eval_last_rounds else last
  return [r for r in range(max(first, 1), last + 1) if rounds.evaluation_due(config, r)]


def last_checkpoint_round(config: run_config.ExperimentConfig) -> int:
  """The round of the last checkpoint a run writes: its last multiple of
  `rounds_per_checkpoint` (TFF's training loop saves no other)."""
  return config.total_rounds - config.total_rounds % config.rounds_per_checkpoint


def _listed(rounds_: list[int]) -> str:
  return f'round {rounds_[0]}' if len(rounds_) == 1 else 'rounds ' + ', '.join(map(str, rounds_))


def missing(config: run_config.ExperimentConfig) -> Optional[str]:
  """What the run's folder lacks of the whole run `config` asks for, in words; None when
  nothing is left to do (a sweep then does not start it).

  The rounds metrics.csv records whole, the evaluations the run is scored by
  (`score_rounds`), and the last checkpoint it writes (`last_checkpoint_round`; a later
  one, of a run continued past `total_rounds`, does as well): what `launch.train`'s
  resumption writes again when any is missing.

  Raises:
    errors.ExperimentError: the folder holds a run with other settings, or a run trained
      past `total_rounds` whose metrics.csv lacks evaluations it is scored by (a resumed
      run never trains those rounds again).
  """
  check_resumable(run_config.resolve_evaluation(config))
  rows = analysis.runs.whole_rows(config.metrics_csv)
  trained = max(_rounds_with(rows, analysis.runs.TRAIN_LOSS), default=0)
  if trained < config.total_rounds:
    first = trained + 1
    return f'round {first}' if first == config.total_rounds else (
        f'rounds {first}-{config.total_rounds}')
  newest = run_directory.newest_checkpoint_round(config.checkpoint_dir)
  evaluated = _rounds_with(rows, analysis.runs.EVAL_ACCURACY)
  unevaluated = [r for r in score_rounds(config) if r not in evaluated]
  if unevaluated:
    if newest is not None and newest > config.total_rounds:
      raise errors.ExperimentError(
          f'{config.metrics_csv} lacks the evaluation of {_listed(unevaluated)}, which a run'
          f' of {config.total_rounds} rounds is scored by, and the run has trained on to'
          f' round {newest}, so no resumption evaluates it again: move {config.output_dir}'
          ' away to train it afresh, or pass --overwrite'
      )
    return f'the evaluation of {_listed(unevaluated)}'
  needed = last_checkpoint_round(config)
  if newest is None or newest < needed:
    return f'the checkpoint of round {needed}'
  return None


def is_finished(config: run_config.ExperimentConfig) -> bool:
  """Whether the folder holds the whole run `config` asks for (`missing`).

  Raises:
    errors.ExperimentError: as `missing`.
  """
  return missing(config) is None


def rounds_done(config: run_config.ExperimentConfig) -> int:
  """Rounds a run's metrics.csv already holds (0 for a new run)."""
  trained = analysis.runs.metric_by_round(config.metrics_csv, analysis.runs.TRAIN_LOSS)
  return max(trained, default=0)


def evaluated_after(config: run_config.ExperimentConfig, round_num: Optional[int]) -> set[int]:
  """The rounds after `round_num` (the checkpoint a run resumes from) that metrics.csv
  records evaluated: trained again, they are evaluated again, whatever the rounds to go
  now ask for, so that resuming never loses a score."""
  evaluated = analysis.runs.metric_by_round(config.metrics_csv, analysis.runs.EVAL_ACCURACY)
  return {r for r in evaluated if r > (round_num or 0)}


def rewind(config: run_config.ExperimentConfig) -> Optional[str]:
  """Deletes the checkpoints of rounds metrics.csv does not record whole (a torn or lost
  last row: a damaged disk, a power cut) or records without an evaluation the run is
  scored by (`score_rounds`), so that the run resumes before them and trains and
  evaluates those rounds again (the same rounds: training is a function of the seed).

  Returns:
    A sentence saying what was deleted, or None.

  Raises:
    errors.ExperimentError: no checkpoint before those rounds is kept.
  """
  if not os.path.exists(config.metrics_csv):
    return None  # `run_directory.repair_metrics_csv` refuses it beside checkpoints.
  rows = analysis.runs.whole_rows(config.metrics_csv)
  recorded = max((int(r['key']) for r in rows), default=-1)
  evaluated = _rounds_with(rows, analysis.runs.EVAL_ACCURACY)
  unevaluated = [r for r in score_rounds(config) if r <= recorded and r not in evaluated]
  limit = min([recorded] + [r - 1 for r in unevaluated])
  versions = run_directory.checkpoint_versions(config.checkpoint_dir)
  ahead = [v for v in versions if v > limit]
  if not ahead:
    return None
  why = (f'lacks the evaluation of {_listed(unevaluated)}' if limit < recorded
         else f'ends at round {recorded}')
  if len(ahead) == len(versions):
    raise errors.ExperimentError(
        f'{config.metrics_csv} {why} but the checkpoints kept go from round {ahead[0]} to'
        f' {ahead[-1]}, so those rounds would never be written again: restore the file, or'
        ' pass --overwrite to start afresh'
    )
  for version in ahead:
    shutil.rmtree(os.path.join(config.checkpoint_dir, f'program_state_{version}'))
  return (f'{run_files.METRICS} {why}: resuming from the checkpoint of round'
          f' {versions[len(versions) - len(ahead) - 1]}, the checkpoints of'
          f' {_listed(ahead)} are written again')


def check_resumable(config: run_config.ExperimentConfig) -> bool:
  """Refuses to continue a run whose flags.json records different settings.

  Returns:
    Whether flags.json exists (and agrees).
  """
  path = os.path.join(config.output_dir, run_files.FLAGS)
  if not os.path.exists(path):
    return False
  try:
    with open(path) as f:
      recorded = json.load(f)
  except (OSError, ValueError) as e:
    raise errors.ExperimentError(
        f'{path} is unreadable ({type(e).__name__}); delete it to resume by the record'
        f' beside the checkpoints ({_IDENTITY_PATH}), or pass --overwrite to start this'
        ' experiment afresh'
    ) from e
  if not isinstance(recorded, dict):
    kind = {list: 'list', type(None): 'null', str: 'string', bool: 'boolean'}.get(
        type(recorded), 'number'
    )
    raise errors.ExperimentError(
        f'{path} holds a JSON {kind}, not a run\'s settings; delete it'
        f' to resume by the record beside the checkpoints ({_IDENTITY_PATH}), or pass'
        ' --overwrite'
    )
  if not {'task', 'algo'} <= recorded.keys():  # Every run's record has them.
    raise errors.ExperimentError(
        f'{path} is not the record of a launch.train run (it names no task and algo):'
        f' {config.output_dir} holds files of something else; move them away or choose'
        ' another --experiment_name'
    )
  changed = run_identity.differences(
      lasting_settings(recorded), lasting_settings(config.recorded())
  )
  if changed:
    raise errors.ExperimentError(
        f'{config.output_dir} holds a run with other settings ({changed}); pass'
        ' --overwrite to replace it or choose another --experiment_name'
    )
  return True


def check_identity(
    config: run_config.ExperimentConfig, identity_now: dict, flags_agree: bool
) -> None:
  """Refuses checkpoints made with other settings or other data than `identity_now`
  (`identity`; the record read as today's, `lasting_settings`); a run from before the
  record continues where its flags.json agrees (`flags_agree`)."""
  run_identity.check_identity(
      config.output_dir, config.checkpoint_dir, identity_now, legacy_flags_ok=flags_agree,
      read_settings=lasting_settings,
  )


def lasting_settings(recorded: dict) -> dict:
  """The settings a resumed run must share with its start, as JSON reads them back:
  without the rounds to go, where it runs, and where its files are.

  A record from before the evaluation setting evaluated each of its first
  `num_eval_clients` test clients (0: all), which is the per-client evaluation; one from
  before the evaluation batch evaluated at its task's TaskSpec.eval_batch_size; one from
  before the aggregator setting aggregated with the algorithm's mean; one from
  before runs listed every hyperparameter holds only those given (`{}` for the
  defaults): the algorithm's defaults fill in the rest, so that it reads as the same run
  as today's record of the same command (but a GlobalGC record without a weight decay
  trained with none, unlike today's default).
  """
  ignored = _RESUMABLE_CHANGES | _LOCATION_SETTINGS
  settings = {
      k: v for k, v in json.loads(json.dumps(recorded)).items() if k not in ignored
  }
  if 'evaluation' not in settings:  # Before the setting: TFF's evaluation per client.
    settings.update(evaluation=evaluation.PER_CLIENT, eval_examples=None,
                    num_eval_clients=settings.get('num_eval_clients') or None)
  # Before the evaluation batch was chosen for speed, every run evaluated at its task's.
  if settings.get('task') in tasks.SPECS:
    settings.setdefault('eval_batch_size', tasks.SPECS[settings['task']].eval_batch_size)
  # Before the aggregator setting, every run averaged with its algorithm's own mean.
  settings.setdefault('aggregator', aggregation.AggregatorSettings().used())
  hparams = settings.get('hparams')
  if isinstance(hparams, dict) and settings.get('algo') in registry.ALGORITHMS:
    defaults = json.loads(json.dumps(dict(registry.get(settings['algo']).defaults)))
    if settings['algo'] == 'global_gc':  # Before it took a decay, its clients had none.
      defaults['weight_decay'] = 0.0
    settings['hparams'] = {**defaults, **hparams}
  return settings


def identity(config: run_config.ExperimentConfig, task) -> dict:
  """What a resumed run must share with the run that made its checkpoints.

  The settings that change results (not the rounds to go, where it runs, or where its
  files are) and the data's clients; no paths, so a copied run folder resumes.
  """
  return {
      'settings': lasting_settings(config.recorded()),
      'data': run_identity.data_identity(
          task.datasets.train_data.client_ids, task.datasets.test_data.client_ids
      ),
  }


def check_total_rounds(config: run_config.ExperimentConfig) -> None:
  """Refuses a --total_rounds below the rounds a run's checkpoints already hold."""
  versions = run_directory.checkpoint_versions(config.checkpoint_dir)
  if versions and versions[-1] > config.total_rounds:
    raise errors.ExperimentError(
        f'{config.output_dir} already trained {versions[-1]} rounds, more than'
        f' --total_rounds={config.total_rounds}, and a run is never cut back (its'
        f' {run_files.METRICS} holds every round): pass'
        f' --total_rounds={versions[-1]} or more to continue it, or --overwrite to train'
        ' afresh'
    )


def _cache_dir(config: run_config.ExperimentConfig) -> str:
  """The folder the task's loader reads: the setting, or the loader's own default."""
  if config.cache_dir:
    return os.path.expanduser(config.cache_dir)
  if config.task in tasks.CENTRALIZED_TASK_NAMES:
    return tfds_source.DEFAULT_DATA_DIR
  return sources.DEFAULT_CACHE_DIR


def check_run_directory(config: run_config.ExperimentConfig) -> None:
  """Everything about the run's folder that can be refused before any computation."""
  run_directory.check_environment(
      config.root_output_dir, config.output_dir, _cache_dir(config),
      # Derived data (synthetic, partitions, tfds copies) is built and locked there.
      cache_must_be_writable=(
          config.data_source == 'synthetic' or config.partition is not None
          or config.task in tasks.CENTRALIZED_TASK_NAMES
      ),
      num_parameters=tasks.registry.spec_with_model(config.task, config.model).num_parameters,
  )
  if config.overwrite:
    run_directory.check_deletable(config.root_output_dir, config.output_dir)
  elif os.path.isdir(config.output_dir):
    run_directory.check_holds_a_run(config.output_dir)
    # Read after the last round to add this session: a damaged one is refused now.
    analysis.runs.read_runtime(config.output_dir)
  run_directory.check_not_locked(config.output_dir)
  if not config.overwrite:
    check_total_rounds(config)


def check_checkpoint(
    config: run_config.ExperimentConfig, process, store=None
) -> Optional[int]:
  """Resumes from the newest checkpoint that can be read into this process's state (and
  whose client states `store`, if any, can restore).

  Newer ones that cannot (a save cut short, a damaged disk, a lost snapshot) are set aside as
  `checkpoints/unreadable_program_state_N`, saying so; if none can, the run is refused.

  Returns:
    The round of the checkpoint the run resumes from (None: it starts afresh).
  """
  if not os.path.isdir(config.checkpoint_dir):
    return None
  manager = rounds.CheckpointReader(config.checkpoint_dir)
  structure = process.initialize()
  loop = event_loop.thread_event_loop()

  def load(version):
    loop.run_until_complete(manager.load(version, structure))
    if store is not None:
      store.check_restorable(version)

  version, refused = run_directory.find_intact_checkpoint(config.checkpoint_dir, load)
  if refused and version is None:
    newest, e = refused[0]
    message = str(e).strip().splitlines()[0] if str(e).strip() else ''
    raise errors.ExperimentError(
        f'no checkpoint in {config.checkpoint_dir} can be restored into this experiment'
        f' (round {newest}: {type(e).__name__}: {message[:200]}); pass --overwrite to start'
        ' afresh'
    )
  for newer, e in refused:
    aside = run_directory.set_aside_unreadable(config.checkpoint_dir, newer)
    print(
        f'checkpoint of round {newer} cannot be read ({type(e).__name__}); resuming from'
        f' round {version}, the newest intact one (kept as'
        f' {run_files.CHECKPOINTS}/{aside})', flush=True,
    )
  return version
