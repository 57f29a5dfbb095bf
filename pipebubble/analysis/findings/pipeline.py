"""Pipeline findings: too few micro-batches, imbalance, the schedule, and exposed point-to-point transfers.

Worth of the first three is the what-if replay's own gain: the replay of the current setup (the
``current:`` recommendation) minus the replay of the change, per step. Both come from the same calibrated
model, so a replay that is off the measured step (``replay_error``) does not count as a gain; each
finding's worth is its own replay's gain alone (the gains are not additive: fixing one changes the others).

- too_few_microbatches: only when m < ``MICROBATCH_FACTOR`` x p (GPipe's and 1F1B's bubble,
  (p-1)/(m+p-1), is then above (p-1)/(5p-1): 20 % at p = 4); the best ``m=...`` row.
- imbalance: the ``rebalanced stages`` row; the slowest stage is named by its compute per step against the
  mean stage's. In a DP × PP job, the replicas' own what-if (``pipeline.replicas``): layers moved as each
  stage's least compute over the replicas needs, the same move in every replica, the job (its slowest
  replica) replayed; the title says whether the stage named is heavy in every replica.
- slow_worker (DP × PP jobs): the worker whose compute at its peers' median (the same stage in the other
  replicas) replays the job shortest: a GPU slower than its peers at the same work, not a heavier stage.
  Where the trace holds operators' FLOPs (``report.flops``), they say which: the same FLOPs at a lower FLOP/s
  is a slow GPU; more FLOPs is more work (uneven data), and the finding says so. In a pipeline of one replica,
  the slowest stage at the median stage's FLOPs is a slow GPU too (slow_worker, worth the rebalanced replay's
  gain), and a heavy stage's FLOPs ratio is given beside its time's.
- schedule: the best row of another schedule at the same m.
- exposed_p2p: no replay runs without hand-offs, so its worth is the drop of the pipeline's steady-state
  bound: every stage's step holds its compute and its exposed receive transfers (the part of its receives
  after the peer's send began, and no more than its communication not under compute), so the step is at
  least max over stages of (compute + transfer); hiding the transfers lowers that to max over stages of
  compute. The difference lies on one stage (the pace-setting one), never a sum over stages; receive
  waits (before the send began) are the bubble's and imbalance's, not the link's, and are left out.
"""

from __future__ import annotations

import statistics

from pipebubble.analysis.findings.common import Step, finding, gpus, job_step, mean, ms
from pipebubble.report import Pipeline, Recommendation, Report, Stage
from pipebubble.report.findings import Finding, Where
from pipebubble.report.flops import FlopsStage

MICROBATCH_FACTOR = 4  # m below this many times p is "too few" (Megatron-LM advises m >> p)
REPLAY_HOW = "replay of the current setup minus the replay of {change}, per step (its own gain alone)"


def findings(report: Report) -> list[Finding]:
    """Every pipeline finding the report supports (none without a pipeline section)."""
    pipe, step = report.pipeline, job_step(report)
    if pipe is None or step is None or not report.stages:
        return []
    replayed = _replay_findings(report, pipe, step)
    p2p = exposed_p2p(report.stages, step, gpus(report))
    return replayed + ([p2p] if p2p else [])


def _replay_findings(report: Report, pipe: Pipeline, step: Step) -> list[Finding]:
    """The findings that compare replays with the current one (none without a replay of it)."""
    current = next((r for r in pipe.recommendations if r.label.startswith("current:")), None)
    if current is None:
        return []
    flops = _stage_flops(report)
    balance = imbalance(report.stages, pipe, current, step, flops, report.billed) if pipe.replicas is None else (
        replica_imbalance(report.stages, pipe, step, flops))
    found = [too_few_microbatches(pipe, current, step), balance, schedule(pipe, current, step),
             slow_worker(report.stages, pipe, step, flops)]
    return [f for f in found if f is not None]


StageFlops = dict[tuple[int, int | None], FlopsStage]


def _stage_flops(report: Report) -> StageFlops:
    """(stage, replica) -> its FLOPs row (``flops.by_stage``); empty where the trace holds no FLOPs."""
    if report.flops is None:
        return {}
    return {(s.stage, s.replica): s for s in report.flops.by_stage if s.flops > 0 and s.flops_per_s}


def _against(row: FlopsStage | None, others: list[FlopsStage]) -> dict:
    """A stage's (or worker's) FLOPs and FLOP/s against the median of ``others``: evidence, empty where either
    is unknown."""
    if row is None or not others:
        return {}
    flops, rate = statistics.median(o.flops for o in others), statistics.median(o.flops_per_s for o in others)
    return {"flops": row.flops, "median_flops": flops, "flops_ratio": row.flops / flops,
            "flops_per_s": row.flops_per_s, "median_flops_per_s": rate, "rate_ratio": row.flops_per_s / rate}


SAME_FLOPS = 1.05  # FLOPs within this ratio of the peers' median are the same work


def label(rec: Recommendation) -> str:
    """A recommendation's change, without its predicted bubble ("m=16 → bubble 5.0 %" → "m=16")."""
    return rec.label.split(" → ")[0]


def _gain(current: Recommendation, rec: Recommendation) -> dict:
    """The evidence of a replayed change: both replays and the gain."""
    return {"replayed_current_ns": current.step_time_ns, "replayed_ns": rec.step_time_ns,
            "gain_ns": current.step_time_ns - rec.step_time_ns, "change": label(rec), "note": rec.note}


def _best(rows: list[Recommendation]) -> Recommendation | None:
    """The row that replays shortest among those not predicted to run out of memory (``fits`` false)."""
    return min((r for r in rows if r.fits is not False), key=lambda r: r.step_time_ns, default=None)


def too_few_microbatches(pipe: Pipeline, current: Recommendation, step: Step) -> Finding | None:
    """m below ``MICROBATCH_FACTOR`` x p and a larger m replays shorter: the best ``m=...`` replay's gain."""
    m, p = pipe.microbatches, pipe.stages
    best = _best([r for r in pipe.recommendations if r.label.startswith("m=")])
    if m is None or m >= MICROBATCH_FACTOR * p or best is None or best.step_time_ns >= current.step_time_ns:
        return None
    worth = current.step_time_ns - best.step_time_ns
    return finding(
        "too_few_microbatches", f"{m} micro-batches for {p} stages: {label(best)} replays {ms(worth)} shorter a step",
        Where(stages=list(range(p))), f"m={m} < {MICROBATCH_FACTOR}·p={MICROBATCH_FACTOR * p}: fill and drain bubble",
        {"microbatches": m, "stages": p, "bubble_fraction": pipe.bubble_fraction,
         "theoretical_bubble_fraction": pipe.theoretical_bubble_fraction, **_gain(current, best)},
        worth, p, step.ns, f"split the global batch into {best.microbatches} micro-batches",
        REPLAY_HOW.format(change=label(best)),
    )


def slowest(stages: list[Stage], count: int) -> dict:
    """The stage with the most compute per step, its compute, the mean stage's, and its excess over it."""
    top = max(stages, key=lambda s: s.busy_ns)
    average, busy = mean([s.busy_ns // count for s in stages]), top.busy_ns // count
    return {"stage": top.stage, "name": top.name, "busy_ns": busy, "forward_ns": top.forward_ns // count,
            "backward_ns": top.backward_ns // count, "mean_busy_ns": average,
            "excess": busy / average - 1 if average else 0.0}


def imbalance(stages: list[Stage], pipe: Pipeline, current: Recommendation, step: Step,
              flops: StageFlops | None = None, unit: str = "GPU") -> Finding | None:
    """The rebalanced-stages replay's gain, naming the slowest stage and how far it is above the mean; at the
    median stage's FLOPs, a slow GPU instead (the module docstring)."""
    rebalanced = next((r for r in pipe.recommendations if r.label.startswith("rebalanced")), None)
    if rebalanced is None or rebalanced.step_time_ns >= current.step_time_ns:
        return None
    worth = current.step_time_ns - rebalanced.step_time_ns
    top = slowest(stages, step.count)
    work = _against((flops or {}).get((top["stage"], None)),
                    [f for (s, _), f in (flops or {}).items() if s != top["stage"]])
    if work and work["flops_ratio"] <= SAME_FLOPS:  # no more work than the others: a slower device
        how = ("at the same FLOPs" if work["flops_ratio"] >= 1 / SAME_FLOPS
               else f"with {work['flops_ratio']:.2f}× the median stage's FLOPs")
        why = ("clocks, thermal or power throttling, a bad node or link" if unit == "GPU"
               else "a slower core, or cores shared with other ranks or processes")
        return finding(
            "slow_worker",
            f"stage {top['stage']} ({top['name']}) computes {top['excess'] * 100:.0f} % above the mean stage {how} "
            f"({work['rate_ratio']:.2f}× their FLOP/s): rebalanced stages replay {ms(worth)} shorter a step",
            Where(stages=[top["stage"]]),
            f"its {unit} runs no more work slower than the other stages' ({why}); it sets the pipeline's pace",
            {"slowest": top, **work, **_gain(current, rebalanced)}, worth, pipe.stages, step.ns,
            f"check the {unit} of stage {top['stage']} ({why}) and fix or replace it; until then, fewer layers "
            "on it even the stages' time",
            REPLAY_HOW.format(change="rebalanced stages"))
    heavier = f" and holds {work['flops_ratio']:.2f}× the median stage's FLOPs" if work else ""
    return finding(
        "imbalance",
        f"stage {top['stage']} ({top['name']}) computes {top['excess'] * 100:.0f} % above the mean stage{heavier}: "
        f"rebalanced stages replay {ms(worth)} shorter a step",
        Where(stages=[top["stage"]]), "the slowest stage sets the pipeline's pace",
        {"slowest": top, "imbalance": pipe.imbalance, "stage_time_cv": pipe.stage_time_cv, **work,
         **_gain(current, rebalanced)},
        worth, pipe.stages, step.ns, f"move layers off stage {top['stage']} to the faster stages",
        REPLAY_HOW.format(change="rebalanced stages"),
    )


WORKER_HOW = ("every replica replayed (its calibrated pass times under the detected schedule), the job's step the "
              "slowest replica's; minus the same with {change}, per step")


def replica_imbalance(stages: list[Stage], pipe: Pipeline, step: Step, flops: StageFlops | None = None
                      ) -> Finding | None:
    """A DP × PP job's heavy stage: the replicas' balanced what-if's gain (the module docstring)."""
    rep = pipe.replicas
    if rep is None or not rep.balanced_worth_ns or rep.balanced_worth_ns <= 0 or rep.heavy_stage is None:
        return None
    s = rep.heavy_stage
    name = next((st.name for st in stages if st.stage == s), f"pp{s}")
    everywhere = rep.heavy_min_ratio is not None and rep.heavy_min_ratio > 1.05
    where = "in every replica" if everywhere else "at its fastest worker"
    # the stage's FLOPs against the other stages', in the replica the stages describe
    rows = {k: f for k, f in (flops or {}).items() if k[1] == rep.analysed}
    work = _against(rows.get((s, rep.analysed)), [f for (t, _), f in rows.items() if t != s])
    held = f" and holds {work['flops_ratio']:.2f}× its FLOPs (the model's work)" if work else ""
    paced = f" (with {', '.join(rep.balanced_paced)} at its peers' pace)" if rep.balanced_paced else ""
    return finding(
        "imbalance",
        f"stage {s} ({name}) is {rep.heavy_ratio:.2f}× heavier than the median stage {where}{held}: layers moved "
        f"evenly replay {ms(rep.balanced_worth_ns)} shorter a step{paced}",
        Where(stages=[s]), "the slowest stage sets every replica's pace"
        + (": it holds more of the model's work (FLOPs), not a slower GPU" if work
           and work["flops_ratio"] > SAME_FLOPS else ""),
        {"stage": s, "heavy_ratio": rep.heavy_ratio, "heavy_min_ratio": rep.heavy_min_ratio, "replicas": rep.count,
         "replayed_current_ns": rep.replayed_step_ns, "replayed_ns": rep.balanced_step_ns,
         "gain_ns": rep.balanced_worth_ns, "stage_busy_ns": [r.stage_busy_ns[s] for r in rep.rows],
         "paced_workers": rep.balanced_paced, **work},
        rep.balanced_worth_ns, pipe.stages * rep.count, step.ns,
        f"move layers off stage {s} to the lighter stages (the same partition in every replica)",
        WORKER_HOW.format(change="the stages' work scaled to the typical replica's mean, in every replica"),
    )


def slow_worker(stages: list[Stage], pipe: Pipeline, step: Step, flops: StageFlops | None = None
                ) -> Finding | None:
    """The worker of a DP × PP job whose compute at its peers' median gives the job back the most; a whole
    replica, where all its workers at their peers' median give back much more than any one (a slow node)."""
    rep = pipe.replicas
    if rep is None:
        return None
    top = next((w for w in rep.workers if w.worth_ns and w.worth_ns > 0), None)
    whole = rep.slow_replica_worth_ns or 0
    if whole > 0 and whole > REPLICA_FACTOR * (top.worth_ns if top else 0):
        return _slow_replica(rep, pipe, step)
    if top is None:
        return None
    rank = f", rank {top.rank}" if top.rank is not None else ""
    flops = flops or {}
    work = _against(flops.get((top.stage, top.replica)),
                    [f for (s, r), f in flops.items() if s == top.stage and r != top.replica])
    peers = "replica" if rep.count == 2 else f"{rep.count - 1} replicas"
    more = bool(work) and work["flops_ratio"] > SAME_FLOPS
    if more:  # more work, not a slower GPU
        how = f" at {work['flops_ratio']:.2f}× their FLOPs"
        cause = (f"it runs {work['flops_ratio']:.2f}× the FLOPs of the same stage in the other {peers}: more work "
                 "(uneven batches, sequence lengths or experts), not a slower GPU; the job waits for it at every "
                 "gradient sync")
        action = (f"even out the work {top.name} gets (sequence packing, the data loader's sharding, expert load "
                  "balance); its GPU runs at its peers' FLOP/s")
    else:
        how = f" at the same FLOPs ({work['rate_ratio']:.2f}× their FLOP/s)" if work else ""
        cause = (f"one GPU is slower than the same stage in the other {peers} at the same work"
                 + (" (its FLOPs are its peers', its FLOP/s lower)" if work else "")
                 + "; the job waits for it at every gradient sync")
        action = (f"check the GPU of {top.name} (clocks, thermal or power throttling, a bad node or link) and "
                  "replace or re-clock it; moving layers would not help, its peers run the same ones faster")
    return finding(
        "slow_worker",
        f"worker {top.name} (stage {top.stage}, replica {top.replica}{rank}) computes {top.ratio:.2f}× longer than "
        f"its peers{how}: at their median the job replays {ms(top.worth_ns)} shorter a step",
        Where(ranks=[top.rank] if top.rank is not None else [], stages=[top.stage]), cause,
        {"stage": top.stage, "replica": top.replica, "rank": top.rank, "compute_ns": top.compute_ns,
         "peers_median_ns": top.peers_ns, "ratio": top.ratio, "replayed_current_ns": rep.replayed_step_ns,
         "replayed_ns": top.step_time_ns, "gain_ns": top.worth_ns, **work},
        top.worth_ns, pipe.stages * rep.count, step.ns, action,
        WORKER_HOW.format(change=f"{top.name}'s passes at its peers' median"),
    )


REPLICA_FACTOR = 1.5  # a replica's what-if this many times any one worker's names the replica


def _slow_replica(rep, pipe: Pipeline, step: Step) -> Finding:
    """A whole replica slower than the others at the same work (each of its workers at its peers' median)."""
    d = rep.slow_replica
    ranks = sorted(w.rank for w in rep.workers if w.replica == d and w.rank is not None)
    named = f" (ranks {', '.join(map(str, ranks))})" if ranks else ""
    return finding(
        "slow_worker",
        f"replica {d}{named} computes {rep.slow_replica_ratio:.2f}× longer than the other replicas: at their "
        f"median the job replays {ms(rep.slow_replica_worth_ns)} shorter a step",
        Where(ranks=ranks, stages=list(range(pipe.stages))),
        "every GPU of one replica is slower at the same work than the other replicas' (one node or its "
        "interconnect); the job waits for it at every gradient sync",
        {"replica": d, "ranks": ranks, "ratio": rep.slow_replica_ratio, "replayed_current_ns": rep.replayed_step_ns,
         "replayed_ns": rep.slow_replica_step_ns, "gain_ns": rep.slow_replica_worth_ns},
        rep.slow_replica_worth_ns, pipe.stages * rep.count, step.ns,
        f"check the node(s) of replica {d} (clocks, throttling, a slower GPU model, the network) and replace them",
        WORKER_HOW.format(change=f"every worker of replica {d} at its peers' median"),
    )


def schedule(pipe: Pipeline, current: Recommendation, step: Step) -> Finding | None:
    """The best other schedule at the same micro-batch count, when it replays shorter."""
    others = [r for r in pipe.recommendations
              if not r.label.startswith(("current:", "m=", "rebalanced")) and r.microbatches == current.microbatches]
    best = _best(others)
    if best is None or best.step_time_ns >= current.step_time_ns:
        return None
    worth = current.step_time_ns - best.step_time_ns
    now = label(current).removeprefix("current: ").split(",")[0]
    return finding(
        "schedule", f"{label(best)} replays {ms(worth)} shorter a step than {now}",
        Where(stages=list(range(pipe.stages))), f"the {now} schedule's bubble",
        {"schedule": pipe.schedule, "chunks": pipe.chunks, "bubble_fraction": pipe.bubble_fraction,
         "replayed_bubble_fraction": best.bubble_fraction, **_gain(current, best)},
        worth, pipe.stages, step.ns, f"switch the schedule to {label(best)}" + (f" ({best.note})" if best.note else ""),
        REPLAY_HOW.format(change=label(best)),
    )


def exposed_p2p(stages: list[Stage], step: Step, frees: int) -> Finding | None:
    """The drop of the steady-state bound when every stage's exposed receive transfers are hidden (module
    docstring); the stage that sets the bound with them is the one named."""
    transfer = {s.stage: min(s.p2p_transfer_ns, s.comm_ns) for s in stages}
    pace = max(stages, key=lambda s: s.busy_ns + transfer[s.stage])
    with_p2p = (pace.busy_ns + transfer[pace.stage]) // step.count
    compute = max(s.busy_ns for s in stages) // step.count
    worth = with_p2p - compute
    if worth <= 0:
        return None
    return finding(
        "exposed_p2p", f"stage {pace.stage}'s receive transfers add {ms(worth)} a step to the pipeline's pace",
        Where(stages=[pace.stage]), "activations and gradients between stages move while the stage waits",
        {"stage": pace.stage, "busy_ns": pace.busy_ns // step.count, "transfer_ns": transfer[pace.stage] // step.count,
         "p2p_wait_ns": pace.p2p_wait_ns // step.count, "bound_with_p2p_ns": with_p2p, "bound_compute_ns": compute},
        worth, frees, step.ns, "overlap sends and receives with compute (batched isend/irecv ahead of use), "
        "or send less between stages",
        "max over stages of (compute + exposed receive transfer) minus max over stages of compute, per step: "
        "the steady-state bound's drop, on the pace-setting stage",
    )
