"""Analysis of training runs: accuracy-curve summaries and terminal-cliff detection."""
