"""GitHub-flavoured Markdown, for PR comments: facts as a list, tables as pipe tables, the timeline in a code block."""

from __future__ import annotations

from pipebubble.render import sections
from pipebubble.render.choices import TOP
from pipebubble.render.sections import (
    Table,
    collectives,
    findings,
    gpu_timeline,
    gputime,
    memory,
    pipeline,
    requests,
    serving,
    timeline,
)
from pipebubble.report import Report


def _cell(text: str) -> str:
    # A pipe would end the cell, a newline the row.
    return text.replace("|", "\\|").replace("\n", " ")


def table(section: Table) -> list[str]:
    align = ["---:" if i in section.numeric else "---" for i in range(len(section.columns))]
    lines = [f"### {section.title}", "", "| " + " | ".join(section.columns) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in section.rows]
    notes = sections.footnotes(section)
    return [*lines, "", *(f"{note}  " for note in notes), *([""] if notes else [])]


def timeline_block(report: Report, width: int, step: int | None, window: tuple[int, int] | None,
                   lanes: bool) -> list[str]:
    grid = timeline.build(report, width, step=step, window=window, lanes=lanes)
    return ["### Timeline", "", "```text", *timeline.plain_lines(grid), "```", "", timeline.legend(grid), ""]


def facts(report: Report, unit: str = "ms") -> list[str]:
    """What was read, the job's notes and the pipeline's header, one list item each."""
    lines = sections.ingest_lines(report) + sections.job_notes(report) + pipeline.header(report, unit)
    return [f"- {line}" for line in lines] + [""]


def collective_facts(report: Report, unit: str = "ms") -> list[str]:
    """The collectives' facts as a list under their heading (their tables are sections of their own)."""
    if report.collectives is None:
        return []
    return ["### Collectives", "", *(f"- {fact}" for fact in collectives.facts(report, unit)), ""]


def host(report: Report, unit: str = "ms") -> list[str]:
    """The host's launch facts as a list under their heading (its tables are sections of their own)."""
    if report.host is None:
        return []
    return ["### Host", "", *(f"- {fact}" for fact in gputime.host_facts(report, unit)), ""]


def gpu_timeline_section(report: Report, width: int) -> list[str]:
    """One step per GPU in a code block, the top findings marked."""
    if report.strips is None:
        return []
    return ["### GPU timeline", "", "```", *gpu_timeline.text(report.strips, width, findings.marks(report)), "```", ""]


def requests_section(report: Report, unit: str = "ms") -> list[str]:
    """The served requests' facts as a list under their heading."""
    lines = requests.facts(report, unit)
    return ["### Served requests", "", *(f"- {_cell(f)}" for f in lines), ""] if lines else []


def findings_section(report: Report, unit: str = "ms") -> list[str]:
    """The summary line as a heading, then each finding as a numbered item with its detail under it."""
    lines = [f"### {findings.summary(report)}", ""]
    for head, detail in findings.items(report, unit):
        lines += [_cell(head), f"   {_cell(detail)}", ""]
    return lines


def memory_section(report: Report, unit: str = "ms") -> list[str]:
    """The memory facts as a list under their heading, then its device and stage tables."""
    if not memory.shown(report):
        return []
    zero = timeline.origin(report)
    lines = ["### Memory", "", *(f"- {f}" for f in memory.memory_facts(report.memory, zero, unit)), ""]
    tables = memory.memory_tables(report.memory, zero, unit) if report.memory else []
    return lines + [line for t in tables for line in table(t)]


def legend(report: Report) -> list[str]:
    line = sections.legend(report)
    return [line, ""] if line else []


def interference(report: Report) -> list[str]:
    """The serving facts as a list under their heading (their tables are sections of their own)."""
    if report.interference is None:
        return []
    return ["### Serving: prefill / decode interference", "",
            *(f"- {fact}" for fact in serving.interference_facts(report)), ""]


def render(report: Report, width: int = 100, *, step: int | None = None, window: tuple[int, int] | None = None,
           lanes: bool = False, unit: str = "ms", top: int = TOP) -> str:
    """The report as one Markdown document, its sections in ``sections.SECTIONS`` order; times in ``unit``,
    ``top`` rows of the kernel, API and range tables, every row of the others."""
    drawn = {"facts": lambda: facts(report, unit),
             "timeline": lambda: timeline_block(report, width, step, window, lanes) if report.timeline else [],
             "collectives": lambda: collective_facts(report, unit), "interference": lambda: interference(report),
             "gpu_bars": list, "stage_bars": list, "host": lambda: host(report, unit), "legend": lambda: legend(report),
             "memory": lambda: memory_section(report, unit), "findings": lambda: findings_section(report, unit),
             "gpu_timeline": lambda: gpu_timeline_section(report, width),
             "requests": lambda: requests_section(report, unit)}
    lines = ["## pipebubble report", ""]
    for kind, section in sections.walk(report, timeline.origin(report), sections.Layout(unit, top)):
        lines += table(section) if section is not None else drawn[kind]()
    return "\n".join(lines).rstrip("\n") + "\n"
