"""Useful work as tables: the operators with their roofline, and MFU per GPU, stage and step; the headline's
line. Only formatting: every number is read from ``Report.flops`` as it is (``analysis/flops``)."""

from __future__ import annotations

from pipebubble.render.cells import Table, num, pct, time
from pipebubble.report import Report

EVERY = "--format csv --table flops_ops, json, markdown or html list more"


def _rate(value: float | None) -> str | None:
    """FLOP/s or bytes/s with a 1,000-power prefix: 4.57e14 -> '457 T'."""
    if value is None:
        return None
    for prefix, size in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.3g} {prefix}"
    return f"{value:.3g}"


def summary(report: Report) -> str | None:
    """One line: the GPU time in modelled operators and the job's MFU."""
    f = report.flops
    if f is None:
        return None
    kind = report.billed
    line = (f"useful work: {pct(f.modelled_share)} of {kind} time in modelled operators"
            if f.modelled_share is not None else "useful work")
    line += f", {_rate(f.flops)}FLOP of matrix work"
    line += f" at {pct(f.peak_share)} of peak while it ran" if f.peak_share is not None else ""
    if f.mfu is not None:
        line += f"; MFU {pct(f.mfu)} ({'--peak-flops' if f.peak_source == 'flag' else 'peak of the device table'})"
    return line


def op_table(report: Report, top: int | None = None, unit: str = "ms") -> Table:
    """The operators by GPU time with FLOPs, bytes, intensity and their roofline class."""
    f = report.flops
    if f is None:
        return Table("Operators by FLOPs", [], [])
    rows = f.ops if top is None else f.ops[:top]
    hidden = len(f.ops) - len(rows)
    return Table(
        f"Operators by {report.billed} time ({unit}; FLOP/s achieved while they ran; intensity = FLOPs / bytes; "
        "bound against the device's ridge point; peak = the share of the binding roof)",
        ["operator", "input dims", "dtype", "count", "FLOPs", "bytes", f"time {unit}", "FLOP/s", "intensity",
         "bound", "peak", "source"],
        [[o.name, o.input_dims, o.dtype, num(o.count), _rate(o.flops), _rate(o.bytes), time(o.gpu_ns, unit),
          _rate(o.flops_per_s), num(o.intensity), o.bound, pct(o.peak_share), o.source] for o in rows],
        frozenset({3, 4, 5, 6, 7, 8, 10}), (f"{hidden:,} more operators not shown: {EVERY}",) if hidden else (),
        drop=("source", "bytes", "input dims", "intensity"))


def gpu_table(report: Report, limit: int | None = None, unit: str = "ms") -> Table:
    """MFU per GPU, then per stage and per step where the job has them."""
    f = report.flops
    if f is None:
        return Table("MFU", [], [])
    gpus = f.by_gpu if limit is None else f.by_gpu[:limit]
    rows = [[g.lane, g.device, g.dtype, _rate(g.flops), time(g.gpu_ns, unit), time(g.window_ns, unit),
             _rate(g.flops_per_s), _rate(g.peak_flops_per_s), pct(g.mfu)] for g in gpus]
    rows += [[f"stage {s.stage}" + (f" (replica {s.replica})" if s.replica is not None else ""), None, None,
              _rate(s.flops), time(s.gpu_ns, unit), None, _rate(s.flops_per_s), None, pct(s.mfu)]
             for s in f.by_stage]
    rows += [[f"step {s.step}", None, None, _rate(s.flops), None, time(s.window_ns, unit), None, None, pct(s.mfu)]
             for s in f.by_step]
    hidden = len(f.by_gpu) - len(gpus)
    notes = tuple(f.notes) + ((f"{hidden:,} more GPUs not shown: --format csv --table flops",) if hidden else ())
    return Table(f"MFU ({unit}; model FLOPs of matrix work over window × the device's dense peak)",
                 ["where", "device", "dtype", "FLOPs", f"in ops {unit}", f"window {unit}", "FLOP/s", "peak FLOP/s",
                  "MFU"], rows, frozenset({3, 4, 5, 6, 7, 8}), notes, drop=("device", "peak FLOP/s", "dtype"))


def unmodelled_table(report: Report, top: int | None = None, unit: str = "ms") -> Table:
    f = report.flops
    if f is None or not f.unmodelled:
        return Table("Unmodelled", [], [])
    rows = f.unmodelled if top is None else f.unmodelled[:top]
    return Table(f"GPU time with no FLOPs model, by the operator that launched it ({unit}; "
                 f"{pct(f.unmodelled_share)} in all)", ["operator", f"time {unit}", "share"],
                 [[u.name, time(u.gpu_ns, unit), pct(u.share)] for u in rows], frozenset({1, 2}))
