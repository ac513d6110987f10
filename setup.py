"""tff_zmg: gradient-projection and gradient-correction federated optimizers for TFF."""
import sys

if not (3, 9) <= sys.version_info[:2] <= (3, 11):
  sys.exit(
      'tff_zmg needs Python 3.9, 3.10 or 3.11 (TensorFlow Federated 0.87.0 supports no'
      f' other); this is Python {sys.version.split()[0]}. Run scripts/bootstrap.sh, which'
      ' picks a supported interpreter.'
  )

from setuptools import find_packages, setup  # pylint: disable=g-import-not-at-top

setup(
    name='tff_zmg',
    version='0.1.0',
    description=(
        'FedZMG, GC-Fed, FedRKMGC, FedGPS and friends as composable TFF processes.'
    ),
    python_requires='>=3.9,<3.12',
    packages=find_packages(include=['tff_zmg*', 'tasks*', 'launch*']),
    # The tested dependency set lives in requirements/; scripts/bootstrap.sh installs it
    # (TFF must be installed without its unsatisfiable jax pin, which setup.py cannot say).
    install_requires=[],
)
