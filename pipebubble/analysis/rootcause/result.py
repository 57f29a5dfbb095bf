"""Reduce, last step: one ``LateRank`` per rank the others wait for, with its lateness per step split into
entered late and inside, the cause, the step time a fix saves and the chain of waits behind it."""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from pipebubble.analysis.comm.collectives import pid_of, rank_of
from pipebubble.analysis.rootcause.chain import Link, follow
from pipebubble.analysis.rootcause.late import by_cause, per_call
from pipebubble.analysis.rootcause.part import CLASSES

#: A rank is late (not only the straggler) when it is the late last arrival at this share of the late calls.
MATERIAL = 0.1


@dataclass(frozen=True)
class LateRank:
    """A rank (or rankless process, ``pid``) its peers waited for, per step it was late in (``steps``; None:
    calls outside every profiler step): ``late_ns`` = ``entered_late_ns`` + ``inside_ns`` (summed over its late
    calls), ``worth_ns`` the step time its being on time saves (the least peer wait at each call, summed);
    ``cause`` the largest share of its lateness (``entered_late`` or a ``late.CAUSES`` value),
    ``cause_worth_ns`` its part of the worth; ``measured_steps`` how many steps its trace holds."""

    rank: int | None
    pid: int | None
    steps: list[int | None]
    late_ns: list[int]
    entered_late_ns: list[int]
    inside_ns: list[int]
    worth_ns: list[int]
    cause: str
    cause_worth_ns: list[int]
    calls: int
    measured_steps: int
    evidence: dict = field(default_factory=dict)
    chain: list[Link] = field(default_factory=list)


def late_ranks(windows: pl.DataFrame, matched: pl.DataFrame, pairs: pl.DataFrame | None,
               material: float = MATERIAL) -> list[LateRank]:
    """Reduce: the late ranks of the job, most worth first, from every file's ``part.windows`` (on the job's
    clock), the matched collectives (``collectives.match``) and the paired sends and receives
    (``p2p.match``'s pairs; None: none)."""
    calls = per_call(windows, matched)
    if calls.is_empty():
        return []
    counts = calls.group_by("who").len()
    late = counts.filter(pl.col("len") >= material * calls.height)["who"].to_list()
    parts = by_cause(calls)
    found = [_late_rank(who, calls, parts, windows, matched, pairs) for who in late]
    return sorted(found, key=lambda r: (-sum(r.worth_ns), r.rank if r.rank is not None else -1))


def _late_rank(who: int, calls: pl.DataFrame, parts: pl.DataFrame, windows: pl.DataFrame, matched: pl.DataFrame,
               pairs: pl.DataFrame | None) -> LateRank:
    """The ``LateRank`` of participant ``who``."""
    mine, own = calls.filter(pl.col("who") == who), parts.filter(pl.col("who") == who)
    totals = own.group_by("cause").agg(pl.col("late", "worth").sum()).sort("late", "cause", descending=[True, False])
    cause = totals["cause"][0]
    steps = mine.group_by("step").agg(
        late=pl.col("lateness").sum(), entered=pl.col("entered").sum(), inside=pl.col("inside").sum(),
        worth=pl.col("worth").sum()).sort("step", nulls_last=True)
    of_cause = steps.select("step").join(own.filter(pl.col("cause") == cause), on="step", how="left", nulls_equal=True)
    measured = windows.filter(pl.col("who") == who)["step"].drop_nulls().n_unique()
    chain = []
    if cause == "comm":
        top = mine.filter(pl.col("cause") == "comm").sort("worth", descending=True).row(0, named=True)
        chain = follow(who, top["opened"], top["arrival"], matched, pairs, calls, windows)
    evidence = {
        "late_by_cause_ns": dict(totals.select("cause", "late").iter_rows()),
        "worth_by_cause_ns": dict(totals.select("cause", "worth").iter_rows()),
        "excess_ns": {c: int(mine[f"x_{c}"].clip(lower_bound=0).sum()) for c in CLASSES},
        "late_calls": mine.height,
    }
    return LateRank(
        rank_of(who), pid_of(who), steps["step"].to_list(), steps["late"].to_list(), steps["entered"].to_list(),
        steps["inside"].to_list(), steps["worth"].to_list(), cause, of_cause["worth"].fill_null(0).to_list(),
        mine.height, max(measured, 1), evidence, chain,
    )
