"""A profile of start-up (``warmup_profile``): the profiled steps hold the job's initialisation (CUDA context
and module loading, library handles and communicators, the caching allocator's first allocations), which a
steady step does not.

The calls are the host threads' start-up calls (``Host.facts.calls`` named like ``breakdown.facts.STARTUP``)
and allocations and frees (``ALLOCATOR``), their time within the owner's GPU window (first to last GPU
operation: start-up before the GPU's first work holds no step back). The critical host thread is the one with
the most of it. Worth: that thread's time in those calls over the number of profiled steps (a trace without
steps is one window). Start-up happens once: the worth is what the profiled steps hold that steady ones would
not, no recurring cost (``worth_gpu_ns`` 0: it frees no GPU time), and the other findings of such a profile
measure start-up too, so where the calls take at least ``LEADS`` of the step the finding comes first whatever
the others' worth (``findings.findings``).

Allocations and frees alone are start-up only where they fill most of the step (``LEADS``); less of them
recurring in steady steps is the allocator's idle (``gpu.allocator``).
"""

from __future__ import annotations

import re

from pipebubble.analysis.breakdown.facts import ALLOCATOR, STARTUP
from pipebubble.analysis.findings.common import finding, gpu_step, ms, step_rows
from pipebubble.analysis.findings.per_lane import busiest as busiest_gpus
from pipebubble.report import Report
from pipebubble.report.breakdown import ThreadCall
from pipebubble.report.findings import Finding, Where

#: From this share of the step, start-up leads the findings (and allocations alone count as start-up).
LEADS = 0.5
#: Calls named in the title.
SHOWN = 3


def first_launches(report: Report) -> list[Finding]:
    """Start-up the host calls do not name: the idle account's ``startup`` on each step's busiest GPU (a
    kernel's first launch, which loads its code), the mean over steps; none without it."""
    groups = step_rows(report)
    step = gpu_step(groups)
    busiest = busiest_gpus(groups)
    worth = round(sum(b.idle_causes.get("startup", 0) for b in busiest) / len(busiest)) if busiest else 0
    if step is None or worth <= 0:
        return []
    lanes = list(dict.fromkeys(b.lane for b in busiest))
    rows = sorted((r for r in report.idle if r.cause == "startup" and r.lane in lanes), key=lambda r: -r.ns)
    named = ", ".join(f"{' in '.join(x for x in (r.call, r.op) if x)} {ms(r.ns)}" for r in rows[:SHOWN])
    share = worth / step.ns if step.ns else 0.0
    return [finding(
        "warmup_profile", f"the profile holds start-up: the busiest GPU ({', '.join(lanes)}) idles {ms(worth)}"
        f" {step.per_words} while the host loads code ({named})", Where(gpus=lanes),
        "a kernel's first launch loads its module (and a library's first call initialises it): the GPU waits once,"
        " in the first iterations, not in steady ones",
        {"startup_idle_ns": worth, "share_of_step": share, "leads": share >= LEADS,
         "behind": [{"op": r.op, "call": r.call, "ns": r.ns} for r in rows[:SHOWN]]}, worth, 0, step,
        "profile steady steps: torch.profiler.profile(schedule=torch.profiler.schedule(wait=1, warmup=1, active=3))"
        " with prof.step() each iteration skips the first iterations (module loading, cuDNN autotuning, the caching"
        " allocator's growth); CUDA_MODULE_LOADING=EAGER moves module loading to start-up",
        step.how("the idle account's start-up on the busiest GPU (a launch of 1 ms or more, or a loading or"
                 " initialising call); it happens once, so it is what the profile holds that steady steps would"
                 " not, not a recurring cost (it frees no GPU time)"),
    )]


def findings(report: Report) -> list[Finding]:
    """The start-up finding (none without start-up calls inside a GPU window)."""
    step = gpu_step(step_rows(report))
    if step is None or report.host is None:
        return []
    startup = [c for c in report.host.facts.calls if re.match(STARTUP, c.name) or re.match(ALLOCATOR, c.name)]
    threads: dict[str, list[ThreadCall]] = {}
    for c in startup:
        threads.setdefault(c.lane, []).append(c)
    if not threads:
        return first_launches(report)
    thread = max(threads, key=lambda t: (sum(c.inside_ns for c in threads[t]), t))
    calls = sorted(threads[thread], key=lambda c: -c.inside_ns)
    inside = sum(c.inside_ns for c in calls)
    worth = round(inside / step.count)
    share = worth / step.ns if step.ns else 0.0
    contexts = [c for c in calls if re.match(STARTUP, c.name) and c.inside_ns > 0]
    if worth <= 0 or (not contexts and share < LEADS):
        return []
    named = ", ".join(f"{c.name} {ms(c.inside_ns)}" for c in calls[:SHOWN] if c.inside_ns > 0)
    evidence = {
        "thread": thread, "startup_ns": inside, "steps": step.count, "share_of_step": share, "leads": share >= LEADS,
        "outside_gpu_window_ns": sum(c.total_ns - c.inside_ns for c in calls),
        "calls": {c.name: {"count": c.count, "total_ns": c.total_ns, "inside_ns": c.inside_ns} for c in calls},
    }
    what = "the profile is mostly start-up" if share >= LEADS else "the profile holds start-up"
    return [finding(
        "warmup_profile",
        f"{what}: {named} on {thread} ({share:.0%} of the {step.per})",
        Where(ranks=[int(r) for r in re.findall(r"^rank(\d+)/", thread)]),
        "the profiled steps include the job's initialisation (CUDA context and module loading, library handles,"
        " first allocations): their idle and launch figures are start-up's, not the steady state's",
        evidence, worth, 0, step,
        "profile steady steps: torch.profiler.profile(schedule=torch.profiler.schedule(wait=1, warmup=1, active=3))"
        " with prof.step() each iteration skips the first iterations (initialisation, lazy module loading, cuDNN"
        " autotuning, the caching allocator's growth); under Nsight, nsys profile --capture-range=cudaProfilerApi"
        " around steady steps (or --delay)",
        f"the start-up calls' time inside the GPU window on the host thread with the most of it, over the"
        f" {step.count} profiled {step.per}(s); it happens once, so this is what the profile holds that steady"
        f" {step.per}s would not, not a recurring cost (it frees no GPU time: no cost per hour); from {LEADS:.0%} of"
        f" the {step.per} it leads the findings",
    )]
