"""The late ranks as findings: ``data_loader`` where a rank's loader makes it late, else ``late_rank`` with
why (entered its steps late, its GPU's compute, a synchronize, its host's operators, untraced host time, or
another rank it waited for).

Three numbers, each said for what it is:
- in all: the others' spin at the calls the rank arrived last to, summed over its peers and the trace's calls
  (the collectives' ``late_ns`` of the rank, as the straggler's note says it);
- a step: had the rank come on time, each such call would release at the second-last arrival: the least peer
  wait at each call it arrived last and late to, summed, divided by the job's steps (``worth_ns``);
- the worth: the part of that given to the finding's cause (the worth of each call split between entered
  late and inside in proportion to the lateness, the inside part given to the class the rank exceeded its
  peers by most there): what fixing that cause alone gives back. The title names both when they differ, the
  detail the rest by cause; entering the step late lies before the step, and fixing what the rank does inside
  its steps does not give it back.
Thin evidence (few calls, some ranks of a bigger job: ``collectives.thin_reasons``, or a rank late at fewer
than ``THIN_CALLS`` calls) is said in the title.
"""

from __future__ import annotations

from pipebubble.analysis.comm.collectives import thin_reasons
from pipebubble.analysis.findings.common import Step, finding, ms
from pipebubble.analysis.rootcause.result import LateRank
from pipebubble.report import THIN_CALLS, Collectives
from pipebubble.report.findings import Finding, Where
from pipebubble.report.words import cause_words

#: cause -> (what the title says, what to do); ``{who}`` is the rank.
WORDS = {
    "entered_late": ("enters its steps late (the delay lies before the step, not inside it)",
                     "capture more steps (or start the profile earlier) to see what holds {who} before its steps"),
    "data_loader": ("waits longer in its data loader", "give {who}'s DataLoader more workers, pin_memory and "
                    "prefetching, or move the input work off its critical path"),
    "gpu_compute": ("computes longer on its GPU before the collectives",
                    "look for uneven work on {who} (batch shapes, routing) or a slower or throttled GPU"),
    "sync": ("waits longer in synchronize calls (and the GPU's refill after them)",
             "remove {who}'s host syncs before the collective (.item(), .cpu(), torch.cuda.synchronize)"),
    "host_ops": ("spends longer in host operators and launches",
                 "cut {who}'s host overhead (CUDA graphs, torch.compile, fewer small kernels)"),
    "host_idle": ("spends longer in untraced host time", "profile {who}'s Python (py-spy) or add "
                  "record_function ranges to see it"),
    "comm": ("is held waiting for another rank", "fix what holds the rank it waits for"),
    "blocking_copy": ("waits longer in blocking copies (its GPU idles meanwhile)",
                      "copy from pinned memory with non_blocking=True on {who}"),
    "allocator": ("waits longer in the allocator (cudaMalloc / cudaFree)",
                  "keep {who}'s caching allocator warm (no empty_cache(), steady shapes)"),
    "startup": ("is still starting up (code loading, first launches)", "profile steady steps of {who}"),
    "dependency": ("waits longer on its own GPU's dependencies (events, other streams)",
                   "look at what {who}'s streams wait for before the collectives"),
    "unknown": ("is late for no cause its trace shows", "compare {who}'s trace with a peer's"),
}


def findings(late: list[LateRank], step_ns: int, steps: int | None = None, gpus: int = 1,
             collectives: Collectives | None = None, per: str = "step") -> list[Finding]:
    """One finding per late rank (most worth first), worth per step over ``steps`` (the job's; None: each
    rank's measured steps) of a ``step_ns`` step, freeing ``gpus`` GPUs; ``collectives``: the job's matched
    calls (what the others waited in all, and how thin the evidence is). ``per``: ``"window"`` for a trace
    without step markers (its window stands for the step, and the finding says so, never "a step")."""
    return [_finding(r, step_ns, steps or r.measured_steps, gpus, collectives, per) for r in late
            if sum(r.worth_ns) > 0]


def _finding(r: LateRank, step_ns: int, steps: int, gpus: int, coll: Collectives | None, per: str) -> Finding:
    """The finding of one late rank."""
    who = f"rank {r.rank}" if r.rank is not None else f"process {r.pid}"
    total, worth = sum(r.worth_ns) / steps, round(sum(r.cause_worth_ns) / steps)
    said, action = WORDS[r.cause]
    held = f": {_chain(r)}" if r.chain else ""
    thin = _thin(r, coll)
    title = f"{who} {said}{held}{_share(worth, total, per)}" + (
        f" (thin evidence: {', '.join(thin)})" if thin else "")
    evidence = {
        "steps": r.steps, "late_ns": r.late_ns, "entered_late_ns": r.entered_late_ns, "inside_ns": r.inside_ns,
        "worth_ns_per_step": r.worth_ns, "late_calls": r.calls, "measured_steps": r.measured_steps, **r.evidence,
    }
    return finding(
        "data_loader" if r.cause == "data_loader" else "late_rank", title,
        Where(ranks=[r.rank] if r.rank is not None else []), r.cause, evidence, worth, gpus,
        Step(step_ns, steps, per), action.format(who=who), _how(r, steps, total, _in_all(r, coll), per),
    )


def _share(worth: int, total: float, per: str) -> str:
    """What the others wait a step (or over the window) for the rank, and the cause's part of it where the
    rest shows."""
    each = "a step" if per == "step" else "over the window"
    if ms(worth) == ms(total):
        return f"; the others wait {ms(total)} {each} for it"
    return f": {ms(worth)} of the {ms(total)} {each} the others wait for it"


def _how(r: LateRank, steps: int, total: float, in_all: tuple[int, int] | None, per: str) -> str:
    """How the worth was computed, from the others' wait in all to the cause's part a step."""
    span = f"{steps:,} step{'s' * (steps != 1)}" if per == "step" else "the window"
    each = "a step" if per == "step" else "over the window"
    waited = (f"the others waited {ms(in_all[0])} in all at the {in_all[1]:,} calls it arrived last to ({span}, "
              f"summed over its peers); " if in_all else "")
    parts = sorted(r.evidence.get("worth_by_cause_ns", {}).items(), key=lambda kv: (-kv[1], kv[0]))
    split = ", ".join(f"{cause_words(c)} {ms(ns / steps)}" for c, ns in parts if round(ns / steps / 1e5))
    before = (" (entering late lies before its steps: fixing what it does inside them does not give that back)"
              if r.cause != "entered_late" and any(c == "entered_late" for c, _ in parts) else "")
    return (f"{waited}on time, each call would release at the second-last arrival: {ms(total)} {each} (the least "
            f"peer wait at each, summed, {'per step' if per == 'step' else 'over the window'}); by cause, in"
            f" proportion to its "
            f"lateness: {split}{before}; the worth is its cause's part ({cause_words(r.cause)})")


def _in_all(r: LateRank, coll: Collectives | None) -> tuple[int, int] | None:
    """The others' spin at the calls the rank arrived last to, summed over peers and calls, and how many
    calls (the collectives' row of the rank); None without one."""
    row = next((c for c in coll.ranks if (c.rank, c.pid) == (r.rank, r.pid)), None) if coll else None
    return None if row is None or not row.late_ns else (row.late_ns, row.last)


def _thin(r: LateRank, coll: Collectives | None) -> list[str]:
    """What makes the claim thin: the job's evidence across ranks, else a rank late at few of many calls."""
    job = thin_reasons(coll) if coll is not None else []
    few = coll is None or coll.support is None or coll.support.calls >= THIN_CALLS
    return job + ([f"late at only {r.calls} call{'s' * (r.calls != 1)}"] if few and r.calls < THIN_CALLS else [])


def _chain(r: LateRank) -> str:
    """The chain of waits as words: ``waits for rank 1 at recv #3 (GPU compute)``, link after link."""
    return ", which ".join(
        f"waits for {'rank ' + str(k.rank) if k.rank is not None else 'a process'} at {k.at} "
        f"({cause_words(k.cause)})" for k in r.chain)
