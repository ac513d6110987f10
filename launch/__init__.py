"""The package's programs (`python -m launch.<program>`).

TensorFlow's C++ start-up lines would bury every program's output, and `--verbosity`
does not reach them: the level is set here, before any program imports TensorFlow
(`tasks` and `tff_zmg` import it), unless the user set it. Level 3, not 2: this CUDA build
of TensorFlow logs three ERROR lines at import on every machine ("Unable to register
cuDNN factory ... already registered"); errors that matter reach Python as exceptions
(launch/failures.py). `TF_CPP_MIN_LOG_LEVEL=0` shows everything.
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
