"""The reduce of a job, pure: every file's parts (what each analysis of ``registry.ANALYSES`` mapped, on the
job's one clock) to the Report. Across ranks first: the pipeline section on evidence, the collectives matched
(within a pipeline, among each stage's data-parallel peers), the waits of both, why a late rank is late and
each step's critical path (``_across_ranks``); then the serving steps, GPU time, timeline strips, memory,
requests and the idle account; last, the findings over them all. What the run does before (each file's
account, the one clock) is ``run.reducer``'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import polars as pl

from pipebubble.analysis import breakdown as bd
from pipebubble.analysis.breakdown.strips import empty_bins, job_strips
from pipebubble.analysis.comm import collectives as coll
from pipebubble.analysis.comm import p2p as pp
from pipebubble.analysis.critical import CriticalPart, critical_paths, median_path
from pipebubble.analysis.flops.summary import flops_report, lane_flops
from pipebubble.analysis.idle import top_rows
from pipebubble.analysis.lanes import sort_lanes
from pipebubble.analysis.launch import summary as launch
from pipebubble.analysis.memcpy import memcpy_report
from pipebubble.analysis.memory import memory_report
from pipebubble.analysis.pipeline.evidence import one_rank, some_ranks
from pipebubble.analysis.pipeline.part import StagePart
from pipebubble.analysis.pipeline.report import PipelineSection, reduce_stages, stacked
from pipebubble.analysis.requests import summarize as summarize_requests
from pipebubble.analysis.requests.part import RequestsPart
from pipebubble.analysis.rootcause import part as rc_part
from pipebubble.analysis.rootcause.result import LateRank, late_ranks
from pipebubble.options import Options, PipelineOptions
from pipebubble.report import Collectives, CriticalPath, IngestSummary, Lane, Report, Requests, Strips, Wait

#: At most this many collective waits are listed (biggest first); ``Collectives`` sums them all.
MAX_COLLECTIVE_WAITS = 1000


@dataclass(frozen=True)
class CommPart:
    """What one file contributes to the collectives: its calls (``collectives.CALL_COLUMNS``) and facts
    (``p2p_send``, ``p2p_recv``, ``step_ns``); and its point-to-point operations (``p2p.SCHEMA``; none by
    default), matched across ranks in the pipeline section."""

    calls: pl.DataFrame
    facts: dict
    p2p: pl.DataFrame = field(default_factory=pp.empty)
    windows: pl.DataFrame = field(default_factory=rc_part.empty)  # each arrival's window (``rootcause.part``)

    FRAMES = ("calls", "p2p", "windows")


@dataclass(frozen=True)
class JobSection:
    section: PipelineSection = field(default_factory=PipelineSection)
    collectives: Collectives | None = None
    waits: list[Wait] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    late: list[LateRank] = field(default_factory=list)  # why each late rank is late (``rootcause``)
    critical: list[CriticalPath] = field(default_factory=list)  # each step's critical path across ranks


#: A trace holding fewer of its operator ids than this share, of at least ``SAMPLED_OPS`` operators, had
#: events removed after profiling (a complete Kineto trace holds nearly all: 97 % in the shared resnet DDP).
SAMPLED_SHARE, SAMPLED_OPS = 0.5, 100


def _sampled(metas: list[dict]) -> list[str]:
    """A note for each file whose operators were mostly removed after profiling (``operator_ids``): its idle
    and host figures describe what was kept, not the job."""
    out = []
    for meta in metas:
        kept, span = meta.get("operator_ids") or (0, 0)
        if kept >= SAMPLED_OPS and kept < SAMPLED_SHARE * span:
            who = f"rank {meta['rank']}" if meta.get("rank") is not None else "a file"
            out.append(f"{who}'s trace keeps {kept:,} of the {span:,} operator ids in its range ({kept / span:.1%}): a "
                       "filtered or sampled trace (events removed after profiling); its GPU idle, host and launch "
                       "figures describe what was kept, not the job")
    return out


def reduce_job(parts: dict[str, list[Any]], metas: list[dict], options: Options, ingest: IngestSummary,
               notes: list[str]) -> Report:
    """The job's report. ``parts``: each analysis's parts by its name (the ``FilePart`` fields: ``serving``
    and ``segments`` apart), one per file (None where it has none), in the files' order, on one clock;
    ``metas``: each file's meta; ``ingest`` and ``notes``: what was read and what its clocks say."""
    from pipebubble.analysis.findings import findings  # the reduce's alone: not loaded by a worker
    from pipebubble.analysis.memory.fit import with_memory

    have = {name: [p for p in each if p is not None] for name, each in parts.items()}
    job = _across_ranks(have["stages"], have["comm"], metas, options.pipeline, have["critical"],
                        lane_flops(have["flops"]))
    section, gpus = job.section, have["gpu"]
    interference, segments = max(zip(parts["serving"], parts["segments"], strict=True),
                                 key=lambda s: (s[0].steps or 0) if s[0] else 0)
    memory = memory_report([(m, s.names if s else None, meta) for m, s, meta in
                            zip(parts["memory"], parts["stages"], metas, strict=True)],
                           [s.name for s in sorted(section.stages, key=lambda s: s.stage)], section.pipeline)
    pipeline = section.pipeline
    if pipeline is not None:
        pipeline = with_memory(pipeline, memory, options.pipeline.memory_limit)
    lanes = sort_lanes(pl.concat(parts["lanes"], how="vertical_relaxed"))
    unbinned = _unbinned(parts["strips"], metas)
    report = Report(
        ingest=replace(ingest, memory_events=memory.events if memory else 0),
        lanes=[Lane(**row) for row in lanes.iter_rows(named=True)],
        stages=section.stages,
        pipeline=pipeline,
        waits=job.waits,
        interference=interference,
        timeline=section.timeline + segments,
        collectives=job.collectives,
        notes=notes + job.notes + unbinned + _sampled(metas) + launch.skipped(parts["launch"], metas),
        breakdown=[row for g in gpus for row in g.rows],
        kernels=bd.kernels(gpus),
        host=bd.host(gpus),
        memory=memory,
        strips=_strips(have["strips"]),
        critical_path=_with_median_segments(job.critical),
        requests=_requests(have["requests"]),
        idle=top_rows([g.idle for g in gpus]),
        gpu_annotations=launch.gpu_annotations(have["launch"]),
        launch_queue=launch.launch_queues(have["launch"]),
        launch_delays=launch.launch_delays(have["launch"]),
        memcpy=memcpy_report(have["memcpy"]),
    )
    report = replace(report, flops=flops_report(
        list(zip(parts["flops"], metas, strict=True)), report.lanes, report.stages, report.breakdown,
        options.peak_flops, options.peak_bandwidth, report.pipeline))
    late = None if unbinned else job.late  # a spilled rank not read whole has no arrivals' windows
    return replace(report, findings=findings(report, options.pipeline.gpu_cost, late=late))


#: The note of a report some of whose traces were spilled and not read whole (``run.mapper._map_spilled``).
UNBINNED = ("per-GPU timeline, critical path, FLOPs and why a rank is late: not computed for {} trace(s) spilled to "
            "disk (bigger than the memory budget; a late rank is named from the collectives alone)")


def _unbinned(strips: list[pl.DataFrame | None], metas: list[dict]) -> list[str]:
    """A note when spilled traces have no strips nor critical-path part (not read whole)."""
    count = sum(1 for s, meta in zip(strips, metas, strict=True) if meta.get("spill") and s is None)
    return [UNBINNED.format(count)] if count else []


def _strips(frames: list[pl.DataFrame]) -> Strips | None:
    """The job's timeline strips (one step per GPU), None without a GPU."""
    bins = pl.concat(frames, how="vertical_relaxed") if frames else empty_bins()
    return job_strips(bins) if bins.height else None


def _requests(parts: list[RequestsPart]) -> Requests | None:
    """The served requests of every file (OTLP, Jaeger or an engine's own events) with the engine steps and
    KV-cache events found beside them, on the job's clock."""
    if not parts:
        return None
    frames = {k: pl.concat([getattr(p, k) for p in parts], how="vertical_relaxed") for k in RequestsPart.FRAMES}
    return summarize_requests(frames["requests"], frames["steps"], frames["kv"], frames["step_trace"])


def _with_median_segments(paths: list[CriticalPath]) -> list[CriticalPath]:
    """Every step's path, the segments kept on the median step's only (the others' shares stay whole)."""
    median = median_path(paths)
    return [p if p is median else replace(p, segments=[]) for p in paths]


def _across_ranks(
    stage_parts: list[StagePart], comm_parts: list[CommPart], metas: list[dict], options: PipelineOptions,
    critical_parts: list[CriticalPart], lane_flops: dict[str, int] | None = None,
) -> JobSection:
    """The pipeline section on evidence, then the collectives (within a pipeline: among each stage's
    data-parallel peers), the waits (a pipeline's gaps spent in a collective get cause ``collective``), the
    notes, why each late rank is late and each step's critical path (both given the send/recv pairs)."""
    p2p = {
        "send": sum(c.facts.get("p2p_send", 0) for c in comm_parts),
        "recv": sum(c.facts.get("p2p_recv", 0) for c in comm_parts),
    }
    ops = pl.concat([c.p2p for c in comm_parts], how="vertical_relaxed") if comm_parts else pp.empty()
    section = reduce_stages(stage_parts, options, p2p, ops, lane_flops)
    calls = pl.concat([c.calls for c in comm_parts], how="vertical_relaxed") if comm_parts else pl.DataFrame()
    stage_of = stage_groups(stage_parts, calls) if section.stages else None
    matched, left_out = coll.match(calls, stage_of) if calls.height else (pl.DataFrame(), {})
    worlds = [m.get("world_size") for m in metas if isinstance(m.get("world_size"), int)]
    collectives = coll.summarize(matched, left_out, world=max(worlds, default=None)) if matched.height else None
    notes = list(section.notes)
    if len(metas) == 1:
        stage = section.stages[0].name if len(section.stages) == 1 else None
        note = one_rank(metas[0], stage)
        if note and section.pipeline is None:
            notes.append(note)
    elif collectives is not None and (note := some_ranks(metas)):
        notes.append(note)
    if collectives is not None:
        note = coll.straggler_note(collectives)
        if note:
            notes.append(note)
    steps = [n for c in comm_parts for n in c.facts.get("step_ns", [])]
    threshold = options.wait_threshold * (sum(steps) / len(steps) if steps else _span(calls))
    limit = None if section.stages else MAX_COLLECTIVE_WAITS
    spins, total = coll.waits(matched, threshold, stage_of, limit) if collectives is not None else ([], 0)
    if section.stages:
        waits = _collective_causes(section.waits, spins)
    else:
        waits = spins
        if total > len(spins):
            notes.append(f"waits: the {len(spins):,} longest of {total:,} collective waits listed")
    windows = [c.windows for c in comm_parts if c.windows.height]
    pairs = section.pairs if section.pairs is not None and section.pairs.height else None
    late = late_ranks(pl.concat(windows, how="vertical_relaxed"), matched, pairs) if windows and matched.height else []
    paths = critical_paths(critical_parts, matched if matched.height else None, pairs) if critical_parts else []
    return JobSection(replace(section, waits=waits), collectives, waits, notes, late, paths)


def _span(calls: pl.DataFrame) -> float:
    if calls.is_empty():
        return 0.0
    return float(calls["end"].max() - calls["start"].min())


def stage_groups(parts: list[StagePart], calls: pl.DataFrame) -> dict[int, int]:
    """Participant -> stage position (by stage name: ``pp1`` of every data-parallel replica is one group),
    through the lanes the stages' work ran on, over every file's part (replicas left out of the pipeline
    analysed included: they are the stages' collective peers)."""
    if calls.is_empty() or not parts:
        return {}
    pairs = stacked([p.work for p in parts]).select("stage", "lane", "part").unique()
    rows = [
        (lane, parts[k].names[stage])
        for stage, lane, k in pairs.iter_rows()
        if stage is not None and stage < len(parts[k].names)
    ]
    if not rows:
        return {}
    lanes = pl.DataFrame(rows, schema={"lane": pl.String, "name": pl.String}, orient="row").unique()
    joined = calls.filter(pl.col("lane").is_not_null()).join(lanes, on="lane")
    per = joined.group_by("who").agg(pl.col("name").mode().first())
    names = {n: i for i, n in enumerate(sorted(set(per["name"].to_list())))}
    return {who: names[name] for who, name in per.iter_rows()}


def _collective_causes(waits: list[Wait], spins: list[Wait]) -> list[Wait]:
    """A pipeline gap (not fill, drain or a neighbour's pass) that its stage spent mostly spinning in a
    collective: cause ``collective``, waiting for the rank that arrived last."""
    if not spins or not waits:
        return waits
    gaps = pl.DataFrame(
        [(i, w.stage, w.start_ns, w.start_ns + w.dur_ns) for i, w in enumerate(waits)
         if w.cause not in ("fill", "drain", "upstream", "downstream")],
        schema={"i": pl.Int64, "stage": pl.Int64, "start": pl.Int64, "end": pl.Int64}, orient="row",
    )
    spun = pl.DataFrame(
        [(w.stage, w.start_ns, w.start_ns + w.dur_ns, k) for k, w in enumerate(spins) if w.stage is not None],
        schema={"stage": pl.Int64, "s": pl.Int64, "e": pl.Int64, "spin": pl.Int64},
        orient="row",
    )
    overlap = pl.min_horizontal("end", "e") - pl.max_horizontal("start", "s")
    best = (
        gaps.join(spun, on="stage")
        .with_columns(overlap=overlap)
        .filter(2 * pl.col("overlap") >= pl.col("end") - pl.col("start"))
        .sort("overlap", descending=True)
        .unique("i", keep="first")
    )
    found = {r["i"]: r for r in best.iter_rows(named=True)}
    return [_spun_in(w, spins[found[i]["spin"]]) if i in found else w for i, w in enumerate(waits)]


def _spun_in(gap: Wait, spin: Wait) -> Wait:
    """A pipeline gap spent spinning in a collective: who spun, and whom for."""
    return replace(gap, cause="collective", rank=spin.rank, pid=spin.pid, waited_for=spin.waited_for,
                   waited_for_pid=spin.waited_for_pid)
