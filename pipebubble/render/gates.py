"""Gate and diff results as text, Markdown, JSON, JUnit XML or GitHub Actions annotations. Strings only.

Which of these each command offers is in ``formats`` (the registry); ``render_check`` and ``render_diff``
dispatch through it.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import asdict

from pipebubble.gates import Delta, DiffResult, Gate

NAMED = 12  # regressions named in the one-line verdict (the table and JSON list them all)
STATUS = {"pass": "PASS", "fail": "FAIL", "skip": "SKIP"}


def _number(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "ns":
        return f"{value / 1e6:.3f} ms"
    if unit == "ms":
        return f"{value:.3f} ms"
    return f"{value:.3f}{unit}"


def _sentence(gate: Gate) -> str:
    """e.g. ``bubble 0.491 > max 0.300`` or ``bubble skipped: not a pipeline``."""
    if gate.passed is None:
        return f"{gate.name} skipped: {gate.note}"
    ok = gate.passed
    op = ("<=" if ok else ">") if gate.bound == "max" else (">=" if ok else "<")
    note = f" ({gate.note})" if gate.note else ""
    return f"{gate.name} {_number(gate.value, gate.unit)} {op} {gate.bound} {_number(gate.threshold, gate.unit)}{note}"


def _summary(gates: list[Gate]) -> str:
    counts = {status: sum(g.status == status for g in gates) for status in STATUS}
    return f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped"


def render_check(gates: list[Gate], fmt: str) -> str:
    """The gates as ``fmt``, one of ``formats.names("check")``; an unknown one raises ValueError naming them."""
    from pipebubble.render import formats

    return formats.get("check", fmt).render(gates, formats.Options())


def check_text(gates: list[Gate]) -> str:
    lines = [f"{STATUS[g.status]}  {_sentence(g)}" for g in gates]
    return "\n".join([*lines, _summary(gates)]) + "\n"


def check_json(gates: list[Gate]) -> str:
    body = {"passed": not any(g.status == "fail" for g in gates),
            "gates": [{**asdict(g), "status": g.status} for g in gates]}
    return json.dumps(body, indent=2, allow_nan=False) + "\n"


def check_junit(gates: list[Gate]) -> str:
    suite = ET.Element("testsuite", name="pipebubble check", tests=str(len(gates)),
                       failures=str(sum(g.status == "fail" for g in gates)),
                       skipped=str(sum(g.status == "skip" for g in gates)))
    for gate in gates:
        case = ET.SubElement(suite, "testcase", classname="pipebubble.check", name=gate.name)
        if gate.status == "fail":
            ET.SubElement(case, "failure", message=_sentence(gate))
        elif gate.status == "skip":
            ET.SubElement(case, "skipped", message=_sentence(gate))
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def _escape(text: str) -> str:
    """GitHub workflow-command escaping of a message (and of a property, which also escapes : and ,)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def check_github(gates: list[Gate]) -> str:
    lines = []
    for gate in gates:
        level = "error" if gate.status == "fail" else "notice"
        title = _escape(f"pipebubble check {gate.name} {gate.status}").replace(":", "%3A").replace(",", "%2C")
        lines.append(f"::{level} title={title}::{_escape(_sentence(gate))}")
    return "\n".join([*lines, _summary(gates)]) + "\n"


def _change(delta: Delta) -> str:
    return f"{delta.change:+.1%}"


def render_diff(result: DiffResult, fmt: str) -> str:
    """The diff as ``fmt``, one of ``formats.names("diff")``; an unknown one raises ValueError naming them."""
    from pipebubble.render import formats

    return formats.get("diff", fmt).render(result, formats.Options())


def _verdict(result: DiffResult) -> str:
    bad = result.regressions
    if not bad:
        return f"no regression beyond {result.tolerance:.1%} ({len(result.deltas)} metrics compared)"
    names = ", ".join(d.metric for d in bad[:NAMED]) + (f" and {len(bad) - NAMED} more" if len(bad) > NAMED else "")
    return f"{len(bad)} regression(s) beyond {result.tolerance:.1%}: {names}"


def diff_text(result: DiffResult) -> str:
    lines = [f"REGRESSED  {d.metric}: {_number(d.base, d.unit)} -> {_number(d.new, d.unit)} ({_change(d)})"
             for d in result.regressions]
    return "\n".join([*lines, *(f"note: {n}" for n in result.notes), _verdict(result)]) + "\n"


def diff_markdown(result: DiffResult) -> str:
    rows = [f"| {d.metric} | {_number(d.base, d.unit)} | {_number(d.new, d.unit)} | {_change(d)} | "
            f"{'**regressed**' if d.regressed else 'ok'} |" for d in result.deltas]
    head = ["## pipebubble diff", "", _verdict(result), "", "| metric | base | new | change | status |",
            "|---|---:|---:|---:|---|"]
    notes = [""] + [f"- {n}" for n in result.notes] if result.notes else []
    return "\n".join(head + rows + notes) + "\n"


def diff_json(result: DiffResult) -> str:
    body = {"regressed": bool(result.regressions), "tolerance": result.tolerance,
            "regressions": [d.metric for d in result.regressions], "notes": result.notes,
            "deltas": [asdict(d) for d in result.deltas]}
    return json.dumps(body, indent=2, allow_nan=False) + "\n"
