"""``diff --by op`` as text, JSON, JUnit XML, GitHub Actions workflow commands or Markdown. Strings only.

The operators added, removed and changed are listed (the unchanged ones counted); JUnit and GitHub lay the
same rows out as the metric diff does (``render.gates``), a regression failing as a metric's would. Times in
``unit`` (``--timeunit``); JSON keeps raw numbers (its keys are this command's contract).
"""

from __future__ import annotations

import json
from dataclasses import asdict

from pipebubble.gates.ops import OpChange, OpsDiff
from pipebubble.render import cells
from pipebubble.render.gates import FORMATS, Row, _github, _junit

NAME_WIDTH = 60  # a name's characters in text and Markdown (both ends kept: templates differ at the end)
TAGS = {"added": "ADDED", "removed": "REMOVED", "changed": "CHANGED", "same": "same"}
COLUMNS = ("operator", "kind", "base count", "new count", "base time", "new time", "delta", "change")


def render_ops(result: OpsDiff, fmt: str, timeunit: str = "ms") -> str:
    """The operator diff as ``fmt``, one of ``render.gates.FORMATS``; an unknown one raises ValueError."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: expected one of {', '.join(FORMATS)}")
    return globals()[f"ops_{fmt}"](result, timeunit)


def _count(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.2f}"


def _time(ns: float, timeunit: str) -> str:
    return f"{cells.time(ns, timeunit)} {timeunit}"


def _kind(row: OpChange) -> str:
    return row.kind if row.cls is None else f"{row.kind} ({row.cls})"


def _cells(row: OpChange, timeunit: str) -> tuple[str, ...]:
    delta = ("+" if row.delta_ns >= 0 else "−") + _time(abs(row.delta_ns), timeunit)
    change = "new" if row.change is None else cells.signed_pct(row.change)
    return (cells.shorten(row.name, NAME_WIDTH), _kind(row), _count(row.base_count), _count(row.new_count),
            _time(row.base_ns, timeunit), _time(row.new_ns, timeunit), delta, change)


def _listed(result: OpsDiff) -> list[OpChange]:
    return [r for r in result.rows if r.status != "same" or r.regressed]


def sentence(row: OpChange, timeunit: str = "ms") -> str:
    """e.g. ``cpu_op aten::mm: count 4 -> 6, time 1.20 ms -> 2.40 ms (+100.0%)``."""
    name, kind, ca, cb, ta, tb, _, change = _cells(row, timeunit)
    return f"{kind} {name}: count {ca} -> {cb}, time {ta} -> {tb} ({change})"


def verdict(result: OpsDiff) -> str:
    counts = f"{len(result.added)} added, {len(result.removed)} removed, {len(result.changed)} changed"
    tail = f" of {len(result.rows)} operators ({counts}; changed: count, or time beyond {cells.pct(result.tolerance)})"
    if result.max_regression is None:
        return f"informational{tail}"
    bad = result.regressions
    gap = " and an input is incomplete" if result.incomplete and not result.allow_partial else ""
    if not bad:
        return f"no operator regressed beyond {cells.pct(result.max_regression)}{gap}{tail}"
    return f"{len(bad)} operator(s) regressed beyond {cells.pct(result.max_regression)}{gap}{tail}"


def _notes(result: OpsDiff) -> list[str]:
    return [*result.notes, *(f"input incomplete: {n}" for n in result.incomplete)]


def ops_text(result: OpsDiff, timeunit: str = "ms") -> str:
    rows = _listed(result)
    table = [("", *COLUMNS)] + [(TAGS[r.status] + (" REGRESSED" if r.regressed else ""), *_cells(r, timeunit))
                                for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    right = {3, 4, 5, 6, 7, 8}
    lines = ["  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(line, widths,
                                                                                             strict=True))).rstrip()
             for line in table] if rows else []
    return "\n".join([*lines, *(f"note: {n}" for n in _notes(result)), verdict(result)]) + "\n"


def ops_markdown(result: OpsDiff, timeunit: str = "ms") -> str:
    def line(values: tuple[str, ...]) -> str:
        return "| " + " | ".join(v.replace("|", "\\|") for v in values) + " |"

    paths = f" (base `{result.base}`, new `{result.new}`)" if result.base and result.new else ""
    head = f"**{'failed' if result.failed else 'passed'}**: {verdict(result)}{paths}"
    out = ["## pipebubble diff --by " + result.by, "", head, ""]
    rows = _listed(result)
    if rows:
        out += [line((*COLUMNS, "status")), "|" + "|".join(["---", "---"] + ["---:"] * 6 + ["---"]) + "|"]
        out += [line((*_cells(r, timeunit), f"**{TAGS[r.status]}{' REGRESSED' if r.regressed else ''}**"))
                for r in rows]
        out.append("")
    out += [f"- {n}" for n in _notes(result)]
    return "\n".join(out).rstrip("\n") + "\n"


def ops_json(result: OpsDiff, timeunit: str = "ms") -> str:
    def row(r: OpChange) -> dict:
        body = asdict(r)
        return {"kind": body.pop("kind"), "class": body.pop("cls"), **body}

    body = {"by": result.by, "failed": result.failed, "per_step": result.per_step,
            "base_steps": result.base_steps, "new_steps": result.new_steps, "tolerance": result.tolerance,
            "max_op_regression": result.max_regression, "base": result.base, "new": result.new,
            **{status: [r.name_full for r in result.having(status)] for status in ("added", "removed", "changed")},
            "regressions": [r.name_full for r in result.regressions], "notes": result.notes,
            "incomplete": result.incomplete, "allow_partial": result.allow_partial,
            "operators": [row(r) for r in result.rows]}
    return json.dumps(body, indent=2, allow_nan=False) + "\n"


def rows(result: OpsDiff, timeunit: str = "ms") -> list[Row]:
    """The listed operators as the gate writers' rows: a regression fails, the rest pass."""
    gap = "skip" if result.allow_partial or result.max_regression is None else "fail"
    return ([Row(f"incomplete[{i}]", "input incomplete", gap, "INCOMPLETE", f"input incomplete: {note}")
             for i, note in enumerate(result.incomplete)]
            + [Row(f"{r.kind}[{r.cls or ''}:{r.name_full}].ns", f"{r.kind} {cells.shorten(r.name, NAME_WIDTH)}",
                   "fail" if r.regressed else "pass", "REGRESSED" if r.regressed else TAGS[r.status],
                   sentence(r, timeunit), r.new_ns, None, r.base_ns, "ns") for r in _listed(result)])


def ops_junit(result: OpsDiff, timeunit: str = "ms") -> str:
    props = {"base": result.base or "", "new": result.new or "", "by": result.by,
             "tolerance": repr(result.tolerance), "per_step": str(result.per_step).lower(),
             **({} if result.max_regression is None else {"max_op_regression": repr(result.max_regression)})}
    return _junit("diff", rows(result, timeunit), result.new, result.timestamp, result.seconds, props)


def ops_github(result: OpsDiff, timeunit: str = "ms") -> str:
    """A regression is an ``::error`` on the baseline; added, removed and changed operators plain log lines."""
    return _github("diff", rows(result, timeunit), result.base, verdict(result))
