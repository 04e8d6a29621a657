"""Running a curation on Ray: the tagger pipeline (`curation.pipeline`) with its tasks as Ray tasks (one per
file or per partition, `--workers` CPUs locally or a cluster at `--address`), progress per stage on stderr.

The result does not depend on the number of workers, nor on the number of partitions: every task's output
is a function of its inputs alone and every decision (cluster ids, the kept document) of document uids.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

from curation.minhash import LSHParams
from curation.model_taggers import ModelOptions
from curation.pipeline import curate, local_mapper
from curation.report import write_report
from rungs.data.workers import ray_session, run_units

MIN_PARTITIONS = 4
PARTITION_INPUT_BYTES = 256 << 20  # input text per shuffle partition: a partition's keys stay ~100 MB or less


def partitions_for(workers: int, input_bytes: int) -> int:
    """Shuffle partitions: two per worker (so a slow partition does not hold the others), at least 4, and one
    per PARTITION_INPUT_BYTES of input, so a partition's memory does not grow with the corpus."""
    return max(MIN_PARTITIONS, 2 * workers, -(-input_bytes // PARTITION_INPUT_BYTES))


def input_bytes(manifest: str | Path) -> int:
    from rungs.data.manifest import load_manifest
    from rungs.data.storage import size_of

    return sum(size_of(f) for ds in load_manifest(manifest).sources for f in ds.files)


def run_curation(manifest: str | Path, out: str | Path, *, taggers: list[str] | None = None, workers: int = 1,
                 address: str | None = None, lsh: LSHParams | None = None,
                 model_options: ModelOptions | None = None, progress: bool = True) -> dict:
    """Tag the manifest's training documents into `out` and write its report; returns the report."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("curate {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=Console(file=sys.stderr), transient=True,
                   disable=not (progress and sys.stderr.isatty()))
    tasks: dict[str, int] = {}

    def on_stage(stage: str, total: int) -> None:
        tasks[stage] = bar.add_task(stage, total=total)

    def on_task(stage: str) -> None:
        bar.advance(tasks[stage])

    with ray_session(workers, address), bar:
        mapper = local_mapper if workers <= 1 and address is None else partial(run_units, workers=workers,
                                                                               address=address)
        curate(manifest, out, taggers=taggers, partitions=partitions_for(workers, input_bytes(manifest)),
               mapper=mapper, lsh=lsh, model_options=model_options, on_stage=on_stage, on_task=on_task)
    return write_report(out)
