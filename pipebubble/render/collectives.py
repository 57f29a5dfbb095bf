"""The collectives section as strings: how the calls were matched across ranks, the straggler, the per-rank
table and the worst calls. Only formatting: every number is read from ``Report.collectives`` as it is."""

from __future__ import annotations

from pipebubble.render.cells import Table, num, time
from pipebubble.report import CollectiveRank, Report

TOP_CALLS = 10
MATCHED_BY = {"seq": "process group and sequence number", "order": "call order", "end": "their kernels' ends"}


def facts(report: Report, unit: str = "ms") -> list[str]:
    """One line per fact: what was matched (and left out), the spin summed, the straggler when there is one."""
    c = report.collectives
    if c is None:
        return []
    by = MATCHED_BY.get(c.matched_by, c.matched_by)
    lines = [f"{c.calls:,} collective calls matched across {len(c.ranks):,} ranks by {by}"
             + (f"; {c.unmatched:,} call{'s' * (c.unmatched != 1)} left out (not matched on every rank)"
                if c.unmatched else ""),
             f"collective wait: {time(c.waited_ns, unit)} {unit} over all ranks (kernels spinning until the last peer"
             " arrived)"]
    return lines + ([straggler(c.straggler, c.ranks, unit)] if c.straggler is not None else [])


def straggler(rank: int, ranks: list[CollectiveRank], unit: str = "ms") -> str:
    found = next((r for r in ranks if r.rank == rank), None)
    if found is None:
        return f"straggler: rank {rank}"
    return (f"straggler: rank {rank} arrived last at {found.last:,} of {found.calls:,} collectives;"
            f" others waited {time(found.late_ns, unit)} {unit} for it")


def rank_table(report: Report, limit: int | None = None, unit: str = "ms") -> Table:
    """One row per rank, the latest first (the ranks others waited for most lead; then those that waited most);
    ``limit``: at most that many rows, with a note of how many more."""
    ranks = report.collectives.ranks if report.collectives else []
    ordered = sorted(ranks, key=lambda r: (-r.late_ns, -r.last, -r.wait_ns, r.rank))
    shown = ordered if limit is None else ordered[:limit]
    lanes = any(r.lane for r in shown)
    rows = [[str(r.rank), *([r.lane or "-"] if lanes else []), num(r.calls), time(r.wait_ns, unit),
             time(r.late_ns, unit), num(r.last)] for r in shown]
    hidden = len(ordered) - len(shown)
    notes = (f"{hidden:,} more ranks not shown: --format json, markdown or html lists every rank",) if hidden else ()
    columns = ["rank", *(["lane"] if lanes else []), "calls", f"wait {unit}", f"late {unit}", "arrived last"]
    first = 2 if lanes else 1
    return Table("Collectives per rank (wait: spun until the last peer arrived; late: peers spun waiting for it)",
                 columns, rows, frozenset(range(first, first + 4)), notes, drop=("lane", "calls"))


def call_table(report: Report, origin_ns: int, unit: str = "ms") -> Table:
    """The worst calls in report order (the analysis lists the most waited first); `at` counts from the
    timeline's origin."""
    c = report.collectives
    calls = c.worst if c else []
    rows = [[w.name, num(w.seq), time(w.start_ns - origin_ns, unit), time(w.skew_ns, unit), f"rank {w.last_rank}",
             time(w.waited_ns, unit), num(w.ranks) if w.ranks else "-"] for w in calls[:TOP_CALLS]]
    shown = f" (top {len(rows)} of {len(calls)})" if len(calls) > len(rows) else ""
    return Table(f"Worst collective calls{shown}, most waited first (skew: first to last arrival; waited: the"
                 " peers' spin summed)",
                 ["call", "seq", f"at {unit}", f"skew {unit}", "last", f"waited {unit}", "ranks"], rows,
                 frozenset({1, 2, 3, 5, 6}), drop=("ranks", "seq", f"at {unit}"))
