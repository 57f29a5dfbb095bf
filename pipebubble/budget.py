"""The memory budget: how much memory an analysis may use, and what follows from it.

``--memory-budget`` / ``PIPEBUBBLE_MEMORY_BUDGET`` (bytes, or ``800M``, ``1.5G``, ``2GiB``) sets it; by
default it is an eighth of the memory available when the command starts, within [512 MiB, 8 GiB]. It bounds
the anonymous memory of the whole process tree (the command, a pool's fork server and workers), whatever the
trace's size: every size below is derived from it, each from what its part of the work was measured to hold
(Pss_Anon, ``bench/scale.py``). A budget below ``LEAST_BYTES`` is refused (``BudgetError``, exit 2); so is an
analysis that must hold more than its budget allows (``whole_read``), saying the least it needs.

- Processes: each one that maps files holds ``PROCESS_BYTES`` whatever it does, and a pool's fork server and
  resource tracker ``POOL_BYTES``. Several files are mapped by at most ``mappers`` processes at once, each
  with an equal share of the budget (``share_bytes``); a lone file has it all.
- ``spill_bytes``: a JSON trace with more text than this is spilled to Parquet rather than held in memory
  (held whole, an analysis needs about ``IN_MEMORY_FACTOR`` times its text), and at most ``SPILL_AT_MOST``
  (above it, spilling is also the faster way); ``PIPEBUBBLE_SPILL_BYTES`` overrides it.
- ``block_bytes`` and ``decoders``: a big trace's JSON is decoded in blocks of at most ``trace.BLOCK_BYTES``
  (each decodes in about ``BLOCK_FACTOR`` times its text) on as many processes as the budget holds
  (``DECODER_BYTES`` each besides its block), at most one per core.
- ``rows_per_window``: how many spans a spilled table's windowed passes (lanes, GPU breakdown) hold at
  once (each costs about ``WINDOW_ROW_BYTES`` of working memory), at most ``MAX_WINDOW_ROWS`` (more are no
  faster); ``PIPEBUBBLE_WINDOW_ROWS`` overrides it.

The budget is read from the environment, so a pool's workers, started from this process, follow it too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from pipebubble.errors import PipebubbleError, StageSpecError
from pipebubble.options import parse_size

ENV = "PIPEBUBBLE_MEMORY_BUDGET"
SPILL_ENV = "PIPEBUBBLE_SPILL_BYTES"
WINDOW_ENV = "PIPEBUBBLE_WINDOW_ROWS"
#: How many processes map files at once (set for a pool's workers by ``shared``): each has its share.
MAPPERS_ENV = "PIPEBUBBLE_MAPPERS"
_MIB = 1 << 20
#: What one process that maps a file holds whatever the trace: its interpreter, polars and the analysis
#: loaded, the query engine's threads and what the allocators keep between queries (measured 100-140 MB).
PROCESS_BYTES = 160 * _MIB
#: A pool's fork server and multiprocessing's resource tracker (measured 30 MB).
POOL_BYTES = 32 * _MIB
#: The least working memory a process can map a file in (a small block, a small window, a small trace held).
MIN_WORK_BYTES = 64 * _MIB
#: The least budget an analysis runs in: one process, its pool's helpers and the least working memory.
LEAST_BYTES = PROCESS_BYTES + POOL_BYTES + MIN_WORK_BYTES
#: Peak memory of an analysis held in memory, over its trace's JSON text (measured: 1.2-2.5).
IN_MEMORY_FACTOR = 2.5
#: Above this much JSON text a spilled trace is analysed faster than one held whole (its decode workers write
#: their blocks' spans themselves, and each analysis reads back only the columns it uses).
SPILL_AT_MOST = 256 << 20
#: Working memory of a block being decoded, over its JSON text (measured: 3.4 at 16 MB, 2.8 at 32 MB).
BLOCK_FACTOR = 4
#: A decode worker's own memory besides its block (the pages it does not share with its fork server).
DECODER_BYTES = 40 * _MIB
#: The smallest decode block (smaller ones cost more in queries than they save in memory).
MIN_BLOCK_BYTES = 2 * _MIB
#: Working memory per span of a window (both windowed passes together; measured on the 2.4 GB trace of
#: ``bench/scale.py``: 600 bytes, the host spans read beside each GPU operation and what the allocator keeps
#: of the window before included), with room for traces whose host records more spans per GPU operation.
WINDOW_ROW_BYTES = 3000
#: Fewer spans per window cost more in queries than they save in memory; more than the most gain little
#: (the 2.4 GB trace on 2 cores: 31 s and 300 MB in all with 262k spans a window, 28.6 s and 460 MB with
#: 524k, 25.3 s and 765 MB with 1M).
MIN_WINDOW_ROWS, MAX_WINDOW_ROWS = 1000, 1 << 20
#: Memory per span of a table read whole from its spill (the span table, and what an analysis builds of it).
WHOLE_ROW_BYTES = 800
_LOW, _HIGH = 512 << 20, 8 << 30


class BudgetError(PipebubbleError, ValueError):
    """A memory budget that is not a size, or in which the analysis cannot be done."""


def parse(text: str) -> int:
    """Bytes in a memory budget (``options.parse_size``: 800M, 1.5G, 2GiB or a number of bytes), at least
    ``LEAST_BYTES``."""
    try:
        size = parse_size(text, "memory budget")
    except StageSpecError as exc:
        raise BudgetError(str(exc)) from None
    return check(size, text)


def check(budget: int, text: str | None = None) -> int:
    """``budget``, when an analysis can be done in it; else a BudgetError saying the least it needs."""
    if budget < LEAST_BYTES:
        given = text if text is not None else str(budget)
        raise BudgetError(f"memory budget {given} is below the least an analysis needs, {size_text(LEAST_BYTES)} "
                          f"(--memory-budget {size_text(LEAST_BYTES)} or more)")
    return budget


def size_text(size: int) -> str:
    """``size`` bytes as a budget is written, rounded up (``269M``, ``1.6G``): what ``parse`` reads back as at
    least ``size``."""
    if size >= 10**9:
        return f"{-(-size // 10**8) / 10:g}G"
    return f"{-(-size // 10**6)}M"


@contextmanager
def used(budget: int | None) -> Iterator[None]:
    """Within the block, ``budget`` (bytes; None: leave it as it is) is this process's budget and that of the
    workers it starts; the one before is put back after. A budget no analysis can be done in is refused (one
    given in the environment too)."""
    if budget is None:
        budget_bytes()
        yield
        return
    check(int(budget))
    with _env(ENV, str(int(budget))):
        yield


@contextmanager
def shared(mappers: int) -> Iterator[None]:
    """Within the block, ``mappers`` processes map files at once, each within its share of the budget."""
    with _env(MAPPERS_ENV, str(max(1, int(mappers)))):
        yield


@contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def budget_bytes() -> int:
    """The budget in bytes: ``PIPEBUBBLE_MEMORY_BUDGET`` when set (a bad value is an error), else an eighth of
    the memory available now, within [512 MiB, 8 GiB]."""
    given = os.environ.get(ENV)
    if given:
        return parse(given)
    return min(_HIGH, max(_LOW, _available() // 8))


def mappers(cores: int, budget: int | None = None) -> int:
    """How many processes (at most ``cores``) may map files at once within ``budget`` (default: this one's):
    each holds ``PROCESS_BYTES`` and at least ``MIN_WORK_BYTES`` more, beside the pool's helpers."""
    budget = budget_bytes() if budget is None else budget
    return max(1, min(cores, (budget - POOL_BYTES) // (PROCESS_BYTES + MIN_WORK_BYTES)))


def share_bytes() -> int:
    """The part of the budget this process may use: all of it but the pool's helpers, split between the
    processes that map files at once (``shared``)."""
    processes = max(1, int(os.environ.get(MAPPERS_ENV) or 1))
    return (budget_bytes() - POOL_BYTES) // processes


def work_bytes() -> int:
    """What this process may hold beyond ``PROCESS_BYTES``: its working memory."""
    return max(MIN_WORK_BYTES, share_bytes() - PROCESS_BYTES)


def spill_bytes() -> int:
    """JSON text above which a trace is spilled to Parquet."""
    given = os.environ.get(SPILL_ENV)
    return int(given) if given else min(SPILL_AT_MOST, int(work_bytes() / IN_MEMORY_FACTOR))


def block_bytes(largest: int) -> int:
    """JSON text per decode block: ``largest``, or less where the working memory holds fewer than four
    blocks being decoded (this process's and three workers'), never under ``MIN_BLOCK_BYTES``."""
    return max(min(largest, MIN_BLOCK_BYTES), min(largest, work_bytes() // (4 * BLOCK_FACTOR)))


def decoders(cores: int, block: int) -> int:
    """How many processes (at most ``cores``: this one and the pool's workers) may decode blocks of ``block``
    bytes of text at once: this process's block, and each worker's own memory and block, in the working memory."""
    each = BLOCK_FACTOR * block
    return max(1, min(cores, 1 + (work_bytes() - each) // (DECODER_BYTES + each)))


def rows_per_window() -> int:
    """Spans per window of a spilled table's windowed passes (within [``MIN_WINDOW_ROWS``, ``MAX_WINDOW_ROWS``])."""
    given = os.environ.get(WINDOW_ENV)
    if given:
        return max(1, int(given))
    return max(MIN_WINDOW_ROWS, min(MAX_WINDOW_ROWS, work_bytes() // WINDOW_ROW_BYTES))


def whole_read(rows: int, what: str) -> None:
    """Refuse (``BudgetError``) to read ``rows`` spans whole where the budget cannot hold them, saying the
    least budget that can; ``what`` says what reads them."""
    need = rows * WHOLE_ROW_BYTES
    if need <= work_bytes():
        return
    processes = max(1, int(os.environ.get(MAPPERS_ENV) or 1))
    least = (PROCESS_BYTES + need) * processes + POOL_BYTES
    raise BudgetError(f"{what} reads its {rows:,} spans whole, which needs a memory budget of at least "
                      f"{size_text(least)} (--memory-budget {size_text(least)}; it is {size_text(budget_bytes())})")


def _available() -> int:
    """Memory available to new work (MemAvailable; where there is no /proc/meminfo, the physical memory)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 4 << 30
