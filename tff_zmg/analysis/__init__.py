"""Turning training runs into a paper's numbers: metrics, statistics, tables and figures.

Plain functions, usable from a notebook on any metrics.csv that `launch.train` wrote:

    from tff_zmg import analysis
    rounds, acc = analysis.accuracy_series('runs/emnist_fedzmg_seed0')
    analysis.final_accuracy(acc, rounds), analysis.rounds_to_threshold(acc, 0.85, rounds)

The definitions are those of specification.md section 6 (FedZMG paper, section 5.3).
"""

from tff_zmg.analysis import comparison
from tff_zmg.analysis import heterogeneity
from tff_zmg.analysis import metrics
from tff_zmg.analysis import plots
from tff_zmg.analysis import runs
from tff_zmg.analysis import tables
from tff_zmg.analysis import tuning
from tff_zmg.analysis.comparison import compare_runs
from tff_zmg.analysis.heterogeneity import client_statistics
from tff_zmg.analysis.heterogeneity import client_table
from tff_zmg.analysis.heterogeneity import dominant_class_fraction
from tff_zmg.analysis.heterogeneity import gini
from tff_zmg.analysis.heterogeneity import kl_divergence
from tff_zmg.analysis.heterogeneity import label_counts
from tff_zmg.analysis.heterogeneity import label_diversity
from tff_zmg.analysis.heterogeneity import normalized_entropy
from tff_zmg.analysis.heterogeneity import summary
from tff_zmg.analysis.heterogeneity import volume
from tff_zmg.analysis.metrics import final_accuracy
from tff_zmg.analysis.metrics import late_stage_accuracy
from tff_zmg.analysis.metrics import mean_of_last_rounds
from tff_zmg.analysis.metrics import moving_average
from tff_zmg.analysis.metrics import paired_t_test
from tff_zmg.analysis.metrics import rounds_to_threshold
from tff_zmg.analysis.metrics import slowest_round
from tff_zmg.analysis.metrics import TTestResult
from tff_zmg.analysis.plots import accuracy_curves
from tff_zmg.analysis.plots import heatmap
from tff_zmg.analysis.runs import accuracy_series
from tff_zmg.analysis.runs import metric_series
from tff_zmg.analysis.tables import markdown_table
from tff_zmg.analysis.tables import NOT_REACHED
from tff_zmg.analysis.tables import write_csv
from tff_zmg.analysis.tuning import find_tuned
from tff_zmg.analysis.tuning import TunedRates
