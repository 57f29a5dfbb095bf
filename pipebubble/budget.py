"""The memory budget: how much memory an analysis may use, and what follows from it.

``--memory-budget`` / ``PIPEBUBBLE_MEMORY_BUDGET`` (bytes, or ``800M``, ``1.5G``, ``2GiB``) sets it; by
default it is an eighth of the memory available when the command starts, within [512 MiB, 8 GiB]. From it:

- ``spill_bytes``: a JSON trace with more text than this is spilled to Parquet rather than held in memory
  (held whole, an analysis needs about ``IN_MEMORY_FACTOR`` times its text), and at most ``SPILL_AT_MOST``
  (above it, spilling is also the faster way); ``PIPEBUBBLE_SPILL_BYTES`` overrides it.
- ``rows_per_window``: how many spans a spilled table's windowed passes (lanes, GPU breakdown) hold at
  once (each costs about ``WINDOW_ROW_BYTES`` of working memory).

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
#: Peak memory of an analysis held in memory, over its trace's JSON text (measured: 1.2-2.5).
IN_MEMORY_FACTOR = 2.5
#: Above this much JSON text a spilled trace is analysed faster than one held whole (its decode workers write
#: their blocks' spans themselves, and each analysis reads back only the columns it uses).
SPILL_AT_MOST = 256 << 20
#: Working memory per span of a windowed pass (measured: 400-600 bytes per GPU operation in the breakdown),
#: with room for what the pass holds whole (one launch delay and one duration per operation).
WINDOW_ROW_BYTES = 3000
#: Fewer spans per window cost more in queries than they save in memory.
MIN_WINDOW_ROWS = 1000
_LOW, _HIGH = 512 << 20, 8 << 30


class BudgetError(PipebubbleError, ValueError):
    """A memory budget that is not a size."""


def parse(text: str) -> int:
    """Bytes in a memory budget (``options.parse_size``: 800M, 1.5G, 2GiB or a number of bytes)."""
    try:
        return parse_size(text, "memory budget")
    except StageSpecError as exc:
        raise BudgetError(str(exc)) from None


@contextmanager
def used(budget: int | None) -> Iterator[None]:
    """Within the block, ``budget`` (bytes; None: leave it as it is) is this process's budget and that of the
    workers it starts; the one before is put back after."""
    if budget is None:
        yield
        return
    before = os.environ.get(ENV)
    os.environ[ENV] = str(int(budget))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before


def budget_bytes() -> int:
    """The budget in bytes: ``PIPEBUBBLE_MEMORY_BUDGET`` when set (a bad value is an error), else an eighth of
    the memory available now, within [512 MiB, 8 GiB]."""
    given = os.environ.get(ENV)
    if given:
        return parse(given)
    return min(_HIGH, max(_LOW, _available() // 8))


def spill_bytes() -> int:
    """JSON text above which a trace is spilled to Parquet."""
    given = os.environ.get(SPILL_ENV)
    return int(given) if given else min(SPILL_AT_MOST, int(budget_bytes() / IN_MEMORY_FACTOR))


def rows_per_window() -> int:
    """Spans per window of a spilled table's windowed passes (at least ``MIN_WINDOW_ROWS``)."""
    return max(MIN_WINDOW_ROWS, budget_bytes() // WINDOW_ROW_BYTES)


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
