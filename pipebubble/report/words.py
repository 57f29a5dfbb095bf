"""The words a report says for the names its JSON holds: a finding's kind, a late rank's cause, why events
were not kept. JSON keeps the names (the public contract); titles, text, Markdown and HTML say these words,
looked up here only."""

from __future__ import annotations

#: ``Finding.kind`` -> how a report names it (the timeline's marks).
KINDS = {
    "too_few_microbatches": "too few micro-batches",
    "imbalance": "stage imbalance",
    "slow_worker": "slow worker",
    "schedule": "schedule",
    "exposed_p2p": "exposed send/recv",
    "late_rank": "late rank",
    "exposed_comm": "exposed comm",
    "launch_bound": "launch-bound",
    "sync_stall": "sync stall",
    "blocking_copy": "blocking copy",
    "allocator": "allocator",
    "cpu_bound": "CPU-bound host",
    "data_loader": "data loader",
    "interference": "interference",
    "memory": "memory",
    "queueing": "queueing",
    "tail_interference": "tail interference",
    "preemption": "preemption",
    "prefill_heavy_tail": "prefill-heavy steps in the tail",
}

#: Why a rank arrived late (``Finding.cause`` of a ``late_rank`` or ``data_loader`` finding, the keys of its
#: ``late_by_cause_ns``, a chain link's cause) -> how a report says it.
LATE_CAUSES = {
    "entered_late": "entered the step late",
    "data_loader": "data loader",
    "gpu_compute": "GPU compute",
    "sync": "synchronize calls",
    "host_ops": "host operators and launches",
    "host_idle": "untraced host time",
    "comm": "waiting for another rank",
    "blocking_copy": "blocking copies",
    "allocator": "the allocator",
    "startup": "start-up",
    "dependency": "its GPU's own dependencies",
    "unknown": "no cause its trace shows",
}


def kind_words(kind: str) -> str:
    """A finding's kind as words (a kind not listed: its name's words)."""
    return KINDS.get(kind, kind.replace("_", " "))


def cause_words(cause: str) -> str:
    """A finding's cause as words: a late rank's cause named, any other (already a sentence) as it is."""
    return LATE_CAUSES.get(cause, cause)


def reason_words(reason: str) -> str:
    """Why events were not kept (a key of ``IngestSummary.skipped``: ``profiler_trace``) as words."""
    return reason.replace("_", " ")


#: What ``--gpu-cost``'s price is taken for, by ``Report.billed``: a GPU-hour, as the flag says, or, where the
#: job's lanes hold no GPU (CPU ranks on gloo), an hour of one CPU rank, as its CPU-ms figures count; the JSON's
#: ``*_gpu_*`` keys keep their names.
PRICED = {
    "GPU": "",
    "CPU": "--gpu-cost taken as the price of a CPU-hour, one CPU rank's hour, as the job's lanes hold no GPU",
}


def priced_words(billed: str) -> str:
    """How the report prices ``billed`` time (``Report.billed``): "" for GPU-hours, else what it took the price for."""
    return PRICED.get(billed, "")
