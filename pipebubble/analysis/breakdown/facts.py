"""Map: what the findings read of a file's GPU operations and host calls that the breakdown's unions do not
keep (``report.Facts``, under ``Host.facts``), each a small query over the part's GPU operations
(``part.gpu_ops``) and host spans:

- ``streams``: per GPU lane, stream, class and tag, the operations' count and time, and how many of the
  kernels (compute or communication) ran under ``TINY_NS``. A copy's tag is its direction and host memory as
  its name says them (Kineto's ``Memcpy HtoD (Pageable -> Device)`` is ``HtoD pageable``, Nsight's
  ``Memcpy HtoD`` is ``HtoD``); a compute kernel that converts a tensor's layout (cuDNN's ``nchwToNhwc``,
  ``nhwcToNchw``, ``convertTensor``, transposes) is ``layout``. Copies' bytes are not in the span table, so
  no bandwidth is derived here.
- ``gaps``: per GPU lane, the idle between two consecutive kernels that both ran under ``TINY_NS`` (the GPU's
  work as one union: a gap is a time no operation of the GPU runs, the op before it the one whose end closed
  the busy period, the op after it the one that opened the next), counting only gaps up to ``TINY_GAP_NS``.
  A longer gap is not a kernel's launch overhead (a launch costs microseconds, an eager operator's dispatch
  tens of them): a sync, a blocking copy or other host work held the GPU, which the idle account names.
  Its sort holds each operation's lane, times and whether it is tiny (a spilled table's too: about as much
  as the launch delays its breakdown holds whole).
- ``calls``: per host thread and name, the start-up calls (``STARTUP``: context, module and library
  loading, handle and communicator creation; ``ALLOCATOR``: device and pinned allocations and frees) and the
  framework markers (``FRAMEWORK``: DDP's and FSDP's ranges and reducer operators, TorchRec and FBGEMM
  operators, CUDA-graph replays): count, total and ``inside``, the part of them inside their owner's GPU
  window (its first to last GPU operation), the time they can hold a step back.
"""

from __future__ import annotations

import polars as pl

from pipebubble.analysis.hostnames import range_name
from pipebubble.analysis.idle.activity import STARTUP_CALLS
from pipebubble.spans import owner

#: A kernel shorter than this is tiny (the host summary's short kernels).
TINY_NS = 10_000
#: The longest gap between two tiny kernels counted as their launch overhead.
TINY_GAP_NS = 1_000_000

#: A copy's direction as CUPTI names it (Kineto ``Memcpy HtoD (...)``, Nsight ``Memcpy HtoD``).
COPY_DIRECTION = r"\b(HtoD|DtoH|DtoD|PtoP|HtoH|HtoA|AtoH|AtoA|AtoD|DtoA)\b"
#: The host memory a copy reads or writes, where its name says it (Kineto: ``(Pageable -> Device)``).
HOST_MEMORY = r"(?i)\b(pageable|pinned)\b"
#: Layout conversions, matched on a kernel's function name (before its argument list, so a kernel merely
#: taking cuBLAS's ``cublasTransposeParams`` is no conversion).
LAYOUT = (r"(?i)nchwToNhwc|nhwcToNchw|nchw2nhwc|nhwc2nchw|convertTensor|transpose_readWrite"
          r"|cudnn::\w+(::\w+)*::\w*transpose")
#: Start-up calls (runtime, driver, library): context, modules and libraries, handles and communicators.
#: The idle account's (``idle.activity.STARTUP_CALLS``), and the creation of streams.
STARTUP = STARTUP_CALLS + r"|^(cu|cuda|hip)StreamCreate\w*(_v\d+)*$"
#: Allocations and frees of device and pinned memory (not the stream-ordered ``*Async`` ones).
ALLOCATOR = (r"^(cu|cuda|hip)(Malloc|MallocHost|MallocManaged|MallocPitch|Malloc3D|HostAlloc|HostRegister|Free"
             r"|FreeHost|HostUnregister|MemAlloc|MemAllocHost|MemAllocManaged|MemAllocPitch|MemHostAlloc"
             r"|MemHostRegister|MemFree|MemFreeHost|MemHostUnregister|ExtMallocWithFlags)(_v\d+)*$")
#: Names that say which framework runs the job, by framework (``findings.framework`` reads them in host
#: calls, ranges, these facts' ``calls`` and, for TorchRec, kernels).
FRAMEWORKS = {
    "cuda_graphs": r"(?i)^(cu|cuda|hip)Graph(Exec)?Launch|graph_?runner.*replay|cuda_?graph\w*\.replay"
                   r"|CUDAGraph\w*::replay",
    "ddp": r"DistributedDataParallel|ddp\.reducer|distributed::reducer",
    "fsdp": r"FullyShardedDataParallel|\bFSDP|^fsdp::",
    "torchrec": r"(?i)torchrec|fbgemm|split_embedding\w*codegen|embedding_bag|bounds_check_indices|permute_pooled_embs",
    "all_to_all": r"(?i)^(nccl|rccl|gloo):all_to_all|alltoall",
}
FRAMEWORK = "|".join(f"(?:{p})" for p in FRAMEWORKS.values())


def streams(gpu: pl.LazyFrame) -> pl.LazyFrame:
    """lane, stream, cls, tag, count, total, tiny, tiny_total: the GPU operations ``gpu`` per lane, stream,
    class and tag (module docstring), with their kernels under ``TINY_NS`` (count and time). Names are
    tagged once each, after a group-by."""
    dur = pl.col("end") - pl.col("start")
    tiny = pl.col("cls").is_in(["compute", "comm"]) & (dur < TINY_NS)
    per = gpu.group_by("lane", "stream", pl.col("cls").cast(pl.String), pl.col("name").cast(pl.String)).agg(
        count=pl.len(), total=dur.sum(), tiny=tiny.sum().cast(pl.Int64), tiny_total=dur.filter(tiny).sum()
    )
    tagged = per.with_columns(tag=tag(pl.col("cls"), pl.col("name")))
    sums = pl.col("count", "tiny").sum().cast(pl.Int64), pl.col("total", "tiny_total").sum()
    return tagged.group_by("lane", "stream", "cls", "tag").agg(*sums)


def tag(cls: pl.Expr, name: pl.Expr) -> pl.Expr:
    """A copy's direction and host memory (``HtoD pageable``, ``DtoD``, ``other`` when its name says no
    direction), ``layout`` for a layout conversion, else null."""
    direction = name.str.extract(COPY_DIRECTION, 1).fill_null("other")
    memory = name.str.extract(HOST_MEMORY, 1).str.to_lowercase()
    copy = pl.concat_str([direction, memory], separator=" ", ignore_nulls=True)
    function = name.str.extract(r"^([^(]*)", 1)
    return (pl.when(cls == "memcpy").then(copy)
            .when((cls == "compute") & function.str.contains(LAYOUT)).then(pl.lit("layout"))
            .otherwise(pl.lit(None, pl.String)))


def gaps(gpu: pl.LazyFrame) -> pl.LazyFrame:
    """lane, count, total: per GPU lane, the gaps of its busy union between two tiny kernels, each at most
    ``TINY_GAP_NS`` (module docstring). Operations in start order; the busy period so far reaches the running
    maximum of the ends; a gap opens where an operation starts past the reach of those before it, and its
    ends are tiny when that operation is a tiny kernel and the one before it is a tiny kernel ending at the
    reach."""
    dur = pl.col("end") - pl.col("start")
    tiny = pl.col("cls").is_in(["compute", "comm"]) & (dur < TINY_NS)
    ops = gpu.select(pl.col("lane").cast(pl.Categorical), "start", "end", tiny=tiny)
    ops = ops.sort("lane", "start", "end").with_columns(reach=pl.col("end").cum_max().over("lane"))
    before = {c: pl.col(c).shift(1).over("lane") for c in ("reach", "end", "tiny")}
    gap = pl.col("start") - before["reach"]
    tiny_ends = pl.col("tiny") & before["tiny"] & (before["end"] == before["reach"])
    found = ops.select("lane", gap=gap, keep=tiny_ends).filter(
        pl.col("keep") & (pl.col("gap") > 0) & (pl.col("gap") <= TINY_GAP_NS))
    summed = found.group_by("lane").agg(count=pl.len().cast(pl.Int64), total=pl.col("gap").sum())
    return summed.with_columns(pl.col("lane").cast(pl.String))


def calls(gpu: pl.LazyFrame, cpu: pl.LazyFrame) -> pl.LazyFrame:
    """lane, name, count, total, inside: the host spans named like ``STARTUP``, ``ALLOCATOR`` or
    ``FRAMEWORK`` per thread and name (as ``hostnames.range_name`` names it: ``nccl:all_to_all, op_id = 7`` is
    ``nccl:all_to_all``), ``inside`` their time within their owner's GPU window. The names are matched once
    each."""
    named = cpu.select("lane", "start", "end", range_name(pl.col("name").cast(pl.String)), owner=owner())
    pattern = "|".join(f"(?:{p})" for p in (STARTUP, ALLOCATOR, FRAMEWORK))
    wanted = named.select("name").unique().filter(pl.col("name").str.contains(pattern))
    windows = gpu.group_by("owner").agg(first=pl.col("start").min(), last=pl.col("end").max())
    found = named.join(wanted, on="name", how="semi").join(windows, on="owner", how="left")
    clipped = pl.min_horizontal("end", "last") - pl.max_horizontal("start", "first")
    inside = pl.when(pl.col("first").is_null()).then(0).otherwise(clipped.clip(lower_bound=0))
    return found.group_by("lane", "name").agg(
        count=pl.len().cast(pl.Int64), total=(pl.col("end") - pl.col("start")).sum(), inside=inside.sum())


def collected(gpu: pl.LazyFrame, cpu: pl.LazyFrame) -> dict[str, pl.DataFrame]:
    """The three frames (``streams``, ``gaps``, ``calls``) of a part, as ``GpuPart`` names them."""
    found = pl.collect_all([streams(gpu), gaps(gpu), calls(gpu, cpu)], engine="streaming")
    return dict(zip(("streams", "gaps", "calls"), found, strict=True))
