"""The late ranks as findings: ``data_loader`` where a rank's loader makes it late, else ``late_rank`` with
why (entered its steps late, its GPU's compute, a synchronize, its host's operators, untraced host time, or
another rank it waited for).

Worth (per step): a ``late_rank`` finding's is all of the rank's worth (the least peer wait at each call it
arrived last and late to, summed, divided by the job's steps): on time, each such call would release at the
second-last arrival. A ``data_loader`` finding's is the loader's part of it (the worth of each call split
between entered late and inside in proportion to the lateness, the inside part the loader's where the
loader was the class the rank exceeded its peers by most there).
"""

from __future__ import annotations

from pipebubble.analysis.findings.common import finding, ms
from pipebubble.analysis.rootcause.result import LateRank
from pipebubble.report.findings import Finding, Where

#: cause -> (what the title says, what to do); ``{who}`` is the rank.
WORDS = {
    "entered_late": ("enters its steps late (the delay lies before the step, not inside it)",
                     "capture more steps (or start the profile earlier) to see what holds {who} before its steps"),
    "data_loader": ("waits longer in its data loader", "give {who}'s DataLoader more workers, pin_memory and "
                    "prefetching, or move the input work off its critical path"),
    "gpu_compute": ("computes longer on its GPU before the collectives",
                    "look for uneven work on {who} (batch shapes, routing) or a slower or throttled GPU"),
    "sync": ("waits longer in synchronize calls", "remove {who}'s host syncs before the collective "
             "(.item(), .cpu(), torch.cuda.synchronize)"),
    "host_ops": ("spends longer in host operators and launches",
                 "cut {who}'s host overhead (CUDA graphs, torch.compile, fewer small kernels)"),
    "host_idle": ("spends longer in untraced host time", "profile {who}'s Python (py-spy) or add "
                  "record_function ranges to see it"),
    "comm": ("is held waiting for another rank", "fix what holds the rank it waits for"),
    "unknown": ("is late for no cause its trace shows", "compare {who}'s trace with a peer's"),
}


def findings(late: list[LateRank], step_ns: int, steps: int | None = None, gpus: int = 1) -> list[Finding]:
    """One finding per late rank (most worth first), worth per step over ``steps`` (the job's; None: each
    rank's measured steps) of a ``step_ns`` step, freeing ``gpus`` GPUs."""
    return [_finding(r, step_ns, steps or r.measured_steps, gpus) for r in late if sum(r.worth_ns) > 0]


def _finding(r: LateRank, step_ns: int, steps: int, gpus: int) -> Finding:
    """The finding of one late rank."""
    who = f"rank {r.rank}" if r.rank is not None else f"process {r.pid}"
    loader = r.cause == "data_loader"
    worth = round(sum(r.cause_worth_ns if loader else r.worth_ns) / steps)
    said, action = WORDS[r.cause]
    held = f": {_chain(r)}" if r.chain else ""
    title = f"{who} {said}{held}; the others wait {ms(worth)} a step for it"
    evidence = {
        "steps": r.steps, "late_ns": r.late_ns, "entered_late_ns": r.entered_late_ns, "inside_ns": r.inside_ns,
        "worth_ns_per_step": r.worth_ns, "late_calls": r.calls, "measured_steps": r.measured_steps, **r.evidence,
    }
    how = ("the least peer wait at each call it arrived last to, split between entered late and inside in "
           "proportion to lateness; the loader's part, " if loader else
           "the least peer wait at each call it arrived last to (the call releases at the second-last arrival), ")
    return finding(
        "data_loader" if loader else "late_rank", title, Where(ranks=[r.rank] if r.rank is not None else []),
        r.cause, evidence, worth, gpus, step_ns, action.format(who=who), how + "summed, per step",
    )


def _chain(r: LateRank) -> str:
    """The chain of waits as words: ``waits for rank 1 at recv #3 (gpu_compute)``, link after link."""
    return ", which ".join(
        f"waits for {'rank ' + str(k.rank) if k.rank is not None else 'a process'} at {k.at} ({k.cause})"
        for k in r.chain)
