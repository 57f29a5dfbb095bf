"""GitHub-flavoured Markdown, for PR comments: facts as a list, tables as pipe tables, the timeline in a code block."""

from __future__ import annotations

from pipebubble.render import sections, timeline
from pipebubble.render.sections import Table
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


def render(report: Report, width: int = 100, *, step: int | None = None, window: tuple[int, int] | None = None,
           lanes: bool = False) -> str:
    lines = ["## pipebubble report", ""]
    lines += [f"- {line}" for line in sections.ingest_lines(report) + sections.header(report)]
    lines.append("")
    if report.timeline:
        lines += timeline_block(report, width, step, window, lanes)
    origin = timeline.origin(report)
    tables = [sections.stage_table(report), sections.wait_table(report, origin), sections.recommendation_table(report)]
    if report.interference is not None:
        lines += ["### Serving: prefill / decode interference", ""]
        lines += [f"- {fact}" for fact in sections.interference_facts(report)] + [""]
        tables += [sections.step_table(report), sections.episode_table(report, origin)]
    for section in [*tables, sections.lane_table(report)]:
        if section.rows:
            lines += table(section)
    return "\n".join(lines).rstrip("\n") + "\n"
