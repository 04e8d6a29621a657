"""Execution: the Ray sweep orchestrator, the tracking server, the nightly regression run."""
