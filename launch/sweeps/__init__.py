"""Many training runs: running them some at a time in a pool of warm slots,
learning-rate grids and their halving search, comparisons over seeds, and the dry run's
estimates."""
