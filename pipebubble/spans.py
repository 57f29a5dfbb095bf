"""The span table: the one interface between ingest and analysis.

All times are int64 nanoseconds on one clock per job; unknown values are null, never -1.
``lane`` names the device lane of GPU work (``rank0/gpu0`` or ``pid123/gpu0``) or the thread lane of
CPU work (``rank0/cpu/123``); per-stream lanes are derived from it (``rank0/gpu0/stream7``).

Four columns hold an event's own arguments where its format records them (null elsewhere, and on most
events): ``bytes``, a copy's or memset's size (Kineto's ``bytes`` arg, Nsight's CUPTI ``bytes``); ``flops``,
the count torch.profiler writes on an operator with ``with_flops=True``; ``dims`` and ``dtypes``, an
operator's ``Input Dims`` and ``Input type`` args as the JSON text the trace holds, in torch's own spacing
whatever the file's layout (``[[4096, 4096], [4096, 4096]]``, ``["float", "float"]``), never decoded into lists.
"""

from __future__ import annotations

from typing import TypeVar

import polars as pl

KINDS = (
    "kernel",
    "memcpy",
    "memset",
    "comm",
    "sync",
    "cpu_op",
    "runtime",
    "annotation",
    "gpu_annotation",
    "step",
)
Kind = pl.Enum(list(KINDS))

#: Every start and end lies strictly within ±TIME_LIMIT_NS (2**62 ns, about 146 years either side of the
#: clock's zero: epoch nanoseconds fit with a century to spare). Readers skip events beyond it, so the
#: difference of any two times (a window, a gap, a duration) is below 2**63 and cannot overflow int64.
TIME_LIMIT_NS = 2**62
#: A whole number fits Int32 when -INT32 <= it < INT32, and Int64 likewise: what readers check before
#: a value from a trace becomes a column of that type.
INT32, INT64 = 2**31, 2**63

#: Kinds that occupy a GPU engine: their union is a device lane's busy time.
GPU_WORK = ("kernel", "memcpy", "memset", "comm")
#: A thread's work (lanes' busy time, a CPU stage's work): operators, runtime calls, syncs and host-side
#: communication. Annotations and steps are labels, not work.
CPU_WORK = ("cpu_op", "runtime", "sync", "comm")
#: A stage's host activity, kept beside its work to explain its waits: CPU work less communication, which
#: is the wait itself rather than its cause.
HOST_WORK = ("cpu_op", "runtime", "sync")
#: Host work that can hold back the GPU (a launch-bound gap): operators and runtime calls, not syncs.
HOST_CALLS = ("cpu_op", "runtime")

# The communication rule, for every format. A kernel named like a collective or point-to-point transfer
# (NCCL/RCCL), like a DeepEP all-to-all or an NVSHMEM one is of kind ``comm``; so is a CPU range of a
# collective library (``gloo:all_reduce``). The analysis also gives the communication role to CPU ranges named
# like c10d's (``c10d::send``), torch's ``record_param_comms`` and torch.distributed.pipelining's
# ``PP:{stage}SEND_``/``RECV_``.
NCCL_KERNELS = r"^(void )?(nccl|rccl|ncclDevKernel|ncclKernel)|AllReduce|ReduceScatter|AllGather|SendRecv"
#: DeepEP (deepseek-ai/DeepEP, csrc/kernels/api.cuh): its ``intranode``, ``internode`` and ``internode_ll``
#: namespaces hold only the MoE all-to-all and its handshakes (``notify_dispatch``, ``cached_notify``,
#: ``cached_notify_dispatch``/``_combine``, ``dispatch``, ``combine``, ``barrier``, the low-latency
#: ``dispatch``/``combine`` and ``clean_low_latency_buffer``); DeepSeek's published traces name the same
#: kernels ``dpsk::ep::internode::dispatch<...>``, ``...::dispatch_ll``. DeepEP 2 compiles
#: ``deep_ep::elastic::{hybrid_,}dispatch_impl``/``combine_impl``, ``barrier_impl``, ``pp_send_impl``/``pp_recv_impl``.
#: Local computation is not communication: ``deep_ep::layout::get_dispatch_layout``,
#: ``dpsk::ep::cuda::get_dispatch_layout``, the elastic copy and reduce epilogues, CUB's ``cdpsk::ep::``
#: scans, a kernel merely templated on a DeepEP type and any ``moe_combine``-like kernel of another library.
DEEPEP_KERNELS = (
    r"^(void )?(deep_ep|dpsk::ep)::(intranode|internode|internode_ll)::"
    r"|^(void )?deep_ep::elastic::((hybrid_)?(dispatch|combine)|barrier|pp_send|pp_recv)_impl\b"
)
#: NVSHMEM's own kernels (``nvshmemi_proxy_rma_entrypoint``, ``nvshmemi_reduce_kernel``, on-stream waits).
NVSHMEM_KERNELS = r"^(void )?nvshmem[ix]?_"
COMM_KERNELS = "(?i)" + "|".join((NCCL_KERNELS, DEEPEP_KERNELS, NVSHMEM_KERNELS))
COLLECTIVE_RANGES = r"^(gloo|nccl|mpi|ucc):"
COMM_NAMES = "(?i)" + "|".join((COLLECTIVE_RANGES, r"^c10d::", "record_param_comms", r"^PP:\d+(SEND|RECV)_"))
#: The name of a duration event whose arguments give its micro-batch and model chunk (a ``B``/``E`` pair's merged),
#: as Megatron's MegaScan tracer writes them (``forward`` with ``{"microbatch": 3, "model_chunk": 1}``) and its
#: step timers (``forward-compute`` with ``{"mb_id": 3, "model_chunk": 1}``): ``args_label`` writes it at ingest,
#: the pipeline's labels read it back (``ARGS_LABEL``'s groups: phase, mb, chunk).
ARGS_LABEL = r"^(?P<phase>[^()]+) \(microbatch (?P<mb>\d+)(?:, model_chunk (?P<chunk>\d+))?\)$"


def args_label(name: str | None, microbatch: int | None, chunk: int | None) -> str | None:
    """``name`` as ``ARGS_LABEL`` spells a pass of ``microbatch`` (and ``chunk``); ``name`` itself without a
    micro-batch."""
    if microbatch is None or name is None:
        return name
    return f"{name} (microbatch {microbatch})" if chunk is None else (
        f"{name} (microbatch {microbatch}, model_chunk {chunk})")


#: Operators of a backward pass (autograd's engine runs them), for inferring passes without labels.
BACKWARD_NAMES = r"(?i)backward|autograd::engine"


def owner() -> pl.Expr:
    """Whose GPU or thread a span is: its rank, or its process where the file names no ranks (Nsight)."""
    return pl.coalesce(pl.col("rank").cast(pl.Int64), pl.col("pid"))


def is_comm() -> pl.Expr:
    """True for communication: a comm span (NCCL/RCCL kernel, collective) or a CPU range named like one."""
    return (pl.col("kind") == "comm") | pl.col("name").str.contains(COMM_NAMES)


SCHEMA: dict[str, pl.DataType] = {
    "source": pl.String,
    "rank": pl.Int32,
    "pid": pl.Int64,
    "tid": pl.Int64,
    "device": pl.Int32,
    "stream": pl.Int64,
    "lane": pl.String,
    "kind": Kind,
    "name": pl.String,
    "start": pl.Int64,
    "end": pl.Int64,
    "correlation": pl.Int64,
    "external_id": pl.Int64,
    "stage": pl.Int32,
    "microbatch": pl.Int32,
    "phase": pl.String,
    "bytes": pl.Int64,
    "flops": pl.Int64,
    "dims": pl.String,
    "dtypes": pl.String,
}


Frame = TypeVar("Frame", pl.DataFrame, pl.LazyFrame)


def empty() -> pl.DataFrame:
    """A span table with no rows."""
    return pl.DataFrame(schema=SCHEMA)


def conform(frame: Frame, schema: dict[str, pl.DataType] = SCHEMA) -> Frame:
    """Cast ``frame`` to ``schema`` (the span schema; the allocator-event and request tables pass theirs):
    missing columns become null, extra ones are dropped. A lazy frame stays lazy (a reader's last step of its
    plan, not a query of its own)."""
    names = frame.collect_schema().names()
    cols = [(pl.col(c) if c in names else pl.lit(None)).cast(t).alias(c) for c, t in schema.items()]
    return frame.select(cols)


def validate(frame: pl.DataFrame) -> list[str]:
    """Problems that make a span table unusable (an empty list when it is sound)."""
    problems = [f"column {c}: {frame.schema.get(c)} != {t}" for c, t in SCHEMA.items() if frame.schema.get(c) != t]
    if problems:
        return problems
    bad = frame.filter(pl.col("start").is_null() | pl.col("end").is_null() | (pl.col("end") < pl.col("start")))
    if bad.height:
        problems.append(f"{bad.height} spans without a valid start <= end")
    limit = pl.lit(TIME_LIMIT_NS, pl.Int64)
    far = frame.filter((pl.col("start") <= -limit) | (pl.col("end") >= limit))
    if far.height:
        problems.append(f"{far.height} spans beyond ±2**62 ns")
    return problems
