"""The GPU annotations, launch queues and launch delays as tables (``report.launches``). Only formatting: every
number is read from the Report as it is."""

from __future__ import annotations

from pipebubble.render.cells import Table, num, pct, share, time
from pipebubble.render.choices import TOP
from pipebubble.report import Report
from pipebubble.report.launches import FULL_QUEUE

EVERY = "--format csv --table {} or json list them"


def _capped(rows: list, limit: int | None, what: str, table: str) -> tuple[list, tuple[str, ...]]:
    """``rows`` cut to ``limit`` and the note saying how many more ``what`` there are."""
    shown = rows if limit is None else rows[:limit]
    hidden = len(rows) - len(shown)
    return shown, ((f"{hidden:,} more {what} not shown: {EVERY.format(table)}",) if hidden else ())


def annotation_table(report: Report, top: int = TOP, unit: str = "ms") -> Table:
    """One row per GPU annotation name, the most GPU time first: its ranges, their union, the operations
    within and the one with most time there."""
    shown, notes = _capped(report.gpu_annotations, top, "annotations", "gpu_annotations")
    rows = [[a.name, num(a.count), time(a.gpu_ns, unit), time(a.sum_ns, unit), num(a.kernel_count),
             time(a.kernel_ns, unit), a.kernels[0].name if a.kernels else None] for a in shown]
    columns = ["annotation", "ranges", f"GPU {unit}", f"sum {unit}", "kernels", f"kernels {unit}", "top kernel"]
    return Table("GPU annotations (GPU = union of its ranges per stream; kernels = GPU operations within them on "
                 "its stream)", columns, rows, frozenset(range(1, 6)), notes,
                 drop=(f"sum {unit}", "top kernel", f"kernels {unit}"))


def queue_table(report: Report, limit: int | None = None, unit: str = "ms") -> Table:
    """One row per GPU stream: its launch queue's length over the stream's window."""
    shown, notes = _capped(report.launch_queue, limit, "streams", "launch_queue")
    rows = [[q.lane, num(q.stream), num(q.launches), num(q.max), num(q.mean), num(q.p50), num(q.p95),
             time(q.at_max_ns, unit), share(q.empty_ns, q.window_ns), time(q.full_ns, unit)] for q in shown]
    columns = ["lane", "stream", "launches", "max", "mean", "p50", "p95", f"at max {unit}", "empty",
               f"full {unit}"]
    return Table(f"Launch queue per stream (launched, not yet ended; over the stream's window, time-weighted; full ="
                 f" {FULL_QUEUE:,} or more)", columns, rows, frozenset(range(1, 10)), notes,
                 drop=(f"full {unit}", "p50", f"at max {unit}"))


def delay_table(report: Report, top: int = TOP, unit: str = "ms") -> Table:
    """One row per launching operator, the most total launch delay first."""
    shown, notes = _capped(report.launch_delays, top, "operators", "launch_delays")
    rows = [[d.operator, num(d.count), time(d.total_ns, unit), time(d.mean_ns, unit), time(d.median_ns, unit),
             time(d.max_ns, unit), time(d.kernel_mean_ns, unit), pct(d.over_share)] for d in shown]
    columns = ["operator", "launches", f"total {unit}", f"mean {unit}", f"median {unit}", f"max {unit}",
               f"kernel mean {unit}", "delay > kernel"]
    return Table("Launch delays per operator (launch call start to GPU start; operator = innermost open at the call)",
                 columns, rows, frozenset(range(1, 8)), notes, drop=(f"max {unit}", f"median {unit}"))
