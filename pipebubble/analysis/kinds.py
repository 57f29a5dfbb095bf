"""Which spans are which kind of work, written once for every analysis module.

The kinds are the span table's (``spans.py``); these are the sets of them the analyses mean by "work" in
each place, and the name patterns that make a CPU range communication or a backward pass. (They belong
beside the span schema; until they move there, import them from here.)
"""

from __future__ import annotations

import polars as pl

#: A thread's work (lanes' busy time, a CPU stage's work): operators, runtime calls, syncs and host-side
#: communication. Annotations and steps are labels, not work.
CPU_WORK = ("cpu_op", "runtime", "sync", "comm")
#: A stage's host activity, kept beside its work to explain its waits (``waits._cause``): CPU_WORK less
#: communication, which is the wait itself rather than its cause.
HOST_WORK = ("cpu_op", "runtime", "sync")
#: Host work that can hold back the GPU (a launch-bound gap): operators and runtime calls, not syncs.
HOST_CALLS = ("cpu_op", "runtime")

#: CPU ranges that are communication: gloo/NCCL/MPI/UCC collectives (``gloo:all_reduce``), c10d's
#: (``c10d::send``), torch's ``record_param_comms`` and torch.distributed.pipelining's ``PP:{stage}SEND_``/
#: ``RECV_`` ranges. The ingest has its own copies for kernels (``ingest/chrome.py``: COMM_KERNEL, COMM_CPU;
#: ``ingest/nsys_spans.py``), which decide a span's kind; this one decides a CPU range's role.
COMM_NAMES = r"(?i)^(gloo|nccl|mpi|ucc):|^c10d::|record_param_comms|^PP:\d+(SEND|RECV)_"
#: Operators of a backward pass (autograd's engine runs them), for inferring passes without labels.
BACKWARD_NAMES = r"(?i)backward|autograd::engine"


def is_comm() -> pl.Expr:
    """True for communication: a comm span (NCCL/RCCL kernel, collective) or a CPU range named like one."""
    return (pl.col("kind") == "comm") | pl.col("name").str.contains(COMM_NAMES)
