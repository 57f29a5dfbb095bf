"""``check`` and ``diff``: the CI gates of ``pipebubble check`` and ``pipebubble diff`` as calls that return their
verdict (truthy when it passes) instead of an exit code."""

from __future__ import annotations

import os
import time
from dataclasses import fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from pipebubble import gates
from pipebubble.api.reports import made
from pipebubble.api.settings import PathLike, public, with_settings
from pipebubble.errors import PipebubbleError
from pipebubble.gates import ops

R = TypeVar("R", gates.CheckResult, gates.DiffResult, ops.OpsDiff)


class _Verdict:
    """What Check and Diff add to the gates' results: truth, and how a notebook and ``print`` show them."""

    failed: bool
    command = ""

    @property
    def passed(self) -> bool:
        return not self.failed

    def __bool__(self) -> bool:
        return self.passed

    def render(self, format: str = "text", timeunit: str = "ms") -> str:
        """The verdict as ``pipebubble check/diff --format`` writes it: text, json, junit, github or markdown."""
        from pipebubble.render import gates as rendered

        try:
            return getattr(rendered, f"render_{self.command}")(self, format, timeunit)
        except ValueError as exc:
            raise PipebubbleError(str(exc)) from None

    def __repr__(self) -> str:
        return self.render("text").rstrip("\n")

    def _repr_markdown_(self) -> str:
        return self.render("markdown")


class Check(_Verdict, gates.CheckResult):
    """The gates of one run (``gates``: each with its value, threshold and status pass, fail or skip);
    ``passed`` (and the truth of the result) is False when any failed."""

    command = "check"


class Diff(_Verdict, gates.DiffResult):
    """Two reports metric by metric: ``regressions`` and ``improvements`` (each a ``gates.Delta``), ``notes``
    and ``unmatched`` (what only one report has); ``passed`` is False on a regression (or, ``strict``, on
    something unmatched)."""

    command = "diff"


class OpsDiff(_Verdict, ops.OpsDiff):
    """Two reports operator by operator (``diff(..., by="op")``): ``rows`` (each a ``gates.ops.OpChange``),
    ``added``, ``removed``, ``changed``, and ``frame``, one row per operator as a polars DataFrame; ``passed``
    is False only on a regression beyond ``max_op_regression`` (without it the diff is informational)."""

    command = "ops"

    def render(self, format: str = "text", timeunit: str = "ms") -> str:
        """The diff as ``pipebubble diff --by op --format`` writes it: text, json, junit, github or markdown."""
        from pipebubble.render.gates_ops import render_ops

        try:
            return render_ops(self, format, timeunit)
        except ValueError as exc:
            raise PipebubbleError(str(exc)) from None

    @property
    def frame(self) -> Any:
        """One row per operator, the ``OpChange`` fields as columns (``class`` for ``cls``)."""
        import polars as pl

        names = [f.name for f in fields(ops.OpChange)]
        columns = {("class" if n == "cls" else n): [getattr(r, n) for r in self.rows] for n in names}
        schema = {**{n: pl.Float64 for n in ("base_count", "new_count", "base_ns", "new_ns", "delta_count",
                                            "delta_ns", "change")},
                  **{n: pl.Int64 for n in ("base_total_count", "new_total_count", "base_total_ns", "new_total_ns")},
                  "kind": pl.String, "class": pl.String, "name": pl.String, "name_full": pl.String,
                  "status": pl.String, "regressed": pl.Boolean}
        return pl.DataFrame(columns, schema={k: schema[k] for k in columns})


@public
@with_settings
def check(report: Any, *, max_bubble: float | str | None = None, max_excess_bubble: float | str | None = None,
          min_utilization: float | str | None = None, max_stage_cv: float | str | None = None,
          max_imbalance: float | str | None = None, max_wait_ms: float | str | None = None,
          max_decode_slowdown: float | str | None = None, max_finding: float | str | None = None,
          max_ttft_p99: float | str | None = None, max_tpot_p99: float | str | None = None,
          max_queue_p99: float | str | None = None, max_preemptions: float | str | None = None,
          strict: bool = False, allow_partial: bool = False,
          config: PathLike | None = None, **settings: Any) -> Check:
    """Gate a run as ``pipebubble check`` does, without exiting: ``report`` is a Report (or paths, analysed
    with ``settings``); thresholds as its flags take them (``max_bubble=0.3`` or ``"30%"``,
    ``max_wait_ms="500us"``), over the ``[check]`` table of pipebubble.toml. ``strict``: a gate the report
    cannot evaluate fails. An incomplete input (a file cut off, events lost, ranks missing) fails first unless
    ``allow_partial``.

    >>> result = pipebubble.check("sample_traces/pipeline_1f1b", max_bubble=0.05)
    >>> result.passed, [g.status for g in result.gates]
    (False, ['fail'])
    """
    from pipebubble import config as configuration

    given = {"max_bubble": max_bubble, "max_excess_bubble": max_excess_bubble, "min_utilization": min_utilization,
             "max_stage_cv": max_stage_cv, "max_imbalance": max_imbalance, "max_wait_ms": max_wait_ms,
             "max_decode_slowdown": max_decode_slowdown, "max_finding": max_finding, "max_ttft_p99": max_ttft_p99,
             "max_tpot_p99": max_tpot_p99, "max_queue_p99": max_queue_p99, "max_preemptions": max_preemptions}
    thresholds = _thresholds(given, configuration.load(_path(config)))
    started, clock = _now(), time.monotonic()
    judged = made(report, config, settings)
    try:
        result = gates.check(judged.to_dict(), thresholds, strict, allow_partial)
    except ValueError as exc:
        raise PipebubbleError(str(exc)) from None
    return _as(Check, result, source=_source(report), timestamp=started, seconds=time.monotonic() - clock)


@public
@with_settings
def diff(base: Any, new: Any, *, tolerance: float | str | None = None, strict: bool = False,
         allow_partial: bool = False, by: str | None = None, max_op_regression: float | str | None = None,
         config: PathLike | None = None, **settings: Any) -> Diff | OpsDiff:
    """Compare a run with a baseline as ``pipebubble diff`` does, without exiting: each is a Report (or paths,
    analysed with ``settings``); ``tolerance`` is the relative worsening allowed (``0.05`` or ``"5%"``; default
    the ``[diff]`` table of pipebubble.toml, else 5 %). An incomplete input fails unless ``allow_partial``.
    ``by="op"`` (CPU operators and GPU kernels) or ``"kernel"`` (GPU kernels alone) compares operators
    instead (``gates.ops``: added, removed, changed beyond ``tolerance``), an ``OpsDiff`` whose ``frame`` is
    a DataFrame; it fails only where ``max_op_regression`` is given and an operator's time grew beyond it.

    >>> r = pipebubble.analyze("sample_traces/pipeline_1f1b")
    >>> pipebubble.diff(r, r).regressions
    []
    >>> pipebubble.diff(r, r, by="op").added
    []
    """
    from pipebubble import config as configuration

    allowed = _tolerance(tolerance, configuration.load(_path(config)))
    started, clock = _now(), time.monotonic()
    reports = [made(subject, config, settings) for subject in (base, new)]
    for subject, report in zip((base, new), reports, strict=True):
        if not report.lanes:
            raise PipebubbleError(f"{_source(subject) or 'report'}: nothing to compare: the report has no lanes")
    dicts = [report.to_dict() for report in reports]
    try:
        if by is not None:
            most = None if max_op_regression is None else gates.parse_tolerance(max_op_regression,
                                                                                "max_op_regression")
            found = ops.ops_diff(*dicts, by=by, tolerance=allowed, max_regression=most, allow_partial=allow_partial)
            return _as(OpsDiff, found, base=_source(base), new=_source(new), timestamp=started,
                       seconds=time.monotonic() - clock)
        result = gates.diff(*dicts, allowed, strict, allow_partial)
    except ValueError as exc:
        raise PipebubbleError(str(exc)) from None
    return _as(Diff, result, base=_source(base), new=_source(new), timestamp=started,
               seconds=time.monotonic() - clock)


def _thresholds(given: dict[str, Any], config: Any) -> dict[str, float]:
    """The gates to run (``gates.thresholds``, worded as the keyword arguments)."""
    try:
        return gates.thresholds(given, config, lambda key: key)
    except ValueError as exc:
        raise PipebubbleError(str(exc)) from None


def _tolerance(given: float | str | None, config: Any) -> float:
    try:
        return gates.tolerance(given, config, "tolerance")
    except ValueError as exc:
        raise PipebubbleError(str(exc)) from None


def _as(cls: type[R], result: R, **changes: Any) -> R:
    """``result`` as ``cls`` (Check or Diff), with ``changes``."""
    return cls(**{f.name: getattr(result, f.name) for f in fields(result)} | changes)


def _source(subject: Any) -> str | None:
    """What the outputs name as the input judged: the path given, the folder that holds the paths given, or
    None for a report already made."""
    if isinstance(subject, str | os.PathLike):
        return str(subject)
    if not isinstance(subject, list | tuple) or not subject:
        return None
    try:
        return os.path.commonpath([str(p) for p in subject]) if len(subject) > 1 else str(subject[0])
    except ValueError:  # absolute and relative paths mixed
        return str(subject[0])


def _path(config: PathLike | None) -> Path | None:
    return None if config is None else Path(config)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
