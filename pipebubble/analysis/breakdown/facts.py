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
  Its sort holds each operation's lane, times and whether it is tiny; a spilled table's are counted window
  by window instead (``WindowedGaps``), each lane's last operation carried to the next.
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


def copy_direction(name: pl.Expr) -> pl.Expr:
    """A copy's direction as its name says it (``HtoD``); null where it says none."""
    return name.str.extract(COPY_DIRECTION, 1)


def host_memory(name: pl.Expr) -> pl.Expr:
    """The host memory a copy's name says it reads or writes (``pageable``, ``pinned``); null where none."""
    return name.str.extract(HOST_MEMORY, 1).str.to_lowercase()


def tag(cls: pl.Expr, name: pl.Expr) -> pl.Expr:
    """A copy's direction and host memory (``HtoD pageable``, ``DtoD``, ``other`` when its name says no
    direction), ``layout`` for a layout conversion, else null."""
    copy = pl.concat_str([copy_direction(name).fill_null("other"), host_memory(name)], separator=" ",
                         ignore_nulls=True)
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
    found = _tiny_gaps(gap_ops(gpu).sort(*ORDER))
    summed = found.group_by("lane").agg(count=pl.len().cast(pl.Int64), total=pl.col("gap").sum())
    return summed.with_columns(pl.col("lane").cast(pl.String))


#: The order ``gaps`` reads a lane's operations in: by start and end, and among equals a tiny kernel last (so
#: the operation before a gap is the same whatever order the table holds equal ones in).
ORDER = ("lane", "start", "end", "tiny")


def gap_ops(gpu: pl.LazyFrame | pl.DataFrame) -> pl.LazyFrame:
    """lane (a category), start, end, tiny: what ``gaps`` reads of each GPU operation."""
    dur = pl.col("end") - pl.col("start")
    tiny = pl.col("cls").is_in(["compute", "comm"]) & (dur < TINY_NS)
    return gpu.lazy().select(pl.col("lane").cast(pl.Categorical), "start", "end", tiny=tiny)


def _tiny_gaps(ops: pl.LazyFrame, reach: pl.Expr | None = None) -> pl.LazyFrame:
    """lane, gap: the gaps ``gaps`` counts among ``ops`` (``gap_ops``' columns, sorted in ``ORDER``);
    ``reach``: where the busy period of a lane's first row reaches, where it is not its own end."""
    end = pl.col("end") if reach is None else reach
    ops = ops.with_columns(reach=end.cum_max().over("lane"))
    before = {c: pl.col(c).shift(1).over("lane") for c in ("reach", "end", "tiny")}
    gap = pl.col("start") - before["reach"]
    tiny_ends = pl.col("tiny") & before["tiny"] & (before["end"] == before["reach"])
    return ops.select("lane", gap=gap, keep=tiny_ends).filter(
        pl.col("keep") & (pl.col("gap") > 0) & (pl.col("gap") <= TINY_GAP_NS)).select("lane", "gap")


class WindowedGaps:
    """``gaps`` over the GPU operations a window at a time (each window's operations: those that start in
    it, windows in time order): each lane's last operation and the reach before it carry to the next window,
    so every gap is counted once, as ``gaps`` counts it over them all."""

    def __init__(self) -> None:
        self.carry = pl.DataFrame(schema={"lane": pl.Categorical, "start": pl.Int64, "end": pl.Int64,
                                          "tiny": pl.Boolean, "reach": pl.Int64, "first": pl.Boolean})
        self.sums: list[pl.DataFrame] = []

    def add(self, own: pl.DataFrame) -> None:
        """The operations (``gap_ops``' columns, with lane a category) that start in the next window."""
        rows = own.select("lane", "start", "end", "tiny").with_columns(
            reach=pl.col("end"), first=pl.lit(False))
        both = pl.concat([self.carry.with_columns(first=pl.lit(True)), rows], how="vertical_relaxed").sort(
            "lane", "first", *ORDER[1:], descending=[False, True, False, False, False])
        both = both.with_columns(pl.col("reach").cum_max().over("lane"))
        self.carry = both.filter(pl.int_range(pl.len()).over("lane") == pl.len().over("lane") - 1)
        found = _tiny_gaps(both.lazy().select("lane", "start", "end", "tiny", "reach"), pl.col("reach"))
        self.sums.append(found.group_by("lane").agg(count=pl.len().cast(pl.Int64), total=pl.col("gap").sum())
                         .collect())

    def result(self) -> pl.DataFrame:
        """``gaps``' frame: lane, count, total."""
        found = pl.concat([s.with_columns(pl.col("lane").cast(pl.String)) for s in self.sums]) if self.sums else (
            pl.DataFrame(schema={"lane": pl.String, "count": pl.Int64, "total": pl.Int64}))
        return found.group_by("lane").agg(pl.col("count").sum().cast(pl.Int64), pl.col("total").sum())


def calls(gpu: pl.LazyFrame, cpu: pl.LazyFrame) -> pl.LazyFrame:
    """lane, name, count, total, inside: the host spans named like ``STARTUP``, ``ALLOCATOR`` or
    ``FRAMEWORK`` per thread and name (as ``hostnames.range_name`` names it: ``nccl:all_to_all, op_id = 7`` is
    ``nccl:all_to_all``), ``inside`` their time within their owner's GPU window. The names are matched once
    each."""
    named = cpu.select("lane", "start", "end", range_name(pl.col("name").cast(pl.String)), owner=owner())
    pattern = "|".join(f"(?:{p})" for p in (STARTUP, ALLOCATOR, FRAMEWORK))
    # The names wanted are few: a filter on them, not a join (which would hold every host span of a scan).
    wanted = named.select("name").unique().filter(pl.col("name").str.contains(pattern)).collect(
        engine="streaming")["name"]
    windows = gpu.group_by("owner").agg(first=pl.col("start").min(), last=pl.col("end").max())
    found = named.filter(pl.col("name").is_in(wanted.implode())).join(windows, on="owner", how="left")
    clipped = pl.min_horizontal("end", "last") - pl.max_horizontal("start", "first")
    inside = pl.when(pl.col("first").is_null()).then(0).otherwise(clipped.clip(lower_bound=0))
    return found.group_by("lane", "name").agg(
        count=pl.len().cast(pl.Int64), total=(pl.col("end") - pl.col("start")).sum(), inside=inside.sum())


def collected(gpu: pl.LazyFrame, cpu: pl.LazyFrame, gaps_of: pl.DataFrame | None = None,
              optimizations: pl.QueryOptFlags | None = None) -> dict[str, pl.DataFrame]:
    """The three frames (``streams``, ``gaps``, ``calls``) of a part, as ``GpuPart`` names them; ``gaps_of``:
    the gaps where they are counted already (a spilled table's windows: ``WindowedGaps``). ``optimizations``:
    how the queries are optimised (``intervals.SCAN_OPTIMIZATIONS`` for scans)."""
    queries = [streams(gpu), calls(gpu, cpu)] + ([gaps(gpu)] if gaps_of is None else [])
    found = pl.collect_all(queries, engine="streaming", optimizations=optimizations or pl.QueryOptFlags())
    return {"streams": found[0], "gaps": found[2] if gaps_of is None else gaps_of, "calls": found[1]}
