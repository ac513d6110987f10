"""A run's folder: names stay inside the root, --overwrite deletes only runs, one process
per run, the run's identity beside its checkpoints, and resuming from what kills leave.

Most cases fail before any computation and run `launch.train.main` in this process; the
concurrent-run and `..` cases run real `python -m launch.train` processes.
"""

import csv
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from launch.run import errors
from launch.run import run_directory
import small_runs

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SMALL = small_runs.FLAGS
_BASE = ['--task=emnist', '--algo=fedavg']
_FINISHED = {}  # The two-round run of the concurrency test, reused by the resume test.


def _command(cache_dir, root, *args):
  return [sys.executable, '-m', 'launch.train', f'--cache_dir={cache_dir}',
          f'--root_output_dir={root}', *_SMALL, *_BASE, *args]


def _one_line(err, *parts):
  assert 'Traceback' not in err
  assert len(err.strip().splitlines()) == 1, err
  for part in parts:
    assert part in err, err


def _tree(path):
  """Every file and folder under `path` (relative), to show nothing else was touched."""
  found = set()
  for root, dirs, files in os.walk(path):
    for name in dirs + files:
      found.add(os.path.relpath(os.path.join(root, name), path))
  return found


def _keys(csv_path):
  with open(csv_path, newline='') as f:
    return [int(r['key']) for r in csv.DictReader(f)]


def test_names_outside_the_root_are_refused_and_overwrite_deletes_only_runs(
    run_main, tmp_path, synthetic_cache_dir
):
  root = tmp_path / 'root'
  (root / 'other_run').mkdir(parents=True)
  (root / 'other_run' / 'flags.json').write_text('{}')
  (tmp_path / 'beside.txt').write_text('keep')
  (tmp_path / 'elsewhere').mkdir()
  (tmp_path / 'elsewhere' / 'flags.json').write_text('{}')
  # A folder with a run's files and one of the user's; a link to a run outside the root.
  (root / 'mixed').mkdir()
  (root / 'mixed' / 'flags.json').write_text('{}')
  (root / 'mixed' / 'notes.txt').write_text('mine')
  (root / 'link').symlink_to(tmp_path / 'elsewhere')
  before = _tree(tmp_path)
  for name, message in [
      ('.', "'.' component"),
      ('a/../..', "'..' component"),
      ('a//b', 'an empty component'),
      (str(tmp_path / 'elsewhere'), 'absolute path'),
      ('x' * 300, '300 bytes long'),
  ]:
    rc, out, err = run_main(*_BASE, f'--experiment_name={name}', '--overwrite', root=root)
    assert rc == 2 and not out, name
    _one_line(err, message)
  rc, _, err = run_main(*_BASE, '--experiment_name=mixed', '--overwrite', root=root)
  assert rc == 2
  _one_line(err, "holds files no run writes ('notes.txt')")
  rc, _, err = run_main(*_BASE, '--experiment_name=link', '--overwrite', root=root)
  assert rc == 2
  _one_line(err, 'is a symbolic link')
  # `..` with --overwrite in a real process: the root's parent and siblings survive.
  proc = subprocess.run(
      _command(synthetic_cache_dir, root, '--experiment_name=..', '--overwrite'),
      capture_output=True, text=True, timeout=300, cwd=_REPO,
  )
  assert proc.returncode == 2 and not proc.stdout
  _one_line(proc.stderr, "'..' component")
  assert _tree(tmp_path) == before


def test_unusable_folders_and_flags_files_end_in_one_line(run_main, tmp_path):
  (tmp_path / 'a_file').write_text('not a folder')
  cases = [
      # --root_output_dir, a run folder and --cache_dir that are files (a file inside the
      # path, too): RunEnvironmentError, the machine's fault, not the settings'.
      ([f'--root_output_dir={tmp_path / "a_file"}'], 'is a file, not a folder'),
      ([f'--root_output_dir={tmp_path / "a_file" / "deeper"}'], 'is a file, not a folder'),
      (['--experiment_name=a_file'], 'the run folder'),
      ([f'--cache_dir={tmp_path / "a_file"}'], '--cache_dir'),
  ]
  if os.geteuid() != 0:  # root writes into read-only folders.
    (tmp_path / 'read_only').mkdir(mode=0o555)
    cases.append(([f'--root_output_dir={tmp_path / "read_only"}'], 'not writable'))
  before = _tree(tmp_path)
  for args, message in cases:
    rc, out, err = run_main(*_BASE, *args, root=tmp_path)
    assert rc == 5 and not out, args  # The machine's fault: launch.cli.failures' status 5.
    _one_line(err, message)
  for content, kind in (('[]', 'JSON list'), ('null', 'JSON null'), ('{"task": "em', 'unreadable')):
    (tmp_path / 'run').mkdir(exist_ok=True)
    (tmp_path / 'run' / 'flags.json').write_text(content)
    rc, _, err = run_main(*_BASE, '--experiment_name=run', root=tmp_path)
    assert rc == 2
    _one_line(err, 'flags.json', kind, '--overwrite')
    assert (tmp_path / 'run' / 'flags.json').read_text() == content
  assert _tree(tmp_path) == before | {'run', 'run/flags.json'}


def test_free_space_below_one_checkpoint_is_refused(tmp_path):
  free = shutil.disk_usage(tmp_path).free
  parameters = free // run_directory.BYTES_PER_PARAMETER + 1
  needed = run_directory.checkpoint_bytes(parameters)
  with pytest.raises(errors.RunEnvironmentError) as e:
    run_directory.check_free_space(str(tmp_path / 'run'), needed, parameters)
  assert '\n' not in str(e.value)
  assert f'{parameters:,} parameters x 4 bytes =' in str(e.value) and 'MiB free' in str(e.value)
  run_directory.check_free_space(str(tmp_path / 'run'), free // 2, parameters)  # Room enough.


def test_a_second_training_of_the_same_run_is_refused_while_the_first_trains(
    tmp_path, synthetic_cache_dir
):
  root = tmp_path / 'root'
  first = subprocess.Popen(
      _command(synthetic_cache_dir, root, '--total_rounds=2'),
      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=_REPO,
  )
  try:
    for line in first.stdout:
      if line.startswith('round 1/2'):
        # Stopped mid-run, it holds the run's lock until it is continued and ends.
        first.send_signal(signal.SIGSTOP)
        break
    second = subprocess.run(
        _command(synthetic_cache_dir, root, '--total_rounds=2'),
        capture_output=True, text=True, timeout=300, cwd=_REPO,
    )
  finally:
    first.send_signal(signal.SIGCONT)
  out, _ = first.communicate(timeout=300)
  assert second.returncode == 2 and not second.stdout
  _one_line(second.stderr, 'is being trained by another process', f'(pid {first.pid})')
  assert first.returncode == 0 and 'summary:' in out
  run = root / 'emnist_fedavg_seed0'
  assert _keys(run / 'metrics.csv') == [0, 1, 2]  # Each round once.
  assert len(os.listdir(run / 'tensorboard')) == 1
  _FINISHED['dir'] = run


def _finished_run(tmp_path_factory, synthetic_cache_dir):
  if 'dir' not in _FINISHED:  # This test alone: train the run here.
    root = tmp_path_factory.mktemp('finished')
    subprocess.run(_command(synthetic_cache_dir, root, '--total_rounds=2'), check=True,
                   capture_output=True, timeout=600, cwd=_REPO)
    _FINISHED['dir'] = root / 'emnist_fedavg_seed0'
  return _FINISHED['dir']


def test_the_identity_beside_the_checkpoints_guards_a_copied_run_that_resumes_past_damage(
    run_main, tmp_path, tmp_path_factory, synthetic_cache_dir
):
  # A copy under another name, without flags.json: the checkpoints' own record decides.
  run = tmp_path / 'renamed'
  shutil.copytree(_finished_run(tmp_path_factory, synthetic_cache_dir), run)
  os.remove(run / 'flags.json')
  identity = json.loads((run / 'checkpoints' / 'run_identity.json').read_text())
  assert identity['settings']['seed'] == 0 and 'root_output_dir' not in identity['settings']
  name = '--experiment_name=renamed'
  rc, _, err = run_main(*_BASE, name, '--seed=7', '--client_learning_rate=0.5', root=tmp_path)
  assert rc == 2
  _one_line(err, 'other settings', 'seed: 0 -> 7', 'client_learning_rate', 'run_identity.json')
  # Fewer rounds than it trained: refused, and nothing rewritten to claim otherwise.
  rc, _, err = run_main(*_BASE, name, '--total_rounds=1', root=tmp_path)
  assert rc == 2
  _one_line(err, 'already trained 2 rounds', '--total_rounds=2 or more')
  assert not (run / 'flags.json').exists()
  # What a kill or a damaged disk leaves: a checkpoint save cut short (a temporary folder,
  # and a newest checkpoint that cannot be read) ...
  (run / 'checkpoints' / 'program_state_3_temp1234' / 'variables').mkdir(parents=True)
  for folder, _, files in os.walk(run / 'checkpoints' / 'program_state_2'):
    for f in files:
      with open(os.path.join(folder, f), 'wb') as out:
        out.write(b'garbage')
  rc, out, err = run_main(*_BASE, name, '--total_rounds=2', root=tmp_path)
  assert rc == 0, err
  assert 'removed what interrupted saves left: checkpoints/program_state_3_temp1234' in out
  assert 'checkpoint of round 2 cannot be read' in out and 'resuming from round 1' in out
  assert 'round 2/2' in out and 'round 1/2' not in out
  assert _keys(run / 'metrics.csv') == [0, 1, 2]
  names = sorted(os.listdir(run / 'checkpoints'))
  assert 'program_state_2' in names and 'unreadable_program_state_2' in names
  assert not any('_temp' in n for n in names)
  recorded = json.loads((run / 'flags.json').read_text())
  assert recorded['experiment_name'] == 'renamed' and recorded['seed'] == 0
  # ... and a torn last row, though the checkpoint of its round is on the disk: the round is
  # trained again from the checkpoint before it.
  data = (run / 'metrics.csv').read_bytes()
  (run / 'metrics.csv').write_bytes(data[:data.rstrip().rfind(b'\n') + 8])
  rc, out, err = run_main(*_BASE, name, '--total_rounds=2', root=tmp_path)
  assert rc == 0, err
  assert 'dropped a torn last row' in out
  assert ('metrics.csv ends at round 1: resuming from the checkpoint of round 1, the'
          ' checkpoints of round 2 are written again') in out
  assert 'round 2/2' in out and 'round 1/2' not in out
  assert _keys(run / 'metrics.csv') == [0, 1, 2]


def test_a_checkpoint_with_a_list_where_the_state_has_a_tuple_is_read_into_the_tuple(tmp_path):
  """FedGPS wrote its mean update as a list until 2026-11-29, and the state holds a tuple:
  such a checkpoint is read into the state's containers, its values kept; one whose
  nesting differs is still unreadable."""
  import asyncio  # pylint: disable=g-import-not-at-top
  import collections  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from launch.run import rounds  # pylint: disable=g-import-not-at-top

  saved = collections.OrderedDict(
      last_update=[np.arange(2, dtype=np.float32), np.ones(3, np.float32)],
      round_num=np.int32(1))
  asyncio.run(tff.program.FileProgramStateManager(str(tmp_path)).save(saved, 1))
  state = collections.OrderedDict(
      last_update=(np.zeros(2, np.float32), np.zeros(3, np.float32)), round_num=np.int32(0))
  reader = rounds.CheckpointReader(str(tmp_path))
  with pytest.raises(TypeError):  # TFF's own load refuses it.
    asyncio.run(tff.program.FileProgramStateManager(str(tmp_path)).load(1, state))
  loaded = asyncio.run(reader.load(1, state))
  assert type(loaded) is collections.OrderedDict and type(loaded['last_update']) is tuple
  np.testing.assert_array_equal(loaded['last_update'][0], [0, 1])
  np.testing.assert_array_equal(loaded['last_update'][1], [1, 1, 1])
  assert loaded['round_num'] == 1
  three = collections.OrderedDict(last_update=(np.zeros(2), np.zeros(3), np.zeros(1)),
                                  round_num=np.int32(0))
  with pytest.raises((TypeError, ValueError)):
    asyncio.run(reader.load(1, three))
