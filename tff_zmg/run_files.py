"""The names of the files in a run's folder and a grid's, declared once.

`launch` writes these folders and `tff_zmg.analysis` reads them, so the names live in the
library that both import. A run's folder (`<root_output_dir>/<experiment_name>/`):

  flags.json          the run's settings (written before its first round)
  metrics.csv         one row per round (TFF's `CSVFileReleaseManager`)
  runtime.json        what ran each session of the run: runtime, devices, threads
  communication.json  the aggregator and the bytes a client sends and receives per round
  diverged.txt        the one-line reason the run stopped diverging (written when it
                      does; gone once it trains again): a sweep does not retry it
  checkpoints/        TFF's program state, with run_identity.json (what they belong to)
  tensorboard/        the same metrics for TensorBoard
  client_states/      the states of clients that keep state, where they are on disk
  .lock               held by the one process that trains the run

A grid search's folder holds its cells' folders, and best.json (its pick).
"""

FLAGS = 'flags.json'
METRICS = 'metrics.csv'
RUNTIME = 'runtime.json'
COMMUNICATION = 'communication.json'
DIVERGED = 'diverged.txt'
CHECKPOINTS = 'checkpoints'
IDENTITY = 'run_identity.json'
TENSORBOARD = 'tensorboard'
CLIENT_STATES = 'client_states'
LOCK = '.lock'
# What a run's folder holds at its top; `--overwrite` deletes no folder holding anything else.
RUN_ENTRIES = frozenset({
    FLAGS, METRICS, RUNTIME, COMMUNICATION, DIVERGED, CHECKPOINTS, TENSORBOARD,
    CLIENT_STATES, LOCK,
})

BEST = 'best.json'
