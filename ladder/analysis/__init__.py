"""Analysis: compute-law fitting over a sweep's runs, recipe cards, the demo and its report, notebook data."""
