"""The served requests' section: facts (percentiles, TTFT's parts, the tail attributed to engine steps, the
KV-cache), the percentile table, and in HTML each latency's distribution drawn as a curve. Only formatting:
every number is the report's."""

from __future__ import annotations

from html import escape

from pipebubble.render.cells import Table, num, time
from pipebubble.report import Report
from pipebubble.report.requests import Requests

LATENCIES = (("ttft_ns", "TTFT (arrival → first token)"), ("queue_ns", "queue (arrival → scheduled)"),
             ("prefill_ns", "prefill"), ("tpot_ns", "TPOT ((e2e − TTFT) / (tokens − 1))"),
             ("e2e_ns", "e2e (arrival → completion)"))
DRAWN = (("ttft_ns", "TTFT"), ("tpot_ns", "TPOT"), ("e2e_ns", "e2e"))
W, LABEL_W, ROW_H, PLOT_H = 1000, 90, 110, 80  # the SVG's own units


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
    kv = r.kv_cache
    if kv:
        lines.append(f"KV cache: at most {kv['peak_blocks']:,} blocks in use ({kv['events']:,} allocations and "
                     "releases)")
    return lines + [f"note: {n}" for n in r.notes]


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
    """Each latency's distribution over the requests (the share of requests at or under each value), one row
    per latency, with its p50 and p99 marked."""
    rows = [(key, label, sorted(v for v in (getattr(q, key) for q in requests.rows) if v is not None))
            for key, label in DRAWN]
    rows = [row for row in rows if row[2]]
    if not rows:
        return ""
    height = ROW_H * len(rows) + 10
    out = [f'<svg viewBox="0 0 {W} {height}" role="img" aria-label="request latency distributions" '
           'style="font:11px system-ui,sans-serif">']
    for k, (key, label, values) in enumerate(rows):
        y0 = k * ROW_H + 10
        top, n = max(values[-1], 1), len(values)
        x = [LABEL_W + (W - LABEL_W - 20) * v / top for v in values]
        points = " ".join(f"{xi:.1f},{y0 + PLOT_H - PLOT_H * (i + 1) / n:.1f}" for i, xi in enumerate(x))
        q = getattr(requests, key) or {}
        out += [f'<text x="0" y="{y0 + PLOT_H / 2:.0f}">{escape(label)}</text>',
                f'<line x1="{LABEL_W}" y1="{y0 + PLOT_H}" x2="{W - 20}" y2="{y0 + PLOT_H}" stroke="#999"/>',
                f'<polyline fill="none" stroke="#0072b2" stroke-width="1.5" points="{points}">'
                f'<title>{escape(label)}: {n:,} requests</title></polyline>',
                f'<text x="{W - 20}" y="{y0 + PLOT_H + 14}" text-anchor="end">{num(top / 1e6)} ms</text>',
                f'<text x="{LABEL_W}" y="{y0 + PLOT_H + 14}">0</text>']
        for p in ("p50", "p99"):
            if q.get(p) is not None:
                px = LABEL_W + (W - LABEL_W - 20) * q[p] / top
                out.append(f'<line x1="{px:.1f}" y1="{y0}" x2="{px:.1f}" y2="{y0 + PLOT_H}" stroke="#d55e00" '
                           f'stroke-dasharray="3 2"><title>{p} {num(q[p] / 1e6)} ms</title></line>'
                           f'<text x="{px + 3:.1f}" y="{y0 + 10}" fill="#d55e00">{p}</text>')
    return "".join(out) + "</svg>"

