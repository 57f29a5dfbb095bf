"""Rich terminal output. Renderables only: the CLI decides where they go."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from pipebubble.report import Report


def ms(ns: int) -> str:
    return f"{ns / 1e6:,.3f}"


def pct(x: float) -> str:
    return f"{100 * x:.2f} %"


def lanes_table(report: Report) -> Table:
    table = Table(title="Lanes (busy = union of work; window = first to last busy instant)", title_justify="left")
    for col, justify in [("lane", "left"), ("kind", "left"), ("busy ms", "right"), ("idle ms", "right"),
                         ("window ms", "right"), ("idle", "right")]:
        table.add_column(col, justify=justify, no_wrap=col != "lane")
    for lane in report.lanes:
        table.add_row(lane.lane, lane.kind, ms(lane.busy_ns), ms(lane.idle_ns), ms(lane.window_ns),
                      pct(lane.idle_fraction))
    return table


def ingest_lines(report: Report) -> Text:
    ing = report.ingest
    text = Text(f"{len(ing.files)} file(s), {ing.events_read:,} events, {ing.spans:,} spans")
    if ing.skipped:
        text.append("; not spans: " + ", ".join(f"{k} {v:,}" for k, v in ing.skipped.items()))
    for warning in ing.warnings:
        text.append(f"\nwarning: {warning}", style="yellow")
    return text


def render(report: Report) -> RenderableType:
    return Group(ingest_lines(report), lanes_table(report))
