"""Reduce: the files' FLOPs parts as the report's ``flops`` section (``report.flops``): operators with their
roofline, MFU per GPU, stage (and replica) and step, and the unmodelled GPU time.

Peaks come from each GPU's name (``peaks.peak_of`` over the file's ``gpu_names``), or from ``--peak-flops``
and ``--peak-bandwidth``, which replace the table's figures for every device and dtype (a CPU job's only
source of them). A dtype the device's table lacks (fp8 on a V100) is taken at its fp32 peak.
"""

from __future__ import annotations

import polars as pl

from pipebubble.analysis.flops.part import FlopsPart
from pipebubble.analysis.flops.peaks import Peak, peak_of
from pipebubble.report.breakdown import Breakdown
from pipebubble.report.flops import Flops, FlopsGpu, FlopsOp, FlopsStage, FlopsStep, Unmodelled
from pipebubble.report.ingest import Lane
from pipebubble.report.pipeline import Pipeline, Stage

OPS_KEPT = 1000
UNMODELLED_KEPT = 20


def peak_for(peak: Peak | None, dtype: str | None) -> float | None:
    if peak is None:
        return None
    got = peak.flops.get(dtype or "fp32") or peak.flops.get("fp32")
    return got or None


def lane_flops(parts: list[FlopsPart]) -> dict[str, int]:
    """Each lane's model FLOPs (matrix work), what the pipeline's rebalanced what-if moves."""
    heavy = [p.lanes.filter("heavy") for p in parts if p.lanes.height]
    if not heavy:
        return {}
    return dict(pl.concat(heavy).group_by("lane").agg(pl.col("flops").sum()).iter_rows())


def flops_report(parts: list[tuple[FlopsPart | None, dict]], lanes: list[Lane], stages: list[Stage],
                 breakdown: list[Breakdown], peak_flops: float | None = None,
                 peak_bandwidth: float | None = None, pipeline: Pipeline | None = None) -> Flops | None:
    """The job's ``Flops``; None where no file has an operator with FLOPs (no shapes recorded)."""
    present = [(p, meta) for p, meta in parts if p is not None and p.lanes.height]
    if not present:
        return None
    peaks = _peaks(present, peak_flops, peak_bandwidth)
    by_lane = pl.concat([p.lanes for p, _ in present])
    peaks, tf32 = _with_tf32(peaks, by_lane) if not peak_flops else (peaks, [])
    by_lane = _at_peak(by_lane, peaks)
    heavy = by_lane.filter("heavy")
    per_lane = _per_lane(by_lane)
    windows = {lane.lane: lane.window_ns for lane in lanes}
    gpus = _by_gpu(per_lane, peaks, windows, _workers(stages, pipeline, per_lane["lane"].to_list(),
                                                      dict(per_lane.select("lane", "rank").iter_rows())))
    gpu_total = sum(p.gpu_ns for p, _ in present)
    unmodelled = pl.concat([p.unmodelled for p, _ in present]).group_by("name").agg(pl.col("gpu_ns").sum())
    lost = int(unmodelled["gpu_ns"].sum() or 0)
    counted_ns = int(by_lane["gpu_ns"].sum() or 0)
    flops = int(heavy["flops"].sum() or 0)
    known = per_lane.filter(pl.col("at_peak").is_not_null() & (pl.col("heavy_ns") > 0))
    equivalent = sum(g.mfu * g.window_ns for g in gpus if g.mfu is not None)
    window = sum(g.window_ns for g in gpus if g.mfu is not None)
    source = "flag" if peak_flops else ("table" if any(p is not None for p in peaks.values()) else None)
    notes = [f"float32 products on {', '.join(tf32)} ran faster than the device's float32 peak: they ran on "
             "TF32 tensor cores (torch.backends.cuda.matmul.allow_tf32), so float32 is held to the TF32 peak"
             ] if tf32 else []
    if source is None:
        notes.append("no peak FLOP/s for these devices (the trace names none the table knows): MFU and the "
                     "roofline need --peak-flops and --peak-bandwidth")
    return Flops(
        ops=_ops(pl.concat([p.ops for p, _ in present]), peaks),
        by_gpu=gpus,
        by_stage=_by_stage(gpus),
        by_step=_by_step(heavy, breakdown),
        unmodelled_share=lost / gpu_total if gpu_total else None,
        unmodelled=[Unmodelled(name, ns, ns / gpu_total) for name, ns in
                    unmodelled.sort("gpu_ns", descending=True).head(UNMODELLED_KEPT).iter_rows()] if gpu_total else [],
        flops=flops,
        gpu_ns=counted_ns,
        modelled_share=counted_ns / gpu_total if gpu_total else None,
        mfu=equivalent / window if window else None,
        peak_share=known["at_peak"].sum() * 1e9 / known["heavy_ns"].sum() if known.height else None,
        peak_source=source,
        notes=notes,
    )


def _peaks(present, peak_flops: float | None, peak_bandwidth: float | None) -> dict[str, Peak | None]:
    """lane -> its device's peaks, under the name the trace gives the device (the flags' figures where
    given: ``--peak-flops`` for every dtype)."""
    out: dict[str, Peak | None] = {}
    every = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8")
    for part, meta in present:
        names = {int(k): v for k, v in (meta.get("gpu_names") or {}).items()}
        # a device number the header lacks (it numbers the visible devices, the events the physical ones) is
        # named by the header where that names one kind of device only
        only = next(iter(set(names.values()))) if len(set(names.values())) == 1 else None
        for lane, device in part.lanes.select("lane", "device").unique().iter_rows():
            named = names.get(device, only) if device is not None else None
            peak = peak_of(named)
            flops = dict.fromkeys(every, peak_flops) if peak_flops else (peak.flops if peak else {})
            bandwidth = peak_bandwidth or (peak.bytes_per_s if peak else 0.0)
            out[lane] = Peak(named or (peak.device if peak else "given"), flops, bandwidth) if flops else None
    return out


def _with_tf32(peaks: dict[str, Peak | None], by_lane: pl.DataFrame) -> tuple[dict[str, Peak | None], list[str]]:
    """The peaks with float32 at the TF32 peak on each GPU whose float32 matrix work ran faster than the
    float32 (CUDA core) peak: it can only have run on tensor cores. The lanes so changed."""
    rates = by_lane.filter(pl.col("heavy") & (pl.col("dtype") == "fp32")).group_by("lane").agg(
        rate=pl.col("flops").sum() / pl.col("gpu_ns").sum() * 1e9)
    changed = []
    out = dict(peaks)
    for lane, rate in rates.iter_rows():
        peak = peaks.get(lane)
        if peak is not None and "tf32" in peak.flops and rate > peak.flops.get("fp32", float("inf")):
            out[lane] = peak._replace(flops={**peak.flops, "fp32": peak.flops["tf32"]})
            changed.append(lane)
    return out, sorted(changed)


def _at_peak(by_lane: pl.DataFrame, peaks: dict[str, Peak | None]) -> pl.DataFrame:
    """``by_lane`` with ``at_peak``: the seconds its FLOPs take at its device's peak for their dtype (null on
    a lane whose device has no peak); each (lane, dtype) pair's peak looked up once."""
    pairs = by_lane.select("lane", "dtype").unique()
    rates = pl.Series("peak", [peak_for(peaks.get(lane), dtype) for lane, dtype in pairs.iter_rows()],
                      dtype=pl.Float64)
    with_peak = by_lane.join(pairs.with_columns(rates), on=["lane", "dtype"], how="left", nulls_equal=True)
    return with_peak.with_columns(at_peak=pl.col("flops") / pl.col("peak")).drop("peak")


def _known_sum(column: str) -> pl.Expr:
    """The sum of ``column``; null where any of it is null (a figure unknown in part is unknown)."""
    return pl.when(pl.col(column).is_null().any()).then(None).otherwise(pl.col(column).sum())


def _per_lane(by_lane: pl.DataFrame) -> pl.DataFrame:
    """lane, rank, gpu_ns (every counted operator's), flops, heavy_ns and at_peak (the matrix work's), dtype
    (the one with the most matrix FLOPs): one row per lane, sorted by lane."""
    heavy = by_lane.filter("heavy")
    dtypes = heavy.group_by("lane", "dtype").agg(pl.col("flops").sum()).sort(
        "lane", "flops", "dtype", descending=[False, True, False]).unique("lane", keep="first", maintain_order=True)
    work = heavy.group_by("lane").agg(pl.col("flops").sum(), heavy_ns=pl.col("gpu_ns").sum(),
                                      at_peak=_known_sum("at_peak"))
    per = by_lane.group_by("lane").agg(pl.col("rank").first(), pl.col("gpu_ns").sum())
    per = per.join(work, on="lane", how="left").join(dtypes.select("lane", "dtype"), on="lane", how="left")
    return per.with_columns(pl.col("flops", "heavy_ns").fill_null(0)).sort("lane")


def _workers(stages: list[Stage], pipeline: Pipeline | None, lanes: list[str], ranks: dict) -> dict:
    """lane -> (stage, replica): the stages' own lanes, and in a DP × PP job every worker's (by its rank, or
    a lane the worker's name begins, as a step-timer timeline's ``pp1/dp0 compute``)."""
    where = {lane: (s.stage, s.replica) for s in stages for lane in s.lanes}
    rep = pipeline.replicas if pipeline is not None else None
    if rep is None:
        return where
    by_rank = {w.rank: (w.stage, w.replica) for w in rep.workers if w.rank is not None}
    by_name = {w.name: (w.stage, w.replica) for w in rep.workers}
    for lane in lanes:
        if lane in where:
            continue
        named = lane.split(" ")[0].rsplit("/tp", 1)[0]
        if named in by_name:
            where[lane] = by_name[named]
        elif ranks.get(lane) in by_rank:
            where[lane] = by_rank[ranks[lane]]
    return where


def _by_gpu(per_lane: pl.DataFrame, peaks: dict, windows: dict[str, int], where: dict) -> list[FlopsGpu]:
    out = []
    for row in per_lane.iter_rows(named=True):
        lane, main, heavy_ns = row["lane"], row["dtype"], row["heavy_ns"]
        peak, window = peaks.get(lane), windows.get(lane, 0)
        # a lane whose operators did no matrix work ran none of it at its peak: 0 s, where the peak is known
        at_peak = row["at_peak"] if row["at_peak"] is not None or not heavy_ns else 0.0
        at_peak = at_peak if peak is not None else None
        stage, replica = where.get(lane, (None, None))
        out.append(FlopsGpu(
            lane=lane, rank=row["rank"], device=peak.device if peak else None,
            peak_flops_per_s=peak_for(peak, main), peak_bytes_per_s=(peak.bytes_per_s or None) if peak else None,
            dtype=main, flops=row["flops"], gpu_ns=row["gpu_ns"], window_ns=window,
            flops_per_s=row["flops"] / heavy_ns * 1e9 if heavy_ns else None,
            mfu=at_peak / (window / 1e9) if at_peak is not None and window > 0 else None,
            stage=stage, replica=replica))
    return out


def _by_stage(gpus: list[FlopsGpu]) -> list[FlopsStage]:
    groups: dict[tuple[int, int | None], list[FlopsGpu]] = {}
    for g in gpus:
        if g.stage is not None:
            groups.setdefault((g.stage, g.replica), []).append(g)
    out = []
    for (stage, replica), rows in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        flops = sum(g.flops for g in rows)
        rate = [g.flops_per_s for g in rows if g.flops_per_s]
        busy = sum(g.flops / g.flops_per_s for g in rows if g.flops_per_s)
        window = sum(g.window_ns for g in rows if g.mfu is not None)
        mfu = sum(g.mfu * g.window_ns for g in rows if g.mfu is not None) / window if window else None
        out.append(FlopsStage(stage, flops, sum(g.gpu_ns for g in rows),
                              flops / busy if rate and busy else None, mfu, replica))
    return out


def _by_step(heavy: pl.DataFrame, breakdown: list[Breakdown]) -> list[FlopsStep]:
    """Per step: its matrix FLOPs, its GPUs' windows in it (the breakdown's rows) and MFU; a window or a peak
    unknown for one of its lanes leaves the step's unknown."""
    windows = pl.DataFrame([(b.lane, b.step, b.window_ns) for b in breakdown if b.step is not None],
                           schema={"lane": pl.String, "step": pl.Int64, "window_ns": pl.Int64}, orient="row")
    windows = windows.unique(["lane", "step"], keep="last", maintain_order=True)
    lanes = heavy.filter(pl.col("step").is_not_null()).group_by("lane", "step").agg(
        pl.col("flops").sum(), at_peak=_known_sum("at_peak"))
    steps = lanes.join(windows, on=["lane", "step"], how="left").group_by("step").agg(
        pl.col("flops").sum(), window_ns=_known_sum("window_ns"), at_peak=_known_sum("at_peak")).sort("step")
    return [FlopsStep(step, flops, window, at_peak / (window / 1e9) if at_peak is not None and window else None)
            for step, flops, window, at_peak in steps.select("step", "flops", "window_ns", "at_peak").iter_rows()]


def _ops(ops: pl.DataFrame, peaks: dict) -> list[FlopsOp]:
    """Operators by GPU time, biggest first, with their roofline against the job's first device with peaks."""
    table = ops.group_by("name", "input_dims", "dtype", "cls", "source").agg(
        pl.col("count").sum(), pl.col("flops").sum(), pl.col("gpu_ns").sum(),
        bytes=pl.when(pl.col("bytes").is_not_null().any()).then(pl.col("bytes").sum()))
    order = ["gpu_ns", "flops", "name", "input_dims", "dtype", "cls", "source"]  # every key: one order each run
    table = table.sort(order, descending=[True, True] + [False] * 5, nulls_last=True).head(OPS_KEPT)
    peak = next((p for p in peaks.values() if p is not None), None)
    out = []
    for row in table.iter_rows(named=True):
        flops, nbytes, ns = row["flops"], row["bytes"], row["gpu_ns"]
        rate = flops / ns * 1e9 if ns else None
        intensity = flops / nbytes if nbytes else None
        p = peak_for(peak, row["dtype"])
        bound, share = None, rate / p if rate is not None and p else None
        if intensity is not None and p and peak is not None and peak.bytes_per_s:
            bound = "compute" if intensity >= p / peak.bytes_per_s else "memory"
            if bound == "memory":  # the share of the roof that binds it: the bandwidth
                share = nbytes / ns * 1e9 / peak.bytes_per_s if ns else None
        out.append(FlopsOp(name=row["name"], input_dims=row["input_dims"], dtype=row["dtype"], cls=row["cls"],
                           count=row["count"], flops=flops, bytes=nbytes, gpu_ns=ns, flops_per_s=rate,
                           intensity=intensity, bound=bound, peak_share=share,
                           source=row["source"]))
    return out
