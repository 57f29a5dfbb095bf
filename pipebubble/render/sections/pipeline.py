"""The pipeline's sections: its header lines (shape, evidence, bubble against theory, utilization, bounds,
idle and its cost), the stage table, the biggest waits and what each waited for, the what-if table and the
median step's critical path. Only formatting: every number is read from the Report as it is."""

from __future__ import annotations

from pipebubble.render.cells import Table, bar, num, pct, share, signed_pct, size, time
from pipebubble.render.sections.collectives import who
from pipebubble.report import Recommendation, Report, Wait
from pipebubble.report.words import priced_words

TOP_WAITS = 10


def header(report: Report, unit: str = "ms") -> list[str]:
    """One line per fact about the pipeline: shape, evidence, bubble vs theory, utilization, bounds, cost."""
    p = report.pipeline
    if p is None:
        return []
    m = "?" if p.microbatches is None else f"{p.microbatches}" + (" (inferred)" if p.microbatches_inferred else "")
    sched = (p.schedule or "unknown schedule") + (f", v={p.chunks} chunks" if p.chunks > 1 else "")
    theory = f" vs {pct(p.theoretical_bubble_fraction)} in theory" if p.theoretical_bubble_fraction is not None else ""
    step = f", step {time(p.step_time_ns, unit)} {unit}" if p.step_time_ns else ""
    lines = [f"pipeline: p={p.stages} stages, m={m} micro-batches, {sched}{step}"]
    lines += ["pipeline evidence: " + "; ".join(p.evidence)] if p.evidence else []  # an item may hold commas
    efficiency = f"; efficiency {pct(p.pipeline_efficiency)} of theory's" if p.pipeline_efficiency is not None else ""
    lines += [f"bubble: {pct(p.bubble_fraction)} measured{theory}" + _excess(p.excess_bubble_fraction,
                                                                             p.excess_causes),
              f"utilization {pct(1 - p.bubble_fraction)} (1 − bubble{efficiency}), stage time CV"
              f" {num(p.stage_time_cv)}, imbalance {num(p.imbalance)}",
              f"throughput: compute-only bound {num(p.throughput_bound)} steps/s"
              + (f"; with exposed comm {num(p.throughput_bound_with_comm)} steps/s"
                 if p.throughput_bound_with_comm else "")]
    if p.replicas is not None:
        r = p.replicas
        lines.append(f"replicas: {r.count} data-parallel replicas of this pipeline; the job's step"
                     f" {time(r.step_time_ns, unit)} {unit}, bubble {pct(r.bubble_fraction)} (every worker over the"
                     f" job's step); the stages shown are replica {r.analysed}'s, the slowest")
    billed = report.billed
    if p.idle_gpu_ns_per_step and p.step_time_ns:
        lines.append(f"idle: {time(p.idle_gpu_ns_per_step, unit)} {billed}-{unit} per step, of"
                     f" {time(p.stages * p.step_time_ns, unit)} {billed}-{unit} billed")
    if p.idle_cost_per_hour is not None:
        priced = priced_words(billed)
        lines.append(f"idle cost: ${num(p.idle_cost_per_hour)}/hour, ${num(p.idle_cost_per_step, 4)}/step"
                     + (f", ${num(p.effective_price_per_useful_gpu_hour)} per useful {billed}-hour"
                        if p.effective_price_per_useful_gpu_hour is not None else "")
                     + (f" ({priced})" if priced else ""))
    return lines + [f"note: {n}" for n in p.notes]


def _excess(excess: float | None, causes: dict[str, float]) -> str:
    if excess is None:
        return ""
    shown = [(k, v) for k, v in sorted(causes.items(), key=lambda kv: (-kv[1], kv[0])) if round(v, 3)]
    parts = ", ".join(f"{k} {pct(v)}" for k, v in shown)  # causes that round to 0.0 % say nothing
    return f" (excess {pct(excess)}" + (f": {parts})" if parts else ")")


#: The stage table's columns after its name: (header, Stage field); busy and the three idle parts add up to the
#: stage's window (``Stage``: idle = |W| − busy = fill + drain + steady), and comm is a part of that idle.
STAGE_PARTS = (("busy", "busy_ns"), ("+ fill", "fill_ns"), ("+ drain", "drain_ns"), ("+ steady idle", "steady_idle_ns"))


def stage_table(report: Report, bar_width: int = 10, unit: str = "ms") -> Table:
    """Busy + fill + drain + steady idle = the stage's window (every column read from the Stage; the window is
    its busy and idle, ``Stage.idle_ns``); comm is the part of that idle spent communicating, so it is shown
    beside the window, not added to it; so are its receives' wait for the peer's send and transfer, where the
    job's sends were paired with them. ``bar_width`` 0: no text bar after the utilization."""
    p2p = report.pipeline is not None and report.pipeline.p2p is not None
    extra = [("p2p wait", "p2p_wait_ns"), ("p2p transfer", "p2p_transfer_ns")] if p2p else []
    rows = [[_stage_name(st.stage, st.name), *(time(getattr(st, key), unit) for _, key in STAGE_PARTS),
             time(st.busy_ns + st.idle_ns, unit), time(st.comm_ns, unit),
             *(time(getattr(st, key), unit) for _, key in extra),
             pct(st.utilization) + (f" {bar(st.utilization, bar_width)}" if bar_width else "")]
            for st in report.stages]
    columns = ["stage", *(head for head, _ in STAGE_PARTS), "= window", "comm in idle", *(h for h, _ in extra),
               "utilization"]
    return Table(f"Stages ({unit} over the step windows W: busy + fill + drain + steady idle = window; comm in idle:"
                 " the part of that idle spent communicating, not added again;"
                 + (" p2p wait/transfer: its receives spinning for the peer's send / transferring;" if p2p else "")
                 + " utilization = busy / |W|)",
                 columns, rows, frozenset(range(1, len(columns))),
                 drop=(*(h for h, _ in extra), "= window", "comm in idle"))


TOP_WORKERS = 10


def replica_table(report: Report, unit: str = "ms") -> Table:
    """A DP × PP job's replicas: each one's step and bubble over its own windows, its replayed step, and its
    busiest stage's compute per step."""
    r = report.pipeline.replicas if report.pipeline else None
    if r is None:
        return Table("Replicas", [], [])
    rows = []
    for row in r.rows:
        top = max(range(len(row.stage_busy_ns)), key=lambda s: row.stage_busy_ns[s], default=None)
        rows.append([f"dp{row.replica}" + (" (shown)" if row.replica == r.analysed else ""),
                     time(row.step_time_ns, unit), pct(row.bubble_fraction),
                     "-" if row.replayed_step_ns is None else time(row.replayed_step_ns, unit),
                     "-" if top is None else f"s{top} {time(row.stage_busy_ns[top], unit)}"])
    return Table(f"Replicas ({r.count}; each over its own step windows; the job's step is the slowest's, as the "
                 "gradient sync waits for it)",
                 ["replica", f"step {unit}", "bubble", f"replayed {unit}", f"busiest stage, {unit} compute/step"],
                 rows, frozenset({1, 2, 3}), drop=(f"replayed {unit}",))


def worker_table(report: Report, unit: str = "ms") -> Table:
    """The workers furthest above their peers (the same stage in the other replicas), with the job's replayed
    step were each at its peers' median."""
    r = report.pipeline.replicas if report.pipeline else None
    if r is None:
        return Table("Workers", [], [])
    shown = r.workers[:TOP_WORKERS]
    rows = [[w.name, str(w.stage), str(w.replica), "-" if w.rank is None else str(w.rank),
             time(w.compute_ns, unit), time(w.peers_ns, unit), f"{w.ratio:.2f}x",
             "-" if w.worth_ns is None else time(w.worth_ns, unit)] for w in shown]
    return Table(f"Workers (top {len(shown)} of {len(r.workers)}: compute per step against the same stage in the"
                 " other replicas; given back: the job's replayed step less the same with it at their median)",
                 ["worker", "stage", "replica", "rank", f"compute {unit}", f"peers {unit}", "ratio",
                  f"given back {unit}"], rows, frozenset({1, 2, 3, 4, 5, 6, 7}), drop=("stage", "replica"))


def _stage_name(stage: int, name: str) -> str:
    """``s1`` as on the timeline, plus the stage's own name when it says more."""
    short = f"s{stage}"
    return short if not name or name == short else f"{short} {name}"


def wait_table(report: Report, origin_ns: int, unit: str = "ms") -> Table:
    """The biggest waits (the report lists them biggest first); `at` is from the timeline's origin. A
    "waited for" column names the last rank to arrive when some wait shown spun in a collective."""
    shown = report.waits[:TOP_WAITS]
    blame = any(w.waited_for is not None or w.waited_for_pid is not None for w in shown)
    rows = [[wait_where(w), time(w.start_ns - origin_ns, unit), time(w.dur_ns, unit), w.cause, w.before or "-",
             w.after or "-", *([who(w.waited_for, w.waited_for_pid)] if blame else [])] for w in shown]
    title = f"Biggest waits (top {len(shown)} of {len(report.waits)})"
    return Table(title, ["where", f"at {unit}", unit, "cause", "before", "after", *(["waited for"] if blame else [])],
                 rows, frozenset({1, 2}), drop=("before", f"at {unit}"))


#: What each wait cause means (``analysis/pipeline/waits.py``, ``analysis/comm/collectives.py``), for tooltips
#: and legends.
CAUSES = {"fill": "before the stage's first compute of the step (pipeline fill)",
          "drain": "after the stage's last compute of the step (pipeline drain)",
          "upstream": "the next forward waited for its activation from the stage before",
          "downstream": "the next backward waited for its gradient from the stage after",
          "sync": "a host synchronize overlapped the gap", "comm": "communication covered most of the gap",
          "host": "its launching thread was busy (launch-bound)",
          "collective": "spun in a collective until the last rank arrived",
          "dp_sync": "waited at its stage's gradient sync for the slowest replica", "unknown": "no cause found"}


def wait_peer(w: Wait) -> str:
    """Whom a wait waited for, as its cause says: the stage before (upstream) or after (downstream), or the
    rank that arrived last at the collective; "" when the cause names no one."""
    if w.waited_for is not None or w.waited_for_pid is not None:
        return who(w.waited_for, w.waited_for_pid)
    if w.stage is not None and w.cause in ("upstream", "downstream"):
        return f"s{w.stage - 1 if w.cause == 'upstream' else w.stage + 1}"
    return ""


def wait_where(w: Wait) -> str:
    """The stage (``s2``, with its worker's lane at a replicas' sync); in a job that is not a pipeline, the
    rank, else the lane."""
    if w.stage is not None:
        return f"s{w.stage} {w.lane}" if w.cause == "dp_sync" and w.lane else f"s{w.stage}"
    if w.rank is None and w.pid is None:
        return w.lane or "-"
    return who(w.rank, w.pid)


def recommendation_table(report: Report, unit: str = "ms") -> Table:
    """Notes are long and repeat across rows, so each distinct note is a footnote the rows point to."""
    recs = report.pipeline.recommendations if report.pipeline else []
    current = next((r for r in recs if _current(r.label)), None)
    replay = _replay(report, current, unit)  # a footnote on the current setup's row
    notes = tuple(dict.fromkeys([*(r.note for r in recs if r.note), *([replay] if replay else [])]))
    # a label may end in "→ bubble 12 %"; the bubble column says that already
    measured = any(r.peak_memory_bytes is not None for r in recs)
    rows = [[r.label.split(" → ")[0], r.schedule, str(r.microbatches), str(r.chunks), time(r.step_time_ns, unit),
             pct(r.bubble_fraction), f"{r.speedup:.2f}x", *([size(r.peak_memory_bytes), _FITS[r.fits]] if measured
                                                           else []),
             _refs(notes, r.note, replay if _current(r.label) else "")]
            for r in recs]
    memory = ["peak memory", "fits"] if measured else []
    # rows written before ``replay_bubble_fraction`` carry the replay's own bubble, not the measured definition's
    as_measured = any(r.replay_bubble_fraction is not None for r in recs)
    return Table("What if (simulated from the measured stage times; same global batch"
                 + ("; bubble as measured: 1 − the measured compute / (p · the row's step)" if as_measured else "")
                 + ("" if measured else "; memory not measured") + ")",
                 ["change", "schedule", "m", "v", f"step {unit}", "bubble", "speedup", *memory, "note"],
                 rows, frozenset({2, 3, 4, 5, 6, 7} if measured else {2, 3, 4, 5, 6}), notes, drop=("schedule",))


_FITS = {True: "yes", False: "no", None: "?"}  # ? : no --memory-limit and no GPU capacity in the trace


def _replay(report: Report, current: Recommendation | None = None, unit: str = "ms") -> str:
    """The what-if replay of the current schedule against the measured step, when the analysis compared them;
    and the current row's bubble against the measured one where the two, as shown, differ (the replay's step
    is not the measured step's)."""
    p = report.pipeline
    if p is None or p.replay_error is None or p.replayed_step_ns is None:
        return ""
    # rows without ``replay_bubble_fraction`` (saved before it) carry the replay's own bubble, passes alone busy
    new = current is not None and current.replay_bubble_fraction is not None
    at = "at the replayed step" if new else "in the replay"
    bubble = "" if current is None or pct(current.bubble_fraction) == pct(p.bubble_fraction) else (
        f", bubble {pct(current.bubble_fraction)} {at} vs {pct(p.bubble_fraction)} measured")
    return (f"current: replay {time(p.replayed_step_ns, unit)} {unit} vs measured {time(p.step_time_ns, unit)} {unit}"
            f" ({signed_pct(p.replay_error)}){bubble}; speedups are against the measured step")


def _current(label: str) -> bool:
    return label.startswith("current")


def _refs(notes: tuple[str, ...], *texts: str) -> str:
    return " ".join(f"[{notes.index(text) + 1}]" for text in texts if text)


def critical_table(report: Report, unit: str = "ms") -> Table:
    """The median step's critical path by participant: its time there by kind and its share of the step."""
    paths = [p for p in report.critical_path if p.segments]
    if not paths:
        return Table("Critical path", [], [])
    path = paths[0]
    rows = [[who(s.rank, s.pid), time(s.compute_ns, unit), time(s.memory_ns, unit), time(s.comm_ns, unit),
             time(s.host_ns, unit), time(s.waiting_ns, unit),
             share(s.compute_ns + s.memory_ns + s.comm_ns + s.host_ns + s.waiting_ns, path.length_ns)]
            for s in path.by_rank]
    step = "" if path.step is None else f" of step {path.step}"
    return Table(f"Critical path{step} (the median step, {time(path.length_ns, unit)} {unit}: the longest chain of"
                 " stream order, launches, collectives' last arrivals and send → recv; its length is the step's)",
                 ["on", f"compute {unit}", f"memory {unit}", f"exposed comm {unit}", f"host {unit}",
                  f"waiting {unit}", "of step"], rows, frozenset(range(1, 7)))
