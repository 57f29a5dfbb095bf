"""The idle account's names: why a GPU sat idle, in its users' words, and the operators behind it.

Every GPU idle interval is attributed once (``analysis/idle``); these are the causes it can have, the keys
of ``Breakdown.idle_causes`` and of the timeline strips' idle classes, in the order reports show them.
"""

from __future__ import annotations

from dataclasses import dataclass

#: cause -> how a report says it.
WORDS = {
    "sync_stall": "sync stall",  # the host blocked in a synchronize, then refilled the queue
    "blocking_copy": "blocking copy",  # a copy that returns once done (cudaMemcpy, pageable memory)
    "allocator": "allocator",  # cudaMalloc / cudaFree (implicitly synchronizing)
    "startup": "start-up",  # code loading, runtime and library initialisation, a kernel's first launch
    "cpu_ops": "CPU-bound (operators)",  # the launching thread ran operators
    "python": "CPU-bound (Python / untraced)",  # the launching thread ran nothing traced
    "launch": "launch overhead",  # runtime launch calls and their latency
    "peer": "waiting for a peer",  # the thread was in a collective or send/recv call
    "data_loader": "data loader",  # the thread waited for the next batch
    "dependency": "dependency",  # launched before the GPU went idle: an event or another stream held it
    "unknown": "unknown",  # no launch recorded, or idle before the GPU's first work of the step
}
CAUSES = tuple(WORDS)


@dataclass(frozen=True)
class IdleCause:
    """One GPU's idle over its whole window of one ``cause``, ``op`` and runtime ``call`` (the operator
    around the launching thread's time, and the call it was in, where one was): ``ns`` in ``gaps`` gaps.
    Each GPU and cause keeps its ``TOP`` biggest."""

    lane: str
    rank: int | None
    cause: str
    op: str | None
    call: str | None
    ns: int
    gaps: int


#: Rows kept per GPU and cause.
TOP = 5
