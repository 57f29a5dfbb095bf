"""The late rank at collectives: the straggler the others wait for.

Worth: the straggler's ``late_ns`` (its peers' spin at the calls it arrived last to) divided by its peers
(participants − 1) and by the job's steps. At each such call the collective's release, on the step's
critical path, waits for the last arrival; had it come on time the call would end when the second-last
did. For two participants that is exactly the peer's wait; for more, the mean of the peers' waits is used
(the wait of the second-last arrival is the least of them, so this is the upper end), never their sum.
Why the rank is late (its compute, data loader, host) needs per-rank data the report does not hold yet.
"""

from __future__ import annotations

from pipebubble.analysis.comm.collectives import support_words
from pipebubble.analysis.findings.common import finding, gpus, job_step, ms
from pipebubble.report import CollectiveRank, Collectives, Report
from pipebubble.report.findings import Finding, Where


def findings(report: Report) -> list[Finding]:
    """The late_rank finding, when the collectives name a straggler (a rank or a rankless process)."""
    coll, step = report.collectives, job_step(report)
    if coll is None or step is None:
        return []
    late = straggler(coll)
    if late is None or late.late_ns <= 0 or len(coll.ranks) < 2:
        return []
    peers = len(coll.ranks) - 1
    worth = round(late.late_ns / peers / step.count)
    who = f"rank {late.rank}" if late.rank is not None else f"process {late.pid}"
    thin = coll.support is not None and coll.support.thin
    return [finding(
        "late_rank", f"{who} arrives last at {late.last} of {late.calls} collectives: the others wait {ms(worth)} "
        f"{step.per_words}" + support_words(coll),
        Where(ranks=[late.rank] if late.rank is not None else [], gpus=[late.lane] if late.lane else []),
        "late at collectives" + (" (thin evidence)" if thin else ""),
        {"late_ns": late.late_ns, "last": late.last, "calls": late.calls, "peers": peers, "steps": step.count,
         "waited_ns": coll.waited_ns, "support": _support(coll)},
        worth, gpus(report), step, f"find what holds {who} before the collectives it arrives last to",
        f"the others waited {ms(late.late_ns)} in all at the calls it arrived last to (summed over its peers and "
        "calls), divided by its peers" + (" and steps: the mean peer wait at those calls, per step" if step.per ==
                                          "step" else ": the mean peer wait at those calls, over the window"),
    )]


def straggler(coll: Collectives) -> CollectiveRank | None:
    """The straggler's row: by rank, else by process (a trace without ranks)."""
    if coll.straggler is not None:
        return next((r for r in coll.ranks if r.rank == coll.straggler), None)
    if coll.straggler_pid is not None:
        return next((r for r in coll.ranks if r.rank is None and r.pid == coll.straggler_pid), None)
    return None


def _support(coll: Collectives) -> dict | None:
    """The support of the claim as plain values (calls, ranks, world, thin)."""
    s = coll.support
    return None if s is None else {"calls": s.calls, "ranks": s.ranks, "world": s.world, "thin": s.thin}
