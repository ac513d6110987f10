"""Batched cells in a warm slot: the runs of one request, cells of a grid that differ only
in what their process state holds (their learning rates), trained as one computation.

Each run is still an ordinary run (`launch.run.training.train`, as `launch.train` trains
it): its folder, flags.json, metrics.csv, checkpoints, evaluation and log are its own, and
so are its resumption, its divergence and its exit status. The runs train in threads of
their own, one thread at a time (a lock they hand over only while they wait for a round),
and a run's round goes to a `CellGroup`: once every run still training has asked for its
round, the group trains them as the cells of `tff_zmg.templates.cells` and hands each
its own state and metrics. Their evaluations meet the same way and are evaluated together
(`tasks.evaluation.Evaluator.evaluate_many`: the cells share the evaluator's slots, where
one after another each would have one slot of a small test set). Runs at different rounds
(resumed from checkpoints of different rounds) catch up with each other first; a run that
ends (finished, diverged, failed) leaves the group and the others go on, its place in the
computation filled.

A process that cannot be batched (clients that keep state), or a runtime other than
the in-process one, trains its runs one after another, each saying so in one line.
"""

import collections
import contextlib
import functools
import sys
import threading
from typing import Any, Callable, Optional

import tensorflow_federated as tff

from launch.run import builds as builds_lib
from tff_zmg.runtime import in_process
from tff_zmg.templates import cells


# How the log of a run that cannot be batched says so, before why (`Member.alone`).
ALONE = 'batched cells: this run trains alone:'


class CellGroup:
  """The rounds of `size` runs trained together (each run trains in its `turn`, with the
  `Member` it yields)."""

  def __init__(self, size: int, builds: Optional[builds_lib.Builds] = None):
    self._size = size
    self._builds = builds
    self._turn = threading.Condition()
    self._live = set(range(size))
    # member -> (round, process, state, its clients' datasets to make, its runtime context)
    self._asking: dict[int, tuple[int, Any, Any, Any, Any]] = {}
    self._evaluating: dict[int, tuple[Any, Any]] = {}  # member -> (evaluator, weights)
    self._answers: dict[int, Any] = {}
    self._stopping = False

  @contextlib.contextmanager
  def turn(self, member: int):
    """The block in which `member` trains: one member at a time, handing its turn over
    while it waits for a round; it leaves the group at the end."""
    with self._turn:
      try:
        yield Member(self, member)
      finally:
        self.leave(member)

  @property
  def stopping(self) -> bool:
    return self._stopping

  def stop(self) -> None:
    """Every member waiting for a round, or asking for one later, gets a
    `KeyboardInterrupt` (its run stops as on Ctrl-C and resumes next time)."""
    self._stopping = True  # Set before the lock: a member training alone holds it.
    with self._turn:
      self._turn.notify_all()

  def next(self, member: int, round_num: int, process, state, clients: Callable, context):
    """`member`'s round `round_num`: its (state, metrics) and where the clients ran, once
    the group has trained it in one of its members' runtime `context`s on the datasets
    `clients()` makes (one member's: the group's members select the same)."""
    if self._stopping:
      raise KeyboardInterrupt
    self._asking[member] = (round_num, process, state, clients, context)
    return self._answer(member)

  def evaluate(self, member: int, evaluator, weights):
    """`evaluator(weights)` for `member`, once the group has evaluated every member that
    asks with the others' (`Evaluator.evaluate_many`)."""
    if self._stopping:
      raise KeyboardInterrupt
    self._evaluating[member] = (evaluator, weights)
    return self._answer(member)

  def _answer(self, member: int):
    """What `member` asked for, once every live member asks (its turn handed over while
    it waits)."""
    self._train_if_all_ask()
    while member not in self._answers:
      if self._stopping:
        self._asking.pop(member, None)
        self._evaluating.pop(member, None)
        raise KeyboardInterrupt
      self._turn.wait()
    answer = self._answers.pop(member)
    if isinstance(answer, BaseException):
      raise answer
    return answer

  def leave(self, member: int) -> None:
    """`member` trains no more rounds with the group (its run ended, or trains alone)."""
    self._live.discard(member)
    self._asking.pop(member, None)
    self._evaluating.pop(member, None)
    self._train_if_all_ask()

  def _train_if_all_ask(self) -> None:
    """Once every live member asks: evaluates those that ask for an evaluation, else
    trains those at the earliest round (sharing a process) as cells, and wakes everyone."""
    if self._stopping:  # No new round: each asking member stops as it wakes.
      self._turn.notify_all()
      return
    waiting = set(self._asking) | set(self._evaluating)
    if not waiting or waiting != self._live:
      return
    if self._evaluating:
      self._evaluate_all()
      self._turn.notify_all()
      return
    round_num, process = min((r, id(p)) for r, p, *_ in self._asking.values())
    members = sorted(m for m, (r, p, *_) in self._asking.items()
                     if r == round_num and id(p) == process)
    _, process, _, clients, context = self._asking[members[0]]
    states = [self._asking.pop(m)[2] for m in members]
    # The computation keeps its size: places of members that left train a copy.
    states += states[:1] * (self._size - len(states))
    try:
      # In a member's context: the thread may be one whose run has ended. Each member
      # counts the round's clients in its own context, this one's included.
      counted = collections.Counter(context.client_devices), context.rounds_run
      with tff.framework.get_context_stack().install(context):
        output = self.cells_process(process).next(tuple(states), clients())
      devices = list(context.last_client_devices)
      context.client_devices, context.rounds_run = counted
      for place, m in enumerate(members):
        self._answers[m] = (tff.learning.templates.LearningProcessOutput(
            output.state[place], output.metrics[place]), devices)
    except Exception as e:  # pylint: disable=broad-except
      for m in members:  # Each member's run ends with the error, as it would alone.
        self._answers[m] = e
    self._turn.notify_all()

  def _evaluate_all(self) -> None:
    """Answers every member asking for an evaluation, those of one evaluator together."""
    by_evaluator: dict[int, tuple[Any, list]] = {}
    for member in sorted(self._evaluating):
      evaluator, weights = self._evaluating.pop(member)
      by_evaluator.setdefault(id(evaluator), (evaluator, []))[1].append((member, weights))
    for evaluator, asked in by_evaluator.values():
      try:
        results = evaluator.evaluate_many([weights for _, weights in asked])
      except Exception as e:  # pylint: disable=broad-except
        results = [e] * len(asked)  # Each member's run ends with it, as it would alone.
      for (member, _), result in zip(asked, results):
        self._answers[member] = result

  def cells_process(self, process):
    """The computation of this group's cells of `process` (kept in the slot's builds)."""
    build = lambda: cells.build_cells_process(process, self._size)
    if self._builds is None:
      return build()
    return self._builds.get('cells', dict(process=id(process), size=self._size), build)


class Member:
  """One run's place in a `CellGroup`: what `launch.run.experiment` trains its rounds by."""

  def __init__(self, group: CellGroup, member: int):
    self._group = group
    self._member = member
    self._round = None
    self._context = None
    self.alone: Optional[str] = None  # Why its run trains alone (`wrap`), if it does.

  def prepare(self, process) -> None:
    """Builds the group's computation of `process`, if it can be batched, as soon as the
    process is: before the run makes its evaluation's Keras models. (A Keras model made
    outside a graph fails its first call once another model has been made in a graph,
    as tracing a TFF computation does; a run's evaluation is first called only after
    its first round when it resumes.)"""
    if cells.unbatchable_reason(process) is None:
      self._group.cells_process(process)

  def wrap(self, process, training_process, select: Callable, evaluate):
    """(training process, selection, evaluation) for TFF's training loop: this run's
    rounds and evaluations (a `launch.run.rounds.Evaluation`) go to the group; unchanged
    (and the run leaves the group, saying why) where they cannot."""
    reason = cells.unbatchable_reason(process)
    context = tff.framework.get_context_stack().current
    if reason is None and not isinstance(context, in_process.InProcessContext):
      reason = 'its runtime is not the in-process one'
    if reason is not None:
      self.alone = reason
      print(f'{ALONE} {reason}', flush=True)
      self._group.leave(self._member)
      return _StoppedWithGroup(self._group, training_process), select, evaluate
    self._context = context

    def selection(round_num):
      # The datasets are made only for the member whose are trained on.
      self._round = round_num
      return functools.partial(select, round_num)

    group_evaluation = evaluate.with_evaluator(
        lambda evaluator: _GroupEvaluator(self._group, self._member, evaluator))
    return _GroupRounds(self, process, training_process), selection, group_evaluation

  def next(self, process, state, clients: Callable):
    output, devices = self._group.next(self._member, self._round, process, state, clients,
                                       self._context)
    if devices:  # This run's record says where its clients ran (`runtime_choice`).
      self._context.last_client_devices = devices
      self._context.client_devices.update(devices)
      self._context.rounds_run += 1
    return output


class _GroupRounds:
  """A training process for TFF's loop whose `next` is the group's."""

  def __init__(self, member: Member, process, training_process):
    self._member = member
    self._process = process
    self._training_process = training_process

  def initialize(self):
    return self._training_process.initialize()

  def next(self, state, clients: Callable):
    return self._member.next(self._process, state, clients)


class _GroupEvaluator:
  """A run's evaluator whose calls go to its group (`CellGroup.evaluate`)."""

  def __init__(self, group: CellGroup, member: int, evaluator):
    self._group = group
    self._member = member
    self._evaluator = evaluator

  def __call__(self, weights):
    return self._group.evaluate(self._member, self._evaluator, weights)

  def close(self) -> None:
    self._evaluator.close()


class _StoppedWithGroup:
  """A training process for TFF's loop that trains alone but stops with its group."""

  def __init__(self, group: CellGroup, training_process):
    self._group = group
    self._training_process = training_process

  def initialize(self):
    return self._training_process.initialize()

  def next(self, *args):
    if self._group.stopping:
      raise KeyboardInterrupt
    return self._training_process.next(*args)


class ThreadOutput:
  """A stream that writes to the file its writing thread was given (`to`), else to
  `default`: each run of a group prints to its own log."""

  def __init__(self, default):
    self._default = default
    self._local = threading.local()

  @contextlib.contextmanager
  def to(self, stream):
    self._local.stream = stream
    try:
      yield
    finally:
      self._local.stream = None

  def _stream(self):
    return getattr(self._local, 'stream', None) or self._default

  def write(self, text):
    return self._stream().write(text)

  def flush(self):
    self._stream().flush()

  def __getattr__(self, name):
    return getattr(self._stream(), name)


@contextlib.contextmanager
def thread_outputs():
  """sys.stdout and sys.stderr as `ThreadOutput`s inside the block."""
  saved = sys.stdout, sys.stderr
  sys.stdout, sys.stderr = ThreadOutput(saved[0]), ThreadOutput(saved[1])
  try:
    yield sys.stdout, sys.stderr
  finally:
    sys.stdout, sys.stderr = saved
