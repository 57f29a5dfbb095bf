"""``check``: each gate that has a threshold against one report (a dict), pass, fail or skip with a note saying
why the report lacks the metric (an error with ``strict``). An incomplete input (``ingest.completeness``: a
file cut off, events lost, ranks missing) is a gate of its own, first: it fails, or with ``allow_partial``
is skipped with its reasons (a warning), so a crashed profiler or a full disk never passes a gate."""

from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean
from typing import Any

from pipebubble.gates.names import lane_names, wait_label
from pipebubble.gates.requests import METRICS as REQUEST_METRICS
from pipebubble.gates.specs import GATES, parse_threshold


@dataclass(frozen=True)
class Gate:
    """One gate's outcome; ``passed`` is None when the report lacks the metric (with a ``note`` saying why):
    a skip, or an error when the gate was ``required`` (``--strict``)."""

    name: str
    value: float | None
    threshold: float
    passed: bool | None
    unit: str = "ratio"
    bound: str = "max"  # max: value must be <= threshold; min: value must be >= threshold
    note: str = ""
    key: str = ""
    label: str = ""
    required: bool = False

    @property
    def status(self) -> str:
        if self.passed is None:
            return "error" if self.required else "skip"
        return "pass" if self.passed else "fail"


@dataclass(frozen=True)
class CheckResult:
    """The gates of one run, and what the outputs name: the input judged (``source``), when (``timestamp``,
    ISO 8601) and how long it took (``seconds``)."""

    gates: list[Gate]
    strict: bool = False
    allow_partial: bool = False
    source: str | None = None
    timestamp: str | None = None
    seconds: float | None = None

    def count(self, status: str) -> int:
        return sum(g.status == status for g in self.gates)

    @property
    def failed(self) -> bool:
        return any(g.status in ("fail", "error") for g in self.gates)


COMPLETENESS = "completeness"


def check(report: dict[str, Any], thresholds: dict[str, float | None], strict: bool = False,
          allow_partial: bool = False) -> CheckResult:
    """One Gate per threshold that is set, in the order of ``GATES``, after the completeness gate when the
    input is incomplete; ``strict``: a gate the report cannot evaluate is an error, not a skip;
    ``allow_partial``: an incomplete input is a skip (a warning), not a failure."""
    unknown = set(thresholds) - set(GATES)
    if unknown:
        raise ValueError(f"unknown gate(s): {', '.join(sorted(unknown))}")
    reasons = incomplete(report)
    gates = [Gate(COMPLETENESS, None, 1.0, None if allow_partial else False, "ratio", "min", "; ".join(reasons),
                  "allow_partial", "input complete")] if reasons else []
    for key, spec in GATES.items():
        if thresholds.get(key) is None:
            continue
        threshold = parse_threshold(key, thresholds[key])
        value, note = METRICS[spec.metric](report)
        passed = None if value is None else value <= threshold if spec.bound == "max" else value >= threshold
        gates.append(Gate(spec.metric, value, threshold, passed, spec.unit, spec.bound, note, key, spec.label,
                          strict))
    return CheckResult(gates, strict, allow_partial)


def incomplete(report: dict[str, Any]) -> list[str]:
    """Why the input of ``report`` is incomplete (its ``ingest.completeness`` reasons; none for a report saved
    before reports said)."""
    return list(((report.get("ingest") or {}).get("completeness") or {}).get("reasons") or [])


def _pipeline(report: dict, key: str) -> tuple[float | None, str]:
    pipeline = report.get("pipeline")
    if pipeline is None:
        why = [n for n in report.get("notes") or [] if n.startswith(("not a pipeline", "one rank"))]
        return None, why[0] if why else _why_no_pipeline(report)
    value = pipeline.get(key)
    return (None, f"{key} unknown") if value is None else (float(value), "")


def _why_no_pipeline(report: dict) -> str:
    lanes = report.get("lanes") or []
    ranks = len({lane.get("rank") for lane in lanes})
    gpus = sum(lane["kind"] == "gpu" and lane.get("stream") is None for lane in lanes)
    return (f"not a pipeline: {ranks} rank(s) and {gpus} GPU(s) in the trace, no stages (a pipeline needs two or "
            "more; --pp-size, --stage-by or --stage name them)")


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
        worst = max(waits, key=lambda w: w["dur_ns"])
        return worst["dur_ns"] / 1e6, wait_label(worst, lane_names(report.get("lanes") or []), "at ", ", ", "")
    return (0.0, "no waits") if report.get("pipeline") else _pipeline(report, "waits")


def _decode_slowdown(report: dict) -> tuple[float | None, str]:
    serving = report.get("interference") or {}
    if serving.get("decode_slowdown_when_mixed") is not None:
        return float(serving["decode_slowdown_when_mixed"]), ""
    if serving.get("decode_slowdown_when_prefill") is not None:  # no mixed steps: prefill steps stall decode
        return float(serving["decode_slowdown_when_prefill"]), "no mixed steps: slowdown when prefill runs"
    return None, "no prefill/decode interference in the trace"


def _finding(report: dict) -> tuple[float | None, str]:
    """The largest finding's share of its step (findings are sorted by worth; shares of different steps
    are compared as shares); 0 with none above the findings' own threshold."""
    shares = [(f["worth_share"], f["title"]) for f in report.get("findings") or [] if f.get("worth_share") is not None]
    if not shares:
        return 0.0, "no findings"
    share, title = max(shares)
    return float(share), title


METRICS = {
    "bubble": lambda r: _pipeline(r, "bubble_fraction"),
    "excess_bubble": lambda r: _pipeline(r, "excess_bubble_fraction"),
    "utilization": _utilization,
    "stage_cv": lambda r: _pipeline(r, "stage_time_cv"),
    "imbalance": lambda r: _pipeline(r, "imbalance"),
    "wait": _wait,
    "decode_slowdown": _decode_slowdown,
    "finding": _finding,
    **REQUEST_METRICS,
}


