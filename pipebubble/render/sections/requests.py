"""The served requests' section: facts (percentiles, TTFT's parts, the tail attributed to engine steps, the
KV-cache), the percentile table, and in HTML each latency's distribution drawn as a curve. Only formatting:
every number is the report's."""

from __future__ import annotations

from html import escape

from pipebubble.render import axis
from pipebubble.render.cells import Table, num, time
from pipebubble.report import Report
from pipebubble.report.requests import Requests

LATENCIES = (("ttft_ns", "TTFT (arrival → first token)"), ("queue_ns", "queue (arrival → scheduled)"),
             ("prefill_ns", "prefill"), ("tpot_ns", "TPOT ((e2e − TTFT) / (tokens − 1))"),
             ("e2e_ns", "e2e (arrival → completion)"),
             ("requeue_ns", "requeue (preempted → running again)"))
DRAWN = (("ttft_ns", "TTFT"), ("tpot_ns", "TPOT"), ("e2e_ns", "e2e"))
# the SVG's own units: its width, left of the plot (the y-axis' labels), right of it, the caption above a plot,
# a plot, a whole row (caption, plot, the x-axis' ticks, labels and title, a gap)
W, LEFT, RIGHT, CAPTION_H, PLOT_H = 1000, 50, 20, 22, 80
ROW_H = CAPTION_H + PLOT_H + axis.TICK + 11 + axis.LINE_H + 14
CURVE, MARK = "#0072b2", "#d55e00"


def facts(report: Report, unit: str = "ms") -> list[str]:
    """One line per fact of the section (none without served requests)."""
    r = report.requests
    if r is None:
        return []
    lines = [f"requests: {r.count:,} served" + (f" over {time(r.window_ns, unit)} {unit}" if r.window_ns else "")
             + f", {r.with_tpot:,} with a TPOT (two or more output tokens)"]
    lines += [f"{words}: {_quantiles(getattr(r, key), unit)}" for key, words in LATENCIES if getattr(r, key)]
    split = (r.ttft_split_ns or {}).get("tail")
    if split:
        lines.append("TTFT's tail (at or above its p90), on average: " + ", ".join(
            f"{k} {time(v, unit)} {unit}" for k, v in split.items() if isinstance(v, int | float)))
    steps = r.steps
    if steps is not None and steps.shared.tpot_ns and steps.apart.tpot_ns:
        lines.append(f"decodes that shared steps with a prefill: TPOT p99 {time(steps.shared.tpot_ns['p99'], unit)}"
                     f" {unit} ({steps.shared.count:,} requests) against {time(steps.apart.tpot_ns['p99'], unit)}"
                     f" {unit} for the {steps.apart.count:,} that did not")
    elif steps is not None and steps.shared.tpot_ns:
        lines.append(f"every one of the {steps.shared.count:,} requests attributed shared steps with a prefill "
                     f"(TPOT p99 {time(steps.shared.tpot_ns['p99'], unit)} {unit})")
    lines += _preemptions(r, unit) + _step_trace(r, unit)
    kv = r.kv_cache
    if kv:
        lines.append(f"KV cache: at most {kv['peak_blocks']:,} blocks in use ({kv['events']:,} allocations and "
                     "releases)")
    return lines + [f"note: {n}" for n in r.notes]


def _preemptions(r: Requests, unit: str) -> list[str]:
    """The preemptions, and each of the longest waits with the engine as the traced step beside it saw it."""
    pre = r.preemptions
    if pre is None:
        return []
    lost = "" if pre.lost_tokens is None else f", {pre.lost_tokens:,} tokens done then computed again"
    lines = [f"preempted: {pre.requests:,} requests of the {pre.known:,} whose sources say, {pre.count:,} times, "
             f"{time(pre.requeue_ns, unit)} {unit} waiting to run again{lost}"]
    if pre.kv_usage:
        lines.append(f"KV-cache use at the preemptions: {_shares(pre.kv_usage)}")
    for w in pre.worst:
        at = "" if w.kv_usage is None else (f" (step {w.step}: KV cache {w.kv_usage:.0%} used, {w.waiting} waiting, "
                                            f"{w.running} running)")
        lines.append(f"  {w.request_id}: waited {time(w.requeue_ns, unit)} {unit} to run again{at}")
    return lines


def _step_trace(r: Requests, unit: str) -> list[str]:
    """The traced scheduler steps and what the TTFT tail waited through."""
    st = r.step_trace
    if st is None:
        return []
    cover = "" if st.coverage is None or st.coverage >= 1 else f" ({st.coverage:.0%} of the step ids: sampled)"
    lines = [f"scheduler steps traced: {st.steps:,}{cover}, {st.prefill_heavy:,} prefill-heavy, {st.preempted:,} "
             "preemptions in them"]
    if st.waiting and st.kv_usage:
        depth = ", ".join(f"{k} {num(v)}" for k, v in st.waiting.items() if v is not None)
        lines.append(f"queue depth: {depth}; KV-cache use: {_shares(st.kv_usage)}"
                     + ("" if st.kv_peak is None else f", at most {st.kv_peak:.0%}"))
    groups = st.ttft_steps or {}
    for name, words in (("tail", "TTFT's tail (at or above its p90)"), ("rest", "the other requests")):
        g = groups.get(name) or {}
        if g.get("requests") and g.get("prefill_heavy_share") is not None:
            lines.append(f"{words} waited through {num(g['steps_per_request'])} traced steps each: queue "
                         f"{num(g['waiting'])} on average, KV cache at most {_share(g['kv_peak'])}, "
                         f"{g['prefill_heavy_share']:.0%} prefill-heavy")
    if st.kineto:
        lines.append(f"Kineto serving steps matched: {st.kineto['matched']:,} of {st.kineto['steps']:,} traced steps")
    return lines


def _shares(q: dict) -> str:
    return ", ".join(f"{k} {_share(v)}" for k, v in q.items() if v is not None)


def _share(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0%}"


def _quantiles(q: dict, unit: str) -> str:
    return ", ".join(f"{k} {time(v, unit)} {unit}" for k, v in q.items() if v is not None)


def table(report: Report, unit: str = "ms") -> Table:
    """The percentiles of each latency."""
    r = report.requests
    rows = [] if r is None else [[words.split(" (")[0], *(time((getattr(r, key) or {}).get(p), unit)
                                                          for p in ("p50", "p90", "p99"))]
                                 for key, words in LATENCIES if getattr(r, key)]
    return Table(f"Request latency ({unit}; percentiles by linear interpolation)", ["latency", "p50", "p90", "p99"],
                 rows, frozenset({1, 2, 3}))


def svg(requests: Requests) -> str:
    """Each latency's distribution over the requests (the share of requests at or under each value), one plot
    per latency: a y-axis of the share in %, an x-axis of the latency in the unit its ticks need, and its p50
    and p99 marked and labelled with their values inside the plot."""
    rows = [(key, label, sorted(v for v in (getattr(q, key) for q in requests.rows) if v is not None))
            for key, label in DRAWN]
    rows = [row for row in rows if row[2]]
    if not rows:
        return ""
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {ROW_H * len(rows)}" width="100%"'
           ' preserveAspectRatio="xMinYMin meet" role="img" aria-label="request latency distributions">']
    for k, (key, label, values) in enumerate(rows):
        out += _cdf(label, values, getattr(requests, key) or {}, k * ROW_H)
    return "\n".join([*out, "</svg>"])


def _cdf(label: str, values: list[int], q: dict, y0: int) -> list[str]:
    """One latency's plot: its caption, axes, the curve (a step up of 1/n at each request's value) and its
    percentiles."""
    top_y, bottom = y0 + CAPTION_H, y0 + CAPTION_H + PLOT_H
    scale = axis.time_scale(0, max(values[-1], 1), axis.count_for(W - LEFT - RIGHT))
    hi = max(values[-1], scale.ticks[-1], 1)

    def x(v: float) -> float:
        return LEFT + (W - LEFT - RIGHT) * v / hi

    def y(share: float) -> float:
        return bottom - PLOT_H * share

    n = len(values)
    points = " ".join(f"{x(v):.1f},{y((i + 1) / n):.1f}" for i, v in enumerate(values))
    out = [axis.text(LEFT, y0 + 14, f"{label}: share of the {n:,} requests at or under each latency"),
           *axis.y_axis(axis.share_scale(2), y, LEFT, top_y, bottom, grid_to=W - RIGHT),
           *axis.x_axis(scale, x, bottom, LEFT, W - RIGHT, label, W),
           f'<polyline fill="none" stroke="{CURVE}" stroke-width="1.5" points="{points}">'
           f"<title>{escape(label)}: {n:,} requests</title></polyline>"]
    for row, p in enumerate(p for p in ("p50", "p99") if q.get(p) is not None):
        words = f"{p} {_value(q[p], scale.unit)} {scale.unit}"
        at, anchor = axis.beside(x(q[p]), words, LEFT + 2, W - 2)
        out.append(f'<g><title>{escape(f"{label} {words}")}</title>'
                   + axis.line(x(q[p]), top_y, x(q[p]), bottom, MARK, "3 2")
                   + axis.text(at, top_y + 11 + row * axis.LINE_H, words, anchor, MARK) + "</g>")
    return out


def _value(ns: float, unit: str) -> str:
    """A percentile in the axis's unit, to three significant digits at least (``12.3``, ``1,234``)."""
    v = ns / dict(axis.TIME)[unit]
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}" if abs(v) >= 1 else f"{v:.3f}"
