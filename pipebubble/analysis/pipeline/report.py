"""The reduce side of the pipeline analysis: the files' stage parts (``part``) numbered as one set of
stages, then the stages, the pipeline summary (``summary``), the waits and the timeline
(``segments``)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import chain, repeat

import polars as pl

from pipebubble.analysis.comm import p2p as pp
from pipebubble.analysis.pipeline import metrics as pm
from pipebubble.analysis.pipeline import replicas as rp
from pipebubble.analysis.pipeline.evidence import not_a_pipeline, pipeline_evidence, too_few_stages
from pipebubble.analysis.pipeline.part import StagePart, one_stage, stage_part
from pipebubble.analysis.pipeline.segments import timeline
from pipebubble.analysis.pipeline.stages import Worker
from pipebubble.analysis.pipeline.summary import summary
from pipebubble.analysis.pipeline.waits import find_waits
from pipebubble.options import PipelineOptions
from pipebubble.report import Pipeline, Segment, Stage, Wait

__all__ = ["PipelineSection", "StagePart", "combine", "one_stage", "reduce_stages", "stage_part"]


@dataclass(frozen=True)
class PipelineSection:
    stages: list[Stage] = field(default_factory=list)
    pipeline: Pipeline | None = None
    waits: list[Wait] = field(default_factory=list)
    timeline: list[Segment] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # why the stages found are not a pipeline
    pairs: pl.DataFrame | None = field(default=None, compare=False)  # sends paired with receives (``p2p.match``)


def combine(parts: list[StagePart]) -> tuple[list[str], pl.DataFrame, pl.DataFrame, dict]:
    """Reduce, first half: one stage numbering over all files (ordered by the stages' keys; a name seen in
    several files is one stage), and the work and host tables renumbered to it, each row with its
    ``replica``: a data-parallel copy of the pipeline, told by the pipeline group a rank names (numbered by
    the groups' lowest ranks) or by the workers a file of several replicas holds (``StagePart.workers``);
    0 in a job of one. Files of no pipeline group, in a job whose ranks name them, are left out."""
    groups = sorted({p.pipeline for p in parts if p.pipeline is not None})
    if groups:
        parts = [p for p in parts if p.pipeline is not None]
    where = {key: _worker(parts[key[0]], key[1], groups) for key in _used(parts)}
    names = list(dict.fromkeys(w.stage for w in sorted(where.values(), key=lambda w: (w.order, w.stage))))
    index = {n: i for i, n in enumerate(names)}
    stage = {key: index[w.stage] for key, w in where.items()}
    replica = {key: w.replica for key, w in where.items()}
    facts = {
        "pattern": next((p.facts["pattern"] for p in parts if p.facts["pattern"]), None),
        "inferred": any(p.facts["inferred"] for p in parts),
        "mode": "gpu" if any(p.facts["mode"] == "gpu" for p in parts) else "cpu",
        "workers": {(stage[key], replica[key]): w for key, w in where.items()},
    }
    work = _renumbered(parts, [p.work for p in parts], stage, replica)
    host = _renumbered(parts, [p.host for p in parts], stage, replica)
    if facts["pattern"] == "torch_pipelining" and work.height:
        names, work, host = _order_by_stage_ids(names, work, host)
    return names, work, host, facts


def _worker(part: StagePart, i: int, groups: list[int]) -> Worker:
    """Stage ``i`` of ``part`` as a worker of the job: its stage, replica and ranks."""
    if part.workers is not None:
        return part.workers[i]
    replica = groups.index(part.pipeline) if part.pipeline is not None else 0
    return Worker(part.names[i], part.order[i], replica, (part.facts.get("ranks") or {}).get(i))


def tagged(frame: pl.DataFrame, name: str, value: int) -> pl.DataFrame:
    """``frame`` with a column ``name`` (Int64) holding ``value`` in every row, added without a query."""
    return frame.hstack([pl.Series(name, [value], dtype=pl.Int64).new_from_index(0, frame.height)])


def stacked(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """``frames`` one under the other (relaxed to common types) with ``part``, the index of the frame each
    row came from: one table to query once, not a query per part."""
    part = chain.from_iterable(map(repeat, range(len(frames)), (frame.height for frame in frames)))
    return pl.concat(frames, how="vertical_relaxed").hstack([pl.Series("part", list(part), dtype=pl.Int64)])


def _used(parts: list[StagePart]) -> set[tuple[int, int]]:
    """(part, stage) of every stage some work of its part belongs to."""
    if not parts:
        return set()
    present = stacked([p.work for p in parts]).select("stage", "part").unique()
    return {(k, i) for i, k in present.iter_rows() if i is not None and 0 <= i < len(parts[k].names)}


def _renumbered(parts: list[StagePart], frames: list[pl.DataFrame], stage: dict, replica: dict) -> pl.DataFrame:
    """Every part's rows (``frames``: its work or host table) with its stages renumbered to the job's and its
    replica (``stage``, ``replica``: (part, stage) -> number), the rows of no stage left out."""
    if not frames:
        return pl.DataFrame()
    width = max(len(p.names) for p in parts) + 1
    key = pl.col("part") * width + pl.col("stage")

    def mapped(values: dict) -> pl.Expr:
        flat = {k * width + i: v for (k, i), v in values.items()}
        return key.replace_strict(flat, default=None, return_dtype=pl.Int32)

    renumbered = stacked(frames).with_columns(stage=mapped(stage), replica=mapped(replica))
    return renumbered.filter(pl.col("stage").is_not_null()).drop("part")


def _order_by_stage_ids(names: list[str], work: pl.DataFrame, host: pl.DataFrame):
    """torch.distributed.pipelining labels name the stage (``PP:{stage}F{mb}``): stages are ordered by the
    lowest stage id each runs, not by rank, when the ranks do not hold stages in rank order."""
    first = work.filter(pl.col("chunk").is_not_null()).group_by("stage").agg(pl.col("chunk").min())
    if first.height != len(names) or first["chunk"].n_unique() != len(names):
        return names, work, host
    order = first.sort("chunk")["stage"].to_list()
    if order == sorted(order):
        return names, work, host
    remap = {old: new for new, old in enumerate(order)}
    renumber = pl.col("stage").replace_strict(remap, return_dtype=pl.Int32)
    return [names[old] for old in order], work.with_columns(stage=renumber), host.with_columns(stage=renumber)


def reduce_stages(
    parts: list[StagePart],
    options: PipelineOptions = PipelineOptions(),
    p2p: dict[str, int] | None = None,
    ops: pl.DataFrame | None = None,
    lane_flops: dict[str, int] | None = None,
) -> PipelineSection:
    """Reduce: everything pipeline-shaped from the files' parts. Two or more stages are a pipeline only on
    evidence (``evidence.pipeline_evidence``; ``p2p``: the job's send/recv counts outside collectives),
    and their sends and receives (``ops``, ``p2p.SCHEMA``) are paired across ranks: each stage's receive
    wait and transfer, and the waits whose receive waited for a neighbour's send,
    else the section is empty but for a note saying why. One stage that its labels or process group say
    is a pipeline stage (one rank of a bigger job) gets its stage row and waits, and no pipeline summary.
    ``lane_flops``: each lane's model FLOPs (``analysis/flops``), where the trace holds them: the rebalanced
    what-if then moves FLOPs (``whatif.rebalance``)."""
    parts = [p for p in parts if p is not None]
    bare = [p for p in parts if p.facts.get("no_evidence")]
    parts = [p for p in parts if not p.facts.get("no_evidence")]
    if not parts:  # no file holds evidence of a pipeline: say so when they hold several stages
        names = {n for p in bare for n in p.names}
        return PipelineSection(notes=[not_a_pipeline(names)] if len(names) >= 2 else _too_few(options, []))
    names, work, host, facts = combine(parts)
    workers = facts.pop("workers")
    p = len(names)
    found = pipeline_evidence(parts, p2p or {}, options.stages)
    if p >= 2 and not found:
        return PipelineSection(notes=[not_a_pipeline(names)])
    stage_of_many = facts["pattern"] is not None or any(part.pipeline is not None for part in parts)
    if p == 0 or (p == 1 and not stage_of_many):  # one stage is analysed alone only when its labels or group say so
        return PipelineSection(notes=_too_few(options, names))
    work, host, every, analysed = _one_replica(work, host)
    labelled = work
    work = pm.complete_steps(work)
    if work.is_empty():
        return PipelineSection()
    wins = pm.windows(work)
    work = pm.clip_to_windows(work, wins)
    table = pm.stage_step_table(work, wins)
    counts = pm.microbatch_counts(work)
    schedule, chunks, m = pm.detect_schedule(work, counts)
    stage_rows = _with_coordinates(_stages(table, work, names, counts), workers, analysed)
    if len(stage_rows) < min(p, 2) or not _measurable(wins):
        return PipelineSection()  # no two stages with work of any length: nothing pipeline-shaped to measure
    recvs, per, paired, pairs = pp.reduce_pipeline(ops, labelled, wins) if p >= 2 else (None, {}, None, None)
    stage_rows = [replace(s, p2p_wait_ns=per[s.stage][0], p2p_transfer_ns=per[s.stage][1]) if s.stage in per else s
                  for s in stage_rows]
    waits = find_waits(work, wins, host, options.wait_threshold, facts["mode"] == "gpu", recvs)
    lane_of = {s.stage: s.lanes[0] for s in stage_rows if s.lanes}
    waits = [replace(w, lane=lane_of.get(w.stage)) for w in waits]
    if p == 1:
        return PipelineSection(stage_rows, None, waits, timeline(work))
    pipeline = summary(table, work, stage_rows, wins, (schedule, chunks, m), facts, options, waits, lane_flops)
    pipeline = replace(pipeline, evidence=found, p2p=paired)
    if every is not None:
        done, done_wins = every
        lanes = dict(((s, r), lane) for s, r, lane in done.group_by("stage", "replica").agg(pl.col("lane").min())
                     .iter_rows())
        section, sync = rp.analyse(done, done_wins, p, (schedule, chunks, m), workers, analysed, lanes)
        threshold = options.wait_threshold * pipeline.step_time_ns
        waits = sorted([*waits, *(w for w in sync if w.dur_ns > threshold)], key=lambda w: -w.dur_ns)
        pipeline = replace(pipeline, replicas=section)
    return PipelineSection(stage_rows, pipeline, waits, timeline(work), pairs=pairs)


def _too_few(options: PipelineOptions, names: list[str]) -> list[str]:
    """The note, if any, for stages the user's rule asked for that are fewer than two (``names``)."""
    note = too_few_stages(options.stages, names)
    return [note] if note else []


def _one_replica(work: pl.DataFrame, host: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame,
                                                                  tuple[pl.DataFrame, pl.DataFrame] | None,
                                                                  int | None]:
    """The work and host activity of the replica analysed as the pipeline (in a job of several, the slowest:
    the one the job waits for), every replica's complete work with its windows (``replicas.complete``; None
    in a job of one) and which replica."""
    replicas = work["replica"].unique().drop_nulls()
    if replicas.len() <= 1:
        analysed = replicas[0] if replicas.len() else None
        return work.drop("replica"), host.drop("replica", strict=False), None, analysed
    every = rp.complete(work)
    count = int(replicas.max()) + 1
    analysed = rp.slowest(every[1], count) if every[0].height else int(replicas.min())
    mine = pl.col("replica") == analysed
    return work.filter(mine).drop("replica"), host.filter(mine).drop("replica"), every, analysed


def _with_coordinates(rows: list[Stage], workers: dict, replica: int | None) -> list[Stage]:
    """The stage rows with what the trace names of each stage's worker in the replica analysed."""
    out, several = [], any(r for _, r in workers)
    for row in rows:
        w = workers.get((row.stage, replica if replica is not None else 0))
        out.append(replace(row, rank=w.rank if w else None, tp=w.tp if w else None,
                           replica=w.replica if w and several else None))
    return out


def _measurable(wins: pl.DataFrame) -> bool:
    """Every step window has a length (zero-length work alone gives windows of 0 ns)."""
    return bool(wins.height) and bool(wins.select((pl.col("window_end") > pl.col("window_start")).all()).item())


def _stages(table: pl.DataFrame, work: pl.DataFrame, names: list[str], counts: dict[int, int]) -> list[Stage]:
    sums = (
        table.group_by("stage")
        .agg(
            pl.col(c).sum()
            for c in (
                "busy_ns",
                "comm_ns",
                "idle_ns",
                "fill_ns",
                "drain_ns",
                "steady_idle_ns",
                "window_ns",
                "forward_ns",
                "backward_ns",
                "weight_ns",
            )
        )
        .sort("stage")
    )
    lanes = work.group_by("stage").agg(pl.col("lane").unique().sort(),
                                       chunk=pl.col("chunk").drop_nulls().unique().sort())
    per_mb = pm.microbatch_times(work).group_by("stage", "microbatch").agg(pl.col("ns").sum())
    of_stage = dict(per_mb.group_by("stage").agg("ns").iter_rows())
    out = []
    for row in sums.join(lanes, on="stage").sort("stage").iter_rows(named=True):
        mb = of_stage.get(row["stage"], [])
        out.append(
            Stage(
                stage=row["stage"],
                name=names[row["stage"]] if row["stage"] < len(names) else str(row["stage"]),
                lanes=row["lane"],
                chunk=row["chunk"] or None,
                busy_ns=row["busy_ns"],
                comm_ns=row["comm_ns"],
                idle_ns=row["idle_ns"],
                fill_ns=row["fill_ns"],
                drain_ns=row["drain_ns"],
                steady_idle_ns=row["steady_idle_ns"],
                utilization=row["busy_ns"] / row["window_ns"] if row["window_ns"] else 0.0,
                forward_ns=row["forward_ns"],
                backward_ns=row["backward_ns"],
                weight_ns=row["weight_ns"],
                microbatches=counts.get(row["stage"], len(mb)),
                microbatch_cv=pm.cv(mb) if len(mb) > 1 else None,
            )
        )
    return out
