"""``diff --by op``: two reports' operator tables side by side (HTA's TraceDiff, by count and by time).

What is compared: CPU operators (``host.ops``, kind ``cpu_op``, by name) and GPU operations (``kernels``, by
full name and class, labelled by short name); ``by="kernel"`` the GPU side alone. Unlike HTA's, every rank and
every step of both inputs counts, CPU and GPU names never mix, and where both reports marked steps
(``host.steps``) each count and time is per step, so runs of different lengths compare; otherwise the totals
are compared and both runs must cover the same steps.

An operator is **added** (only in the new run), **removed** (only in the base), **changed** (its count per
step differs, or its time per step moved by more than ``tolerance`` of the base's) or **same**. A diff is
informational; with ``max_regression`` it is a gate: an operator present in the new run **regresses** when
its time per step grew by more than ``max_regression`` of its base time and by more than ``FLOOR`` of the
base's time of all operators of its kind (so an added operator fails when it takes more than that share,
and a tiny operator's jitter fails nothing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pipebubble.gates.diff import coverage, full_name

FLOOR = 0.01  # of the base's time of all operators of a kind (per step): the least growth that regresses
STATUSES = ("added", "removed", "changed", "same")  # the order rows are listed in
BY = ("op", "kernel")


@dataclass(frozen=True)
class OpChange:
    """One operator in both reports. ``kind``: ``cpu_op`` or ``kernel`` (a GPU operation; ``cls`` its class:
    compute, comm, memcpy, memset). ``base_count``, ``new_count``, ``base_ns``, ``new_ns`` and the deltas are
    as compared: per step when the diff is ``per_step``, else over each input; ``change`` is ``delta_ns`` over
    ``base_ns`` (None for an added operator); the ``*_total_*`` figures are over each whole input."""

    kind: str
    cls: str | None
    name: str
    name_full: str
    status: str
    base_count: float
    new_count: float
    base_ns: float
    new_ns: float
    delta_count: float
    delta_ns: float
    change: float | None
    base_total_count: int
    new_total_count: int
    base_total_ns: int
    new_total_ns: int
    regressed: bool = False


@dataclass(frozen=True)
class OpsDiff:
    """The operators of two reports (``rows``: added, removed, changed, then same; biggest time change first);
    ``per_step``: counts and times are per step (both reports marked ``base_steps`` and ``new_steps``)."""

    by: str
    tolerance: float
    rows: list[OpChange]
    per_step: bool
    base_steps: int | None = None
    new_steps: int | None = None
    max_regression: float | None = None
    notes: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)
    allow_partial: bool = False
    base: str | None = None
    new: str | None = None
    timestamp: str | None = None
    seconds: float | None = None

    def having(self, status: str) -> list[OpChange]:
        return [r for r in self.rows if r.status == status]

    @property
    def added(self) -> list[OpChange]:
        return self.having("added")

    @property
    def removed(self) -> list[OpChange]:
        return self.having("removed")

    @property
    def changed(self) -> list[OpChange]:
        return self.having("changed")

    @property
    def regressions(self) -> list[OpChange]:
        return [r for r in self.rows if r.regressed]

    @property
    def failed(self) -> bool:
        """Only a gate fails: a regression, or an incomplete input unless allowed (with ``max_regression``)."""
        gate = self.max_regression is not None
        return bool(self.regressions) or (gate and bool(self.incomplete) and not self.allow_partial)


def ops_diff(base: dict[str, Any], new: dict[str, Any], by: str = "op", tolerance: float = 0.05,
             max_regression: float | None = None, allow_partial: bool = False) -> OpsDiff:
    """The operator diff of two JSON reports (module docstring); ValueError for a bad ``by`` or fraction."""
    if by not in BY:
        raise ValueError(f"by {by!r}: expected one of {', '.join(BY)}")
    for what, value in (("tolerance", tolerance), ("max_regression", max_regression)):
        if value is not None and (not math.isfinite(value) or value < 0):
            raise ValueError(f"{what} {value}: expected a finite fraction >= 0, e.g. 0.05 (5%)")
    steps = [(r.get("host") or {}).get("steps") for r in (base, new)]
    per_step = bool(steps[0]) and bool(steps[1])
    tables = [table(r, by) for r in (base, new)]
    divide = (steps[0], steps[1]) if per_step else (1, 1)
    scale = _kind_totals(tables[0], divide[0])
    rows = [_row(key, tables[0].get(key), tables[1].get(key), divide, tolerance, max_regression, scale)
            for key in tables[0].keys() | tables[1].keys()]
    rows.sort(key=lambda r: (STATUSES.index(r.status), -abs(r.delta_ns), r.kind, r.name_full))
    notes = [_basis(per_step, steps)]
    return OpsDiff(by, tolerance, rows, per_step, steps[0], steps[1], max_regression, notes, coverage(base, new),
                   allow_partial)


def _basis(per_step: bool, steps: list[int | None]) -> str:
    if per_step:
        return f"per step: the base marked {steps[0]} step(s), the new run {steps[1]}"
    which = " and ".join(side for side, n in zip(("the base", "the new run"), steps, strict=True) if not n)
    return f"over each whole input ({which} marked no steps): both must cover the same steps"


Key = tuple[str, str | None, str]  # kind, class, full name


def table(report: dict[str, Any], by: str = "op") -> dict[Key, dict[str, Any]]:
    """A report's operators by key: name (shown), count and total time; CPU operators unless ``by`` is
    ``kernel``, then every GPU operation of the kernel table (by full name and class)."""
    rows: dict[Key, dict[str, Any]] = {}
    if by == "op":
        for op in (report.get("host") or {}).get("ops") or []:
            rows[("cpu_op", None, op["name"])] = {"name": op["name"], "count": op["count"], "total": op["total_ns"]}
    for k in report.get("kernels") or []:
        full = full_name(k)
        full = "(no name)" if full is None else full
        rows[("kernel", k.get("class"), full)] = {"name": k.get("name") or full, "count": k["count"],
                                                  "total": k["total_ns"]}
    return rows


def _kind_totals(rows: dict[Key, dict[str, Any]], steps: int) -> dict[str, float]:
    totals: dict[str, float] = {}
    for (kind, _, _), row in rows.items():
        totals[kind] = totals.get(kind, 0.0) + row["total"] / steps
    return totals


def _row(key: Key, a: dict | None, b: dict | None, divide: tuple[int, int], tolerance: float,
         max_regression: float | None, scale: dict[str, float]) -> OpChange:
    kind, cls, full = key
    ca, cb = (a or {}).get("count", 0), (b or {}).get("count", 0)
    ta, tb = (a or {}).get("total", 0), (b or {}).get("total", 0)
    base_ns, new_ns = ta / divide[0], tb / divide[1]
    # counts compared exactly: ca / sa != cb / sb  <=>  ca · sb != cb · sa
    moved = ca * divide[1] != cb * divide[0] or abs(new_ns - base_ns) > tolerance * base_ns
    status = "added" if a is None else "removed" if b is None else "changed" if moved else "same"
    grew = new_ns - base_ns
    regressed = (max_regression is not None and b is not None and grew > max_regression * base_ns
                 and grew > FLOOR * scale.get(kind, 0.0))
    return OpChange(kind, cls, (b or a or {})["name"], full, status, ca / divide[0], cb / divide[1], base_ns, new_ns,
                    cb / divide[1] - ca / divide[0], grew, grew / base_ns if base_ns else None, ca, cb, ta, tb,
                    regressed)
