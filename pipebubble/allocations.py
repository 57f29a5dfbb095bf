"""The allocator-event table: what a trace says about memory, a table of its own beside the span table.

One row per allocation or free the allocator reported (torch.profiler's ``[memory]`` instants with
``profile_memory=True``; Nsight Systems' ``CUDA_GPU_MEMORY_USAGE_EVENTS`` with ``--cuda-memory-usage=true``).
``bytes`` is signed (+ allocated, − freed). ``allocated`` / ``reserved`` are the allocator's totals on that
device just after the event, as the trace states them; where a format states no totals, ``allocated`` is the
running sum of ``bytes`` since the trace began (``baseline`` = ``trace``: memory held before it is unseen),
else ``baseline`` = ``allocator``. Times are int64 ns on the file's clock (the job's once aligned); unknown
is null.

``lane`` names the memory's device as the span table names its lanes: ``rank0/gpu0`` for a GPU (so a GPU
lane's work and memory share a name) and ``rank0/cpu`` for host memory.
"""

from __future__ import annotations

import polars as pl

from pipebubble import spans

#: Device types by the numbers torch writes (c10::DeviceType); others keep their number as a name.
DEVICE_TYPES = {0: "cpu", 1: "cuda", 2: "mkldnn", 3: "opengl", 4: "opencl", 5: "ideep", 6: "hip", 7: "fpga",
                8: "maia", 9: "xla", 10: "vulkan", 11: "metal", 12: "xpu", 13: "mps", 14: "meta", 15: "hpu",
                16: "ve", 17: "lazy", 18: "ipu", 19: "mtia", 20: "privateuseone"}
#: Device types whose memory is a GPU's (an accelerator's): their lane is ``.../gpuN``.
GPU_TYPES = ("cuda", "hip", "xpu", "mps", "mtia", "hpu", "maia", "privateuseone")

SCHEMA: dict[str, pl.DataType] = {
    "source": pl.String,
    "rank": pl.Int32,
    "pid": pl.Int64,
    "tid": pl.Int64,
    "device_type": pl.String,
    "device": pl.Int32,
    "lane": pl.String,
    "ts": pl.Int64,
    "bytes": pl.Int64,
    "allocated": pl.Int64,
    "reserved": pl.Int64,
    "baseline": pl.String,
}


def empty() -> pl.DataFrame:
    """An allocator-event table with no rows."""
    return pl.DataFrame(schema=SCHEMA)


def conform(frame):
    """Cast ``frame`` (eager or lazy, kept so) to the allocator-event table's schema (``spans.conform``)."""
    return spans.conform(frame, SCHEMA)

def lane(owner: pl.Expr) -> pl.Expr:
    """The memory lane of each row: ``{owner}/gpu{device}`` for GPU memory, ``{owner}/cpu`` for host memory,
    ``{owner}/{type}{device}`` for any other device; ``owner`` is ``rank3`` or ``pid123``."""
    gpu = pl.col("device_type").is_in(GPU_TYPES)
    return (
        pl.when(gpu).then(pl.format("{}/gpu{}", owner, pl.col("device")))
        .when(pl.col("device_type") == "cpu").then(pl.format("{}/cpu", owner))
        .otherwise(pl.format("{}/{}{}", owner, pl.col("device_type"), pl.col("device").fill_null(0)))
    )


def with_running_totals(frame: pl.DataFrame) -> pl.DataFrame:
    """Rows without a stated ``allocated`` total get the running sum of ``bytes`` on their lane (in time
    order), ``baseline`` = ``trace``; rows with one keep it, ``baseline`` = ``allocator``."""
    frame = frame.sort(["lane", "ts"], maintain_order=True)
    running = pl.col("bytes").cum_sum().over("lane")
    return frame.with_columns(
        baseline=pl.when(pl.col("allocated").is_null()).then(pl.lit("trace")).otherwise(pl.lit("allocator")),
        allocated=pl.coalesce("allocated", running),
    )
