"""A training run's settings as flags: every flag of `launch.train`, read into `Settings`.

`launch.train` reads its command line into `Settings`; the programs that start many runs
(grid search, comparison, reproduction) define the same flags by importing this module,
derive one `Settings` per run with their own values, and get each run's `ExperimentConfig`
(`experiment_config`) and command line (`Settings.command_line`) from it, so a run's config
is computed by one code path wherever it is computed. A run goes to the process that
trains it as data, its given flags' values (`Settings.given_values`, `settings_of`): no
absl flags are parsed for it there. Only `launch.train` marks --task and --algo required:
the others set them per run.
"""

import dataclasses
import sys
from typing import Any, Mapping

from absl import flags

from launch import papers
from launch.run import accounting
from launch.run import run_config
from launch.run import runtime_choice
import tasks
from tasks import evaluation
from tasks import synthetic
from tff_zmg import aggregation
from tff_zmg.algorithms import registry
from tff_zmg.algorithms import rules
from tff_zmg.runtime import cpp_worker
from tff_zmg.templates import hparams as hparams_lib


_TASK = flags.DEFINE_enum('task', None, list(tasks.TASK_NAMES), 'The federated task.')
_ALGO = flags.DEFINE_enum(
    'algo', None, sorted(registry.ALGORITHMS),
    'The algorithm (docs/algorithms.md) and how the server weights client updates: '
    + ' '.join(f'{name} ({accounting.WEIGHTS[spec.client_weighting]}): {spec.description}'
               for name, spec in registry.ALGORITHMS.items()),
)
# Instead of --algo: any client rule with any server rule (`registry.pair_name`).
_CLIENT_RULE = flags.DEFINE_enum(
    'client_rule', None, sorted(rules.CLIENT_RULES),
    'With --server_rule, instead of --algo: the client step of the process (docs/algorithms.md,'
    ' "Composing rules"); the run is named and recorded as algorithm'
    ' <client_rule>+<server_rule>, its clients weighted by their examples.',
)
_SERVER_RULE = flags.DEFINE_enum('server_rule', None, sorted(rules.SERVER_RULES),
                                  'With --client_rule, instead of --algo: the server step.')
_DATA_SOURCE = flags.DEFINE_enum(
    'data_source', 'tff', ['tff', 'synthetic'],
    "'tff': TFF's published SQLite files in --cache_dir; 'synthetic': generated data in"
    " the same format (offline; for trying things out and tests).",
)
_CACHE_DIR = flags.DEFINE_string(
    'cache_dir', None,
    'Directory with the <name>.sqlite files (default ~/.tff); for cifar10 and'
    ' cifar100_tfds the tensorflow_datasets data_dir (default ~/tensorflow_datasets).',
)
_SYNTHETIC_TRAIN_CLIENTS = flags.DEFINE_integer(
    'synthetic_train_clients', None, 'Synthetic data: number of training clients.'
)
_SYNTHETIC_TEST_CLIENTS = flags.DEFINE_integer(
    'synthetic_test_clients', None, 'Synthetic data: number of test clients.'
)
_SYNTHETIC_EXAMPLES = flags.DEFINE_integer(
    'synthetic_examples_per_client', None, 'Synthetic data: mean examples per client.'
)
_SYNTHETIC_ALPHA = flags.DEFINE_float(
    'synthetic_dirichlet_alpha', 0.5, 'Synthetic data: Dirichlet label-skew parameter.'
)
_SYNTHETIC_VOLUME_SKEW = flags.DEFINE_enum(
    'synthetic_volume_skew', synthetic.DEFAULT_VOLUME_SKEW, list(synthetic.VOLUME_SKEWS),
    'Synthetic data: how unequal the clients\' sizes are. lognormal: lognormal, s = 0.6;'
    ' shakespeare: as skewed as real Shakespeare\'s clients (median a third of the mean, the'
    ' largest about 9 times the mean; docs/data.md).',
)
_SYNTHETIC_SEED = flags.DEFINE_integer(
    'synthetic_seed', 0,
    'Synthetic data: generator seed (separate from --seed, so that runs with different'
    ' seeds see the same data).',
)
_TOTAL_ROUNDS = flags.DEFINE_integer(
    'total_rounds', 10,
    'Number of training rounds (launch.grid_search: each cell\'s,'
    f' {papers.fedzmg.GRID.total_rounds} unless given). Raising it continues a finished run;'
    ' a value below the rounds a run already trained is'
    ' refused (a run is never cut back: read the earlier rounds in its metrics.csv).',
)
_CLIENTS_PER_ROUND = flags.DEFINE_integer('clients_per_round', 10, 'Clients per round.')
_EPOCHS = flags.DEFINE_integer('client_epochs_per_round', 1, 'Local epochs per round.')
_BATCH_SIZE = flags.DEFINE_integer(
    'client_batch_size', None,
    'Client batch size. Default per task: '
    + ', '.join(f'{n}={s.batch_size}' for n, s in tasks.SPECS.items()) + '.',
)
_MAX_ELEMENTS = flags.DEFINE_integer(
    'max_elements_per_client', None, 'Optional cap on examples per client and round.'
)


def _define_flag(name: str, kind: type, valid, text: str, default_text: str):
  """A flag unset by default (None: the dataclass field's default applies), whose help
  is the field's with its range and default."""
  define = {float: flags.DEFINE_float, int: flags.DEFINE_integer, bool: flags.DEFINE_bool,
            str: flags.DEFINE_string}
  return define[kind](name, None, f'{text.rstrip(".")}; {valid.text}. {default_text}')


def _define_hparam_flags() -> dict:
  """One flag per hyperparameter of the registry's `Hparams` dataclasses, unset (None):
  an unset flag leaves the algorithm's default. The help is the field's, with its range
  and each algorithm's default."""
  fields = {}  # name -> (type, valid, help, {algo: default})
  for algo, spec in registry.ALGORITHMS.items():
    defaults = spec.defaults
    for name, (kind, valid, text) in hparams_lib.field_info(spec.hparams_class).items():
      fields.setdefault(name, (kind, valid, text, {}))[3][algo] = defaults[name]
  defined = {}
  for name, (kind, valid, text, defaults) in fields.items():
    if len(set(map(repr, defaults.values()))) == 1:
      default_text = f'Default: {next(iter(defaults.values()))!r} ({", ".join(defaults)}).'
    else:
      default_text = 'Defaults: ' + ', '.join(f'{a}={v!r}' for a, v in defaults.items()) + '.'
    defined[name] = _define_flag(name, kind, valid, text, default_text)
  return defined


def _define_aggregator_flags() -> dict[str, str]:
  """One flag per field of `aggregation.AggregatorSettings` but those the run sets
  (`run_config.RUN_AGGREGATOR_SETTINGS`): `--aggregator` (its kind), the DP and the
  compression settings, unset (None: the field's default).

  Returns:
    flag name -> field name.
  """
  defaults = aggregation.AggregatorSettings()
  defined = {}
  for field, (kind, valid, text) in hparams_lib.field_info(type(defaults)).items():
    if field in run_config.RUN_AGGREGATOR_SETTINGS:
      continue
    name = run_config.aggregator_flag(field)
    _define_flag(name, kind, valid, text, f'Default: {getattr(defaults, field)!r}.')
    defined[name] = field
  return defined


_HPARAMS = _define_hparam_flags()
# docs/privacy_and_communication.md; --clients_per_round and --seed are the DP aggregator's.
_AGGREGATOR_FLAGS = _define_aggregator_flags()
_SEED = flags.DEFINE_integer(
    'seed', 0,
    'Seed of the model initialization, client sampling and shuffling, and of a DP'
    ' aggregator\'s noise.'
)
_ROUNDS_PER_EVAL = flags.DEFINE_integer(
    'rounds_per_eval', 1,
    'Evaluate on the test clients every this many rounds, and after the last round.'
)
_EVAL_LAST_ROUNDS = flags.DEFINE_integer(
    'eval_last_rounds', None,
    'Evaluate only round 0 and the last this many rounds (those --rounds_per_eval asks'
    ' for); unset: every --rounds_per_eval-th round. A grid search\'s cells evaluate the'
    ' rounds their score reads (--score_rounds of each rung); a run may change it when'
    ' resumed. Divergence is then judged by the training loss alone in the other rounds.',
    lower_bound=1,
)
_EVALUATION = flags.DEFINE_enum(
    'evaluation', None, list(evaluation.KINDS),
    'How the model is evaluated on the held-out test set. global (the default, the'
    " papers'): the accuracy over every test example, pooled; per_client: each test"
    " client apart, reporting the mean and standard deviation of the clients' own"
    ' accuracies beside the pooled ones. A run started before this setting existed'
    ' resumes with its per-client evaluation.',
)
_EVAL_EXAMPLES = flags.DEFINE_integer(
    'eval_examples', None,
    'global evaluation only: a fixed subsample (the same for every algorithm and seed)'
    ' of this many test examples, for quick runs (default: every test example).',
)
_NUM_EVAL_CLIENTS = flags.DEFINE_integer(
    'num_eval_clients', None,
    'per_client evaluation only: the first this many test clients (sorted ids;'
    ' default: all).',
)
_ROUNDS_PER_CHECKPOINT = flags.DEFINE_integer(
    'rounds_per_checkpoint', 1, 'Save a checkpoint every this many rounds.'
)
_DIVERGENCE_FACTOR = flags.DEFINE_float(
    'divergence_factor', run_config.DIVERGENCE_FACTOR,
    'A round whose training or evaluation loss is above this multiple of round 0\'s'
    ' evaluation loss (the untrained model\'s, about log(classes)) has diverged, as one'
    ' with a non-finite loss: the run stops (exit status 3) before anything of the round'
    ' is saved. inf: only non-finite losses count.',
)
_ROOT_OUTPUT_DIR = flags.DEFINE_string(
    'root_output_dir', 'runs', 'Directory under which each experiment gets its own.'
)
_EXPERIMENT_NAME = flags.DEFINE_string(
    'experiment_name', None,
    'Experiment directory name inside --root_output_dir (default <task>_<algo>_seed<seed>;'
    ' launch.grid_search: the grid\'s, grid_<task>_<algo>); names may nest (a/b), but no'
    ' component may be empty, "." or "..", or longer than 255 bytes.',
)
_EXECUTOR = flags.DEFINE_enum(
    'executor', 'cpu', ['cpu', 'gpu'],
    'Run client computations on the CPU or on every GPU TensorFlow sees in this process'
    ' (gpu: in-process runtime; refused when no GPU is visible or with --workers).',
)
_RUNTIME = flags.DEFINE_enum(
    'runtime', 'auto', list(runtime_choice.RUNTIMES),
    'Who runs the rounds: in_process (this process\'s TensorFlow), tff_worker (TFF\'s C++'
    f' worker_binary, CPU only: its pip build has no CUDA), or auto: in_process for'
    f' --executor=gpu, tff_worker with --workers, and {runtime_choice.CPU_RUNTIME} for'
    ' --executor=cpu (it starts sooner, and its rounds were within 8% of the worker\'s or'
    ' faster in launch.benchmark: docs/performance.md). The devices each client ran on are'
    ' written to runtime.json.',
)
_MAX_CONCURRENT_CLIENTS = flags.DEFINE_integer(
    'max_concurrent_clients', -1,
    'How many client computations the TFF worker runs at once (<= 0: no limit); in'
    ' process, how many each device runs at once (<= 0: one per core on the CPU, one per'
    ' GPU).',
)
_INTRA_OP_THREADS = flags.DEFINE_integer(
    'intra_op_threads', 0,
    'Threads each TF op may use where clients run on this machine\'s CPU (TFF\'s local'
    ' worker, or this process on the in-process runtime); 0: cores // clients run at once'
    ' (at least 1), the fast choice when a round\'s clients already keep every core busy.',
)
_CLIENT_STATE_STORE = flags.DEFINE_enum(
    'client_state_store', 'disk', ['disk', 'memory'],
    'Where clients that keep state (FedRKMGC, FedGPS, SCAFFOLD) keep it between rounds: on'
    ' disk, one file per client under <experiment>/client_states (memory flat in the'
    ' population), or in memory (faster; snapshots at each checkpoint).',
)
_WORKERS = flags.DEFINE_list(
    'workers', [],
    'host:port of remote TFF workers (`python -m launch.worker --port=PORT` on each'
    ' machine, same TFF version) that share every round\'s clients; empty: this machine'
    ' (--runtime). Results equal a local run\'s up to float32 summation order.',
)
_WORKER_TIMEOUT = flags.DEFINE_float(
    'worker_timeout_s', cpp_worker.REMOTE_CONNECT_TIMEOUT_S,
    'With --workers: how long a worker may not answer, at start or during a round, before'
    ' the run stops (it resumes from its last checkpoint when re-run).',
)
_OVERWRITE = flags.DEFINE_bool(
    'overwrite', False,
    'Delete an existing experiment of the same name and start afresh; a folder holding'
    ' files a run does not write, or a symbolic link, is refused, never deleted.',
)
_PARTITION = flags.DEFINE_enum(
    'partition', None, ['dirichlet'],
    'Re-partition the training examples of an image task: pool them and deal them out to'
    ' --num_clients new clients with Dirichlet(--dirichlet_alpha) label distributions'
    " (tasks/partition.py; the test split is kept). Unset: the dataset's own clients;"
    ' implied for the centralized cifar10 and cifar100_tfds.',
)
_DIRICHLET_ALPHA = flags.DEFINE_float(
    'dirichlet_alpha', 0.1, 'With --partition=dirichlet: the concentration (smaller is more'
    ' skewed).'
)
_NUM_CLIENTS = flags.DEFINE_integer(
    'num_clients', 100, 'With --partition=dirichlet: the number of training clients.'
)
_PARTITION_SEED = flags.DEFINE_integer(
    'partition_seed', 0,
    'With --partition=dirichlet: the partition seed (separate from --seed, so that runs'
    ' with different seeds share one split).',
)


_MODEL = flags.DEFINE_enum(
    'model', None, list(tasks.MODEL_NAMES),
    'The model, per task: '
    + '; '.join(f'{n}: {", ".join(m)}' for n, m in tasks.MODELS.items())
    + ' (unset: the first, the task\'s own).',
)
_PROTOCOL = flags.DEFINE_enum(
    'protocol', None, list(papers.PROTOCOL_NAMES),
    "A paper's training protocol (launch/papers/): sets --partition=dirichlet,"
    ' --num_clients, --dirichlet_alpha, --clients_per_round, --client_epochs_per_round,'
    " --client_batch_size, the client optimizer the paper trains every method with (the"
    " learning rate, momentum and weight decay; an --algo that cannot take them is"
    " refused) and its method's own hyperparameters, each only where not given on the"
    ' command line.',
)


@dataclasses.dataclass(frozen=True)
class Settings:
  """A run as `launch.train`'s flags describe it, apart from absl's global FLAGS.

  The training program reads its own command line into one; the programs that start
  many runs (grid search, comparison, reproduction) derive one per run with their own
  values, and both get the run's `ExperimentConfig` and command line from it, so a
  run's config is computed by one code path wherever it is computed.

  Attributes:
    values: Every flag of this program -> its value (None: unset); 'algo' is the rule
      pair's name (`registry.pair_name`) when --client_rule and --server_rule are given.
    given: The flags set on the command line or by a program; the ones a run's
      command line passes on, and that `--protocol` leaves alone.
  """

  values: Mapping[str, Any]
  given: frozenset[str]

  def __post_init__(self):
    object.__setattr__(self, 'values', _with_rule_pair(self.values, self.given))

  def replace(self, values: Mapping[str, Any]) -> 'Settings':
    """These settings with `values` set and given; a value None unsets its flag (its
    default, not given: a command line cannot give None). An algorithm set as 'algo' is
    given by the flags that give it (`algorithm_flags`: a rule pair's by its rules).

    Raises:
      ValueError: If a name is not a flag of `launch.train`.
    """
    unknown = sorted(set(values) - set(self.values))
    if unknown:
      raise ValueError(f'not flags of launch.train: {unknown}')
    if values.get('algo') is not None:
      values = {**values, **algorithm_flags(values['algo'])}
    unset = {n for n, v in values.items() if v is None}
    return Settings(
        {**self.values, **{n: flags.FLAGS[n].default if n in unset else v
                           for n, v in values.items()}},
        (self.given | set(values)) - unset,
    )

  def given_values(self) -> dict[str, Any]:
    """The given flags and their values: these settings as data (JSON's types), which
    `settings_of` makes them again."""
    return {name: value for name, value in self.values.items()
            if name in self.given and value is not None}

  def command_line(self) -> tuple[str, ...]:
    """The `launch.train` arguments that describe this run: its given flags."""
    return tuple(flag_argument(name, value) for name, value in self.given_values().items())


def algorithm_flags(algo: str) -> dict[str, Any]:
  """The flags that give algorithm `algo`: --algo for a registered one, --client_rule and
  --server_rule for a rule pair (`registry.pair_name`), the others unset; ValueError if
  it is neither."""
  spec = registry.get(algo)
  if algo in registry.ALGORITHMS:
    return {'algo': algo, 'client_rule': None, 'server_rule': None}
  return {'algo': None, 'client_rule': spec.client_rule, 'server_rule': spec.server_rule}


def _with_rule_pair(values: Mapping[str, Any], given: frozenset[str]) -> Mapping[str, Any]:
  """`values`, with --algo the pair --client_rule and --server_rule give when given.

  Raises:
    ValueError: (one line) One rule is given without the other, or with --algo.
  """
  pair = [name for name in ('client_rule', 'server_rule') if name in given]
  if not pair:
    return values
  if len(pair) == 1 or 'algo' in given:
    raise ValueError('give --algo, or --client_rule with --server_rule; got '
                     + ' and '.join(f'--{n}' for n in ('algo', *pair) if n in given))
  return {**values, 'algo': registry.pair_name(values['client_rule'], values['server_rule'])}


def flag_argument(name: str, value) -> str:
  """The command-line argument that sets flag `name` to `value` (`--noname` for False)."""
  flag = flags.FLAGS[name]
  if isinstance(value, bool):
    return f'--{"" if value else "no"}{flag.name}'
  return f'--{flag.name}={flag.serializer.serialize(value)}'


def _read_as_given(name: str, value) -> Any:
  """`value` as flag `name` reads it from its command-line argument (`flag_argument`): an
  int for a float flag becomes a float, a value out of the flag's range is refused.

  Raises:
    ValueError: The flag refuses the value.
  """
  flag = flags.FLAGS[name]
  text = value if flag.boolean else flag.serializer.serialize(value)  # --name, --noname
  try:
    return flag.parser.parse(text)
  except (TypeError, ValueError) as e:
    raise ValueError(f'--{name}={text}: {e}') from None


def _names() -> list[str]:
  """The flags of `launch.train`, in the order they are defined (a command line's)."""
  return [f.name for f in flags.FLAGS.get_flags_for_module(sys.modules[__name__])]


def settings_from_flags() -> Settings:
  """The settings of this program's parsed command line."""
  names = _names()
  return Settings({n: flags.FLAGS[n].value for n in names},
                  frozenset(n for n in names if flags.FLAGS[n].present))


def settings_of(given: Mapping[str, Any]) -> Settings:
  """The settings of the run whose command line gives `given` (flag -> value, as
  `Settings.given_values` has them), every other flag at its default, each value as the
  command line reads it (`_read_as_given`): how a sweep's cell reaches the warm slot
  that trains it, as data. absl's parsed flags are not read.

  Raises:
    ValueError: A name is not a flag of `launch.train`, or its flag refuses the value.
  """
  defaults = Settings({n: flags.FLAGS[n].default for n in _names()}, frozenset())
  return defaults.replace({n: _read_as_given(n, v) for n, v in given.items()})


def apply_protocol(settings: Settings) -> tuple[Settings, dict]:
  """`settings` with `--protocol`'s values on the flags they leave unset.

  Returns:
    The settings, and the values the protocol set (name -> value; empty without one).
    The protocol's values are not marked given: the command line passes `--protocol`.

  Raises:
    ValueError: (one line) `--algo` cannot train with the protocol's client optimizer.
  """
  name = settings.values['protocol']
  if name is None:
    return settings, {}
  applied = papers.values_for_unset(name, settings.given, registry.get(settings.values['algo']))
  return Settings({**settings.values, **applied}, settings.given), applied


def synthetic_settings(settings: Settings):
  """The synthetic generator's settings (None unless --data_source=synthetic)."""
  v = settings.values
  if v['data_source'] != 'synthetic':
    return None
  out = {
      'num_train_clients': v['synthetic_train_clients'],
      'num_test_clients': v['synthetic_test_clients'],
      'mean_examples_per_client': v['synthetic_examples_per_client'],
      'dirichlet_alpha': v['synthetic_dirichlet_alpha'],
      'seed': v['synthetic_seed'],
  }
  if v['synthetic_volume_skew'] != synthetic.DEFAULT_VOLUME_SKEW:
    # Only when not the default: runs recorded before the setting are the default's.
    out['volume_skew'] = v['synthetic_volume_skew']
  return out


def partition_settings(settings: Settings) -> dict:
  """`partition`, `dirichlet_alpha`, `num_clients`, `partition_seed` (all None unless set)."""
  names = ('dirichlet_alpha', 'num_clients', 'partition_seed')
  v = settings.values
  partition = v['partition']
  if partition is None and v['task'] in tasks.CENTRALIZED_TASK_NAMES:
    partition = 'dirichlet'  # A centralized dataset has no clients of its own.
  if partition is None:
    given = [n for n in names if n in settings.given]
    if given:
      raise ValueError(f'--{given[0]} only applies with --partition=dirichlet')
    return dict(partition=None, **{n: None for n in names})
  return dict(partition=partition, **{n: v[n] for n in names})


def experiment_config(settings: Settings) -> run_config.ExperimentConfig:
  """The experiment `settings` describe; hyperparameters not set take the algorithm's
  defaults (which its record, flags.json, lists with the others)."""
  v = settings.values
  if 'worker_timeout_s' in settings.given and not v['workers']:
    raise ValueError('--worker_timeout_s applies only with --workers')
  spec = registry.get(v['algo'])
  given = {n: v[n] for n in _HPARAMS if v[n] is not None}
  unknown = [n for n in given if n not in spec.hparams_class.names()]
  if unknown:
    raise ValueError(
        f'--{unknown[0]} does not apply to --algo={v["algo"]}; its hyperparameters are'
        f' {sorted(spec.hparams_class.names())}'
    )
  # A flag sets the config's field of its name; these fields are made otherwise.
  made = dict(
      experiment_name=v['experiment_name'] or f'{v["task"]}_{v["algo"]}_seed{v["seed"]}',
      hparams=given,
      synthetic_settings=synthetic_settings(settings),
      **partition_settings(settings),
      workers=tuple(v['workers']),
      # --aggregator is its kind (`run_config.aggregator_flag`), beside its settings' flags.
      aggregator={field: v[flag] for flag, field in _AGGREGATOR_FLAGS.items()
                  if v[flag] is not None},
  )
  same = {f.name: v[f.name] for f in dataclasses.fields(run_config.ExperimentConfig)
          if f.name in v and f.name not in made}
  return run_config.ExperimentConfig(**same, **made)


def config_of(settings: Settings) -> run_config.ExperimentConfig:
  """The experiment of the run `settings` describe, its `--protocol` applied."""
  return experiment_config(apply_protocol(settings)[0])
