"""CI gates over the JSON report (a dict, so a saved report works as well as a fresh one).

``check`` compares metrics with fixed thresholds; ``diff`` compares two reports metric by metric and calls a
metric regressed when it worsens by more than a relative tolerance. Pure functions: no I/O, no printing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import fmean
from typing import Any

# gate name -> (metric, "max" or "min", unit); the threshold keys are "max_bubble", "min_utilization" ...
GATES: dict[str, tuple[str, str, str]] = {
    "max_bubble": ("bubble", "max", ""),
    "max_excess_bubble": ("excess_bubble", "max", ""),
    "min_utilization": ("utilization", "min", ""),
    "max_stage_cv": ("stage_cv", "max", ""),
    "max_imbalance": ("imbalance", "max", "x"),
    "max_wait_ms": ("wait", "max", "ms"),
    "max_decode_slowdown": ("decode_slowdown", "max", "x"),
}


@dataclass(frozen=True)
class Gate:
    """One gate's outcome; ``passed`` is None when the report lacks the metric (skipped, with a ``note``)."""

    name: str
    value: float | None
    threshold: float
    passed: bool | None
    unit: str = ""
    bound: str = "max"  # max: value must be <= threshold; min: value must be >= threshold
    note: str = ""

    @property
    def status(self) -> str:
        return "skip" if self.passed is None else "pass" if self.passed else "fail"


def check(report: dict[str, Any], thresholds: dict[str, float | None]) -> list[Gate]:
    """One Gate per threshold that is set, in the order of ``GATES``."""
    unknown = set(thresholds) - set(GATES)
    if unknown:
        raise ValueError(f"unknown gate(s): {', '.join(sorted(unknown))}")
    gates = []
    for key, (name, bound, unit) in GATES.items():
        threshold = thresholds.get(key)
        if threshold is None:
            continue
        value, note = METRICS[name](report)
        passed = None if value is None else value <= threshold if bound == "max" else value >= threshold
        gates.append(Gate(name, value, threshold, passed, unit, bound, note))
    return gates


def _pipeline(report: dict, key: str) -> tuple[float | None, str]:
    pipeline = report.get("pipeline")
    if pipeline is None:
        why = [n for n in report.get("notes") or [] if n.startswith(("not a pipeline", "one rank"))]
        return None, why[0] if why else "not a pipeline"
    value = pipeline.get(key)
    return (None, f"{key} unknown") if value is None else (float(value), "")


def _utilization(report: dict) -> tuple[float | None, str]:
    stages = report.get("stages") or []
    if stages:
        return fmean(s["utilization"] for s in stages), "mean stage utilization"
    gpus = [lane for lane in report.get("lanes", []) if lane["kind"] == "gpu" and lane["stream"] is None]
    windows = [(lane["idle_ns"], lane["window_end_ns"] - lane["window_start_ns"]) for lane in gpus]
    fractions = [idle / window for idle, window in windows if window > 0]
    if not fractions:
        return None, "no stages and no GPU lanes"
    return 1.0 - fmean(fractions), "1 - mean GPU idle fraction"


def _wait(report: dict) -> tuple[float | None, str]:
    waits = report.get("waits") or []
    if waits:
        return max(w["dur_ns"] for w in waits) / 1e6, "longest wait"
    return (0.0, "no waits") if report.get("pipeline") else (None, "not a pipeline")


def _decode_slowdown(report: dict) -> tuple[float | None, str]:
    serving = report.get("interference") or {}
    if serving.get("decode_slowdown_when_mixed") is not None:
        return float(serving["decode_slowdown_when_mixed"]), ""
    if serving.get("decode_slowdown_when_prefill") is not None:  # no mixed steps: prefill steps stall decode
        return float(serving["decode_slowdown_when_prefill"]), "no mixed steps: slowdown when prefill runs"
    return None, "no prefill/decode interference in the trace"


METRICS = {
    "bubble": lambda r: _pipeline(r, "bubble_fraction"),
    "excess_bubble": lambda r: _pipeline(r, "excess_bubble_fraction"),
    "utilization": _utilization,
    "stage_cv": lambda r: _pipeline(r, "stage_time_cv"),
    "imbalance": lambda r: _pipeline(r, "imbalance"),
    "wait": _wait,
    "decode_slowdown": _decode_slowdown,
}


@dataclass(frozen=True)
class Delta:
    """One metric in both reports. ``change`` is relative to the base (to ``scale`` when the base is 0)."""

    metric: str
    base: float
    new: float
    change: float
    unit: str
    regressed: bool


@dataclass(frozen=True)
class DiffResult:
    tolerance: float
    deltas: list[Delta]
    notes: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> list[Delta]:
        return [d for d in self.deltas if d.regressed]


PIPELINE_METRICS = (("bubble_fraction", ""), ("excess_bubble_fraction", ""), ("step_time_ns", "ns"),
                    ("stage_time_cv", ""), ("imbalance", "x"))
STAGE_METRICS = ("busy_ns", "fill_ns", "drain_ns", "idle_ns")
LANE_METRICS = ("busy_ns", "idle_ns")


def diff(base: dict[str, Any], new: dict[str, Any], tolerance: float) -> DiffResult:
    """Every metric named in the module docstring, higher being worse for all of them (more bubble, more
    time, more spread, longer waits)."""
    step = float((base.get("pipeline") or {}).get("step_time_ns") or 0)
    deltas, notes = _pipeline_deltas(base, new, tolerance)
    stage_deltas, stage_notes = _stage_deltas(base, new, tolerance, step)
    lane_deltas, lane_notes = _lane_deltas(base, new, tolerance)
    wait_deltas = _wait_deltas(base, new, tolerance, step)
    return DiffResult(tolerance, deltas + stage_deltas + lane_deltas + wait_deltas, notes + stage_notes + lane_notes)


def _delta(metric: str, base: float, new: float, unit: str, tolerance: float, scale: float = 1.0) -> Delta:
    change = (new - base) / (abs(base) or scale or 1.0)
    return Delta(metric, base, new, change, unit, change > tolerance)


def _pipeline_deltas(base: dict, new: dict, tolerance: float) -> tuple[list[Delta], list[str]]:
    a, b = base.get("pipeline"), new.get("pipeline")
    if a is None or b is None:
        return [], [] if a is b else [f"pipeline only in the {'base' if b is None else 'new'} report"]
    return [_delta(key, float(a[key]), float(b[key]), unit, tolerance) for key, unit in PIPELINE_METRICS
            if a.get(key) is not None and b.get(key) is not None], []


def _stage_deltas(base: dict, new: dict, tolerance: float, step: float) -> tuple[list[Delta], list[str]]:
    a, b = base.get("stages") or [], new.get("stages") or []
    notes = [f"stages: {len(a)} in base, {len(b)} in new (compared by index)"] if len(a) != len(b) else []
    deltas = [_delta(f"stage {i} {key.removesuffix('_ns')}", sa[key], sb[key], "ns", tolerance, step)
              for i, (sa, sb) in enumerate(zip(a, b, strict=False)) for key in STAGE_METRICS]
    return deltas, notes


def _lane_deltas(base: dict, new: dict, tolerance: float) -> tuple[list[Delta], list[str]]:
    a = {lane["lane"]: lane for lane in base.get("lanes", [])}
    b = {lane["lane"]: lane for lane in new.get("lanes", [])}
    deltas = [_delta(f"lane {lane_id} {key.removesuffix('_ns')}", lane[key], b[lane_id][key], "ns", tolerance,
                     lane["window_end_ns"] - lane["window_start_ns"])
              for lane_id, lane in a.items() if lane_id in b for key in LANE_METRICS]
    unmatched = len(a.keys() ^ b.keys())
    return deltas, [f"{unmatched} lane(s) in only one report (lanes match by id)"] if unmatched else []


def _wait_key(wait: dict) -> tuple:
    return wait.get("step"), wait["stage"], wait.get("lane"), wait["cause"], wait["before"], wait["after"]


def _wait_deltas(base: dict, new: dict, tolerance: float, step: float) -> list[Delta]:
    """New or grown waits. A wait regresses when it grew by more than ``tolerance`` of the base step time,
    so a new gap that only just crosses the reporting threshold does not fail a build."""
    before = {_wait_key(w): w["dur_ns"] for w in base.get("waits") or []}
    deltas = []
    for wait in new.get("waits") or []:
        old = before.get(_wait_key(wait), 0)
        if wait["dur_ns"] <= old:
            continue
        label = f"wait stage {wait['stage']} {wait['cause']} ({wait['before'] or '-'} → {wait['after'] or '-'})"
        change = (wait["dur_ns"] - old) / (step or old or 1.0)
        deltas.append(Delta(label + ("" if old else " new"), old, wait["dur_ns"], change, "ns", change > tolerance))
    return deltas
