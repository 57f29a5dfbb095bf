"""The report's opening: its findings, biggest worth first, as a summary line and one item per finding (every
document renderer shows them before anything else). Only formatting: every number is the report's."""

from __future__ import annotations

from pipebubble.render.cells import num, pct, time
from pipebubble.report import Report
from pipebubble.report.findings import THRESHOLD, Finding
from pipebubble.report.words import cause_words, kind_words, priced_words


def summary(report: Report) -> str:
    """``findings: 3, giving back up to ... a step``, or that nothing is worth more than the threshold."""
    found = report.findings
    per = "the window" if found and all(f.evidence.get("per") == "window" for f in found) else "a step"
    if not found:
        return f"Findings: nothing worth more than {THRESHOLD * 100:g} % of a step"
    # a profile mostly of start-up opens the list whatever its worth (analysis/findings: ``leads``)
    order = "start-up first, then biggest" if found[0].evidence.get("leads") else "biggest first"
    priced = priced_words(report.billed) if any(_priced(f) for f in found) else ""
    return (f"Findings ({len(found)}, what a fix would give back {'over' if per == 'the window' else 'per'}"
            f" {per.removeprefix('a ')}, {order}; the gains do not add up: fixing one changes the others"
            + (f"; dollars: {priced}" if priced else "") + ")")


def items(report: Report, unit: str = "ms") -> list[tuple[str, str]]:
    """Per finding: its headline (worth per step, share, GPU (or CPU) time and dollars an hour with --gpu-cost, both
    only where it frees any; what it is) and its detail (where, what to try, how the worth was computed)."""
    billed = report.billed
    return [(_headline(k, f, unit, billed), _detail(f)) for k, f in enumerate(report.findings, 1)]


def _headline(k: int, f: Finding, unit: str, billed: str) -> str:
    window = f.evidence.get("per") == "window"
    worth = [pct(f.worth_share) + (" of the window" if window else " of the step")] if f.worth_share is not None else []
    # a finding that frees no device time (a latency tail's, a start-up profile's) says no "0.00 GPU-ms", no "$0.00"
    worth += [f"{time(f.worth_gpu_ns, unit)} {billed}-{unit}"] if f.worth_gpu_ns > 0 else []
    worth += [f"${num(f.cost_per_hour)}/hour"] if _priced(f) else []
    figures = f" ({', '.join(worth)})" if worth else ""
    return f"{k}. {time(f.worth_ns, unit)} {unit} {'over the window' if window else 'a step'}{figures}: {f.title}"


def _priced(f: Finding) -> bool:
    """Whether a finding's headline shows dollars: priced (--gpu-cost) and freeing device time."""
    return f.cost_per_hour is not None and f.worth_gpu_ns > 0


def _detail(f: Finding) -> str:
    where = _where(f)
    return "; ".join([*([f"where: {where}"] if where else []), f"cause: {cause_words(f.cause)}", f"try: {f.action}",
                      f"worth: {f.how}"])


def marks(report: Report, top: int = 3) -> list[tuple[str | int, str]]:
    """Where the ``top`` findings lie, as the GPU timeline marks them: (GPU lane or rank, ``#k kind``, the kind
    in words)."""
    out: list[tuple[str | int, str]] = []
    for k, f in enumerate(report.findings[:top], 1):
        label = f"#{k} {kind_words(f.kind)}"
        out += [(gpu, label) for gpu in f.where.gpus] + [(rank, label) for rank in f.where.ranks]
    return out


def _where(f: Finding) -> str:
    w = f.where
    parts = ([f"rank{'s' * (len(w.ranks) > 1)} {_list(w.ranks)}"] if w.ranks else []) + (
        [f"stage{'s' * (len(w.stages) > 1)} {_list(w.stages)}"] if w.stages else [])
    return "; ".join(parts) or ", ".join(w.gpus[:3]) + ("…" if len(w.gpus) > 3 else "")


def _list(values: list[int]) -> str:
    return ", ".join(str(v) for v in values[:8]) + ("…" if len(values) > 8 else "")
