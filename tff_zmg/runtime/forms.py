"""TFF's MapReduceForm of a round, compiled once per computation.

The compile is seconds of TFF's Python compiler, and every program that trains asks for
it: for its communication record (`aggregation.communication`) and for the in-process
runtime's pieces. So a form is kept per computation object in this process, and on disk
per computation *content* for the next processes (a resumed run, a grid's or a
comparison's cells at the same hyperparameters): the file's name is the SHA-256 of the
computation's serialized proto and TFF's version, and a process that builds the same
round builds the same proto, so a file is only ever read for the computation it was
compiled from. `TFF_ZMG_FORM_CACHE` names the folder (default
`$XDG_CACHE_HOME/tff_zmg/map_reduce_forms`, `~/.cache/...`); empty turns the disk off.

The compile optimizes each piece with Grappler as TFF does (`GRAPPLER_CONFIG`), except its
memory scheduling: that pass rewrites an `AddN` into a `TemporaryVariable` accumulator whose
name is fixed in the graph, and a `TemporaryVariable` lives in the step container, which all
eager calls of a process share. Two clients trained at once then create the same variable
and one fails with AlreadyExistsError (FedGPS's CIFAR-100 round, 2 tries in 5). The runtime
optimizes what it imports the same way (`tf_computation.call_options`).
"""

import base64
import collections
import contextlib
import hashlib
import json
import os
import threading
from typing import Optional

import tensorflow_federated as tff
from tensorflow_federated.proto.v0 import computation_pb2
from tensorflow_federated.python.core.backends.mapreduce import form_utils

from tasks import cache

# Recent computations only: each entry keeps its computation (and so its id) alive.
_CACHE_SIZE = 8
# Forms kept on disk: the newest by use; each is a few hundred kB to a few MB.
_DISK_FILES = 64
_FORMAT = 2  # Of the files' content and the compile's options; part of their name.
_TMP_PREFIX = '.form-'
_PIECES = ('prepare', 'work', 'zero', 'accumulate', 'merge', 'report', 'secure_sum_bitwidth',
           'secure_sum_max_input', 'secure_modular_sum_modulus', 'update')
_forms: collections.OrderedDict = collections.OrderedDict()
_lock = threading.Lock()


def turn_off_memory_scheduling(config) -> None:
  """Grappler's memory scheduling off in a `ConfigProto`; its swapping (a GPU's) stays."""
  rewrites = config.graph_options.rewrite_options
  rewrites.memory_optimization = rewrites.SWAPPING_HEURISTICS


def _grappler_config():
  """TFF's compile options with memory scheduling off."""
  config = type(form_utils._GRAPPLER_DEFAULT_CONFIG)()  # pylint: disable=protected-access
  config.CopyFrom(form_utils._GRAPPLER_DEFAULT_CONFIG)  # pylint: disable=protected-access
  turn_off_memory_scheduling(config)
  return config


GRAPPLER_CONFIG = _grappler_config()


def compile_form(comp) -> tff.backends.mapreduce.MapReduceForm:
  """TFF's MapReduceForm of `comp`, compiled with `GRAPPLER_CONFIG`."""
  return tff.backends.mapreduce.get_map_reduce_form_for_computation(
      comp, grappler_config=GRAPPLER_CONFIG)


def map_reduce_form(comp) -> tff.backends.mapreduce.MapReduceForm:
  """`tff.backends.mapreduce.get_map_reduce_form_for_computation(comp)`, kept per object
  in this process and per content on disk."""
  with _lock:
    cached = _forms.get(id(comp))
    if cached is not None and cached[0] is comp:
      _forms.move_to_end(id(comp))
      return cached[1]
  path = _disk_path(comp)
  form = _read(path, comp) if path else None
  if form is None:
    form = compile_form(comp)
    if path:
      _write(path, form)
  with _lock:
    _forms[id(comp)] = (comp, form)
    while len(_forms) > _CACHE_SIZE:
      _forms.popitem(last=False)
  return form


def cache_dir() -> Optional[str]:
  """The forms' folder on disk, None if turned off."""
  configured = os.environ.get('TFF_ZMG_FORM_CACHE')
  if configured is not None:
    return os.path.expanduser(configured) or None
  base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return os.path.join(base, 'tff_zmg', 'map_reduce_forms')


def _disk_path(comp) -> Optional[str]:
  directory = cache_dir()
  if directory is None or not isinstance(comp, tff.framework.ConcreteComputation):
    return None
  digest = hashlib.sha256(f'{tff.__version__}/{_FORMAT}/'.encode())
  digest.update(tff.framework.ConcreteComputation.get_proto(comp).SerializeToString(
      deterministic=True))
  return os.path.join(directory, f'{digest.hexdigest()}.json')


def _read(path: str, comp) -> Optional[tff.backends.mapreduce.MapReduceForm]:
  """The form in `path`, or None when there is none or it cannot be read (recompiled)."""
  try:
    with open(path) as f:
      pieces = json.load(f)
    form = tff.backends.mapreduce.MapReduceForm(comp.type_signature, **{
        name: tff.framework.ConcreteComputation(
            computation_proto=computation_pb2.Computation.FromString(
                base64.b64decode(pieces[name])),
            context_stack=tff.framework.get_context_stack())
        for name in _PIECES})
  except (OSError, ValueError, KeyError, TypeError, AttributeError):
    return None
  with contextlib.suppress(OSError):
    os.utime(path)  # Most recently used: the last to be pruned.
  return form


def _write(path: str, form: tff.backends.mapreduce.MapReduceForm) -> None:
  """Writes `form` to `path` whole or not at all (`tasks.cache.atomic_path`, which also
  removes what a killed writer left); a machine refusing the write only costs the next
  process a compile."""
  pieces = {
      name: base64.b64encode(tff.framework.ConcreteComputation.get_proto(
          getattr(form, name)).SerializeToString(deterministic=True)).decode('ascii')
      for name in _PIECES}
  try:
    with cache.atomic_path(path, _TMP_PREFIX) as temporary:
      with open(temporary, 'w') as f:
        json.dump(pieces, f)
  except OSError:
    return
  _prune(os.path.dirname(path))


def _prune(directory: str) -> None:
  """Keeps the `_DISK_FILES` most recently used forms."""
  with contextlib.suppress(OSError):
    forms = sorted((entry for entry in os.scandir(directory) if entry.name.endswith('.json')),
                   key=lambda entry: entry.stat().st_mtime, reverse=True)
    for entry in forms[_DISK_FILES:]:
      with contextlib.suppress(OSError):
        os.remove(entry.path)
