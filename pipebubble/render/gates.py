"""Gate and diff results as text, JSON, JUnit XML, GitHub Actions workflow commands or Markdown. Strings only.

One layer serves both commands: a check's gates and a diff's deltas become ``Row``s (a name, an outcome, a
sentence, the value with its threshold, baseline and unit), and the text, JUnit, GitHub and Markdown writers
lay rows out; only the JSON differs per command (its keys are each command's contract). Times are shown in
``unit`` (``--timeunit``) through ``cells.time``, fractions as ``cells.pct`` shows them in ``analyze``.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass

from pipebubble.gates import CheckResult, Delta, DiffResult, Gate
from pipebubble.render import cells
from pipebubble.render.choices import GATE_FORMATS

FORMATS = tuple(name for name, _, _ in GATE_FORMATS)  # what check and diff both offer (--format)
NAMED = 12  # regressions named in the one-line verdict (the table and JSON list them all)
TAGS = {"pass": "PASS", "fail": "FAIL", "skip": "SKIP", "error": "ERROR", "regressed": "REGRESSED",
        "improved": "IMPROVED", "ok": "ok", "unmatched": "UNMATCHED", "incomplete": "INCOMPLETE"}


@dataclass(frozen=True)
class Row:
    """One gate or metric as every writer sees it. ``outcome``: pass, fail, skip or error (JUnit's words);
    ``tag``: what text shows (PASS, REGRESSED, IMPROVED, ...)."""

    key: str
    title: str
    outcome: str
    tag: str
    sentence: str
    value: float | None = None
    threshold: float | None = None
    baseline: float | None = None
    unit: str = ""
    columns: tuple[str, ...] = ()  # the Markdown table's cells after the title


# ---- numbers ---------------------------------------------------------------------------------------------


def number(value: float | None, unit: str, timeunit: str = "ms", digits: int | None = None) -> str:
    """A value as the reports show it: a fraction as ``49.1%``, a time as ``1,234.56 ms`` in ``timeunit``, a
    ratio as ``1.27``; ``digits`` overrides the digits after the point."""
    if value is None:
        return "n/a"
    if unit == "fraction":
        return cells.pct(value) if digits is None else f"{100 * value:.{digits}f}%"
    if unit in ("ns", "ms"):
        ns = value * 1e6 if unit == "ms" else value
        shown = cells.time(ns, timeunit) if digits is None else f"{ns / cells.per(timeunit):,.{digits}f}"
        return f"{shown} {timeunit}"
    return cells.num(value) if digits is None else f"{value:,.{digits}f}"


def pair(a: float | None, b: float | None, unit: str, timeunit: str = "ms") -> tuple[str, str]:
    """Two values shown with enough digits that different values never read the same (``30.0% > 30.0%``)."""
    shown = number(a, unit, timeunit), number(b, unit, timeunit)
    for digits in range(3, 10):
        if a is None or b is None or a == b or shown[0] != shown[1]:
            break
        shown = number(a, unit, timeunit, digits), number(b, unit, timeunit, digits)
    return shown


def _change(delta: Delta) -> str:
    if delta.change is None:
        return "same" if delta.new == delta.base else "new"
    return cells.signed_pct(delta.change)


# ---- rows ------------------------------------------------------------------------------------------------


def _checked(result: CheckResult | list[Gate]) -> CheckResult:
    return result if isinstance(result, CheckResult) else CheckResult(list(result))


def gate_sentence(gate: Gate, timeunit: str = "ms") -> str:
    """e.g. ``bubble 49.1% > max 30.0%`` or ``bubble skipped: not a pipeline``."""
    label = gate.label or gate.name
    if gate.name == "completeness":
        return (f"input incomplete{' (allowed: --allow-partial)' if gate.passed is None else ''}: {gate.note}"
                + ("" if gate.passed is None else "; --allow-partial judges it by the thresholds alone"))
    if gate.passed is None:
        return f"{label} {'not evaluated (--strict)' if gate.required else 'skipped'}: {gate.note}"
    value, threshold = pair(gate.value, gate.threshold, gate.unit, timeunit)
    op = ("<=" if gate.passed else ">") if gate.bound == "max" else (">=" if gate.passed else "<")
    note = f" ({gate.note})" if gate.note else ""
    return f"{label} {value} {op} {gate.bound} {threshold}{note}"


CHECK_COLUMNS = ("gate", "value", "threshold", "note")
DIFF_COLUMNS = ("metric", "base", "new", "change", "limit")
NUMERIC = {"value", "threshold", "base", "new", "change", "limit"}  # right-aligned columns


def check_rows(result: CheckResult, timeunit: str = "ms") -> list[Row]:
    def columns(g: Gate) -> tuple[str, ...]:
        value, threshold = pair(g.value, g.threshold, g.unit, timeunit)
        return value, f"{g.bound} {threshold}", g.note

    return [Row(g.name, g.label or g.name, g.status, TAGS[g.status], gate_sentence(g, timeunit), g.value,
                g.threshold, None, g.unit, columns(g)) for g in result.gates]


def delta_sentence(delta: Delta, timeunit: str = "ms") -> str:
    """e.g. ``stage 1 busy 120.00 ms -> 150.00 ms (+25.0%, limit 126.00 ms)``."""
    base, new = pair(delta.base, delta.new, delta.unit, timeunit)
    shown = delta.limit is not None and delta.status != "improved"  # an improvement's limit says nothing
    limit = f", limit {pair(delta.base, delta.limit, delta.unit, timeunit)[1]}" if shown else ""
    return f"{delta.metric} {base} -> {new} ({_change(delta)}{limit})"


def diff_rows(result: DiffResult, timeunit: str = "ms") -> list[Row]:
    outcome = {"regressed": "fail", "improved": "pass", "ok": "pass"}
    def columns(d: Delta) -> tuple[str, ...]:
        base, new = pair(d.base, d.new, d.unit, timeunit)
        limit = "-" if d.limit is None else pair(d.base, d.limit, d.unit, timeunit)[1]
        return base, new, _change(d), limit

    rows = [Row(d.key, d.metric, outcome[d.status], TAGS[d.status], delta_sentence(d, timeunit), d.new, d.limit,
                d.base, d.unit, columns(d)) for d in result.deltas]
    missing = "error" if result.strict else "skip"
    gap = "skip" if result.allow_partial else "fail"
    return ([Row(f"incomplete[{i}]", "input incomplete", gap, TAGS["incomplete"], f"input incomplete: {note}")
             for i, note in enumerate(result.incomplete)] + rows
            + [Row(f"unmatched[{i}]", note, missing, TAGS["unmatched"], note) for i, note in
               enumerate(result.unmatched)])


# ---- the writers both commands share ---------------------------------------------------------------------


def _counts(rows: list[Row]) -> dict[str, int]:
    return {outcome: sum(r.outcome == outcome for r in rows) for outcome in ("pass", "fail", "skip", "error")}


def _junit(command: str, rows: list[Row], source: str | None, timestamp: str | None, seconds: float | None,
           properties: dict[str, str]) -> str:
    """JUnit XML as Jenkins' junit-10.xsd has it: a ``testsuites`` root, one ``testsuite`` with ``tests``,
    ``failures``, ``errors``, ``skipped``, ``time`` and ``timestamp``; a property per metric for its value,
    threshold, baseline and unit (a testcase has no properties there); each case's sentence in system-out."""
    counts = _counts(rows)
    totals = {"tests": str(len(rows)), "failures": str(counts["fail"]), "errors": str(counts["error"])}
    time = f"{seconds or 0:.3f}"
    root = ET.Element("testsuites", name=f"pipebubble {command}", time=time, **totals)
    suite = ET.SubElement(root, "testsuite", name=f"pipebubble {command}", **totals, skipped=str(counts["skip"]),
                          time=time, **({"timestamp": timestamp} if timestamp else {}),
                          **({"file": source} if source else {}))
    props = ET.SubElement(suite, "properties")
    for name, value in [*properties.items(), *_metric_properties(rows)]:
        ET.SubElement(props, "property", name=name, value=value)
    element = {"fail": "failure", "error": "error", "skip": "skipped"}
    for row in rows:
        case = ET.SubElement(suite, "testcase", name=row.title, classname=f"pipebubble.{command}", time="0")
        if row.outcome in element:
            ET.SubElement(case, element[row.outcome], message=row.sentence, type=row.tag.lower())
        ET.SubElement(case, "system-out").text = row.sentence
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _metric_properties(rows: list[Row]) -> list[tuple[str, str]]:
    out = []
    for row in rows:
        for part, value in (("value", row.value), ("threshold", row.threshold), ("baseline", row.baseline)):
            if value is not None:
                out.append((f"{row.key}.{part}", repr(float(value)) if isinstance(value, float) else str(value)))
        if row.unit:
            out.append((f"{row.key}.unit", row.unit))
    return out


def _escape(text: str) -> str:
    """A workflow command's message: %, CR and LF escaped (actions/toolkit ``escapeData``)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    """A workflow command's property: also : and , (``escapeProperty``)."""
    return _escape(text).replace(":", "%3A").replace(",", "%2C")


def annotation(level: str, message: str, title: str, file: str | None = None) -> str:
    props = ([f"file={_escape_property(file)}"] if file else []) + [f"title={_escape_property(title)}"]
    return f"::{level} {','.join(props)}::{_escape(message)}"


def _github(command: str, rows: list[Row], file: str | None, summary: str) -> str:
    """``::error`` for a failed gate or a regression (an error with --strict too), ``::warning`` for a skip or
    for what could not be compared, ``::notice`` for an improvement; passing rows are plain log lines."""
    lines = []
    for row in rows:
        level = {"fail": "error", "error": "error", "skip": "warning"}.get(row.outcome)
        level = level or ("notice" if row.tag == TAGS["improved"] else None)
        title = f"pipebubble {command}: {row.title} {row.tag.lower()}"
        if level:
            lines.append(annotation(level, row.sentence, title, file))
        elif row.tag != TAGS["ok"]:  # a diff's unchanged metrics would drown the log
            lines.append(f"{row.tag}  {row.sentence}")
    return "\n".join([*lines, summary]) + "\n"


def _markdown(command: str, head: str, rows: list[Row], notes: list[str], header: tuple[str, ...]) -> str:
    """The rows that need a look in a table; the passing ones folded into a count (expandable)."""
    look = [r.outcome != "pass" or r.tag == TAGS["improved"] for r in rows]
    shown = [r for r, needed in zip(rows, look, strict=True) if needed]
    passing = [r for r, needed in zip(rows, look, strict=True) if not needed]
    out = [f"## pipebubble {command}", "", head, ""]
    if shown:
        out += _table(header, shown, bold=True) + [""]
    if passing:
        out += [f"<details><summary>{len(passing)} {'passed' if command == 'check' else 'within tolerance'}"
                "</summary>", "", *_table(header, passing, bold=False), "", "</details>", ""]
    out += [f"- {n}" for n in notes]
    return "\n".join(out).rstrip("\n") + "\n"


def _table(header: tuple[str, ...], rows: list[Row], bold: bool) -> list[str]:
    def line(cells: tuple[str, ...]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    rule = "|" + "|".join("---:" if c in NUMERIC else "---" for c in (*header, "status")) + "|"
    return [line((*header, "status")), rule,
            *(line((r.title, *r.columns, f"**{r.tag}**" if bold else r.tag)) for r in rows)]


# ---- check -----------------------------------------------------------------------------------------------


def render_check(result: CheckResult | list[Gate], fmt: str, timeunit: str = "ms") -> str:
    """The gates as ``fmt``, one of ``FORMATS``; an unknown one raises ValueError naming them."""
    return _writer("check", fmt)(_checked(result), timeunit)


def _summary(result: CheckResult) -> str:
    parts = [f"{result.count('pass')} passed", f"{result.count('fail')} failed", f"{result.count('skip')} skipped"]
    if result.count("error"):
        parts.append(f"{result.count('error')} not evaluated (--strict)")
    return ", ".join(parts)


def check_text(result: CheckResult | list[Gate], timeunit: str = "ms") -> str:
    result = _checked(result)
    lines = [f"{TAGS[g.status]}  {gate_sentence(g, timeunit)}" for g in result.gates]
    return "\n".join([*lines, _summary(result)]) + "\n"


def check_json(result: CheckResult | list[Gate], timeunit: str = "ms") -> str:
    result = _checked(result)
    body = {"passed": not result.failed, "strict": result.strict, "allow_partial": result.allow_partial,
            "source": result.source,
            "summary": {s: result.count(s) for s in ("pass", "fail", "skip", "error")},
            "gates": [{**asdict(g), "status": g.status} for g in result.gates]}
    return json.dumps(body, indent=2, allow_nan=False) + "\n"


def check_junit(result: CheckResult | list[Gate], timeunit: str = "ms") -> str:
    result = _checked(result)
    props = {"source": result.source or "", "strict": str(result.strict).lower()}
    return _junit("check", check_rows(result, timeunit), result.source, result.timestamp, result.seconds, props)


def check_github(result: CheckResult | list[Gate], timeunit: str = "ms") -> str:
    result = _checked(result)
    return _github("check", check_rows(result, timeunit), result.source, _summary(result))


def check_markdown(result: CheckResult | list[Gate], timeunit: str = "ms") -> str:
    result = _checked(result)
    source = f" (`{result.source}`)" if result.source else ""
    head = f"**{'failed' if result.failed else 'passed'}**: {_summary(result)}{source}"
    return _markdown("check", head, check_rows(result, timeunit), [], CHECK_COLUMNS)


# ---- diff ------------------------------------------------------------------------------------------------


def render_diff(result: DiffResult, fmt: str, timeunit: str = "ms") -> str:
    """The diff as ``fmt``, one of ``FORMATS``; an unknown one raises ValueError naming them."""
    return _writer("diff", fmt)(result, timeunit)


def _verdict(result: DiffResult) -> str:
    if result.incomplete and not result.allow_partial:
        return (f"failed: {len(result.incomplete)} input gap(s) ({result.incomplete[0]}); --allow-partial compares "
                f"what both cover; {_compared(result)}")
    return _compared(result)


def _compared(result: DiffResult) -> str:
    bad, good = result.regressions, result.improvements
    also = [f"{len(good)} improved"] if good else []
    if result.unmatched:
        also.append(f"{len(result.unmatched)} not comparable{' (--strict)' if result.strict else ''}")
    tail = f" ({len(result.deltas)} metrics compared{''.join(', ' + a for a in also)})"
    if not bad:
        return f"no regression beyond {cells.pct(result.tolerance)}{tail}"
    names = ", ".join(d.metric for d in bad[:NAMED]) + (f" and {len(bad) - NAMED} more" if len(bad) > NAMED else "")
    return f"{len(bad)} regression(s) beyond {cells.pct(result.tolerance)}{tail}: {names}"


def diff_text(result: DiffResult, timeunit: str = "ms") -> str:
    gap = "warning" if result.allow_partial else TAGS["incomplete"]
    lines = [f"{gap}  input incomplete: {n}" for n in result.incomplete]
    lines += [f"{TAGS[d.status]:<9}  {delta_sentence(d, timeunit)}" for d in result.regressions + result.improvements]
    lines += [f"{'ERROR' if result.strict else 'note'}: {n}" for n in result.unmatched]
    return "\n".join([*lines, *(f"note: {n}" for n in result.notes), _verdict(result)]) + "\n"


def diff_markdown(result: DiffResult, timeunit: str = "ms") -> str:
    paths = f" (base `{result.base}`, new `{result.new}`)" if result.base and result.new else ""
    head = f"**{'failed' if result.failed else 'passed'}**: {_verdict(result)}{paths}"
    rows = [r for r in diff_rows(result, timeunit) if not r.key.startswith(("unmatched[", "incomplete["))]
    notes = [f"{'input incomplete' if result.allow_partial else '**input incomplete**'}: {n}"
             for n in result.incomplete]
    notes += [f"{'**not comparable**' if result.strict else 'not comparable'}: {n}" for n in result.unmatched]
    return _markdown("diff", head, rows, notes + result.notes, DIFF_COLUMNS)


def diff_json(result: DiffResult, timeunit: str = "ms") -> str:
    body = {"regressed": bool(result.regressions), "failed": result.failed, "tolerance": result.tolerance,
            "strict": result.strict, "base": result.base, "new": result.new,
            "regressions": [d.metric for d in result.regressions],
            "improvements": [d.metric for d in result.improvements],
            "unmatched": result.unmatched, "notes": result.notes,
            "incomplete": result.incomplete, "allow_partial": result.allow_partial,
            "streams_matched_by_order": [{"base": a, "new": b} for a, b in result.streams],
            "deltas": [asdict(d) for d in result.deltas]}
    return json.dumps(body, indent=2, allow_nan=False) + "\n"


def diff_junit(result: DiffResult, timeunit: str = "ms") -> str:
    props = {"base": result.base or "", "new": result.new or "", "tolerance": repr(result.tolerance),
             "strict": str(result.strict).lower()}
    return _junit("diff", diff_rows(result, timeunit), result.new, result.timestamp, result.seconds, props)


def diff_github(result: DiffResult, timeunit: str = "ms") -> str:
    """Regressions point at the baseline (the committed file a PR is compared with)."""
    return _github("diff", diff_rows(result, timeunit), result.base, _verdict(result))


def warnings(result: CheckResult | DiffResult) -> list[str]:
    """What a CI log must show whatever the format (stderr): gates that could not be evaluated, parts of the
    reports that could not be compared."""
    if isinstance(result, DiffResult):
        hint = "" if result.strict else " (--strict fails on it)"
        allowed = " (allowed: --allow-partial)" if result.allow_partial else ""
        return ([f"input incomplete: {note}{allowed}" for note in result.incomplete]
                + [f"not compared: {note}{hint}" for note in result.unmatched])
    hint = {"skip": " (--strict fails on it)", "error": ""}
    return [gate_sentence(g) if g.name == "completeness" else
            f"gate {g.label or g.name} {'skipped' if g.status == 'skip' else 'not evaluated'}: {g.note}"
            f"{hint[g.status]}" for g in result.gates if g.status in hint or g.name == "completeness"]


def _writer(command: str, fmt: str):
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: expected one of {', '.join(FORMATS)}")
    return globals()[f"{command}_{fmt}"]
