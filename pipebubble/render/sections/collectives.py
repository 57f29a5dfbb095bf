"""The collectives section as strings: how the calls were matched across ranks, the straggler, the per-rank
table and the worst calls. Only formatting: every number is read from ``Report.collectives`` as it is."""

from __future__ import annotations

from pipebubble.render.cells import Table, num, time
from pipebubble.report import THIN_CALLS, CollectiveRank, Report

TOP_CALLS = 10
MATCHED_BY = {"seq": "process group and sequence number", "order": "call order", "end": "their kernels' ends"}


def who(rank: int | None, pid: int | None = None) -> str:
    """A participant as text: ``rank 3``, or ``process 144`` where the trace names no ranks."""
    if rank is not None:
        return f"rank {rank}"
    return f"process {pid}" if pid is not None else "-"


def facts(report: Report, unit: str = "ms") -> list[str]:
    """One line per fact: what was matched (and left out, by reason), the spin summed, the straggler when there
    is one, and once, what makes the evidence thin."""
    c = report.collectives
    if c is None:
        return []
    by = MATCHED_BY.get(c.matched_by, c.matched_by)
    kind = "ranks" if all(r.rank is not None for r in c.ranks) else "participants"
    left = ", ".join(f"{n:,} {WHY.get(k, k)}" for k, n in c.left_out.items())
    left = left or "not matched on every rank"
    lines = [f"{c.calls:,} collective calls matched across {len(c.ranks):,} {kind} by {by}"
             + (f"; {c.unmatched:,} call{'s' * (c.unmatched != 1)} left out ({left})" if c.unmatched else ""),
             f"collective wait: {time(c.waited_ns, unit)} {unit} over all {kind} (kernels spinning until the last"
             " peer arrived)"]
    if c.straggler is not None or c.straggler_pid is not None:
        lines.append(straggler(c.straggler, c.ranks, unit, c.straggler_pid))
    s = c.support
    if s is not None and s.thin:
        words = ([f"only {s.calls} matched call{'s' * (s.calls != 1)}"] if s.calls < THIN_CALLS else []) + (
            [f"{s.ranks:,} of the job's {s.world:,} ranks traced"] if s.world is not None else [])
        lines.append("evidence across ranks is thin: " + ", ".join(words))
    return lines


#: Left-out reasons in words (``analysis.collectives.LEFT_OUT``).
WHY = {"outside_window": "outside some member's trace", "no_peer": "without a traced peer",
       "unmatched": "with no call ending with them on some member", "not_together": "not overlapping"}


def straggler(rank: int | None, ranks: list[CollectiveRank], unit: str = "ms", pid: int | None = None) -> str:
    found = next((r for r in ranks if (r.rank, r.pid) == (rank, pid)), None)
    if found is None:
        return f"straggler: {who(rank, pid)}"
    return (f"straggler: {who(rank, pid)} arrived last at {found.last:,} of {found.calls:,} collectives;"
            f" others waited {time(found.late_ns, unit)} {unit} in all at those calls, summed over peers and calls")


def rank_table(report: Report, limit: int | None = None, unit: str = "ms") -> Table:
    """One row per rank, the latest first (the ranks others waited for most lead; then those that waited most);
    ``limit``: at most that many rows, with a note of how many more."""
    ranks = report.collectives.ranks if report.collectives else []
    ordered = sorted(ranks, key=lambda r: (-r.late_ns, -r.last, -r.wait_ns, r.rank is None, r.rank or r.pid or 0))
    shown = ordered if limit is None else ordered[:limit]
    lanes = any(r.lane for r in shown)
    rows = [[str(r.rank) if r.rank is not None else f"process {r.pid}", *([r.lane or "-"] if lanes else []),
             num(r.calls), time(r.wait_ns, unit),
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
    rows = [[w.name, num(w.seq), time(w.start_ns - origin_ns, unit), time(w.skew_ns, unit),
             who(w.last_rank, w.last_pid),
             time(w.waited_ns, unit), num(w.ranks) if w.ranks else "-"] for w in calls[:TOP_CALLS]]
    shown = f" (top {len(rows)} of {len(calls)})" if len(calls) > len(rows) else ""
    return Table(f"Worst collective calls{shown}, most waited first (skew: first to last arrival; waited: the"
                 " peers' spin summed)",
                 ["call", "seq", f"at {unit}", f"skew {unit}", "last", f"waited {unit}", "ranks"], rows,
                 frozenset({1, 2, 3, 5, 6}), drop=("ranks", "seq", f"at {unit}"))
