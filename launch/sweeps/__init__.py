"""Many training runs: running them some at a time, learning-rate grids and their halving
search, comparisons over seeds, and the dry run's estimates."""
