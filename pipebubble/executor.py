"""Where per-file work runs: in this process, in a local process pool, or on a Ray cluster.

``each(jobs, fn, scale)`` calls ``fn(path, position, **kwargs)`` for every (path, position) job and returns
the results in job order, whatever ran them. Given ``batch`` (``batch(jobs, **kwargs)``: the results of
several jobs at once), the local executor hands small files over a few at a time, so work whose cost is
mostly fixed per call is paid once per batch. Given ``wire`` (``pack``, ``unpack``), the results of a unit
of work made in another process (a pool worker, a Ray task) cross as ``pack(results)`` and are unpacked
here; those made in this process are taken as they are. Nothing here knows what the work is: ingest uses
it to read files, the map/reduce to map them. ``pool`` also decodes the blocks of one big file in parallel.

Where the work ran other than ``Scale`` asked (one file on Ray runs here; a report from the cache maps
nothing) is recorded by ``ran_here`` and handed to the command line by ``notes``, which says it on stderr; a
Ray cluster that cannot be reached is a ``PipebubbleError`` naming its address.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from functools import partial
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from pipebubble.errors import PipebubbleError
from pipebubble.options import EXECUTORS, Scale

Job = tuple[str, int]
OnDone = Callable[[str], None] | None
Batch = Callable[[list[Job]], list] | None
#: How a unit's results (a list) cross between processes: ``pack`` there, ``unpack`` here (None: as
#: Python pickles them).
Wire = tuple[Callable, Callable] | None

#: Files smaller than this are handed over in batches (when the work can take several at once) ...
BATCH_FILE_BYTES = 4 << 20
#: ... of at most this many files and bytes (a gzipped trace holds ten times its size), and few enough
#: files each that every core still gets ``BATCHES_PER_CORE`` batches. A batch's analysis has a fixed cost
#: (its queries: about 0.1 CPU-s, the work of some 20 small rank files), so fewer, bigger batches cost less;
#: two per core still even out what the cores get.
MAX_BATCH, MAX_BATCH_BYTES, BATCHES_PER_CORE = 64, 16 << 20, 2
#: Seconds a Ray cluster's address may take to accept a connection before it is said to be unreachable (Ray
#: itself retries for minutes).
RAY_CONNECT_S = 5.0
_ran_here: list[str] = []  # where work ran other than asked, since the command line last read it (``notes``)


def each(
    jobs: list[Job],
    fn: Callable,
    scale: Scale,
    on_done: OnDone = None,
    batch: Callable | None = None,
    then: Callable | None = None,
    wire: Wire = None,
    **kwargs: Any,
) -> list:
    """``fn(path, position, **kwargs)`` for every job on ``scale``'s executor, results in job order; small
    files go to ``batch(jobs, **kwargs)`` a few at a time where it is given (the local executor). Each
    result is passed through ``then`` in this process as it arrives (while the rest are still running);
    ``wire``'s ``pack`` and ``unpack`` carry those made in other processes. One file on Ray is mapped in this
    process instead (a cluster would only add its start-up), and ``ran_here`` records so."""
    if scale.executor == "ray" and len(jobs) != 1:
        out = on_ray(jobs, fn, scale, on_done, pack=wire and wire[0], **kwargs)
        out = [value for blob in out for value in wire[1](blob)] if wire else out
        return [then(value) for value in out] if then else out
    if scale.executor == "ray":
        ran_here(scale, "one file is mapped in this process (Ray maps two or more)")
    elif scale.executor != "local":
        raise PipebubbleError(f"--executor must be one of {', '.join(EXECUTORS)}, not {scale.executor!r}")
    return local(jobs, partial(fn, **kwargs), scale.workers, on_done, batch and partial(batch, **kwargs), then, wire)


def ran_here(scale: Scale, why: str) -> None:
    """Record that ``scale`` asked for another executor than this process's own (``local``), but ``why`` it
    was not used; said once, however often it is recorded."""
    line = f"--executor {scale.executor} was not used: {why}"
    if scale.executor != "local" and line not in _ran_here:
        _ran_here.append(line)


def notes() -> list[str]:
    """What ``ran_here`` recorded since the last call: the command line says each on stderr."""
    out = list(_ran_here)
    _ran_here.clear()
    return out


def one_thread_each(files: int, scale: Scale) -> None:
    """Several files on the local executor run in parallel across processes, and this process maps some of
    them too: like its workers it then runs polars on one thread, so there are no more threads than cores.
    It takes effect only before polars is loaded (as on the command line); a POLARS_MAX_THREADS set by the
    user stands."""
    if files > 1 and scale.executor == "local" and "polars" not in sys.modules:
        os.environ.setdefault("POLARS_MAX_THREADS", "1")


def local(
    jobs: list[Job],
    fn: Callable,
    workers: int | None,
    on_done: OnDone = None,
    batch: Batch = None,
    then: Callable | None = None,
    wire: Wire = None,
) -> list:
    """A lone file in this process, its blocks decoded on all cores (``fn`` is called with ``workers=``).
    Several files: in units (a file, or a ``batch`` of small ones) shared between this process and a pool
    of the other cores' workers (``_shared``), or one after another here when there is one core."""
    cores = workers or os.cpu_count() or 1
    results = _Results(jobs, then, on_done)
    if len(jobs) == 1:
        path, i = jobs[0]
        results.add([0], [fn(path, i, workers=cores)])  # a lone file's cores
    elif cores <= 1:
        for unit in _units(jobs, cores, batch is not None):
            results.add(unit, _run(fn, batch, [jobs[k] for k in unit]))
    else:
        units = _units(jobs, cores, batch is not None)
        _shared(jobs, units, fn, batch, min(cores - 1, len(units) - 1), results, wire)
    return results.ordered()


class _Results:
    """Results by job, each passed through ``then`` and reported done (``on_done``) as it arrives."""

    def __init__(self, jobs: list[Job], then: Callable | None, on_done: OnDone) -> None:
        self.jobs, self.then, self.on_done = jobs, then, on_done
        self.values: dict[int, Any] = {}

    def add(self, unit: list[int], values: list) -> None:
        for k, value in zip(unit, values, strict=True):
            self.values[k] = self.then(value) if self.then else value
            if self.on_done:
                self.on_done(self.jobs[k][0])

    def ordered(self) -> list:
        return [self.values[k] for k in range(len(self.jobs))]


def _units(jobs: list[Job], cores: int, batched: bool) -> list[list[int]]:
    """Job indices in units of work, biggest first (scheduled by bytes): a file alone, or (``batched``) a
    batch of small files of about the same size."""
    sizes = [_size(Path(path)) for path, _ in jobs]
    order = sorted(range(len(jobs)), key=lambda k: sizes[k], reverse=True)
    small = [k for k in order if batched and sizes[k] < BATCH_FILE_BYTES]
    alone = [[k] for k in order[: len(order) - len(small)]]  # the small ones are the last in size order
    per = max(1, min(MAX_BATCH, len(small) // (BATCHES_PER_CORE * cores)))
    batches: list[list[int]] = []
    held = 0
    for k in small:
        if not batches or len(batches[-1]) == per or held + sizes[k] > MAX_BATCH_BYTES:
            batches.append([])
            held = 0
        batches[-1].append(k)
        held += sizes[k]
    return alone + batches


def _run(fn: Callable, batch: Batch, unit: list[Job], pack: Callable | None = None) -> list:
    """One unit's results: a batch's from ``batch``, a lone file's from ``fn`` (on one core); packed
    together where ``pack`` is given (a unit run in a worker, its results to cross to this process)."""
    if len(unit) > 1 and batch is not None:
        out = batch(unit)
    else:
        out = [fn(path, i, workers=1) for path, i in unit]
    return pack(out) if pack else out


def _shared(
    jobs: list[Job], units: list[list[int]], fn: Callable, batch: Batch, workers: int, results: _Results,
    wire: Wire = None,
) -> None:
    """Units split between this process and ``workers`` pool processes: the pool takes them from the
    biggest, this process from the smallest, so the workers' start-up never delays the first results and a
    small folder costs no more than one process would. A worker is handed its next unit the moment it
    finishes one (from the pool's own thread), never several ahead: a unit queued for a worker still
    starting is one this process could have run. The pool's results cross on ``wire``."""
    pack, unpack = wire or (None, None)
    pending = deque(range(len(units)))  # biggest first for the pool, smallest (from the right) for this process
    lock = threading.RLock()  # a unit that is done as it is handed over calls back at once
    inflight: dict[Future, int] = {}
    arrived: deque[Future] = deque()
    ready = threading.Semaphore(0)

    def take(u: int) -> list[Job]:
        return [jobs[k] for k in units[u]]

    def hand(workers_pool: ProcessPoolExecutor) -> None:
        """The next unit to a worker, if any is left (under ``lock``)."""
        if pending:
            u = pending.popleft()
            future = workers_pool.submit(_run, fn, batch, take(u), pack)
            inflight[future] = u
            future.add_done_callback(lambda f: done(f, workers_pool))

    def done(future: Future, workers_pool: ProcessPoolExecutor) -> None:
        with lock:
            arrived.append(future)
            if not future.cancelled() and future.exception() is None:
                hand(workers_pool)
        ready.release()

    def collect(future: Future) -> None:
        values = future.result()
        with lock:
            u = inflight.pop(future)
        results.add(units[u], unpack(values) if unpack else values)

    with pool(workers) as workers_pool:
        try:
            with lock:
                for _ in range(workers):
                    hand(workers_pool)
            while True:
                while arrived:
                    collect(arrived.popleft())
                with lock:
                    u = pending.pop() if pending else None
                    if u is None and not inflight:
                        break
                if u is not None:
                    results.add(units[u], _run(fn, batch, take(u)))
                else:
                    ready.acquire()
        except BaseException:
            with lock:
                pending.clear()
                for future in inflight:
                    future.cancel()
            raise


@contextmanager
def pool(workers: int) -> Iterator[ProcessPoolExecutor]:
    """A pool of ``workers`` processes, forked from a fork server (``warm``) where the platform has one,
    else freshly spawned; never forked from this process, whose polars threads would not survive it. Each
    worker starts in this process's working folder and environment. When the pool closes, its workers
    are joined, and the fork server (unless someone else started it) and multiprocessing's resource
    tracker are stopped too, so no process of ours outlives the command."""
    from pipebubble import _worker

    method = _start_method()
    if method == "forkserver":
        warm()
    executor = ProcessPoolExecutor(workers, mp_context=get_context(method), initializer=_worker.init,
                                   initargs=(_cwd(), dict(os.environ)))
    try:
        yield executor
    finally:
        executor.shutdown(wait=True, cancel_futures=True)
        _stop_server()
        _stop_resource_tracker()


#: Modules the fork server loads before it forks any worker: polars and the map (pipebubble.run._forkserver).
PRELOAD = ["pipebubble.run._forkserver"]
_ours: list[bool] = [False]  # whether the fork server running is the one ``warm`` started


def warm() -> None:
    """Start the fork server a pool's workers come from, where the platform has one and there are cores
    for workers. Called ahead of the pool (as a command that reads traces does, first thing, when its
    paths look like work for one), it loads polars and the map while this process loads its own, and
    the workers, forked from it later, start at once instead of a third of a second after the pool
    opens. A server someone else started is used as it is."""
    from multiprocessing import forkserver

    if _start_method() != "forkserver" or (os.cpu_count() or 1) < 2:
        return
    server = forkserver._forkserver  # noqa: SLF001 - whether it runs has no public question
    if server._forkserver_pid is None:  # noqa: SLF001
        server.set_forkserver_preload(PRELOAD)
        server.ensure_running()
        _ours[0] = True


def _stop_server() -> None:
    """The fork server ``warm`` started, stopped (it leaves without the interpreter's teardown)."""
    if not _ours[0]:
        return
    _ours[0] = False
    try:
        from multiprocessing import forkserver

        forkserver._forkserver._stop()  # noqa: SLF001 - no public way to stop it
    except Exception:  # noqa: BLE001 - a server that is gone already: nothing to stop
        pass


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:  # removed under the command: the workers stay where they start
        return None


def _start_method() -> str:
    from multiprocessing import get_all_start_methods

    return "forkserver" if "forkserver" in get_all_start_methods() else "spawn"


def _stop_resource_tracker() -> None:
    try:
        from multiprocessing import resource_tracker

        resource_tracker._resource_tracker._stop()  # noqa: SLF001 - no public way to stop it
    except Exception:  # noqa: BLE001 - a tracker that is not running, or another Python's: nothing to stop
        pass


def on_ray(jobs: list[Job], fn: Callable, scale: Scale, on_done: OnDone = None, pack: Callable | None = None,
           **kwargs: Any) -> list:
    """One Ray task per file (a cluster's workers read the traces where they lie), each result packed
    there (a unit of one) where ``pack`` is given."""
    try:
        import ray
    except ImportError:
        raise PipebubbleError("--executor ray needs Ray: pip install 'pipebubble[ray]'") from None
    if not ray.is_initialized():
        _connect(ray, scale)
    task = ray.remote(_packed)
    if scale.memory_budget is not None:  # a cluster's workers are not started from this process: tell them
        from pipebubble import budget

        task = task.options(runtime_env={"env_vars": {budget.ENV: str(scale.memory_budget)}})
    out = ray.get([task.remote(fn, pack, path, i, **kwargs) for path, i in jobs])
    if on_done:
        for path, _ in jobs:
            on_done(path)
    return out


def _connect(ray: Any, scale: Scale) -> None:
    """``ray.init`` on ``scale``'s cluster (none given: a local one started for this command). An address that
    does not answer, or ``auto`` with no cluster running, is a one-line error naming it, not Ray's minutes of
    retries or its own words (which name its ``--address`` flag)."""
    address = scale.ray_address
    if address not in (None, "auto", "local"):
        _answers(address)
    try:
        ray.init(
            address=address,
            num_cpus=None if address else scale.workers,
            include_dashboard=False,
            ignore_reinit_error=True,
            log_to_driver=False,
            configure_logging=False,
        )
    except ConnectionError as exc:
        if address == "auto":
            raise PipebubbleError("--ray-address auto: no Ray cluster is running on this machine (start one with "
                                  "`ray start --head`, or leave out --ray-address to start one for this command)"
                                  ) from None
        where = f"--ray-address {address}" if address else "--executor ray: starting a local Ray cluster"
        raise PipebubbleError(f"{where}: Ray could not connect: {str(exc).partition('. ')[0]}") from None


def _answers(address: str) -> None:
    """Refuse, in one line, a cluster address (``HOST:PORT`` or ``ray://HOST:PORT``) that accepts no
    connection within ``RAY_CONNECT_S``."""
    host, sep, port = address.split("://", 1)[-1].rpartition(":")
    if not sep or not host or not port.isdigit():
        raise PipebubbleError(f"--ray-address {address}: expected auto, HOST:PORT or ray://HOST:PORT")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=RAY_CONNECT_S).close()
    except OSError as exc:
        why = exc.strerror or str(exc) or type(exc).__name__
        raise PipebubbleError(f"--ray-address {address}: no Ray cluster answers there ({why})") from None


def _packed(fn: Callable, pack: Callable | None, path: str, position: int, **kwargs: Any) -> Any:
    """A Ray task: ``fn``'s result for one job (packed as a unit of one, where ``pack`` is given)."""
    value = fn(path, position, **kwargs)
    return pack([value]) if pack else value


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir()) if path.is_dir() else path.stat().st_size
