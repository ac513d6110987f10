r"""One command per paper table: `python -m launch.reproduce --paper=fedzmg [--table=N] [--scale=...]`.

Runs a paper's protocol (launch/papers/<paper>.py) end to end and writes a report beside
the numbers it published (kept in the same file):

1. the learning-rate grid search where the paper tuned (FedZMG: 9 x 9 client x server
   rates, 50 rounds, cohort 10, each algorithm on each task; `launch.grid_search`;
   at --scale=small searched by successive halving up to the same 50 rounds), and a
   re-run of each pick with another seed (a pick that diverges there gives way to its
   best stable neighbour);
2. the comparison: every algorithm on every setting of the chosen tables over the
   paper's seeds, all seeds on one data split, at the best rates of step 1
   (`launch.compare`);
3. the paper's metrics and statistics (`tff_zmg.analysis`), the accuracy curves and the
   grid heatmaps, and `report.md`: each table in the paper's layout with cells
   "ours (paper)", and a generated summary of where the two agree.

    python -m launch.reproduce --paper=fedzmg --scale=small --parallel=2
    python -m launch.reproduce --paper=gcfed --table=5 --cache_dir=~/tensorflow_datasets
    python -m launch.reproduce --paper=fedzmg --table=5,6 --scale=ci --data_source=synthetic
    python -m launch.reproduce --paper=fedzmg --dry_run      # the runs, their count, the time

--scale: `full` (the paper's protocol), `small`, `ci`, or a number in (0, 1] that scales
the rounds only (see `launch/reproduce/scales.py`); where a scale cuts the grid or its
rounds (`ci`, a fraction), report.md says first that the rates were not tuned honestly. Every run is an ordinary `launch.train` run in
`<reproduce_dir>/grid/<setting>/<algo>/<cell>` or `<reproduce_dir>/runs/<setting>/`, so
re-running the same command reuses finished runs and resumes unfinished ones. Other
flags of `launch.train` (--cache_dir, --executor, --data_source, ...) pass on to every run;
the ones the protocol sets cannot be given. With --data_source=synthetic the tfds tasks
(CIFAR-10, the tfds CIFAR-100) are stood in for by synthetic data in TFF's CIFAR-100
format, split by the same Dirichlet protocol.

Exit status: as every program's (docs/operations.md, "Exit statuses"); a run
failing otherwise passes on its own status.
"""

from launch.cli import failures
from launch.reproduce import run

if __name__ == '__main__':
  failures.run_program('reproduce', run.main)
