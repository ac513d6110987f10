"""What made a run, kept beside its checkpoints: `checkpoints/run_identity.json`.

A run's identity is the settings that change its results and the identity of its data
(`data_identity`: its clients, counted and digested). `launch.run.experiment.run` checks it
before and again under the run's lock (`check_identity`), so that a lost or edited
flags.json cannot let other settings or other data continue a run, and writes it before
the first round (`write_identity`). Nothing in it is a path, so a copied or renamed run
folder resumes. The errors are `errors.ExperimentError`s, one line each.
"""

import hashlib
import json
import os
from typing import Callable, Iterable, Optional

from launch.run import errors
from launch.run import run_directory
from tff_zmg import run_files



def data_identity(train_client_ids: Iterable[str], test_client_ids: Iterable[str]) -> dict:
  """What identifies a run's data without reading it: its clients (counts and a digest)."""
  train, test = sorted(train_client_ids), sorted(test_client_ids)
  digest = hashlib.sha256(json.dumps([train, test]).encode('utf-8')).hexdigest()[:16]
  return {'train_clients': len(train), 'test_clients': len(test), 'client_ids_sha256': digest}


def _identity_path(checkpoint_dir: str) -> str:
  return os.path.join(checkpoint_dir, run_files.IDENTITY)


def read_identity(checkpoint_dir: str) -> Optional[dict]:
  """The recorded identity, or None if the run has none (new, or older than this file)."""
  path = _identity_path(checkpoint_dir)
  try:
    with open(path) as f:
      identity = json.load(f)
  except FileNotFoundError:
    return None
  except (OSError, ValueError) as e:
    raise errors.ExperimentError(
        f'{path} is unreadable ({type(e).__name__}); it records the settings that made'
        ' the checkpoints: restore it, or pass --overwrite to start afresh'
    ) from e
  if not isinstance(identity, dict) or not isinstance(identity.get('settings'), dict):
    raise errors.ExperimentError(
        f'{path} does not hold a run\'s identity; restore it, or pass --overwrite to'
        ' start afresh'
    )
  return identity


def differences(recorded: dict, now: dict) -> str:
  """`key: old -> new, ...` over the keys whose values differ ('' if none)."""
  changed = sorted(k for k in set(recorded) | set(now) if recorded.get(k) != now.get(k))
  return ', '.join(f'{k}: {recorded.get(k)!r} -> {now.get(k)!r}' for k in changed)


def check_identity(
    output_dir: str,
    checkpoint_dir: str,
    identity: dict,
    legacy_flags_ok: bool,
    read_settings: Callable[[dict], dict] = lambda settings: settings,
) -> None:
  """Refuses to continue a run whose recorded identity differs from `identity`.

  Args:
    output_dir: The run's folder (for messages).
    checkpoint_dir: Where the identity is recorded.
    identity: `{'settings': ..., 'data': ...}` of the run about to start.
    legacy_flags_ok: Whether flags.json exists and agrees with the settings: a run from
      before identity files may then continue (and gets one).
    read_settings: Brings recorded settings to today's form before they are compared
      (e.g. fills in hyperparameters an older record left out as defaults).
  """
  recorded = read_identity(checkpoint_dir)
  if recorded is None:
    if run_directory.has_checkpoints(checkpoint_dir) and not legacy_flags_ok:
      raise errors.ExperimentError(
          f'{checkpoint_dir} holds checkpoints, but neither {run_files.IDENTITY} there nor'
          f' flags.json in {output_dir} says which settings made them; pass --overwrite to'
          ' start afresh'
      )
    return
  changed = differences(read_settings(recorded['settings']), identity['settings'])
  if changed:
    raise errors.ExperimentError(
        f'{output_dir} holds a run with other settings ({changed}; recorded in'
        f' {os.path.join(os.path.basename(checkpoint_dir), run_files.IDENTITY)}); pass'
        ' --overwrite to replace it or choose another --experiment_name'
    )
  changed = differences(recorded.get('data') or {}, identity['data'])
  if changed:
    raise errors.ExperimentError(
        f'{output_dir} was trained on other data ({changed}); point --cache_dir at that'
        ' data, or pass --overwrite to start afresh on this one'
    )


def write_identity(checkpoint_dir: str, identity: dict) -> None:
  """Records `identity` beside the checkpoints (atomically; kept if already there)."""
  path = _identity_path(checkpoint_dir)
  os.makedirs(checkpoint_dir, exist_ok=True)
  run_directory.write_json_atomically(path, identity)
