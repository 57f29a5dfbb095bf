"""DP × PP jobs: p stages × d replicas of the pipeline, which sync their gradients every step, so the job's
step is its slowest replica's.

Figures per replica are the pipeline metrics (``metrics``) over each replica's own step windows, taken in one
query for all replicas by keying each replica's step apart (``keyed``). The job's step k runs from the first
to the last pass compute over every replica; its bubble is Σ idle of every worker / (p · d · Σ|W_k|), over the
steps every replica completed.

What-ifs replay each replica (its calibrated times under the detected schedule, ``calibrate.replay_times``);
the job's replay is the longest replica's (the sync waits for it):
- a worker (stage s of replica r) with its compute at the median of its peers (stage s in the other
  replicas), pass by pass: a slow GPU replaced or re-clocked;
- the stages balanced as moving layers balances them: one move for every replica (the partition is the
  model's), chosen so that each stage's least compute over the replicas (its work without a slow GPU's
  excess) is even.
The step given back is each what-if's worth.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from fractions import Fraction

import polars as pl

from pipebubble.analysis.pipeline import metrics as pm
from pipebubble.analysis.pipeline.stages import Worker
from pipebubble.analysis.schedule import calibrate, whatif
from pipebubble.analysis.schedule.schedules import make_schedule
from pipebubble.errors import StageSpecError
from pipebubble.report import ReplicaRow, Replicas, Wait, WorkerRow

WORKER_RATIO = 1.05  # a worker computing this much more than its peers' median is replayed at their median


def keyed(work: pl.DataFrame, count: int) -> pl.DataFrame:
    """``work`` (with ``replica``) whose ``step`` is (step, replica) as one number: the metrics' per-step
    queries then run per replica and step, every replica at once. ``step // count`` and ``step % count``
    give both back."""
    return work.with_columns(step=pl.col("step").cast(pl.Int64) * count + pl.col("replica"))


def complete(work: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The work (with ``replica``) of the steps each replica completed (every stage computed), clipped to
    that replica's step windows, steps keyed per replica (``keyed``); and those windows."""
    count = int(work["replica"].max()) + 1
    steps = pm.complete_steps(keyed(work, count))
    wins = pm.windows(steps)
    return pm.clip_to_windows(steps, wins), wins


def slowest(wins: pl.DataFrame, count: int) -> int:
    """The replica whose mean step window (``wins``, keyed per replica) is longest (the lowest of those tied):
    the one the job waits for."""
    mean = wins.group_by(replica=pl.col("step") % count).agg(
        (pl.col("window_end") - pl.col("window_start")).mean().alias("ns"))
    return int(mean.sort(pl.col("ns"), "replica", descending=[True, False])["replica"][0])


def analyse(
    work: pl.DataFrame,
    wins: pl.DataFrame,
    p: int,
    plan: tuple[str | None, int, int | None],
    workers: dict[tuple[int, int], Worker],
    analysed: int,
    lanes: dict[tuple[int, int], str],
) -> tuple[Replicas, list[Wait]]:
    """The replicas' section and their waits at the gradient sync, from ``complete`` work and windows
    (``plan``: the detected schedule, chunks and micro-batches; ``workers``: (stage, replica) -> where the
    trace puts it; ``lanes``: each worker's first lane)."""
    count = int(work["replica"].max()) + 1
    table = pm.stage_step_table(work, wins)
    steps = (
        wins.with_columns(replica=pl.col("step") % count, k=pl.col("step") // count)
        .with_columns(job_start=pl.col("window_start").min().over("k"), job_end=pl.col("window_end").max().over("k"),
                      replicas=pl.len().over("k"))
    )
    every = steps.filter(pl.col("replicas") == count)
    job = every.unique("k").select("k", ns=pl.col("job_end") - pl.col("job_start"))
    job_ns = int(job["ns"].sum())
    busy = table.join(every.select("step"), on="step")["busy_ns"].sum()
    bubble = 1 - busy / (p * count * job_ns) if job_ns else 0.0
    rows, per_worker = _rows(table, steps, p, count)
    times = _replica_times(work, p, plan, wins, count)
    replays = [_replay(t, plan) for t in times]
    sync = _sync_waits(work, count, lanes)
    rows = [replace(r, replayed_step_ns=replays[r.replica]) for r in rows]
    section = Replicas(
        count=count,
        analysed=analysed,
        step_time_ns=job_ns // job.height if job.height else 0,
        bubble_fraction=bubble,
        rows=rows,
        workers=_workers(per_worker, times, replays, plan, workers),
        **_slow_replica(per_worker, times, replays, plan),
        replayed_step_ns=max(replays) if replays and None not in replays else None,
        sync_wait_ns=sum(w.dur_ns for w in sync) // job.height if job.height else 0,
        **_balanced(per_worker, times, replays, plan),
    )
    return section, sync


def _rows(table: pl.DataFrame, steps: pl.DataFrame, p: int, count: int) -> tuple[list[ReplicaRow], dict]:
    """Each replica's row, and each worker's compute per step ((stage, replica) -> ns)."""
    window = steps.group_by("replica").agg(ns=(pl.col("window_end") - pl.col("window_start")).sum(), steps=pl.len())
    per = (
        table.with_columns(replica=pl.col("step") % count)
        .group_by("replica", "stage").agg(pl.col("busy_ns").sum(), pl.col("idle_ns").sum())
        .join(window, on="replica")
    )
    per_worker = {(s, r): b // n for r, s, b, n in per.select("replica", "stage", "busy_ns", "steps").iter_rows()}
    idle = dict(per.group_by("replica").agg(pl.col("idle_ns").sum()).iter_rows())
    rows = [
        ReplicaRow(r, ns // n, idle.get(r, 0) / (p * ns) if ns else 0.0, [per_worker.get((s, r), 0) for s in range(p)])
        for r, ns, n in window.sort("replica").iter_rows()
    ]
    return rows, per_worker


def _replica_times(work: pl.DataFrame, p: int, plan: tuple, wins: pl.DataFrame, count: int
                   ) -> list[whatif.StageTimes | None]:
    """Each replica's calibrated replay inputs (None where its passes cannot be replayed)."""
    _, _, m = plan
    of = pl.col("step") % count
    return [calibrate.replay_times(work.filter(of == r), p, m, wins.filter(of == r)) for r in range(count)]


def _replay(times: whatif.StageTimes | None, plan: tuple) -> int | None:
    schedule, chunks, m = plan
    if times is None or schedule is None or m is None:
        return None
    try:
        return whatif.simulate(make_schedule(schedule, times.stages, m, chunks), times).step_time_ns
    except StageSpecError:
        return None


def _workers(per_worker: dict, times: list, replays: list, plan: tuple, where: dict) -> list[WorkerRow]:
    """Every worker against its peers' median, slowest first; those ``WORKER_RATIO`` above it replayed at it."""
    stages = sorted({s for s, _ in per_worker})
    out = []
    for s in stages:
        mine = {r: ns for (t, r), ns in per_worker.items() if t == s}
        for r, ns in mine.items():
            peers = [v for q, v in mine.items() if q != r]
            if not peers:
                continue
            median = int(statistics.median(peers))
            ratio = ns / median if median else 1.0
            step = worth = None
            if ratio >= WORKER_RATIO:
                step = _job_with(times, replays, plan, r, lambda t, r=r, s=s: _at_peers(t, times, r, s))
                job = _job(replays)
                worth = job - step if step is not None and job is not None else None
            w = where.get((s, r))
            out.append(WorkerRow(s, r, f"pp{s}/dp{r}", w.rank if w else None, ns, median, ratio, step, worth))
    return sorted(out, key=lambda w: (-(w.worth_ns or 0), -w.ratio, w.stage, w.replica))


def _slow_replica(per_worker: dict, times: list, replays: list, plan: tuple) -> dict:
    """The slowest replica's compute against the others' (each stage's median over the other replicas), and the
    job's replay with every one of its workers at its peers' median (a slow node holds a replica's GPUs)."""
    replicas = sorted({r for _, r in per_worker})
    total = {r: sum(ns for (_, q), ns in per_worker.items() if q == r) for r in replicas}
    slow = max(replicas, key=lambda r: (total[r], -r))
    stages = sorted({s for s, _ in per_worker})
    others = sum(statistics.median(per_worker[(s, r)] for r in replicas if r != slow and (s, r) in per_worker)
                 for s in stages if any(r != slow and (s, r) in per_worker for r in replicas))
    out = {"slow_replica": slow, "slow_replica_ratio": total[slow] / others if others else None}
    if _job(replays) is None or times[slow] is None:
        return out
    changed = times[slow]
    for s in stages:
        changed = _at_peers(changed, times, slow, s)
    step = _job_with(times, replays, plan, slow, lambda _: changed)
    return out if step is None else out | {"slow_replica_step_ns": step, "slow_replica_worth_ns": _job(replays) - step}


def _job(replays: list[int | None]) -> int | None:
    return max(replays) if replays and None not in replays else None


def _job_with(times: list, replays: list, plan: tuple, replica: int, change) -> int | None:
    """The job's replay with replica ``replica``'s times changed by ``change``."""
    if times[replica] is None or None in replays:
        return None
    changed = _replay(change(times[replica]), plan)
    if changed is None:
        return None
    return max(changed, *(v for q, v in enumerate(replays) if q != replica))


def _at_peers(own: whatif.StageTimes, times: list, replica: int, stage: int) -> whatif.StageTimes:
    """``own`` with stage ``stage``'s passes (each of its chunks', in ``chunked``) at the median of the other
    replicas', pass by pass."""
    peers = [t for q, t in enumerate(times) if q != replica and t is not None]
    changed = _median_rows(own, peers, stage, own.stages)
    if own.chunked:
        chunked = _median_rows(own.chunked, [t.chunked for t in peers], stage, own.stages)
        changed = replace(changed, chunked=chunked)
    return changed


def _median_rows(times: whatif.StageTimes, peers: list, stage: int, p: int) -> whatif.StageTimes:
    """``times`` with the rows ``stage``, ``stage + p``, ... (a stage, or its virtual stages) of each pass grid
    at the median of ``peers``' same rows, cell by cell."""
    grids = {}
    for name in ("forward", "backward", "weight"):
        mine, theirs = getattr(times, name), [getattr(t, name) if t is not None else None for t in peers]
        if mine is None or not theirs or any(g is None for g in theirs):
            continue
        rows = list(mine)
        for k in range(stage, len(rows), p):
            rows[k] = tuple(int(statistics.median(g[k][j] for g in theirs)) for j in range(len(rows[k])))
        grids[name] = tuple(rows)
    return replace(times, **grids)


def _balanced(per_worker: dict, times: list, replays: list, plan: tuple) -> dict:
    """The partition-move what-if: each stage's scale set from its least compute over the replicas (a
    slow GPU only adds to a stage's work; with two replicas a median would halve its excess into the
    stage), the same in every replica; the heavy stage named with its ratios."""
    stages = sorted({s for s, _ in per_worker})
    replicas = sorted({r for _, r in per_worker})
    typical = [min(per_worker.get((s, r), 0) for r in replicas) for s in stages]
    if not stages or not all(typical):
        return {}
    middle = statistics.median(typical)
    heavy = max(stages, key=lambda s: typical[s])
    least = min(per_worker.get((heavy, r), 0) / statistics.median(per_worker.get((s, r), 0) for s in stages)
                for r in replicas)
    out = {"heavy_stage": heavy, "heavy_ratio": typical[heavy] / middle if middle else None,
           "heavy_min_ratio": least}
    target = Fraction(round(sum(typical)), len(typical))
    scale = [target / round(t) for t in typical]
    if None in replays or any(t is None for t in times):
        return out
    # a slow worker is its own finding: the move is judged with every slow worker at its peers' pace (else
    # more layers on a slow GPU would hide what the partition costs), against the job replayed the same way
    slow = sorted(w for w, ns in per_worker.items() if ns >= WORKER_RATIO * _peers_median(per_worker, *w))
    paced = list(times)
    for s, r in slow:
        paced[r] = _at_peers(paced[r], times, r, s)
    job = _job(replays) if not slow else _job([_replay(t, plan) for t in paced])
    balanced = [_replay(whatif._scaled(t, scale), plan) for t in paced]
    if None in balanced or job is None:
        return out
    return out | {"balanced_step_ns": max(balanced), "balanced_worth_ns": job - max(balanced),
                  "balanced_paced": [f"pp{s}/dp{r}" for s, r in slow]}


def _peers_median(per_worker: dict, stage: int, replica: int) -> float:
    """The median compute of ``stage`` in the other replicas (infinite where it has none: never slow)."""
    peers = [ns for (s, r), ns in per_worker.items() if s == stage and r != replica]
    return statistics.median(peers) if peers else float("inf")


def _sync_waits(work: pl.DataFrame, count: int, lanes: dict) -> list[Wait]:
    """Each worker's wait at its stage's gradient sync in each step: from its last pass compute to the last
    of its peers' (the data-parallel reduce cannot finish before the slowest replica's stage has), where
    longer than nothing."""
    last = (
        work.filter(pl.col("role") == "compute")
        .group_by("step", "stage").agg(pl.col("end").max())
        .with_columns(replica=pl.col("step") % count, k=pl.col("step") // count)
        .with_columns(peers=pl.len().over("k", "stage"), slowest_end=pl.col("end").max().over("k", "stage"))
        .filter(pl.col("peers") == count)
    )
    slowest_of = (
        last.sort("end", "replica", descending=[True, False]).unique(["k", "stage"], keep="first")
        .select("k", "stage", slowest="replica")
    )
    rows = last.filter(pl.col("slowest_end") > pl.col("end")).join(slowest_of, on=["k", "stage"])
    rows = rows.sort("k", "stage", "replica")
    return [
        Wait(stage=s, start_ns=end, dur_ns=slow_end - end, cause="dp_sync", before=None,
             after=f"gradient sync, waiting for {lanes.get((s, slow), f'pp{s}/dp{slow}')}", step=k,
             lane=lanes.get((s, r)))
        for k, s, r, end, slow_end, slow in rows.select("k", "stage", "replica", "end", "slowest_end",
                                                         "slowest").iter_rows()
    ]
