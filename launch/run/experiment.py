"""One federated training run, start to end: `run(config)`.

`launch.train` fills an `ExperimentConfig` from its flags and calls `run`; the grid search
and comparison programs call `run` the same way, one directory per run. `run` reads as its
steps: check everything that can be refused (`_check`), build the task and the process
(`_build`), select each round's clients (`_selection_fn`), then, holding the run's lock,
ready its folder (`_prepare_folder`) and train (`_resume`, `_train`) in the runtime's
context, and sum the run up (`_summary`). Everything that can be rejected (task,
algorithm, hyperparameters, aggregator, data, an existing run with other settings) is
checked before anything is written to the output directory.

The parts live beside it: the settings in `run_config`, who runs the rounds in
`runtime_choice`, the folder's policy in `resumption`, `run_directory` and `run_identity`,
what becomes of each round in `rounds`, what the run spends in privacy and bytes in
`accounting`, the asyncio loop and a stopped run's message in `event_loop`, the errors in
`errors`.
"""

import collections
import contextlib
import os
import time
from typing import Callable, ContextManager, Optional
import warnings

import numpy as np
import tensorflow_federated as tff

from launch.run import accounting
from launch.run import builds as builds_lib
from launch.run import errors
from launch.run import event_loop
from launch.run import resumption
from launch.run import rounds
from launch.run import run_config
from launch.run import run_directory
from launch.run import run_identity
from launch.run import runtime_choice
import tasks
from tff_zmg import analysis
from tff_zmg.algorithms import registry
from tff_zmg import client_states
from tff_zmg.runtime import client_slots
from tff_zmg import run_files
from tff_zmg.templates import stateful_clients

# What a run's rounds are entered in: a context manager that yields the check to call as
# each round starts, before each of a round's clients (`client_slots.between_clients`)
# and after the last, such as `launch.cli.stops.between_rounds`.
BetweenRounds = Callable[[], ContextManager[Callable[[], None]]]


@contextlib.contextmanager
def stops_where_they_land():
  """`BetweenRounds` with no safe point: its check never raises, and a stop raises where it
  lands (a run's default; batched cells; a Ray actor, which Ray ends by SIGTERM)."""
  yield lambda: None


def run(config: run_config.ExperimentConfig, builds: Optional[builds_lib.Builds] = None,
        cell=None, between_rounds: BetweenRounds = stops_where_they_land) -> dict:
  """Runs (or resumes) one experiment and returns its summary.

  With `builds` (a warm slot's), the task, process and evaluation an earlier run built
  with the same arguments are used again, and what this run builds is kept for the next.
  With `cell` (its place in a group of runs trained as batched cells,
  `launch.sweeps.batched_cells.Member`), its rounds are trained with the group's.
  `between_rounds` is entered around the rounds (a program's `launch.cli.stops.between_rounds`)
  and yields what to call as each round starts, before each of a round's clients and after
  the last: a stop signal it defers is raised there (between clients, the round under way
  is dropped; nothing of it was released or saved).

  Raises:
    errors.ExperimentError: bad settings, an existing run with other settings, an unreadable
      checkpoint, an unreachable remote worker, or divergence (`errors.DivergedError`: the
      last good checkpoint is kept, and the reason written to the run's diverged.txt).
    errors.WorkerLostError: a remote worker stopped answering mid-run (an ExperimentError; the
      failed round wrote nothing and re-running resumes from the last checkpoint).
    errors.RunEnvironmentError: an output or cache folder that is a file or not writable, or too
      little free space for a checkpoint (an ExperimentError; checked before any
      computation, `run_directory.check_environment`).
    tasks.MissingDataError, tasks.CorruptDataError: the data is not usable.
    ValueError: a hyperparameter out of its range.
  """
  config = run_config.resolve_evaluation(config)
  in_process_threads, flags_agree = _check(config)
  task, task_arguments, identity, aggregator, process, start_rates = _build(
      config, flags_agree, builds)
  if cell is not None:
    cell.prepare(process)
  select = _selection_fn(config, task, _keeps_client_states(process))
  start = time.monotonic()
  num_train_clients = len(task.datasets.train_data.client_ids)
  epsilon = accounting.epsilon_after(aggregator, num_train_clients)
  progress = rounds.RoundReleaseManager(config, epsilon_after=epsilon)
  client_bytes = None
  # One process per run from here on: checks made before are made again under the lock.
  with run_directory.locked(config.output_dir):
    _prepare_folder(config, identity)
    with (event_loop.stops_say_what_is_kept(config.checkpoint_dir),
          runtime_choice.execution_context(config, progress, builds) as runtime_context):
      print(runtime_choice.runtime_line(config, runtime_context, in_process_threads),
            flush=True)
      print(accounting.aggregator_line(config.algo, aggregator, num_train_clients),
            flush=True)
      evaluate = rounds.evaluation_fn(config, task, process, runtime_context,
                                      in_process_threads, builds, task_arguments)
      print(f'evaluation: {evaluate.held_out.description}', flush=True)
      store = _client_state_store(config, process)
      resumed_from = _resume(config, process, store, progress)
      _say_if_capped(config, task.datasets.train_data)
      run_identity.write_identity(config.checkpoint_dir, identity)
      run_directory.write_json_atomically(
          os.path.join(config.output_dir, run_files.FLAGS), config.recorded()
      )
      client_bytes = accounting.client_bytes(config.output_dir, process)
      print(accounting.communication_line(client_bytes), flush=True)

      def record_session():
        return runtime_choice.record_session(config, runtime_context, in_process_threads,
                                             evaluate.held_out, progress.trained_rounds)

      session = _train(config, process, store, select, evaluate, progress, record_session,
                       resumed_from, between_rounds,
                       builds_lib.starting_state(process, start_rates), cell)
  summary = _summary(config, time.monotonic() - start, session, evaluate.held_out)
  summary.update(accounting.summary(config, epsilon, summary['rounds_completed'],
                                    client_bytes))
  return summary


def _check(config: run_config.ExperimentConfig) -> tuple[Optional[int], bool]:
  """Everything that can be refused before the data is read: the settings, the runtime and
  its devices, the run's folder and a run already in it, the remote workers.

  Returns:
    The threads per TF op of an in-process run, set here before any TF op runs
    (`runtime_choice.set_in_process_threads`), and whether the folder's flags.json
    exists and agrees.
  """
  run_config.validate(config)
  in_process_threads = runtime_choice.set_in_process_threads(config)  # Before any TF op runs.
  flags_agree = False if config.overwrite else resumption.check_resumable(config)
  runtime_choice.check_gpus(config)
  resumption.check_run_directory(config)
  if config.workers:
    runtime_choice.check_workers_reachable(config)
  return in_process_threads, flags_agree


def _task_arguments(config: run_config.ExperimentConfig) -> dict:
  """`tasks.get`'s arguments for the run."""
  return dict(
      name=config.task,
      data_source=config.data_source,
      cache_dir=config.cache_dir,
      batch_size=config.client_batch_size,
      num_epochs=config.client_epochs_per_round,
      max_elements=config.max_elements_per_client,
      shuffle_seed=config.seed,
      model_seed=config.seed,
      synthetic_settings=config.synthetic_settings,
      partition=config.partition,
      dirichlet_alpha=config.dirichlet_alpha,
      num_clients=config.num_clients,
      partition_seed=config.partition_seed,
      model=config.model,
      gpu_kernels=config.executor == 'gpu',
  )


def _build(config: run_config.ExperimentConfig, flags_agree: bool,
           builds: Optional[builds_lib.Builds]):
  """The task (its data read, or made) and the algorithm's process; the run they make
  (`resumption.identity`) is checked against the one in the folder before the process is
  built. With `builds`, what an earlier run built from the same arguments.

  Returns:
    (task, `tasks.get`'s arguments, the run's identity, its aggregator's settings, the
    process, the learning rates its initial state must be given: empty unless `builds`
    gave a process built for others).
  """
  task_arguments = _task_arguments(config)
  if builds is None:
    task = tasks.get(**task_arguments)
  else:
    task = builds.get('task', task_arguments, lambda: tasks.get(**task_arguments))
  identity = resumption.identity(config, task)
  if not config.overwrite:
    resumption.check_identity(config, identity, flags_agree)
  num_clients = len(task.datasets.train_data.client_ids)
  aggregator = config.aggregator_settings(num_clients)
  hparams = registry.resolve(config.algo, config.hparams)

  def build():
    with warnings.catch_warnings():
      # DP's uniform weighting: the run's aggregator line says it (`accounting`).
      warnings.filterwarnings('ignore', message=r'aggregator .* averages client updates')
      return registry.build(
          config.algo, task.model_fn, keras_model_fn=task.keras_model_fn,
          num_clients=num_clients, loop_implementation=run_config.CLIENT_LOOP,
          aggregator=aggregator,
          **config.hparams,
      )

  if builds is None:
    return task, task_arguments, identity, aggregator, build(), {}
  process, start_rates = builds.process(
      dict(algo=config.algo, task=task_arguments, loop=run_config.CLIENT_LOOP.name,
           aggregator=aggregator),
      hparams, build)
  return task, task_arguments, identity, aggregator, process, start_rates


def _keeps_client_states(process) -> bool:
  return isinstance(process, stateful_clients.StatefulClientsLearningProcess)


def _selection_fn(config: run_config.ExperimentConfig, task, stateful: bool) -> Callable:
  """TFF's `training_selection_fn`: a round's clients, sampled uniformly without
  replacement (all of them when the data has fewer), each client's data shuffled by its
  own seed (`_client_seed`); with their ids where clients keep state."""
  train_data = task.datasets.train_data
  clients_per_round = min(config.clients_per_round, len(train_data.client_ids))
  sample_clients = tff.simulation.build_uniform_sampling_fn(
      train_data.client_ids, replace=False, random_seed=config.seed
  )

  def training_selection_fn(round_num):
    ids = sample_clients(round_num, clients_per_round)
    datasets = [  # From the clients in memory: no tf.data function traced a client.
        task.train_preprocess_fn_for_seed(_client_seed(config.seed, round_num, i)).from_tensors(
            task.train_client_tensors(cid))
        for i, cid in enumerate(ids)
    ]
    if stateful:  # The trainer needs the ids to find the clients' states.
      return client_states.ClientSelection(round_num, ids, datasets)
    return datasets

  return training_selection_fn


def _client_seed(seed: int, round_num: int, client_index: int) -> int:
  """The shuffle seed of one client in one round: a pure function of the run's seed."""
  return int(np.random.SeedSequence([seed, round_num, client_index]).generate_state(1)[0])


def _prepare_folder(config: run_config.ExperimentConfig, identity: dict) -> None:
  """Under the run's lock: clears the folder for --overwrite, or checks again that it holds
  this run and forgets a divergence it recorded (the run trains again); then removes what
  interrupted saves left."""
  if config.overwrite:
    run_directory.clear(config.root_output_dir, config.output_dir)
  else:
    flags_agree = resumption.check_resumable(config)
    resumption.check_identity(config, identity, flags_agree)
    resumption.check_total_rounds(config)
    run_directory.forget_divergence(config.output_dir)
  removed = run_directory.remove_interrupted_saves(config.output_dir, config.checkpoint_dir)
  if removed:
    print(f'removed what interrupted saves left: {", ".join(removed)}', flush=True)


def _client_state_store(config: run_config.ExperimentConfig, process):
  """Where a process whose clients keep state keeps them (None: its clients keep none)."""
  if not _keeps_client_states(process):
    return None
  return client_states.create_store(
      config.client_state_store,
      os.path.join(config.output_dir, run_files.CLIENT_STATES),
  )


def _resume(config: run_config.ExperimentConfig, process, store,
            progress) -> Optional[int]:
  """Readies the folder for TFF's training loop, which resumes from its newest checkpoint:
  metrics.csv repaired, no checkpoint newer than the rounds it records whole and scored
  (`resumption.rewind`), the newest made sound (`resumption.check_checkpoint`), and round
  0's evaluation loss, if recorded, made the divergence limit's reference.

  Returns:
    The round of the checkpoint the run resumes from (None: it starts afresh).
  """
  repaired = run_directory.repair_metrics_csv(
      config.metrics_csv, run_directory.newest_checkpoint_round(config.checkpoint_dir))
  rewound = resumption.rewind(config)
  for said in (repaired, rewound):
    if said:
      print(said, flush=True)
  resumed_from = resumption.check_checkpoint(config, process, store)
  initial_loss = analysis.runs.metric_by_round(config.metrics_csv, 'evaluation/loss').get(0)
  progress.set_reference(initial_loss)
  return resumed_from


def _say_if_capped(config: run_config.ExperimentConfig, train_data) -> None:
  """One line when --clients_per_round asks for more clients than the data has."""
  population = len(train_data.client_ids)
  if config.clients_per_round > population:
    print(f'clients_per_round: {config.clients_per_round} asked, but the data has'
          f' {population} training clients: all {population} train every round', flush=True)


def _train(
    config: run_config.ExperimentConfig, process, store, select: Callable,
    evaluate: rounds.Evaluation,
    progress: rounds.RoundReleaseManager, record_session: Callable[[], Optional[dict]],
    resumed_from: Optional[int], between_rounds: BetweenRounds, initial_state=None,
    cell=None,
) -> Optional[dict]:
  """TFF's training loop over the rounds after `resumed_from`, each judged and released
  by `progress`, evaluated where `rounds.evaluation_due` asks or where metrics.csv
  recorded an evaluation before (`resumption.evaluated_after`); returns this process's
  session (`record_session`), recorded even if the loop stops, and a divergence's reason
  in the run's diverged.txt (`run_directory.record_divergence`). A run without a
  checkpoint starts from `initial_state` (None: `process.initialize()`); a run with a
  `cell` trains its rounds with its group's, and `between_rounds` is entered around the
  rounds (`run`)."""
  # A client-state store commits the files a checkpoint needs once it is written, so a
  # run with one saves in the round's time.
  checkpoints = rounds.FiniteStateManager(config, keep_total=3, in_background=store is None)
  state_manager = checkpoints
  training_process = process if initial_state is None else _StartingFrom(process,
                                                                          initial_state)
  if store is not None:
    # Remote workers may not see this machine's files: their states go in the call.
    training_process = client_states.StatefulClientsTrainer(
        process, store, states_in_worker=not config.workers
    )
    state_manager = client_states.ClientStateCheckpointManager(checkpoints, store)
  if cell is not None:
    training_process, select, evaluate = cell.wrap(process, training_process, select,
                                                   evaluate)
  progress.managers = [tff.program.CSVFileReleaseManager(config.metrics_csv)]
  progress.checkpoints = checkpoints
  # TensorBoard's writer opens a new events file when made: a finished run run again, which
  # trains nothing, must leave its folder as it was.
  if resumed_from is None or resumed_from < config.total_rounds:
    progress.managers.append(tff.program.TensorBoardReleaseManager(
        os.path.join(config.output_dir, run_files.TENSORBOARD)))
  evaluated_before = resumption.evaluated_after(config, resumed_from)
  event_loop.thread_event_loop()  # run_training_process asks for it.
  try:
    with (between_rounds() as stop_if_received,
          client_slots.between_clients(stop_if_received)):
      tff.simulation.run_training_process(
          training_process=training_process,
          training_selection_fn=_calling_first(stop_if_received, select),
          total_rounds=config.total_rounds,
          evaluation_fn=evaluate,
          evaluation_selection_fn=lambda round_num: (rounds.evaluation_due(config, round_num)
                                                     or round_num in evaluated_before),
          rounds_per_evaluation=1,  # Asks every round; `rounds.evaluation_due` decides.
          program_state_manager=state_manager,
          rounds_per_saving_program_state=config.rounds_per_checkpoint,
          metrics_managers=[progress],
      )
      stop_if_received()  # A stop received in the last round.
  except BaseException as e:
    # The error that stopped the run is the news; the checkpoint being written is kept.
    with contextlib.suppress(Exception):
      checkpoints.close()
    with contextlib.suppress(Exception):
      record_session()
    if isinstance(e, errors.DivergedError):
      run_directory.record_divergence(config.output_dir, str(e))
    raise
  checkpoints.close()
  evaluate.close()
  return record_session()


def _calling_first(first: Callable[[], None], select: Callable) -> Callable:
  """`select`, called after `first`: TFF's training loop selects a round's clients before
  anything else of the round, after the round before was released and its save begun."""

  def select_after(round_num):
    first()
    return select(round_num)

  return select_after


class _StartingFrom:
  """`process`, whose `initialize` gives `state`: all TFF's training loop calls are
  `initialize` and `next`."""

  def __init__(self, process, state):
    self._process = process
    self._state = state

  def initialize(self):
    return self._state

  def next(self, *args):
    return self._process.next(*args)


def _client_devices(config: run_config.ExperimentConfig,
                    session: Optional[dict]) -> Optional[dict]:
  """Where the clients' computations ran: this process's session's devices, or, when it
  trained no round (a finished run run again), the newest recorded session's; None when
  no session is recorded."""
  if session:
    return session['client_devices']
  sessions = analysis.runs.read_runtime(config.output_dir)
  return sessions[-1].get('client_devices') if sessions else None


def _summary(config: run_config.ExperimentConfig, wall: float, session: Optional[dict],
             held_out) -> dict:
  """What `run` returns: the rounds and accuracies its metrics.csv holds, its time, where
  its outputs are, and what ran it."""
  eval_acc, train_loss = analysis.runs.metrics_by_round(
      config.metrics_csv, (analysis.runs.EVAL_ACCURACY, analysis.runs.TRAIN_LOSS)).values()
  return collections.OrderedDict(
      rounds_completed=max(train_loss, default=0),
      final_eval_accuracy=eval_acc[max(eval_acc)] if eval_acc else None,
      best_eval_accuracy=max(eval_acc.values()) if eval_acc else None,
      wall_time_s=wall,
      output_dir=config.output_dir,
      metrics_csv=config.metrics_csv,
      tensorboard_dir=os.path.join(config.output_dir, run_files.TENSORBOARD),
      runtime=runtime_choice.resolved_runtime(config),
      client_devices=_client_devices(config, session),
      evaluation=held_out.description,
  )
