"""Where per-file work runs: in this process, in a local process pool, or on a Ray cluster.

``each(jobs, fn, scale)`` calls ``fn(path, position, **kwargs)`` for every (path, position) job and returns
the results in job order, whatever ran them. Nothing here knows what the work is: ingest uses it to read
files, the map/reduce to map them. ``pool`` also decodes the blocks of one big file in parallel.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from pipebubble.errors import PipebubbleError
from pipebubble.options import EXECUTORS, Scale

#: Below this many bytes in all, starting worker processes costs more than it saves.
PARALLEL_BYTES = 16 << 20

Job = tuple[str, int]
OnDone = Callable[[str], None] | None


def each(jobs: list[Job], fn: Callable, scale: Scale, on_done: OnDone = None, **kwargs: Any) -> list:
    """``fn(path, position, **kwargs)`` for every job on ``scale``'s executor, results in job order."""
    if scale.executor == "ray":
        return on_ray(jobs, fn, scale, on_done, **kwargs)
    if scale.executor == "local":
        return local(jobs, partial(fn, **kwargs), scale.workers, on_done)
    raise PipebubbleError(f"--executor must be one of {', '.join(EXECUTORS)}, not {scale.executor!r}")


def local(jobs: list[Job], fn: Callable, workers: int | None, on_done: OnDone = None) -> list:
    """In this process one file at a time (a lone big file gets all cores for its blocks: ``fn`` is called
    with ``workers=``), or one file per process in a pool when there are several files and enough bytes
    to be worth the processes' start-up."""
    cores = workers or os.cpu_count() or 1
    if len(jobs) == 1 or cores <= 1 or sum(_size(Path(p)) for p, _ in jobs) < PARALLEL_BYTES:
        out = []
        for path, i in jobs:
            out.append(fn(path, i, workers=cores if len(jobs) == 1 else 1))
            if on_done:
                on_done(path)
        return out
    with pool(min(cores, len(jobs))) as workers_pool:
        futures = [workers_pool.submit(fn, path, i) for path, i in jobs]
        out = []
        for (path, _), future in zip(jobs, futures, strict=True):
            out.append(future.result())
            if on_done:
                on_done(path)
        return out


def pool(workers: int) -> ProcessPoolExecutor:
    """A pool of freshly spawned processes (never forked: polars' threads do not survive a fork)."""
    from pipebubble import _worker

    return ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_worker.init)


def on_ray(jobs: list[Job], fn: Callable, scale: Scale, on_done: OnDone = None, **kwargs: Any) -> list:
    """One Ray task per file (a cluster's workers read the traces where they lie)."""
    try:
        import ray
    except ImportError:
        raise PipebubbleError("--executor ray needs Ray: pip install 'pipebubble[ray]'") from None
    if not ray.is_initialized():
        ray.init(
            address=scale.ray_address,
            num_cpus=None if scale.ray_address else scale.workers,
            include_dashboard=False,
            ignore_reinit_error=True,
            log_to_driver=False,
            configure_logging=False,
        )
    task = ray.remote(fn)
    out = ray.get([task.remote(path, i, **kwargs) for path, i in jobs])
    if on_done:
        for path, _ in jobs:
            on_done(path)
    return out


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir()) if path.is_dir() else path.stat().st_size
