"""The memory copies as a table: one row per direction and host memory over the job, then, where the job has
several device lanes with copies, one per lane. Only formatting: every number is read from ``Report.memcpy``
as it is (``gbps``: bytes over the sized copies' time, computed in ``analysis/memcpy.py``).
"""

from __future__ import annotations

from pipebubble.render.cells import Table, num, time
from pipebubble.report import Report
from pipebubble.report.memcpy import MemcpyRow

EVERY = "--format csv --table memcpy, json, markdown or html list every lane"


def memcpy_table(report: Report, limit: int | None = None, unit: str = "ms") -> Table:
    """The job's copies by direction and host memory, then per lane (at most ``limit`` lane rows, with a note of
    how many more) when more than one lane copies."""
    m = report.memcpy
    if m is None:
        return Table("Memory copies", [], [])
    lanes = m.lanes if len({r.lane for r in m.lanes}) > 1 else []
    shown = lanes if limit is None else lanes[:limit]
    hidden = len(lanes) - len(shown)
    rows = [_row("all", r, unit) for r in m.rows] + [_row(r.lane, r, unit) for r in shown]
    notes = (f"{hidden:,} more lane rows not shown: {EVERY}",) if hidden else ()
    return Table(f"Memory copies ({unit}; busy = sum of the copies' durations; GB/s = bytes / busy of the copies "
                 "whose size the trace records)",
                 ["lane", "direction", "host memory", "count", "bytes", f"busy {unit}", "GB/s"], rows,
                 frozenset({3, 4, 5, 6}), notes, drop=("host memory", "count"))


def _row(lane: str | None, r: MemcpyRow, unit: str) -> list:
    return [lane, r.direction, r.host_memory, num(r.count), num(r.bytes), time(r.busy_ns, unit), num(r.gbps)]
