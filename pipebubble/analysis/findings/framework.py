"""Which framework runs the job, as its report shows it, and the actions that follow from it.

``framework(report)`` reads the names a report keeps (kernels, host runtime calls, annotation ranges and the
host threads' marked calls, ``Host.facts.calls``) against ``breakdown.facts.FRAMEWORKS``:
- ``cuda_graphs``: a graph launch (``cudaGraphLaunch``, ``hipGraphLaunch``, ``cuGraphLaunch``) or a replay
  range (``CUDAGraph::replay``, an engine's graph runner's ``replay``);
- ``ddp``: ``DistributedDataParallel`` ranges or the c10d reducer's operators (``ddp.reducer``,
  ``distributed::reducer``);
- ``fsdp``: ``FullyShardedDataParallel`` or ``FSDP::`` ranges. An all-gather beside a reduce-scatter is no
  evidence alone: tensor parallelism's sequence-parallel layers issue the same pair;
- ``torchrec``: TorchRec or FBGEMM operators and ranges, or FBGEMM's embedding kernels (table-batched
  embeddings, ``embedding_bag``, ``bounds_check_indices``, ``permute_pooled_embs``);
- ``all_to_all``: all-to-all collectives (``nccl:all_to_all``, c10d's ``alltoall``): expert or sequence
  parallelism, or TorchRec's embedding exchange where ``torchrec`` is seen too.

``comm_action`` and ``launch_action`` give the exposed-communication and launch-overhead actions for those
frameworks; ``comm_frameworks`` keeps those whose collectives the job's communication kernels run (DDP's
all-reduce, FSDP's all-gather or reduce-scatter, an all-to-all: NCCL runs it as grouped send/recv), so the
advice is about the communication a trace shows. The findings of this package pick theirs the same way.
"""

from __future__ import annotations

import re

from pipebubble.analysis.breakdown.facts import FRAMEWORKS
from pipebubble.report import Report

#: Names shown per framework in evidence.
SHOWN = 3


def framework(report: Report) -> set[str]:
    """The frameworks the job's names show (module docstring): a subset of ``FRAMEWORKS``' keys."""
    return set(seen(report))


def seen(report: Report) -> dict[str, list[str]]:
    """Per framework seen, the first ``SHOWN`` names that show it (evidence a reader can look up)."""
    names = _names(report)
    found = {}
    for name, pattern in FRAMEWORKS.items():
        rule = re.compile(pattern)
        hits = [n for n in names if rule.search(n)]
        if hits:
            found[name] = hits[:SHOWN]
    return found


def _names(report: Report) -> list[str]:
    """Every name the rules read, biggest first within each source: host calls and ranges, marked calls,
    kernels."""
    host = report.host
    calls = [] if host is None else [c.name for c in [*host.api, *host.ranges] if c.name]
    marked = [] if host is None else [c.name for c in sorted(host.facts.calls, key=lambda c: -c.total_ns) if c.name]
    kernels = [k.name_full or k.name for k in report.kernels]  # the names the trace gives them
    return list(dict.fromkeys([*calls, *marked, *(name for name in kernels if name)]))


def comm_frameworks(report: Report) -> set[str]:
    """``framework(report)`` less the frameworks whose collectives no communication kernel of the job runs
    (``COLLECTIVES``): the exposed communication is the kernels', so their advice is what applies."""
    comm = [k.name_full or k.name for k in report.kernels if k.kind == "comm"]
    return {f for f in framework(report)
            if f not in COLLECTIVES or any(re.search(COLLECTIVES[f], name) for name in comm)}


#: framework -> the communication kernels its collectives run (an all-to-all is NCCL's grouped send/recv).
COLLECTIVES = {
    "ddp": r"(?i)AllReduce",
    "fsdp": r"(?i)AllGather|ReduceScatter",
    "torchrec": r"(?i)SendRecv|AllToAll",
    "all_to_all": r"(?i)SendRecv|AllToAll",
}


def comm_action(frameworks: set[str]) -> str:
    """How to hide exposed communication, for the ``frameworks`` a job shows (generic advice when none)."""
    alone = "all_to_all" in frameworks and "torchrec" not in frameworks  # TorchRec's advice covers its all-to-all
    said = [_COMM[f] for f in ("ddp", "fsdp", "torchrec") if f in frameworks] + ([_COMM["all_to_all"]] if alone else [])
    return "; ".join(said) if said else _COMM["generic"]


def launch_action(frameworks: set[str]) -> str:
    """How to launch less, for the ``frameworks`` a job shows: no CUDA graphs for a job that replays them."""
    said = [_LAUNCH["replayed" if "cuda_graphs" in frameworks else "generic"]]
    return "; ".join(said + ([_LAUNCH["torchrec"]] if "torchrec" in frameworks else []))


_COMM = {
    "generic": ("overlap communication with compute: issue collectives with async_op=True on their own stream as"
                " soon as their inputs are ready, and wait on the work handle only where the result is needed"),
    "ddp": ("DDP: let the gradient buckets' all-reduce overlap the backward (a smaller bucket_cap_mb starts it"
            " sooner; gradient_as_bucket_view=True, static_graph=True), no_sync() across gradient-accumulation"
            " micro-batches, a bf16 compression comm hook for bandwidth-bound all-reduces"),
    "fsdp": ("FSDP: prefetch the next all-gather (backward_prefetch=BACKWARD_PRE, forward_prefetch=True; FSDP2:"
             " set_modules_to_forward_prefetch / set_modules_to_backward_prefetch), fewer and larger wrapped units,"
             " reshard_after_forward=False where memory allows"),
    "all_to_all": ("all-to-all (expert or sequence parallelism): overlap each exchange with compute that does"
                   " not need it, e.g. the batch split in two so one half's dispatch and combine run beside the"
                   " other half's experts"),
    "torchrec": ("TorchRec: pipeline the embeddings' all-to-all with dense compute (TrainPipelineSparseDist),"
                 " quantized communication (qcomms: bf16/fp16 all-to-all), a sharding plan that cuts all-to-all"
                 " volume"),
}

_LAUNCH = {
    "generic": ("launch less often: CUDA graphs (torch.compile(mode='reduce-overhead'), torch.cuda.graphs),"
                " torch.compile to fuse short kernels, fewer and larger kernels (bigger batches)"),
    "replayed": ("the job already replays CUDA graphs: cut the eager work between replays (input preparation,"
                 " sampling, scheduling) or capture more of the step; graphs for the replayed part would not help"),
    "torchrec": ("TorchRec: table-batched embeddings (FBGEMM TBE: one kernel for many tables) and fewer per-feature"
                 " operations on KeyedJaggedTensors"),
}
