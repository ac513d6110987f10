"""A run's directory: where it may be, what it may delete, who may write it, what is left.

`launch.run.experiment.run` calls these before and around training:

- `check_name`: an experiment name is a relative path of ordinary names inside
  `<root_output_dir>` (no '.', '..', empty or over-long components), so nothing a run
  writes or `--overwrite` deletes is outside the root.
- `check_environment`: the root, the run's folder and the data cache are folders this
  process can write, with room for a checkpoint, before anything is computed
  (`RunEnvironmentError`: the machine, not the settings, stops the run).
- `check_deletable` / `clear`: `--overwrite` deletes only a folder that holds nothing but
  a run's own files, and keeps its lock file.
- `locked`: one process per run (an `fcntl.flock` on `<run>/.lock`, held while the run is
  trained and dropped by the kernel when the process dies, kill -9 included).
- `checkpoint_versions`, `newest_checkpoint_round`: the checkpoints TFF has completed.
- `remove_interrupted_saves`, `repair_metrics_csv`: what a killed process leaves behind.
- `record_divergence`, `forget_divergence`: diverged.txt, the reason a run stopped
  diverging, while the run is not trained again.

What made the run, kept beside its checkpoints, is `launch.run.run_identity`'s business.

The errors are `errors.ExperimentError`s (bad input) and `errors.RunEnvironmentError`s; each
message is one line saying what is wrong and what to do.
"""

import contextlib
import fcntl
import json
import os
import re
import shutil
from typing import Callable, Iterator, Optional

from launch.run import errors
from tff_zmg import run_files

UNREADABLE_PREFIX = 'unreadable_'
# Temporary files of interrupted writes: TFF's CSV manager (`metrics.csv_temp1234`) and
# ours (`.flags.json.tmp`, `write_json_atomically`), named after the files they replace;
# any other `.*.tmp` is a user's and stays.
_TEMP_ENTRY = re.compile(
    r'^(metrics\.csv_temp\d+|\.('
    + '|'.join(re.escape(n) for n in sorted(run_files.RUN_ENTRIES) if '.' in n.strip('.'))
    + r')\.tmp)$'
)
_CHECKPOINT_TEMP = re.compile(r'^program_state_\d+_temp\d+$')
_NAME_MAX = 255  # Bytes per file name on Linux file systems.
# Longest path a run writes below its folder, with room to spare:
# checkpoints/program_state_<round>_temp<n>/variables/variables.data-00000-of-00001.
_LONGEST_INSIDE = 120
_PATH_MAX = 4096
# One checkpoint of a model with P float32 parameters takes about 4 * P bytes for the
# weights; the factor covers the server optimizer's slots (Adam keeps two more) and the
# temporary copy TFF writes before renaming it into place.
BYTES_PER_PARAMETER = 4


def check_name(name: str) -> None:
  """Refuses an experiment name that is not a relative path of ordinary names.

  Nested names (`sweep1/fedavg`) are allowed; each component is checked.
  """
  shown = name if len(name) <= 60 else name[:57] + '...'
  if not name:
    raise errors.ExperimentError('--experiment_name is empty; give the run a name')
  if '\0' in name:
    raise errors.ExperimentError(
        f'--experiment_name {shown!r} holds a NUL character; choose another name')
  if os.path.isabs(name):
    raise errors.ExperimentError(
        f'--experiment_name {shown!r} is an absolute path; give a name (the run goes to'
        ' <root_output_dir>/<name>) and set --root_output_dir for the folder'
    )
  for part in name.split(os.sep):
    if part in ('', '.', '..'):
      what = f'a {part!r}' if part else 'an empty'
      raise errors.ExperimentError(
          f'--experiment_name {shown!r} has {what} component; a name must stay inside'
          ' --root_output_dir (letters, digits, ._- and / between names)'
      )
    if len(part.encode('utf-8')) > _NAME_MAX:
      raise errors.ExperimentError(
          f'--experiment_name is {len(part.encode("utf-8"))} bytes long (starting'
          f' {part[:20]!r}); a file name holds at most {_NAME_MAX}: choose a shorter one'
      )


def check_inside(root_output_dir: str, path: str, rule: str) -> None:
  """Refuses `path` unless it is below `root_output_dir` once links are followed.

  `check_name` keeps a name's own components inside; this catches a link on the way out.
  """
  root = os.path.realpath(root_output_dir)
  real = os.path.realpath(path)
  if os.path.commonpath([root, real]) != root or real == root:
    raise errors.ExperimentError(
        f'{path} is not inside --root_output_dir {root_output_dir}; {rule}')


def _nearest_existing(path: str) -> str:
  path = os.path.abspath(path)
  while not os.path.lexists(path):
    path = os.path.dirname(path)
  return path


def _check_folder(path: str, what: str, must_write: bool = True) -> None:
  """`path` (or, while it does not exist, its nearest existing parent) is a writable folder."""
  existing = _nearest_existing(path)
  if not os.path.isdir(existing):
    raise errors.RunEnvironmentError(
        f'{what} {path} cannot be created: {existing} is a file, not a folder; move it or'
        ' choose another path'
    )
  read_only = _read_only_file_system(existing) if must_write else None
  if read_only:
    where = '' if existing == os.path.abspath(path) else f' (its parent {existing})'
    raise errors.RunEnvironmentError(
        f'{what} {path}{where} is read-only: it is on {read_only}; choose another path')
  if must_write and not os.access(existing, os.W_OK | os.X_OK):
    where = '' if existing == os.path.abspath(path) else f' (its parent {existing})'
    raise errors.RunEnvironmentError(
        f'{what} {path}{where} is not writable by this user (or the disk is mounted'
        ' read-only); fix its permissions or choose another path'
    )


def _read_only_file_system(path: str) -> Optional[str]:
  """What makes the file system of `path` read-only, in words, or None.

  `os.access` asks about permissions only: root may 'write' /sys, whose disk then reads as
  0 bytes free, and the run was refused for want of space.
  """
  try:
    stat = os.statvfs(path)
  except OSError:
    return None
  if stat.f_flag & os.ST_RDONLY:
    return 'a file system mounted read-only'
  if stat.f_blocks == 0:
    return 'a file system with no disk behind it (the kernel\'s, as /sys and /proc)'
  return None


def check_output_file(path: str, flag: str) -> None:
  """Refuses, before any work, an output file that cannot be written: a folder, or a
  parent that is a file or not writable (`RunEnvironmentError` for the latter)."""
  if os.path.isdir(path):
    raise errors.ExperimentError(
        f'--{flag}={path} is a folder; give the path of a file to write')
  _check_folder(os.path.dirname(os.path.abspath(path)), f'the folder of --{flag}')


def checkpoint_bytes(num_parameters: int) -> int:
  """The free space a run asks for before it starts: the model's float32 weights, which
  every checkpoint holds (with the optimizers' states, where they have any)."""
  return num_parameters * BYTES_PER_PARAMETER


def check_free_space(path: str, needed: int, num_parameters: int) -> None:
  """Refuses to start when the disk of `path` has less than `needed` bytes free."""
  free = shutil.disk_usage(_nearest_existing(path)).free
  if free < needed:
    raise errors.RunEnvironmentError(
        f'the disk of {path} has {free / 2**20:.1f} MiB free, less than the model\'s weights'
        f' that every checkpoint holds ({num_parameters:,} parameters x'
        f' {BYTES_PER_PARAMETER} bytes = {needed / 2**20:.1f} MiB); free some space or'
        ' choose another --root_output_dir'
    )


def check_environment(
    root_output_dir: str, output_dir: str, cache_dir: Optional[str],
    cache_must_be_writable: bool, num_parameters: int,
) -> None:
  """Checks, writing nothing, that the run can write its folders and has room to start.

  Args:
    root_output_dir: `--root_output_dir`.
    output_dir: The run's folder (inside the root).
    cache_dir: The data folder, expanded (None: not checked).
    cache_must_be_writable: Whether data is derived into the cache (synthetic data,
      partitions), so that it must be writable.
    num_parameters: The model's parameter count, for the free-space check.
  """
  # A run folder that exists is written, not created: its root may then be read-only.
  _check_folder(root_output_dir, '--root_output_dir', must_write=not os.path.isdir(output_dir))
  _check_folder(output_dir, 'the run folder')
  for sub in (run_files.CHECKPOINTS, run_files.TENSORBOARD, run_files.CLIENT_STATES):
    path = os.path.join(output_dir, sub)
    if os.path.lexists(path):
      _check_folder(path, 'the run folder')
  if cache_dir is not None:
    _check_folder(cache_dir, '--cache_dir', must_write=cache_must_be_writable)
  check_free_space(output_dir, checkpoint_bytes(num_parameters), num_parameters)
  if len(os.path.abspath(output_dir)) + _LONGEST_INSIDE > _PATH_MAX:
    raise errors.ExperimentError(
        f'the run folder {output_dir[:40]}... is {len(os.path.abspath(output_dir))}'
        f' characters long; files inside it would pass the {_PATH_MAX}-character limit of'
        ' a path: choose a shorter --root_output_dir or --experiment_name'
    )


def check_holds_a_run(output_dir: str) -> None:
  """Refuses a folder whose metrics.csv no run wrote: a run writes flags.json (and its
  checkpoints) before its first row, and appends to that file."""
  if not os.path.isfile(os.path.join(output_dir, run_files.METRICS)):
    return
  if any(os.path.lexists(os.path.join(output_dir, n))
         for n in (run_files.FLAGS, run_files.CHECKPOINTS)):
    return
  raise errors.ExperimentError(
      f'{output_dir} holds a metrics.csv but no flags.json or checkpoints/ of the run that'
      ' wrote it, so it is not a run\'s, and a run appends to its metrics.csv: move the file,'
      ' or choose another --experiment_name'
  )


def foreign_entries(output_dir: str) -> list[str]:
  """The entries at the top of `output_dir` that no run writes (sorted)."""
  return sorted(
      n for n in os.listdir(output_dir)
      if n not in run_files.RUN_ENTRIES and not _TEMP_ENTRY.match(n)
  )


def check_deletable(root_output_dir: str, output_dir: str) -> None:
  """Refuses --overwrite of anything but a folder inside the root holding only a run."""
  if not os.path.lexists(output_dir):
    return
  if os.path.islink(output_dir):
    raise errors.ExperimentError(
        f'{output_dir} is a symbolic link (to {os.path.realpath(output_dir)});'
        ' --overwrite deletes only a run folder inside --root_output_dir: remove the link'
        ' yourself or choose another --experiment_name'
    )
  check_inside(root_output_dir, output_dir, '--overwrite deletes only a run folder inside it')
  if not os.path.isdir(output_dir):
    return  # `check_environment` says it is a file.
  check_holds_a_run(output_dir)
  foreign = foreign_entries(output_dir)
  if foreign:
    more = f' and {len(foreign) - 1} more' if len(foreign) > 1 else ''
    raise errors.ExperimentError(
        f'--overwrite would delete {output_dir}, which holds files no run writes'
        f' ({foreign[0]!r}{more}); it deletes only a run\'s own files: move them, or'
        ' choose another --experiment_name'
    )


def _remove(path: str) -> None:
  """Deletes a file, a link (not what it points to) or a folder with its contents."""
  if os.path.isdir(path) and not os.path.islink(path):
    shutil.rmtree(path)
  else:
    os.remove(path)


def clear(root_output_dir: str, output_dir: str) -> None:
  """Deletes a run's files for --overwrite (checked again), keeping the lock file."""
  check_deletable(root_output_dir, output_dir)
  for name in os.listdir(output_dir):
    if name == run_files.LOCK:  # Held by this process: a new file would not be locked.
      continue
    _remove(os.path.join(output_dir, name))


def _busy_error(output_dir: str, lock_path: str):
  try:
    with open(lock_path) as f:
      holder = f.read().strip()
  except OSError:
    holder = ''
  who = f' (pid {holder})' if holder.isdigit() else ''
  return errors.ExperimentError(
      f'{output_dir} is being trained by another process{who}; wait for it to end, or'
      ' choose another --experiment_name'
  )


def check_not_locked(output_dir: str) -> None:
  """Fails early, writing nothing, if another process holds the run's lock."""
  lock_path = os.path.join(output_dir, run_files.LOCK)
  try:
    fd = os.open(lock_path, os.O_RDONLY)
  except OSError:
    return  # No lock file yet, or unreadable: `locked` decides.
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    raise _busy_error(output_dir, lock_path) from None
  finally:
    os.close(fd)  # Releases the probe's lock too.


@contextlib.contextmanager
def locked(output_dir: str) -> Iterator[None]:
  """Holds the run's lock (creating its folder) while the block runs.

  The lock is an `flock` on `<output_dir>/.lock`, which holds the owner's pid for the
  message other processes print. The kernel drops it when the process ends, however it
  ends. The descriptor is not inherited by child processes (TFF's workers).
  """
  lock_path = os.path.join(output_dir, run_files.LOCK)
  try:
    os.makedirs(output_dir, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
  except OSError as e:
    raise errors.RunEnvironmentError(
        f'cannot create {lock_path} ({e.strerror}); check the folder\'s permissions and'
        ' free space'
    ) from e
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      raise _busy_error(output_dir, lock_path) from None
    with contextlib.suppress(OSError):  # Only for the message; the lock is what counts.
      os.ftruncate(fd, 0)
      os.write(fd, f'{os.getpid()}\n'.encode())
    yield
  finally:
    os.close(fd)


def has_checkpoints(checkpoint_dir: str) -> bool:
  return bool(checkpoint_versions(checkpoint_dir))


def checkpoint_versions(checkpoint_dir: str) -> list[int]:
  """The rounds with a checkpoint folder, as TFF's file manager lists them (sorted)."""
  try:
    names = os.listdir(checkpoint_dir)
  except (FileNotFoundError, NotADirectoryError):
    return []
  prefix = 'program_state_'
  return sorted(
      int(n[len(prefix):]) for n in names if n.startswith(prefix) and n[len(prefix):].isdigit()
  )


def newest_checkpoint_round(checkpoint_dir: str) -> Optional[int]:
  """The round of the newest complete checkpoint (what a re-run resumes from), or None.

  TFF writes a checkpoint under a temporary name and renames it when complete, so only
  `program_state_<round>` directories count.
  """
  return max(checkpoint_versions(checkpoint_dir), default=None)


def write_json_atomically(path: str, value, sort_keys: bool = True) -> None:
  """Writes `value` as JSON to `path` via a temporary file renamed into place (its keys
  sorted, unless their order says something)."""
  tmp = os.path.join(os.path.dirname(path), f'.{os.path.basename(path)}.tmp')
  with open(tmp, 'w') as f:
    json.dump(value, f, indent=2, sort_keys=sort_keys)
    f.write('\n')
  os.replace(tmp, path)


def record_divergence(output_dir: str, reason: str) -> None:
  """Writes diverged.txt: `reason` in one line. A sweep does not train such a run again
  (`launch.sweeps.runner.status`)."""
  with open(os.path.join(output_dir, run_files.DIVERGED), 'w') as f:
    f.write(' '.join(reason.split()) + '\n')


def forget_divergence(output_dir: str) -> None:
  """Deletes diverged.txt, if any: a run trained again (with a larger
  --divergence_factor, say) is recorded as diverged only if it diverges again."""
  with contextlib.suppress(FileNotFoundError):
    os.remove(os.path.join(output_dir, run_files.DIVERGED))


def remove_interrupted_saves(output_dir: str, checkpoint_dir: str) -> list[str]:
  """Deletes temporaries of saves a killed process left; returns their names."""
  removed = []
  for directory, pattern in ((checkpoint_dir, _CHECKPOINT_TEMP), (output_dir, _TEMP_ENTRY)):
    try:
      names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
      continue
    for name in sorted(names):
      if not pattern.match(name):
        continue
      path = os.path.join(directory, name)
      _remove(path)
      removed.append(os.path.relpath(path, output_dir))
  return removed


def set_aside_unreadable(checkpoint_dir: str, version: int) -> str:
  """Renames checkpoint `version` out of TFF's sight; returns its new name."""
  source = os.path.join(checkpoint_dir, f'program_state_{version}')
  name = f'{UNREADABLE_PREFIX}program_state_{version}'
  n = 1
  while os.path.lexists(os.path.join(checkpoint_dir, name)):
    n += 1
    name = f'{UNREADABLE_PREFIX}program_state_{version}_{n}'
  os.rename(source, os.path.join(checkpoint_dir, name))
  return name


def repair_metrics_csv(path: str, newest_checkpoint: Optional[int]) -> Optional[str]:
  """Drops a torn last row of metrics.csv (a write a kill cut short); refuses worse damage
  (a line that is no row; no file beside checkpoints, `newest_checkpoint`).

  TFF's CSV manager appends one row per round, each ending in a line break. A last line
  without one is a row cut short; its round is trained again (`resumption.rewind`
  deletes a checkpoint of that round, which only a damaged disk leaves: the checkpoint
  is saved after the row).

  Returns:
    A sentence saying what was repaired, or None.
  """
  if not os.path.exists(path):
    if newest_checkpoint:
      raise errors.ExperimentError(
          f'{path} is missing but checkpoints up to round {newest_checkpoint} exist; its'
          ' rounds cannot be written again: restore it, or pass --overwrite to start afresh'
      )
    return None
  with open(path, 'rb') as f:
    data = f.read()
  repaired = None
  if data and not data.endswith(b'\n'):
    cut = data.rfind(b'\n') + 1
    torn = data[cut:].decode('utf-8', 'replace')
    data = data[:cut]
    repaired = (
        f'{os.path.basename(path)}: dropped a torn last row ({torn[:30]!r}...), cut short'
        ' by an interrupted run; its round is trained again'
    )
  lines = data.decode('utf-8', 'replace').splitlines()
  header = lines[0].split(',') if lines else []
  for number, line in enumerate(lines[1:], start=2):
    key = line.split(',', 1)[0]
    if not key.isdigit() or line.count(',') < len(header) - 1:
      raise errors.ExperimentError(
          f'{path} line {number} is damaged ({line[:30]!r}); repair or remove that line,'
          ' or pass --overwrite to start afresh'
      )
  if repaired:
    tmp = os.path.join(os.path.dirname(path), f'.{os.path.basename(path)}.tmp')
    with open(tmp, 'wb') as f:
      f.write(data)
    os.replace(tmp, path)
  return repaired


def find_intact_checkpoint(
    checkpoint_dir: str, load: Callable[[int], None]
) -> tuple[Optional[int], list[tuple[int, Exception]]]:
  """The newest checkpoint `load(version)` accepts, and the newer ones it refused.

  Returns:
    (version or None, [(refused version, its error), ...] newest first).
  """
  refused = []
  for version in reversed(checkpoint_versions(checkpoint_dir)):
    try:
      load(version)
    except Exception as e:  # pylint: disable=broad-except
      refused.append((version, e))
      continue
    return version, refused
  return None, refused
