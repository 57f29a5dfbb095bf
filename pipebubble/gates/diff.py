"""``diff``: two reports metric by metric, each judged regressed, improved or ok against a tolerance relative to
the base's value (or to the step, where the base is 0). Parts only one report has are listed as unmatched.
An incomplete input (either report's ``ingest.completeness``, fewer ranks or steps than the base) fails the
diff unless ``allow_partial``, and no change is called an improvement then: missing data looks like less work.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any

from pipebubble.gates.names import by_name, paired_names, stable_name, streams_note, wait_label
from pipebubble.gates.requests import percentile_pairs
from pipebubble.report.ingest import billed


@dataclass(frozen=True)
class Delta:
    """One metric in both reports. ``change`` is relative to the base value (None when the base is 0: then
    ``limit`` comes from the metric's scale, e.g. the step time). ``limit`` is the value ``new`` may reach
    before it counts as regressed; ``worse`` says which way is worse."""

    metric: str
    base: float
    new: float
    change: float | None
    unit: str
    regressed: bool
    status: str = "ok"  # regressed | improved | ok
    limit: float | None = None
    key: str = ""
    worse: str = "higher"


@dataclass(frozen=True)
class DiffResult:
    tolerance: float
    deltas: list[Delta]
    notes: list[str] = field(default_factory=list)  # informational
    unmatched: list[str] = field(default_factory=list)  # what could not be compared (an error with strict)
    strict: bool = False
    incomplete: list[str] = field(default_factory=list)  # why an input is incomplete (a failure unless allowed)
    allow_partial: bool = False
    base: str | None = None  # the paths compared, as given
    new: str | None = None
    timestamp: str | None = None
    seconds: float | None = None
    streams: list[tuple[str, str]] = field(default_factory=list)  # (base, new) lanes matched by order of first use

    @property
    def regressions(self) -> list[Delta]:
        return [d for d in self.deltas if d.status == "regressed"]

    @property
    def improvements(self) -> list[Delta]:
        return [d for d in self.deltas if d.status == "improved"]

    @property
    def failed(self) -> bool:
        return (bool(self.regressions) or (self.strict and bool(self.unmatched))
                or (bool(self.incomplete) and not self.allow_partial))


def judge(metric: str, base: float, new: float, unit: str, tolerance: float, *, scale: float = 0.0,
          worse: str = "higher", floor: float = 0.0, key: str = "") -> Delta:
    """Regressed when ``new`` is worse than ``base`` by more than ``tolerance`` of the base (of ``scale``
    when the base is 0) and by more than ``floor`` in absolute terms; improved likewise the other way."""
    ref = abs(base) or scale
    moved = (new - base) if worse == "higher" else (base - new)
    beyond = ref > 0 and abs(moved) > tolerance * ref and abs(moved) > floor
    status = "regressed" if beyond and moved > 0 else "improved" if beyond else "ok"
    margin = max(tolerance * ref, floor)
    limit = (base + margin if worse == "higher" else base - margin) if ref > 0 else None
    change = (new - base) / abs(base) if base else None
    return Delta(metric, base, new, change, unit, status == "regressed", status, limit, key or metric, worse)


PIPELINE_METRICS = (("bubble_fraction", "bubble", "fraction", "higher"),
                    ("excess_bubble_fraction", "excess bubble", "fraction", "higher"),
                    ("step_time_ns", "step time", "ns", "higher"),
                    ("stage_time_cv", "stage time CV", "ratio", "higher"),
                    ("imbalance", "imbalance", "ratio", "higher"),
                    ("idle_gpu_ns_per_step", "idle {} time per step", "ns", "higher"),
                    ("pipeline_efficiency", "pipeline efficiency", "fraction", "lower"))
STAGE_METRICS = (("busy_ns", "busy"), ("comm_ns", "exposed comm"), ("fill_ns", "fill"), ("drain_ns", "drain"),
                 ("idle_ns", "idle"))
LANE_METRICS = (("busy_ns", "busy"), ("idle_ns", "idle"))
GPU_METRICS = (("comm_exposed_ns", "exposed comm"), ("memory_exposed_ns", "exposed memory"))
TOP_KERNELS = 10  # kernels compared: the union of each report's biggest by total time


def diff(base: dict[str, Any], new: dict[str, Any], tolerance: float, strict: bool = False,
         allow_partial: bool = False) -> DiffResult:
    """Both reports' pipeline, stages (by number), lanes, GPUs' exposed time, collective waits and top kernels
    (by stable name), and waits (by step, stage, cause, neighbours and order): higher is worse for every one
    but pipeline efficiency. ``strict``: what only one report has fails the diff; ``allow_partial``: an
    incomplete input is a note, not a failure (its changes are still never improvements)."""
    if not math.isfinite(tolerance) or tolerance < 0:
        raise ValueError(f"tolerance {tolerance}: expected a finite fraction >= 0, e.g. 0.05 (5%)")
    *names, streams = paired_names(base.get("lanes") or [], new.get("lanes") or [])
    deltas: list[Delta] = []
    notes: list[str] = [streams_note(streams)] if streams else []
    unmatched: list[str] = []
    for part in (_pipeline_deltas, _stage_deltas, _lane_deltas, _gpu_deltas, _collective_deltas, _kernel_deltas,
                 _wait_deltas, _request_deltas):
        part(base, new, tolerance, names, deltas, notes, unmatched)
    gaps = coverage(base, new)
    if gaps and any(d.status == "improved" for d in deltas):
        deltas = [replace(d, status="ok") if d.status == "improved" else d for d in deltas]
        notes.append("no change is called an improvement: an input is incomplete, and missing data looks like less "
                     "work")
    return DiffResult(tolerance, deltas, notes, unmatched, strict, gaps, allow_partial, streams=streams)


def coverage(base: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Why the two inputs do not cover the same job: a file of either cut off, events of either lost, one
    holding fewer of its job's ranks than the other (both missing the same count compare alike), or the new
    one's pipeline fewer steps than the base's."""
    held = [(r.get("ingest") or {}).get("completeness") or {} for r in (base, new)]
    out = []
    for side, c, other in (("base", held[0], held[1]), ("new", held[1], held[0])):
        out += [f"{side}: {source}: cut off mid-write" for source in c.get("cut_off") or []]
        if c.get("lost_events"):
            out.append(f"{side}: {c['lost_events']:,} events lost to damage")
        world, ranks = c.get("world_size"), c.get("ranks")
        if world and ranks is not None and ranks < world and ranks < (other.get("ranks") or 0):
            out.append(f"{side}: {ranks} of the job's {world} ranks present, the other report holds "
                       f"{other['ranks']}")
    steps = [len((r.get("pipeline") or {}).get("steps") or []) for r in (base, new)]
    if 0 < steps[1] < steps[0]:
        out.append(f"new: {steps[1]} pipeline steps where the base has {steps[0]}")
    return out


def _request_deltas(base, new, tolerance, names, deltas, notes, unmatched) -> None:
    """Each latency percentile of the served requests (higher is worse)."""
    deltas += [judge(label, a, b, "ns", tolerance, scale=scale, key=key)
               for label, key, a, b, scale in percentile_pairs(base, new, unmatched)]


def _pipeline_deltas(base, new, tolerance, names, deltas, notes, unmatched) -> None:
    a, b = base.get("pipeline"), new.get("pipeline")
    if a is None or b is None:
        if a is not b:
            unmatched.append(f"pipeline only in the {'base' if b is None else 'new'} report")
        return
    device = billed([lane.get("kind") for lane in base.get("lanes") or []])  # "idle CPU time" for CPU ranks
    for key, label, unit, worse in PIPELINE_METRICS:
        if a.get(key) is not None and b.get(key) is not None:
            scale = 1.0 if unit != "ns" else float(a.get("step_time_ns") or 0)
            deltas.append(judge(label.format(device), float(a[key]), float(b[key]), unit, tolerance, scale=scale,
                                worse=worse, key=f"pipeline.{key}"))


def _stage_deltas(base, new, tolerance, names, deltas, notes, unmatched) -> None:
    a, b = base.get("stages") or [], new.get("stages") or []
    pairs = list(zip(a, b, strict=False))
    if len(a) != len(b):
        unmatched.append(f"stages: {len(a)} in the base report, {len(b)} in the new one")
        # only the stages both hold: by the rank each names, where every one names it; else none
        ranks = {s.get("rank") for s in a + b}
        of = {s["rank"]: s for s in b}
        pairs = [] if None in ranks else [(sa, of[sa["rank"]]) for sa in a if sa["rank"] in of]
    step = float((base.get("pipeline") or {}).get("step_time_ns") or 0)
    for sa, sb in pairs:
        if sa.get("name") != sb.get("name"):
            notes.append(f"stage {sa['stage']} is {sa.get('name')} in the base report, {sb.get('name')} in the new")
        deltas += [judge(f"stage {sa['stage']} {label}", sa[key], sb[key], "ns", tolerance, scale=step,
                         key=f"stages[{sa['stage']}].{key}") for key, label in STAGE_METRICS if key in sa and key in sb]


def _lane_deltas(base, new, tolerance, names, deltas, notes, unmatched) -> None:
    a, b = by_name(base.get("lanes") or [], names[0]), by_name(new.get("lanes") or [], names[1])
    for only, which in ((a.keys() - b.keys(), "base"), (b.keys() - a.keys(), "new")):
        if only:
            unmatched.append(f"{len(only)} lane(s) only in the {which} report: {', '.join(sorted(only)[:5])}"
                             + (" ..." if len(only) > 5 else ""))
    for name, la in a.items():
        if name in b:
            window = la["window_end_ns"] - la["window_start_ns"]
            deltas += [judge(f"lane {name} {label}", la[key], b[name][key], "ns", tolerance, scale=window,
                             key=f"lanes[{name}].{key}") for key, label in LANE_METRICS]


def _gpu_deltas(base, new, tolerance, names, deltas, notes, unmatched) -> None:
    """Each GPU's exposed communication and memory time and its idle time by cause, over its whole window
    (the breakdown's rows without a step; the GPU's idle as a whole is its lane's)."""
    rows = [{stable_name(r["lane"], n): r for r in report.get("breakdown") or [] if r.get("step") is None}
            for report, n in ((base, names[0]), (new, names[1]))]
    for name, ra in rows[0].items():
        rb = rows[1].get(name)
        if rb is None:
            continue
        pairs = [(k, label, ra[k], rb[k]) for k, label in GPU_METRICS]
        causes = sorted(set(ra.get("idle_causes") or {}) | set(rb.get("idle_causes") or {}))
        pairs += [(f"idle_causes.{c}", f"idle {c.replace('_', ' ')}", (ra.get("idle_causes") or {}).get(c, 0),
                   (rb.get("idle_causes") or {}).get(c, 0)) for c in causes]
        deltas += [judge(f"gpu {name} {label}", x, y, "ns", tolerance, scale=ra["window_ns"],
                         key=f"breakdown[{name}].{key}") for key, label, x, y in pairs if x or y]


def _collective_deltas(base, new, tolerance, names, deltas, notes, unmatched) -> None:
    a, b = base.get("collectives"), new.get("collectives")
    if a is None or b is None:
        return
    span = _span(base)
    deltas.append(judge("collective wait (all ranks)", a["waited_ns"], b["waited_ns"], "ns", tolerance,
                        scale=span, key="collectives.waited_ns"))
    ranks = [{stable_name(r.get("lane"), n, f"rank{r['rank']}"): r for r in c["ranks"]}
             for c, n in ((a, names[0]), (b, names[1]))]
    deltas += [judge(f"collective wait {name}", r["wait_ns"], ranks[1][name]["wait_ns"], "ns", tolerance, scale=span,
                     key=f"collectives.ranks[{name}].wait_ns") for name, r in ranks[0].items() if name in ranks[1]]


def _kernel_deltas(base, new, tolerance, names, deltas, notes, unmatched) -> None:
    """The biggest kernels of either report by total time, by full name and class (a short name is only
    unique within its own report): a kernel missing from one report did not run there (the report lists
    every kernel), so it counts as 0. A kernel is labelled by its short name where a report gives one."""
    rows = [{(full_name(k), k.get("class")): k for k in r.get("kernels") or []} for r in (base, new)]
    a, b = ({key: k["total_ns"] for key, k in found.items()} for found in rows)
    top = {key for totals in (a, b) for key in sorted(totals, key=lambda k: -totals[k])[:TOP_KERNELS]}
    scale = float(sum(a.values()))
    seen: dict[str, int] = defaultdict(int)
    for name, kind in sorted(top, key=lambda k: (-a.get(k, 0), -b.get(k, 0), repr(k))):
        text = "(no name)" if name is None else name  # a kernel the trace did not name
        row = rows[1].get((name, kind)) or rows[0].get((name, kind)) or {}
        named = row.get("name") if "name_full" in row and row.get("name") else text
        short = named if len(named) <= 60 else f"{named[:40]}…{named[-19:]}"  # both ends tell templates apart
        seen[short] += 1
        label = f"kernel {short}{f' [{seen[short]}]' if seen[short] > 1 else ''} total"
        deltas.append(judge(label, a.get((name, kind), 0), b.get((name, kind), 0), "ns", tolerance, scale=scale,
                            key=f"kernels[{kind}:{text}].total_ns"))


def full_name(kernel: dict) -> str | None:
    """A kernel row's full name: ``name_full``, or ``name`` in a report saved before short names."""
    return kernel.get("name_full", kernel.get("name"))


def _wait_deltas(base, new, tolerance, names, deltas, notes, unmatched) -> None:
    """Waits paired by what they are and, among equals, in time order (the second drain wait of a stage with
    the second); one only in one report is paired with a wait of 0. A wait regresses when it grew by more
    than ``tolerance`` of itself and of the base step, so a 0.2 ms gap that doubles in a 300 ms step is shown
    but fails nothing. Only compared when both reports are pipelines or neither is."""
    if (base.get("pipeline") is None) != (new.get("pipeline") is None):
        return
    a, b = _waits(base, names[0]), _waits(new, names[1])
    floor = tolerance * _span(base)
    for key in sorted(a.keys() | b.keys(), key=lambda k: (-(a.get(k) or {}).get("dur_ns", 0), repr(k))):
        wa, wb = a.get(key), b.get(key)
        label = key[0] + (f" #{key[1] + 1}" if key[1] else "")
        deltas.append(judge(label, wa["dur_ns"] if wa else 0, wb["dur_ns"] if wb else 0, "ns", tolerance,
                            scale=_span(base), floor=floor, key=f"waits[{label}]"))


def _waits(report: dict, names: dict[str, str]) -> dict[tuple[str, int], dict]:
    groups: dict[str, list[dict]] = defaultdict(list)
    for wait in sorted(report.get("waits") or [], key=lambda w: w["start_ns"]):
        groups[wait_label(wait, names)].append(wait)
    return {(label, i): w for label, waits in groups.items() for i, w in enumerate(waits)}


def _span(report: dict) -> float:
    """The report's step: the pipeline's, else the longest lane window over the profiler steps seen."""
    step = (report.get("pipeline") or {}).get("step_time_ns")
    if step:
        return float(step)
    windows = [lane["window_end_ns"] - lane["window_start_ns"] for lane in report.get("lanes") or []]
    steps = {r["step"] for r in report.get("breakdown") or [] if r.get("step") is not None}
    return max(windows, default=0) / max(1, len(steps))


