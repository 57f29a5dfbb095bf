"""Map: one file's FLOPs part: its operators' FLOPs and bytes (the ``flops`` arg, else ``model`` over the
recorded shapes), each with the GPU time of the kernels it launched, summed per lane, step and dtype.

Which calls count: torch.profiler records nested operators (``aten::linear`` holds ``aten::matmul`` holds
``aten::mm``), so counting every modelled call would count a product three times. A matrix product, attention
or convolution counts where it holds no other one (the innermost: ``aten::mm``, ``_flash_attention_forward``);
an elementwise operator or a reduction counts where it holds no other modelled call and lies inside no
counted product (a copy inside ``aten::addmm`` is the product's). The counted calls of a thread never
overlap, so each launch belongs to at most one: the counted call whose interval holds the launching runtime
call's start (``launches``). An operator's GPU time is the sum of the GPU operations it launched (kernels,
copies and memsets; communication is not modelled); a call that launched no kernel (a product whose only
GPU work is a memset, its kernel not recorded) does not count on the GPU. A file with no GPU operation (a
CPU job) counts each call's own time on its thread instead.

The GPU time of kernels launched outside every counted call is unmodelled; it is named by the innermost
operator that holds its launch (``launches.innermost``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import polars as pl

from pipebubble.analysis.flops.model import model
from pipebubble.analysis.launches import innermost
from pipebubble.spans import owner

__all__ = ["FlopsPart", "flops_part"]

HEAVY = ("matmul", "attention", "conv")
OPS_SCHEMA = {"name": pl.String, "input_dims": pl.String, "dtype": pl.String, "cls": pl.String,
              "source": pl.String, "count": pl.Int64, "flops": pl.Int64, "bytes": pl.Int64, "gpu_ns": pl.Int64}
LANES_SCHEMA = {"lane": pl.String, "rank": pl.Int32, "device": pl.Int32, "step": pl.Int64, "dtype": pl.String,
                "heavy": pl.Boolean, "flops": pl.Int64, "gpu_ns": pl.Int64}
UNMODELLED_SCHEMA = {"name": pl.String, "gpu_ns": pl.Int64}


@dataclass(frozen=True)
class FlopsPart:
    """``ops``: OPS_SCHEMA, per operator name, input shapes, dtype, class and source; ``lanes``: LANES_SCHEMA,
    per lane (a GPU, or a CPU thread in a file without GPU work), step (null: outside every step) and dtype,
    matrix work (``heavy``) apart; ``unmodelled``: GPU time launched outside every counted call, by the
    operator that holds its launch; ``gpu_ns``: the file's GPU time of non-communication operations."""

    ops: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=OPS_SCHEMA))
    lanes: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=LANES_SCHEMA))
    unmodelled: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=UNMODELLED_SCHEMA))
    gpu_ns: int = 0

    FRAMES = ("ops", "lanes", "unmodelled")


def _costs(calls: pl.DataFrame) -> pl.DataFrame:
    """name, dims, dtypes -> m_flops, m_bytes, cls, dtype: the model of each distinct call shape (a few
    hundred in a trace of millions of calls)."""
    distinct = calls.select("name", "dims", "dtypes").unique()
    rows = []
    for name, dims, dtypes in distinct.iter_rows():
        cost = None
        if dims is not None:
            try:
                cost = model(name, json.loads(dims), json.loads(dtypes) if dtypes else [])
            except (ValueError, TypeError):
                cost = None
        rows.append((name, dims, dtypes, *(cost if cost else (None, None, None, None))))
    return pl.DataFrame(rows, schema={"name": pl.String, "dims": pl.String, "dtypes": pl.String,
                                      "m_flops": pl.Int64, "m_bytes": pl.Int64, "cls": pl.String,
                                      "dtype": pl.String}, orient="row")


def _counted(calls: pl.DataFrame) -> pl.DataFrame:
    """The calls that count (module docstring), each thread's never overlapping."""
    order = ["lane", "start", "end"]
    outer_first = {"descending": [False, False, True]}
    heavy = calls.filter(pl.col("cls").is_in(HEAVY)).sort("lane", "start", "end", **outer_first)
    nxt = pl.col("start").shift(-1).over("lane")
    heavy = heavy.filter(nxt.is_null() | (nxt >= pl.col("end")))
    light = calls.filter(~pl.col("cls").is_in(HEAVY)).sort("lane", "start")
    if heavy.height and light.height:
        spans = heavy.select("lane", h_start="start", h_end="end").sort("lane", "h_start")
        on = {"left_on": "start", "right_on": "h_start", "by": "lane", "check_sortedness": False}
        inside = light.join_asof(spans, strategy="backward", **on)
        holds = light.join_asof(spans, strategy="forward", **on)
        keep = ~(inside["h_end"].fill_null(-(2**62)) > inside["start"]) & ~(
            holds["h_start"].fill_null(2**62) < holds["end"])
        light = light.filter(keep)
    light = light.sort("lane", "start", "end", **outer_first)
    light = light.filter(nxt.is_null() | (nxt >= pl.col("end")))
    return pl.concat([heavy, light]).sort(order)


def flops_part(spans: pl.DataFrame, gpu: pl.DataFrame | None = None, launch: pl.DataFrame | None = None,
               steps: pl.DataFrame | None = None) -> FlopsPart:
    """The ``FlopsPart`` of ``spans``. ``gpu``, ``launch`` and ``steps``: the breakdown's inputs
    (``breakdown.part.GpuInputs``: GPU operations numbered by ``row``, the launch of each, the steps as the GPU
    lives them), built from ``spans`` where not given."""
    if not {"dims", "dtypes", "flops"} <= set(spans.columns):
        return FlopsPart()
    if gpu is None or launch is None or steps is None:
        from pipebubble.analysis.breakdown.part import inputs

        given = inputs(spans)
        gpu, launch, steps = given.gpu, given.launch, given.steps
    ops = spans.filter((pl.col("kind") == "cpu_op") & pl.col("device").is_null())
    calls = ops.filter(pl.col("dims").is_not_null() | pl.col("flops").is_not_null()).select(
        "lane", "rank", "name", "start", "end", "dims", "dtypes", arg_flops=pl.col("flops"), owner=owner())
    work = gpu.filter(pl.col("cls") != "comm") if gpu.height else gpu
    gpu_ns = int(work.select((pl.col("end") - pl.col("start")).sum()).item() or 0) if work.height else 0
    if not calls.height:
        return FlopsPart(gpu_ns=gpu_ns, unmodelled=_unmodelled(ops, work, launch, None))
    calls = calls.join(_costs(calls), on=["name", "dims", "dtypes"], how="left", nulls_equal=True)
    calls = calls.with_columns(
        flops=pl.coalesce("arg_flops", "m_flops"),
        bytes=pl.col("m_bytes"),
        source=pl.when(pl.col("arg_flops").is_not_null()).then(pl.lit("arg")).otherwise(pl.lit("shapes")),
        cls=pl.col("cls").fill_null("matmul"),  # a flops arg without a model: a product, as torch counts them
    ).filter(pl.col("flops").is_not_null()).with_row_index("call")
    counted = _counted(calls)
    if work.height:
        per_call = _launched_by(counted, work, launch)
        counted = counted.join(per_call, on="call", how="inner")
    else:
        counted = counted.with_columns(gpu_ns=pl.col("end") - pl.col("start"), at=pl.col("start"),
                                       gpu_lane=pl.col("lane"), device=pl.lit(None, pl.Int32))
    counted = _with_step(counted, steps)
    table = counted.group_by("name", "dims", "dtype", "cls", "source").agg(
        count=pl.len(), flops=pl.col("flops").sum(), bytes=pl.col("bytes").sum(), gpu_ns=pl.col("gpu_ns").sum())
    table = table.rename({"dims": "input_dims"}).select(list(OPS_SCHEMA)).cast(OPS_SCHEMA)  # type: ignore[arg-type]
    lanes = counted.group_by("gpu_lane", "rank", "device", "step", "dtype", heavy=pl.col("cls").is_in(HEAVY)).agg(
        flops=pl.col("flops").sum(), gpu_ns=pl.col("gpu_ns").sum()).rename({"gpu_lane": "lane"})
    lanes = lanes.select(list(LANES_SCHEMA)).cast(LANES_SCHEMA)  # type: ignore[arg-type]
    return FlopsPart(table, lanes, _unmodelled(ops, work, launch, counted), gpu_ns)


def _launched_by(counted: pl.DataFrame, work: pl.DataFrame, launch: pl.DataFrame) -> pl.DataFrame:
    """call, gpu_ns, at, gpu_lane, device: of each counted call, the GPU time of the operations whose launch
    it holds, and their first lane."""
    launched = _launches(work, launch)
    spans = counted.select("call", lane="lane", c_start="start", c_end="end").sort("lane", "c_start")
    owned = launched.join_asof(spans, left_on="at", right_on="c_start", by="lane", strategy="backward",
                               check_sortedness=False).filter(pl.col("at") < pl.col("c_end"))
    per_call = owned.group_by("call").agg(
        gpu_ns=(pl.col("end") - pl.col("start")).sum(), at=pl.col("at").min(),
        gpu_lane=pl.col("gpu_lane").sort_by("start").first(), device=pl.col("device").sort_by("start").first(),
        kernels=(pl.col("cls") == "compute").sum())
    return per_call.filter(pl.col("kernels") > 0).drop("kernels")


def _launches(work: pl.DataFrame, launch: pl.DataFrame) -> pl.DataFrame:
    """lane (the launching thread's), at, start, end, gpu_lane, device: every GPU operation with its launch."""
    return work.select("row", "start", "end", "cls", gpu_lane="lane", device="device").join(
        launch.select("row", "at", lane="at_lane"), on="row").sort("lane", "at")


def _with_step(counted: pl.DataFrame, steps: pl.DataFrame | None) -> pl.DataFrame:
    """``counted`` with the step whose window holds each call's first launch (null outside every step)."""
    if steps is None or steps.is_empty():
        return counted.with_columns(step=pl.lit(None, pl.Int64))
    windows = steps.select("owner", "step", "ws", "we").sort("owner", "ws")
    joined = counted.sort("owner", "at").join_asof(windows, left_on="at", right_on="ws", by="owner",
                                                    strategy="backward", check_sortedness=False)
    return joined.with_columns(step=pl.when(pl.col("at") < pl.col("we")).then("step")).drop("ws", "we")


def _unmodelled(ops: pl.DataFrame, work: pl.DataFrame, launch: pl.DataFrame | None,
                counted: pl.DataFrame | None) -> pl.DataFrame:
    """name, gpu_ns: the GPU time launched outside every counted call, by the innermost operator that holds
    the launch (null: none does)."""
    if not work.height or launch is None:
        return pl.DataFrame(schema=UNMODELLED_SCHEMA)
    launched = _launches(work, launch)
    if counted is not None and counted.height:
        spans = counted.select(lane="lane", c_start="start", c_end="end").sort("lane", "c_start")
        launched = launched.join_asof(spans, left_on="at", right_on="c_start", by="lane",
                                      strategy="backward", check_sortedness=False).filter(
            pl.col("c_end").is_null() | (pl.col("at") >= pl.col("c_end"))).drop("c_start", "c_end")
    named = innermost(launched.rename({"lane": "at_lane"}).lazy(), ops.lazy()).collect()
    out = named.group_by(name="operator").agg(gpu_ns=(pl.col("end") - pl.col("start")).sum())
    return out.sort("gpu_ns", descending=True).cast(UNMODELLED_SCHEMA)  # type: ignore[arg-type]
