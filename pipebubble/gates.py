"""CI gates over the JSON report (a dict, so a saved report works as well as a fresh one).

``check`` compares metrics with fixed thresholds; ``diff`` compares two reports metric by metric and calls a
metric regressed (or improved) when it moved the worse (or better) way by more than a tolerance relative to
the baseline's value. Pure functions: no I/O, no printing.

Two reports are matched only by what a second recording of the same job keeps: stage numbers, ranks, GPU
device numbers, the order of a process's threads and the order of waits; never a PID or a TID (every run gets
new ones). A GPU's streams match by number, and those whose numbers differ (CUDA hands a new run other ids)
by their order of first use.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from statistics import fmean
from typing import Any, NamedTuple

from pipebubble import gates_requests

# Units of a value: "fraction" (0..1, shown as a percentage), "ratio" (dimensionless), "ms" or "ns" (time).


class GateSpec(NamedTuple):
    metric: str
    bound: str  # max: the value must be <= the threshold; min: >=
    unit: str
    floor: float = 0.0  # the least threshold that means anything (a slowest/mean ratio is never below 1)
    label: str = ""


# gate key (the flag without its dashes) -> what it measures; the keys are the [check] table's too
GATES: dict[str, GateSpec] = {
    "max_bubble": GateSpec("bubble", "max", "fraction", label="bubble"),
    "max_excess_bubble": GateSpec("excess_bubble", "max", "fraction", label="excess bubble"),
    "min_utilization": GateSpec("utilization", "min", "fraction", label="utilization"),
    "max_stage_cv": GateSpec("stage_cv", "max", "ratio", label="stage time CV"),
    "max_imbalance": GateSpec("imbalance", "max", "ratio", 1.0, "imbalance"),
    "max_wait_ms": GateSpec("wait", "max", "ms", label="longest wait"),
    "max_decode_slowdown": GateSpec("decode_slowdown", "max", "ratio", 1.0, "decode slowdown"),
    "max_finding": GateSpec("finding", "max", "fraction", label="largest finding"),
    **{key: GateSpec(metric, "max", "ms", label=label) for key, (metric, label) in gates_requests.GATES.items()},
}
TIME_SUFFIXES = {"ns": 1e-6, "us": 1e-3, "µs": 1e-3, "ms": 1.0, "s": 1e3}  # to ms


def _number(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{what}: expected a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{what}: not a finite number")
    if value < 0:
        raise ValueError(f"{what}: must not be negative")
    return value


def parse_fraction(value: object, where: str, most: float | None = 1.0) -> float:
    """``0.3`` or ``"30%"`` -> 0.3. A bare number above 1 is refused (``30`` is 3000 %: "did you mean 30%?"),
    as are negative, NaN and infinite values and, with ``most``, a percentage above ``most``."""
    text = str(value).strip()
    what = f"{where} {text}"
    if text.endswith("%"):
        fraction = _number(text[:-1].strip(), what) / 100
        if most is not None and fraction > most:
            raise ValueError(f"{what}: more than {most:.0%}")
        return fraction
    fraction = _number(text, what)
    if fraction > 1:
        raise ValueError(f"{what}: a bare number is a fraction ({fraction / 100:g} means {fraction:g}%); did you "
                         f"mean {fraction:g}%?")
    return fraction


DEFAULT_TOLERANCE = 0.05  # diff's, when neither the caller nor pipebubble.toml gives one


def thresholds(given: dict[str, object], config: Any, name: Any) -> dict[str, float]:
    """The gates to run: the config file's [check] table with the thresholds given on top, each parsed by
    ``parse_threshold``; ``name(key)`` is how the caller words a gate (``--max-bubble``, ``max_bubble``).
    None at all, or a value a gate could only misread, is a ValueError of one line."""
    found = {key: parse_threshold(key, value, f"{config.path}: check.{key.replace('_', '-')}")
             for key, value in config.thresholds.items()}
    found |= {key: parse_threshold(key, value, name(key)) for key, value in given.items() if value is not None}
    if not found:
        raise ValueError(f"no gates: give a threshold such as {name('max_bubble')} 30%, or a [check] table in "
                         "pipebubble.toml")
    return found


def tolerance(given: object, config: Any, name: str) -> float:
    """The given tolerance (``name``: how the caller words it), else the config file's, else 5 %."""
    if given is not None:
        return parse_tolerance(given, name)
    return config.tolerance if config.tolerance is not None else DEFAULT_TOLERANCE  # checked when it was read


def parse_tolerance(value: object, where: str = "--tolerance") -> float:
    """A relative tolerance: ``0.05`` or ``"5%"`` (``"150%"`` for more than 1; a bare ``5`` is refused)."""
    return parse_fraction(value, where, most=None)


def parse_threshold(key: str, value: object, where: str | None = None) -> float:
    """The threshold of gate ``key`` from a flag or the config file (``where`` names it in the message).
    Fractions take ``0.3`` or ``30%``; ratios ``1.2``, ``1.2x`` or ``10%``; times ms, or a number with ns, us,
    ms or s. Raises ValueError, one line with a hint, for anything a gate could only misread."""
    if key not in GATES:
        raise ValueError(f"unknown gate {key!r}: expected one of {', '.join(GATES)}")
    spec, where = GATES[key], where or key
    text = str(value).strip()
    if spec.unit == "fraction":
        return parse_fraction(text, where)
    if spec.unit == "ms":
        number, unit = re.fullmatch(r"(.*?)\s*(ns|us|µs|ms|s)?", text).groups()  # type: ignore[union-attr]
        return _number(number, f"{where} {text}") * TIME_SUFFIXES[unit or "ms"]
    ratio = parse_fraction(text, where, most=None) if text.endswith("%") else _number(
        text.removesuffix("x").strip(), f"{where} {text}")
    if ratio < spec.floor:
        raise ValueError(f"{where} {text}: {spec.label} is at least {spec.floor:g}; did you mean "
                         f"{spec.floor + ratio:g}?")
    return ratio


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
    source: str | None = None
    timestamp: str | None = None
    seconds: float | None = None

    def count(self, status: str) -> int:
        return sum(g.status == status for g in self.gates)

    @property
    def failed(self) -> bool:
        return any(g.status in ("fail", "error") for g in self.gates)


def check(report: dict[str, Any], thresholds: dict[str, float | None], strict: bool = False) -> CheckResult:
    """One Gate per threshold that is set, in the order of ``GATES``; ``strict``: a gate the report cannot
    evaluate is an error, not a skip."""
    unknown = set(thresholds) - set(GATES)
    if unknown:
        raise ValueError(f"unknown gate(s): {', '.join(sorted(unknown))}")
    gates = []
    for key, spec in GATES.items():
        if thresholds.get(key) is None:
            continue
        threshold = parse_threshold(key, thresholds[key])
        value, note = METRICS[spec.metric](report)
        passed = None if value is None else value <= threshold if spec.bound == "max" else value >= threshold
        gates.append(Gate(spec.metric, value, threshold, passed, spec.unit, spec.bound, note, key, spec.label,
                          strict))
    return CheckResult(gates, strict)


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
        return worst["dur_ns"] / 1e6, _wait_label(worst, lane_names(report.get("lanes") or []), "at ", ", ", "")
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
    **gates_requests.METRICS,
}


# ---- diff ----------------------------------------------------------------------------------------------


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
        return bool(self.regressions) or (self.strict and bool(self.unmatched))


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
                    ("idle_gpu_ns_per_step", "idle GPU time per step", "ns", "higher"),
                    ("pipeline_efficiency", "pipeline efficiency", "fraction", "lower"))
STAGE_METRICS = (("busy_ns", "busy"), ("comm_ns", "exposed comm"), ("fill_ns", "fill"), ("drain_ns", "drain"),
                 ("idle_ns", "idle"))
LANE_METRICS = (("busy_ns", "busy"), ("idle_ns", "idle"))
GPU_METRICS = (("comm_exposed_ns", "exposed comm"), ("memory_exposed_ns", "exposed memory"))
TOP_KERNELS = 10  # kernels compared: the union of each report's biggest by total time


def diff(base: dict[str, Any], new: dict[str, Any], tolerance: float, strict: bool = False) -> DiffResult:
    """Both reports' pipeline, stages (by number), lanes, GPUs' exposed time, collective waits and top kernels
    (by stable name), and waits (by step, stage, cause, neighbours and order): higher is worse for every one
    but pipeline efficiency. ``strict``: what only one report has fails the diff."""
    if not math.isfinite(tolerance) or tolerance < 0:
        raise ValueError(f"tolerance {tolerance}: expected a finite fraction >= 0, e.g. 0.05 (5%)")
    *names, streams = paired_names(base.get("lanes") or [], new.get("lanes") or [])
    deltas: list[Delta] = []
    notes: list[str] = [streams_note(streams)] if streams else []
    unmatched: list[str] = []
    for part in (_pipeline_deltas, _stage_deltas, _lane_deltas, _gpu_deltas, _collective_deltas, _kernel_deltas,
                 _wait_deltas, _request_deltas):
        part(base, new, tolerance, names, deltas, notes, unmatched)
    return DiffResult(tolerance, deltas, notes, unmatched, strict, streams=streams)


def _request_deltas(base, new, tolerance, names, deltas, notes, unmatched) -> None:
    """Each latency percentile of the served requests (higher is worse)."""
    deltas += [judge(label, a, b, "ns", tolerance, scale=scale, key=key)
               for label, key, a, b, scale in gates_requests.percentile_pairs(base, new, unmatched)]


def _pipeline_deltas(base, new, tolerance, names, deltas, notes, unmatched) -> None:
    a, b = base.get("pipeline"), new.get("pipeline")
    if a is None or b is None:
        if a is not b:
            unmatched.append(f"pipeline only in the {'base' if b is None else 'new'} report")
        return
    for key, label, unit, worse in PIPELINE_METRICS:
        if a.get(key) is not None and b.get(key) is not None:
            deltas.append(judge(label, float(a[key]), float(b[key]), unit, tolerance, scale=1.0 if unit != "ns"
                                else float(a.get("step_time_ns") or 0), worse=worse, key=f"pipeline.{key}"))


def _stage_deltas(base, new, tolerance, names, deltas, notes, unmatched) -> None:
    a, b = base.get("stages") or [], new.get("stages") or []
    if len(a) != len(b):
        unmatched.append(f"stages: {len(a)} in the base report, {len(b)} in the new one")
    step = float((base.get("pipeline") or {}).get("step_time_ns") or 0)
    for sa, sb in zip(a, b, strict=False):
        if sa.get("name") != sb.get("name"):
            notes.append(f"stage {sa['stage']} is {sa.get('name')} in the base report, {sb.get('name')} in the new")
        deltas += [judge(f"stage {sa['stage']} {label}", sa[key], sb[key], "ns", tolerance, scale=step,
                         key=f"stages[{sa['stage']}].{key}") for key, label in STAGE_METRICS if key in sa and key in sb]


def _lane_deltas(base, new, tolerance, names, deltas, notes, unmatched) -> None:
    a, b = _by_name(base.get("lanes") or [], names[0]), _by_name(new.get("lanes") or [], names[1])
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
    rows = [{_name(r["lane"], n): r for r in report.get("breakdown") or [] if r.get("step") is None}
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
    ranks = [{_name(r.get("lane"), n, f"rank{r['rank']}"): r for r in c["ranks"]}
             for c, n in ((a, names[0]), (b, names[1]))]
    deltas += [judge(f"collective wait {name}", r["wait_ns"], ranks[1][name]["wait_ns"], "ns", tolerance, scale=span,
                     key=f"collectives.ranks[{name}].wait_ns") for name, r in ranks[0].items() if name in ranks[1]]


def _kernel_deltas(base, new, tolerance, names, deltas, notes, unmatched) -> None:
    """The biggest kernels of either report by total time, by name and class: a kernel missing from one report
    did not run there (the report lists every kernel), so it counts as 0."""
    a, b = ({(k["name"], k.get("class")): k["total_ns"] for k in r.get("kernels") or []} for r in (base, new))
    top = {key for totals in (a, b) for key in sorted(totals, key=lambda k: -totals[k])[:TOP_KERNELS]}
    scale = float(sum(a.values()))
    seen: dict[str, int] = defaultdict(int)
    for name, kind in sorted(top, key=lambda k: (-a.get(k, 0), -b.get(k, 0), repr(k))):
        text = "(no name)" if name is None else name  # a kernel the trace did not name
        short = text if len(text) <= 60 else f"{text[:40]}…{text[-19:]}"  # both ends tell templates apart
        seen[short] += 1
        label = f"kernel {short}{f' [{seen[short]}]' if seen[short] > 1 else ''} total"
        deltas.append(judge(label, a.get((name, kind), 0), b.get((name, kind), 0), "ns", tolerance, scale=scale,
                            key=f"kernels[{kind}:{text}].total_ns"))


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
        groups[_wait_label(wait, names)].append(wait)
    return {(label, i): w for label, waits in groups.items() for i, w in enumerate(waits)}


def _wait_label(wait: dict, names: dict[str, str], head: str = "wait ", open_: str = " (", close: str = ")") -> str:
    """``wait stage 3 step 0 drain (B7 → -)``: where, when, why and between which passes (never a lane id)."""
    where = f"stage {wait['stage']}" if wait.get("stage") is not None else _name(wait.get("lane"), names, "job")
    step = f" step {wait['step']}" if wait.get("step") is not None else ""
    passes = f"{wait.get('before') or '-'} → {wait.get('after') or '-'}"
    return f"{head}{where}{step} {wait['cause']}{open_}{passes}{close}"


def _span(report: dict) -> float:
    """The report's step: the pipeline's, else the longest lane window over the profiler steps seen."""
    step = (report.get("pipeline") or {}).get("step_time_ns")
    if step:
        return float(step)
    windows = [lane["window_end_ns"] - lane["window_start_ns"] for lane in report.get("lanes") or []]
    steps = {r["step"] for r in report.get("breakdown") or [] if r.get("step") is not None}
    return max(windows, default=0) / max(1, len(steps))


# ---- stable names ----------------------------------------------------------------------------------------


def lane_names(lanes: list[dict]) -> dict[str, str]:
    """Each lane id -> a name that a second recording of the same job gives the same lane: ``rank0/gpu0``,
    ``rank0/gpu0/stream7``, ``rank0/thread0`` (a process's main thread first, then the others by when they
    started working), ``process1/...`` for the second process of a rank (or of a job without ranks), never
    a PID or TID. Two lanes that would share a name get ``#2``, ``#3`` in report order."""
    pids: dict[Any, set[int]] = defaultdict(set)
    for lane in lanes:
        if lane.get("pid") is not None:
            pids[lane.get("rank")].add(lane["pid"])
    process = {(rank, pid): i for rank, found in pids.items() for i, pid in enumerate(sorted(found))}
    threads: dict[tuple, list[dict]] = defaultdict(list)
    for lane in lanes:
        if lane.get("device") is None:
            threads[lane.get("rank"), lane.get("pid")].append(lane)
    order = {lane["lane"]: i for group in threads.values()
             for i, lane in enumerate(sorted(group, key=lambda x: (x.get("tid") != x.get("pid"),
                                                                  x["window_start_ns"], x.get("tid") or 0)))}
    names: dict[str, str] = {}
    seen: dict[str, int] = defaultdict(int)
    for lane in lanes:
        rank, p = lane.get("rank"), process.get((lane.get("rank"), lane.get("pid")))
        parts = [f"rank{rank}"] if rank is not None else []
        if p is not None and (rank is None or p > 0):
            parts.append(f"process{p}")
        if lane.get("device") is not None:
            parts.append(f"gpu{lane['device']}")
            parts += [f"stream{lane['stream']}"] if lane.get("stream") is not None else []
        else:
            parts.append(f"thread{order[lane['lane']]}")
        name = "/".join(parts)
        seen[name] += 1
        names[lane["lane"]] = name if seen[name] == 1 else f"{name}#{seen[name]}"
    return names


def paired_names(base: list[dict], new: list[dict]) -> tuple[dict[str, str], dict[str, str], list[tuple[str, str]]]:
    """Both reports' lane names (``lane_names``), the new report's streams renamed after the base's they match,
    and those (base name, new name) pairs. Within each GPU (its rank, process and device) a stream number
    found in both reports matches itself; the streams left on each side match in their order of first use
    (ties by number), as far as both have streams left; the rest keep their names, only in one report."""
    names = lane_names(base), lane_names(new)
    pairs: list[tuple[str, str]] = []
    theirs = _streams(new, names[1])
    for gpu, ours in _streams(base, names[0]).items():
        common = {number for number, _ in ours} & {number for number, _ in theirs.get(gpu, [])}
        left = [[name for number, name in side if number not in common] for side in (ours, theirs.get(gpu, []))]
        pairs += zip(*left, strict=False)
    renamed = {b: a for a, b in pairs}
    return names[0], {lane: renamed.get(name, name) for lane, name in names[1].items()}, pairs


def _streams(lanes: list[dict], names: dict[str, str]) -> dict[str, list[tuple[int, str]]]:
    """Each GPU's streams (by the GPU's name) as (number, lane name), in their order of first use."""
    streams = [lane for lane in lanes if lane.get("device") is not None and lane.get("stream") is not None]
    out: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for lane in sorted(streams, key=lambda x: (x.get("window_start_ns") is None, x.get("window_start_ns") or 0,
                                               x["stream"])):
        name = names[lane["lane"]]
        out[name.rsplit("/stream", 1)[0]].append((lane["stream"], name))
    return out


def streams_note(pairs: list[tuple[str, str]], shown: int = 5) -> str:
    """One line: which streams matched by order, ``rank0/gpu0/stream7 as stream13`` (the base's name first)."""
    listed = ", ".join(f"{a} as {b.rsplit('/', 1)[-1]}" for a, b in pairs[:shown])
    return (f"{len(pairs)} GPU stream(s) matched by order of first use (their numbers differ): {listed}"
            + (" ..." if len(pairs) > shown else ""))


def _by_name(lanes: list[dict], names: dict[str, str]) -> dict[str, dict]:
    return {names[lane["lane"]]: lane for lane in lanes}


_IDS = re.compile(r"(pid|tid|cpu/)-?\d+")


def _name(lane: str | None, names: dict[str, str], default: str = "") -> str:
    """A lane's stable name; one the lanes do not list keeps its id with the PIDs and TIDs blanked."""
    if lane is None:
        return default
    return names.get(lane) or _IDS.sub(lambda m: m.group(1) + "*", lane)
