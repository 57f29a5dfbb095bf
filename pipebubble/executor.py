"""Where per-file work runs: in this process, in a local process pool, or on a Ray cluster.

``each(jobs, fn, scale)`` calls ``fn(path, position, **kwargs)`` for every (path, position) job and returns
the results in job order, whatever ran them. Nothing here knows what the work is: ingest uses it to read
files, the map/reduce to map them. ``pool`` also decodes the blocks of one big file in parallel.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from functools import partial
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from pipebubble.errors import PipebubbleError
from pipebubble.options import EXECUTORS, Scale

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
    """A lone file in this process, its blocks decoded on all cores (``fn`` is called with ``workers=``).
    Several files: this process maps them too, from the smallest, while a pool of the other cores' workers
    takes them from the biggest (scheduled by bytes), so the workers' start-up never delays the first
    results and a small folder costs no more than one process would."""
    cores = workers or os.cpu_count() or 1
    if len(jobs) == 1 or cores <= 1:
        out = []
        for path, i in jobs:
            out.append(fn(path, i, workers=cores))  # a lone file's cores, or the one core there is
            if on_done:
                on_done(path)
        return out
    return _shared(jobs, fn, min(cores - 1, len(jobs) - 1), on_done)


def _shared(jobs: list[Job], fn: Callable, workers: int, on_done: OnDone) -> list:
    """Jobs split between this process and ``workers`` pool processes, results in job order."""
    order = sorted(range(len(jobs)), key=lambda k: _size(Path(jobs[k][0])), reverse=True)
    pending = deque(order)  # biggest first for the pool, smallest (from the right) for this process
    results: dict[int, Any] = {}
    inflight: dict[Future, int] = {}

    def finish(k: int, value: Any) -> None:
        results[k] = value
        if on_done:
            on_done(jobs[k][0])

    with pool(workers) as workers_pool:
        try:
            while pending or inflight:
                while pending and len(inflight) < 2 * workers:  # two each, so none waits for its next job
                    k = pending.popleft()
                    inflight[workers_pool.submit(fn, jobs[k][0], jobs[k][1], workers=1)] = k
                for future in [f for f in inflight if f.done()]:
                    finish(inflight.pop(future), future.result())
                if pending:
                    k = pending.pop()
                    finish(k, fn(jobs[k][0], jobs[k][1], workers=1))
                elif inflight:
                    done, _ = wait(inflight, return_when=FIRST_COMPLETED)
                    for future in done:
                        finish(inflight.pop(future), future.result())
        except BaseException:
            for future in inflight:
                future.cancel()
            raise
    return [results[k] for k in range(len(jobs))]


@contextmanager
def pool(workers: int) -> Iterator[ProcessPoolExecutor]:
    """A pool of freshly spawned processes (never forked: polars' threads do not survive a fork). When it
    closes, its workers are joined and multiprocessing's resource tracker is stopped too, so no process of
    ours outlives the command."""
    from pipebubble import _worker

    executor = ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_worker.init)
    try:
        yield executor
    finally:
        executor.shutdown(wait=True, cancel_futures=True)
        _stop_resource_tracker()


def _stop_resource_tracker() -> None:
    try:
        from multiprocessing import resource_tracker

        resource_tracker._resource_tracker._stop()  # noqa: SLF001 - no public way to stop it
    except Exception:  # noqa: BLE001 - a tracker that is not running, or another Python's: nothing to stop
        pass


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
