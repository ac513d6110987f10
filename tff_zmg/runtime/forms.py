"""TFF's MapReduceForm of a round, compiled once per computation object.

The compile is seconds of TFF's Python compiler, and a run asks for it twice: for its
communication record (`aggregation.communication`) and for the in-process runtime's pieces.
"""

import collections
import threading

import tensorflow_federated as tff

# Recent computations only: each entry keeps its computation (and so its id) alive.
_CACHE_SIZE = 8
_forms: collections.OrderedDict = collections.OrderedDict()
_lock = threading.Lock()


def map_reduce_form(comp) -> tff.backends.mapreduce.MapReduceForm:
  """`tff.backends.mapreduce.get_map_reduce_form_for_computation(comp)`, kept per object."""
  with _lock:
    cached = _forms.get(id(comp))
    if cached is not None and cached[0] is comp:
      _forms.move_to_end(id(comp))
      return cached[1]
  form = tff.backends.mapreduce.get_map_reduce_form_for_computation(comp)
  with _lock:
    _forms[id(comp)] = (comp, form)
    while len(_forms) > _CACHE_SIZE:
      _forms.popitem(last=False)
  return form
