"""Running prepare's units of work (one input file each) in this process or as Ray tasks, and showing
per-source progress on stderr."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator

from rungs.data.errors import DataDiskFullError, DataInputError

log = logging.getLogger("rungs.data.prepare")


def run_units(fn: Callable, calls: list[tuple[tuple, dict]], workers: int, address: str | None) -> Iterator:
    """`fn(*args, **kwargs)` for every call, results in call order; in-process for one local worker."""
    if workers <= 1 and address is None:
        for args, kwargs in calls:
            yield fn(*args, **kwargs)
        return
    import ray

    remote = ray.remote(num_cpus=1)(_one_thread)
    pending: list = []
    calls_iter = iter(calls)
    for args, kwargs in calls_iter:
        pending.append(remote.remote(fn, *args, **kwargs))
        if len(pending) >= 2 * max(workers, 1):
            break
    while pending:
        try:
            result = ray.get(pending.pop(0))
        except ray.exceptions.RayTaskError as err:  # the worker's typed error, as if raised here
            cause = getattr(err, "cause", None)
            if isinstance(cause, (DataInputError, DataDiskFullError)):
                raise cause from None
            raise
        for args, kwargs in calls_iter:
            pending.append(remote.remote(fn, *args, **kwargs))
            break
        yield result


def _one_thread(fn: Callable, *args, **kwargs):
    """`fn` in a Ray worker with one Rust thread: the workers are the parallelism (tokenizers would otherwise
    use every core in every worker). Set in the worker, before its first encode builds the thread pool: a
    per-task runtime_env would do the same at ~10 s of worker start-up."""
    os.environ["RAYON_NUM_THREADS"] = "1"
    return fn(*args, **kwargs)


@contextlib.contextmanager
def ray_session(workers: int, address: str | None):
    """Ray for this prepare when it runs in parallel: joined if this process already has it, else started
    (locally with `workers` CPUs, or connected to `address`) and shut down at the end."""
    if workers <= 1 and address is None:
        yield
        return
    import ray

    if ray.is_initialized():
        yield
        return
    if address is None:
        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False, configure_logging=False)
    else:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()


class SourceProgress:
    """Per source on stderr: documents, MB and tokens per second (rich; silent when stderr is no tty)."""

    def __init__(self, names: Iterable[str]) -> None:
        from rich.console import Console
        from rich.progress import Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(TextColumn("{task.description}"), TimeElapsedColumn(), console=Console(file=sys.stderr),
                            transient=True, disable=not sys.stderr.isatty())
        self.t0 = time.perf_counter()
        self.stats = {n: [0, 0, 0] for n in names}
        self.tasks = {n: self.bar.add_task(self._line(n), total=None) for n in self.stats}

    def _line(self, name: str) -> str:
        docs, n_bytes, tokens = self.stats[name]
        rate = tokens / max(time.perf_counter() - self.t0, 1e-9)
        return f"tokenize {name}: {docs:,} docs, {n_bytes / 1e6:,.1f} MB, {rate:,.0f} tokens/s"

    def add(self, name: str, info: dict) -> None:
        s = self.stats[name]
        s[0] += info["docs"]
        s[1] += info["bytes"]
        s[2] += info["tokens"]
        self.bar.update(self.tasks[name], description=self._line(name))
        log.info("prepare: %s", self._line(name))
