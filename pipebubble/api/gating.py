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

R = TypeVar("R", gates.CheckResult, gates.DiffResult)


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


@public
@with_settings
def check(report: Any, *, max_bubble: float | str | None = None, max_excess_bubble: float | str | None = None,
          min_utilization: float | str | None = None, max_stage_cv: float | str | None = None,
          max_imbalance: float | str | None = None, max_wait_ms: float | str | None = None,
          max_decode_slowdown: float | str | None = None, max_finding: float | str | None = None,
          max_ttft_p99: float | str | None = None, max_tpot_p99: float | str | None = None,
          max_queue_p99: float | str | None = None, strict: bool = False, allow_partial: bool = False,
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
             "max_tpot_p99": max_tpot_p99, "max_queue_p99": max_queue_p99}
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
         allow_partial: bool = False, config: PathLike | None = None, **settings: Any) -> Diff:
    """Compare a run with a baseline as ``pipebubble diff`` does, without exiting: each is a Report (or paths,
    analysed with ``settings``); ``tolerance`` is the relative worsening allowed (``0.05`` or ``"5%"``; default
    the ``[diff]`` table of pipebubble.toml, else 5 %). An incomplete input fails unless ``allow_partial``.

    >>> r = pipebubble.analyze("sample_traces/pipeline_1f1b")
    >>> pipebubble.diff(r, r).regressions
    []
    """
    from pipebubble import config as configuration

    allowed = _tolerance(tolerance, configuration.load(_path(config)))
    started, clock = _now(), time.monotonic()
    reports = [made(subject, config, settings) for subject in (base, new)]
    for subject, report in zip((base, new), reports, strict=True):
        if not report.lanes:
            raise PipebubbleError(f"{_source(subject) or 'report'}: nothing to compare: the report has no lanes")
    try:
        result = gates.diff(reports[0].to_dict(), reports[1].to_dict(), allowed, strict, allow_partial)
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
