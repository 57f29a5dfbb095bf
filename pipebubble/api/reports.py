"""``analyze``: traces in, a ``Report`` out, whose tables are DataFrames and which a notebook shows as the HTML
report. The numbers are ``pipebubble.run``'s, from the same report cache as ``pipebubble analyze``."""

from __future__ import annotations

import os
import warnings
from dataclasses import fields
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipebubble import report as data
from pipebubble.api import frames
from pipebubble.api.settings import PathLike, Paths, path_list, public, settings, with_settings
from pipebubble.errors import OutputError, PipebubbleError

if TYPE_CHECKING:
    import pandas as pd
    import polars as pl

HTML_HEIGHT = 720  # px of the notebook frame that holds the HTML report (it scrolls, and can be dragged taller)


class Report:
    """One analysis: ``data`` is the ``pipebubble.report.Report`` dataclass (``r.data.pipeline.bubble_fraction``);
    each table is a polars DataFrame of the JSON report's rows (``r.stages``, ``r.kernels`` ...; ``tables``
    names them all); a notebook shows the HTML report.

    Times are int64 ns as in the JSON; ``unit`` ("ns", "us", "ms", "s") and ``relative`` (instants counted
    from the job's start, as the text's "at" columns) set every table's, or one call's (``table``).

    >>> r = pipebubble.analyze("sample_traces/pipeline_1f1b")
    >>> r.stages.sort("utilization").select("stage", "utilization", "fill_ns", "drain_ns")
    >>> r.unit, r.relative = "ms", True; r.waits   # start_ms from the job's start, dur_ms
    >>> r.to_pandas("kernels").head()      # with pandas installed
    >>> r.show("findings")                 # one section in a notebook
    >>> r.save("report.html")              # the format from the suffix, as ``-o``
    """

    tables = tuple(frames.TABLES)

    def __init__(self, report: data.Report, unit: str = "ns", relative: bool = False) -> None:
        self.data = report
        self.unit = unit
        self.relative = relative
        self._json: dict[str, Any] | None = None
        self._frames: dict[str, pl.DataFrame] = {}
        self._spans: pl.DataFrame | None = None

    @property
    def pipeline(self) -> data.Pipeline | None:
        """The pipeline's metrics (bubble, theory, step, what-if rows); None when the job is not a pipeline."""
        return self.data.pipeline

    @property
    def notes(self) -> list[str]:
        """What the job is (a pipeline or not, and why), as the report's notes say."""
        return list(self.data.notes)

    @property
    def warnings(self) -> list[str]:
        """What reading the traces warned about (events skipped, a file cut short)."""
        return list(self.data.ingest.warnings)

    @public
    def table(self, name: str, unit: str | None = None, relative: bool | None = None) -> pl.DataFrame:
        """Table ``name`` (one of ``tables``) as a polars DataFrame, its times in ``unit`` and its instants from
        the job's start when ``relative`` (each by default the report's ``unit`` and ``relative``)."""
        if name not in self._frames:
            self._frames[name] = frames.frame(self._dict(), frames.check_name(name))
        relative = self.relative if relative is None else relative
        return frames.timed(self._frames[name], unit or self.unit, self.origin_ns if relative else None)

    @property
    def origin_ns(self) -> int:
        """The job's start on the trace clock: where the text's "at" times and ``relative`` tables count from
        (the pipeline's first step window, else the first work of any lane)."""
        from pipebubble.render.sections.timeline import origin

        return origin(self.data)

    @property
    def spans(self) -> pl.DataFrame:
        """The span table of the traces analysed (name, kind, lane, rank, stream, correlation, start, end ...,
        int64 ns), each file on the job's one clock as the report put it; read (through the cache) on first
        use. Empty for a report read back from JSON whose traces are gone."""
        if self._spans is None:
            self._spans = _spans(self.data)
        return frames.timed_spans(self._spans, self.unit, self.origin_ns if self.relative else None)

    @public
    def queue_series(self, unit: str | None = None, relative: bool | None = None) -> pl.DataFrame:
        """Each GPU stream's launch queue as it changes, from the span table (``spans``): lane, rank, stream,
        ``at_ns`` and ``queue``, the length from that instant until the stream's next row (its last is 0).
        The ``launch_queue`` table summarises it; ``unit`` and ``relative`` as ``table``'s."""
        from pipebubble.analysis.launch import queue_series

        if self._spans is None:
            self._spans = _spans(self.data)
        relative = self.relative if relative is None else relative
        return frames.timed(queue_series(self._spans), unit or self.unit, self.origin_ns if relative else None)

    @public
    def show(self, section: str) -> Any:
        """One section in a notebook as the HTML report shows it (``findings``, ``facts``, ``timeline``,
        ``stages`` ...: ``pipebubble.render.sections.SECTIONS``), or a table only a frame holds (``idle``,
        ``steps`` ...) as its DataFrame."""
        from pipebubble.render import html
        from pipebubble.render.sections import SECTIONS

        if section in SECTIONS:
            return _Html(html.render(self.data, only=section))
        if section in frames.TABLES:
            return self.table(section)
        raise PipebubbleError(f"unknown section {section!r}: expected a section ({', '.join(SECTIONS)}) or a "
                              f"table ({', '.join(self.tables)})")

    @public
    def to_pandas(self, name: str) -> pd.DataFrame:
        """Table ``name`` as a pandas DataFrame (nullable types); a PipebubbleError when pandas is absent."""
        return frames.to_pandas(self.table(name))

    def to_dict(self) -> dict[str, Any]:
        """The JSON report, equal to ``pipebubble analyze ... --format json``."""
        return self.data.to_dict()

    @public
    def render(self, format: str = "text", **options: Any) -> str:
        """The report in ``format`` (text, json, markdown, html or csv), with the CLI's output options as keyword
        arguments: ``width``, ``timeunit`` ("ms"), ``top``, ``table`` (csv's), ``step``, ``window``, ``lanes``."""
        from pipebubble.render import formats

        try:
            return _render(formats.get("analyze", format), self.data, options)
        except ValueError as exc:
            raise PipebubbleError(str(exc)) from None

    @public
    def save(self, path: PathLike, format: str | None = None, **options: Any) -> Path:
        """Write the report to ``path`` in ``format``, else the one its suffix names (``.html``, ``.json``,
        ``.md``, ``.csv``, ``.txt``), as ``pipebubble analyze -o`` does; the file is written whole or not at all.
        ``options`` as ``render``'s. Returns the path."""
        from pipebubble.render import formats

        path = Path(path)
        try:  # the suffix's message names the path
            text = _render(formats.pick("analyze", format, path), self.data, options)
        except ValueError as exc:
            raise PipebubbleError(str(exc)) from None
        _write(path, text)
        return path

    def _repr_html_(self) -> str:
        """The HTML report in a frame of its own, so that its page style stays off the notebook's."""
        from pipebubble.render import html

        page = escape(html.render(self.data), quote=True)
        return (f'<iframe srcdoc="{page}" title="pipebubble report" style="width:100%;height:{HTML_HEIGHT}px;'
                'border:1px solid #ddd;resize:vertical"></iframe>')

    def __repr__(self) -> str:
        from pipebubble.render.sections import headline

        files = self.data.ingest.files
        shown = f": {files[0]}" + (", …" if len(files) > 1 else "") if files else ""
        head = f"pipebubble.Report of {len(files)} file{'s' * (len(files) != 1)}{shown}"
        cards = [f"  {label}: {value}" for value, label, _ in headline(self.data)]
        counts = ", ".join(f"{name} ({len(frames.rows(self._dict(), name))})" for name in self.tables)
        return "\n".join([head, *cards, f"  tables: {counts}"])

    def _dict(self) -> dict[str, Any]:
        if self._json is None:
            self._json = self.data.to_dict()
        return self._json


class _Html:
    """One section's HTML page, which a notebook shows in a frame of its own (its style stays off the
    notebook's), as the whole report."""

    def __init__(self, text: str) -> None:
        self.text = text

    def _repr_html_(self) -> str:
        return (f'<iframe srcdoc="{escape(self.text, quote=True)}" title="pipebubble section" style="width:100%;'
                f'height:{HTML_HEIGHT // 2}px;border:1px solid #ddd;resize:vertical"></iframe>')

    def __repr__(self) -> str:
        return self.text


def _spans(report: data.Report) -> pl.DataFrame:
    """The report's files read again (the cache makes it cheap) into one span table, each file moved by its
    clock offset as the analysis moved it."""
    import polars as pl

    from pipebubble import spans
    from pipebubble.ingest import load

    present = [Path(f) for f in report.ingest.files if Path(f).exists()]
    if not present or data.is_saved_report(present[0]):
        return spans.empty()
    table = load(present).spans
    moved = {c.source: c.offset_ns for c in report.ingest.clock_offsets if c.aligned and c.offset_ns}
    if not moved:
        return table
    offset = pl.col("source").replace_strict(moved, default=0, return_dtype=pl.Int64)
    return table.with_columns(start=pl.col("start") - offset, end=pl.col("end") - offset)


def _table_attribute(name: str) -> property:
    return property(lambda self: self.table(name), doc=f"{frames.TABLES[name].doc} (a polars DataFrame)")


for _name in frames.TABLES:  # r.lanes, r.stages, ...: one attribute per table of the registry
    setattr(Report, _name, _table_attribute(_name))


@public
@with_settings
def analyze(paths: Paths, *, config: PathLike | None = None, **given: Any) -> Report:
    """The report of the traces under ``paths`` (a file, a folder of per-rank traces, a saved JSON report, or
    a list of them), with the settings of ``pipebubble analyze`` as keyword arguments (``pp_size=4``,
    ``stage_by="rank"``, ``cache=False``; see ``pipebubble.Settings``) over those of ``config`` (default:
    pipebubble.toml found upward, as the CLI). Read warnings are issued as ``UserWarning``.

    >>> import pipebubble as pb
    >>> r = pb.analyze("sample_traces/pipeline_1f1b", gpu_cost=3.0)
    >>> r.pipeline.bubble_fraction, r.stages.height
    """
    return Report(made(paths, config, given))


def made(subject: Any, config: PathLike | None, given: dict[str, Any]) -> data.Report:
    """The report ``subject`` is (a Report, the dataclass, or a JSON report's dict) or makes (paths), read with
    the settings ``given`` over those of ``config``; settings given with a report already made are refused,
    since they would change nothing."""
    ready = _ready(subject)
    if ready is not None:
        if given:
            raise PipebubbleError(f"settings ({', '.join(given)}) apply to traces, not to a report already made: "
                                  "pass the paths instead")
        return ready
    from pipebubble.ingest import cache
    from pipebubble.run import run

    chosen, found = settings(given), path_list(subject)
    report = run(found, chosen.options(config), chosen.scale())
    saved = len(found) == 1 and data.is_saved_report(found[0])  # its warnings were shown when it was made
    for line in dict.fromkeys([*([] if saved else report.ingest.warnings), *cache.warnings()]):
        warnings.warn(f"pipebubble: {line}", UserWarning, stacklevel=4)
    return report


def _ready(subject: Any) -> data.Report | None:
    if isinstance(subject, Report):
        return subject.data
    if isinstance(subject, data.Report):
        return subject
    if isinstance(subject, dict):
        return data.Report.from_dict(subject)
    return None


def _render(fmt: Any, report: data.Report, options: dict[str, Any]) -> str:
    from pipebubble.render import choices, formats

    known = {f.name for f in fields(formats.Options)} - {"spans", "color"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"unknown output option {unknown[0]!r}: expected one of {', '.join(sorted(known))}")
    if options.get("table") is not None and fmt.name != "csv":
        raise ValueError(f"table= chooses the table of the csv format, not of {fmt.name}")
    if options.get("timeunit", "ms") not in choices.TIME_UNITS:
        raise ValueError(f"timeunit={options['timeunit']!r}: expected one of {', '.join(choices.TIME_UNITS)}")
    text = fmt.render(report, formats.Options(**options))
    return text if isinstance(text, str) else text.decode()


def _write(path: Path, text: str) -> None:
    """``text`` to ``path`` through a temporary file beside it, so a failed write leaves no half file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        if path.is_dir():
            raise IsADirectoryError(21, "is a directory")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputError(path, exc.strerror or str(exc)) from None
