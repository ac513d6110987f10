"""The installed set is the one `scripts/bootstrap.sh` promises (`requirements/`)."""

import os

from google.protobuf.internal import api_implementation
import google.protobuf

_OVERRIDES = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'requirements',
                          'overrides.txt')


def test_protobuf_is_the_override_and_runs_its_c_implementation():
  # Pure-Python protobuf (3.20 on Python 3.11) compiles TFF's computations several times
  # slower: the suite and every run's start would quietly take twice as long.
  with open(_OVERRIDES) as f:
    pinned, = [l.strip().split('==')[1] for l in f if l.startswith('protobuf==')]
  assert google.protobuf.__version__ == pinned
  assert api_implementation.Type() == 'upb'
