"""`python -m launch.reproduce`: one command per paper table (the program: `__main__`).

  plan      what a command runs: the paper, tables and settings at a scale; the runs
            (`planned_runs`: each with the rounds it trains, for the estimate)
  scales    how much of a protocol to run (full, small, ci, a fraction of the rounds)
  estimate  the dry run: every run, their count, the time per table and in total (each
            kind of run timed by `launch.sweeps.calibration`)
  report    the paper's tables with our numbers beside the published ones
  run       grid search, comparison, report; `main`
"""

from launch.reproduce.estimate import dry_run
from launch.reproduce.plan import Plan
from launch.reproduce.plan import check_data
from launch.reproduce.plan import comparison_runs
from launch.reproduce.plan import grid_groups
from launch.reproduce.plan import plan_from_flags
from launch.reproduce.plan import planned_runs
from launch.reproduce.report import write_report
from launch.reproduce.run import main
from launch.reproduce.run import reproduce
