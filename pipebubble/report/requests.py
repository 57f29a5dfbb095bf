"""The requests part of the report: served requests' latencies as frozen data, times in ns (definitions:
``analysis/requests``).

JSON (the contract, ARCHITECTURE.md): ``requests: {count, ttft_ns, queue_ns, tpot_ns, e2e_ns (each {p50, p90,
p99}), prefill_ns, prompt_tokens, completion_tokens, with_tpot, window_ns, ttft_split_ns, ttft_p99_without_queue_ns,
steps, kv_cache, notes, rows, requeue_ns, preemption_counts, preemptions, step_trace}``; a percentile set is null
when no request states the value; ``preemptions`` and ``step_trace`` are null where the sources do not say.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

#: Percentiles by name ("p50", "p90", "p99"); statistics of ns or counts, so they may be fractional.
Quantiles = dict[str, float | None]
#: The mean of each part of TTFT (``queue``, ``prefill``, ``other``) over a group of requests, in ns.
Split = dict[str, float | None]


@dataclass(frozen=True)
class Group:
    """Requests of one side of the tail attribution: how many, and the percentiles of their TPOT."""

    count: int = 0
    tpot_ns: Quantiles | None = None


@dataclass(frozen=True)
class Steps:
    """The tail attributed to engine steps (one engine thread, ``lane``) on the requests' clock.

    ``shared``: requests whose decode (first token to completion) shared a step with prompt work (a prefill or
    mixed step); ``apart``: those whose decode did not. ``tpot_p99_without_interference_ns``: p99 TPOT with each
    prompt-carrying step in a request's decode timed as a median pure-decode step. ``prefill_tokens_ahead``:
    the median prompt tokens the engine ran while a request waited in the queue, for the queue's tail (queue at
    or above its p90) and for the rest."""

    lane: str | None = None
    steps: int = 0
    requests: int = 0  # requests within the steps' window, the ones attributed
    shared: Group = field(default_factory=Group)
    apart: Group = field(default_factory=Group)
    tpot_p99_without_interference_ns: float | None = None
    prefill_tokens_ahead: dict[str, float | None] | None = None  # {"tail": ..., "rest": ...}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Steps:
        groups = {k: Group(**data[k]) for k in ("shared", "apart") if isinstance(data.get(k), dict)}
        plain = {f.name: data[f.name] for f in fields(cls) if f.name in data and f.name not in groups}
        return cls(**plain, **groups)


@dataclass(frozen=True)
class RequestRow:
    """One request (``--format csv --table requests``): its id, arrival on the job's clock, latencies (ns)
    and tokens; null where its source does not say."""

    request_id: str | None
    arrival_ns: int | None
    queue_ns: int | None
    ttft_ns: int | None
    tpot_ns: float | None
    e2e_ns: int | None
    prefill_ns: int | None
    decode_ns: int | None
    prompt_tokens: int | None
    completion_tokens: int | None
    preemptions: int | None = None
    requeue_ns: int | None = None  # the time it waited to run again after its preemptions
    lost_tokens: int | None = None  # tokens done at its preemptions, computed again


@dataclass(frozen=True)
class Preemption:
    """One preemption: the request, when (the job's clock), how long it then waited to run again, and the
    engine as the traced step at or before it saw it (its id, queue, running batch, KV-cache use)."""

    request_id: str | None
    at_ns: int | None
    requeue_ns: int | None
    step: int | None = None
    waiting: int | None = None
    running: int | None = None
    kv_usage: float | None = None


@dataclass(frozen=True)
class Preemptions:
    """Requests the engine evicted and queued again (``analysis/requests/preemption``): of the ``known``
    requests whose sources say, how many were preempted, how often, the time they waited to run again and the
    tokens they had done; the KV cache's use at the preemptions (step tracing); their p99 e2e and TTFT, and
    both had no request waited after a preemption; the longest waits (``worst``, at most ``WORST``)."""

    known: int = 0
    requests: int = 0
    count: int = 0
    requeue_ns: int = 0
    lost_tokens: int | None = None
    kv_usage: Quantiles | None = None
    e2e_p99_ns: float | None = None  # over the known requests
    e2e_p99_without_requeue_ns: float | None = None
    ttft_p99_ns: float | None = None
    ttft_p99_without_requeue_ns: float | None = None
    worst: list[Preemption] = field(default_factory=list)

    WORST = 20

    def to_dict(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in fields(self) if f.name != "worst"},
                "worst": [asdict(w) for w in self.worst]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Preemptions:
        plain = {f.name: data[f.name] for f in fields(cls) if f.name in data and f.name != "worst"}
        return cls(**plain, worst=[Preemption(**w) for w in data.get("worst") or []])


@dataclass(frozen=True)
class StepTrace:
    """The scheduler steps the engine traced (``analysis/requests/step_trace``): how many, the share of the
    step ids they cover (sampling), the queue, running batch and KV-cache use, the prefill-heavy steps, a
    timeline of at most ``POINTS`` points ``[t, waiting, running, prefill_tokens, decode_tokens, kv_usage]``,
    the requests' wait for their first token against the steps in it (``ttft_steps``: for the TTFT tail and the
    rest, the steps, mean queue, peak KV use and share of prefill-heavy steps), the p99 TTFT had each
    prefill-heavy step in it run as a median other step, and the Kineto serving steps it matched."""

    steps: int = 0
    coverage: float | None = None
    waiting: Quantiles | None = None
    running: Quantiles | None = None
    kv_usage: Quantiles | None = None
    kv_peak: float | None = None
    kv_peak_at_ns: int | None = None
    prefill_heavy: int = 0
    preempted: int = 0
    timeline: list[list[Any]] = field(default_factory=list)
    ttft_steps: dict[str, Any] | None = None
    ttft_p99_without_prefill_heavy_ns: float | None = None
    kineto: dict[str, Any] | None = None

    POINTS = 240

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepTrace:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass(frozen=True)
class Requests:
    """Served requests: latency percentiles, TTFT's parts, and the tail attributed to engine steps where the
    steps are known. ``kv_cache`` is the hook for KV-cache occupancy over time (None: no source of request
    spans or engine events records it yet)."""

    count: int = 0
    ttft_ns: Quantiles | None = None
    queue_ns: Quantiles | None = None
    tpot_ns: Quantiles | None = None
    e2e_ns: Quantiles | None = None
    prefill_ns: Quantiles | None = None
    prompt_tokens: Quantiles | None = None
    completion_tokens: Quantiles | None = None
    with_tpot: int = 0  # requests with a TPOT (two or more output tokens, TTFT and e2e known)
    window_ns: int | None = None  # first arrival to last completion
    ttft_split_ns: dict[str, Split] | None = None  # {"all": split, "tail": split of TTFT >= its p90}
    ttft_p99_without_queue_ns: float | None = None  # p99 of (TTFT − queue)
    steps: Steps | None = None
    kv_cache: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    rows: list[RequestRow] = field(default_factory=list)  # every request, in arrival order
    requeue_ns: Quantiles | None = None  # over the requests whose preemptions are known (0 when none)
    preemption_counts: Quantiles | None = None  # preemptions per request, likewise
    preemptions: Preemptions | None = None
    step_trace: StepTrace | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["steps"] = None if self.steps is None else self.steps.to_dict()
        for key in ("preemptions", "step_trace"):
            out[key] = None if out[key] is None else out[key].to_dict()
        out["notes"] = list(self.notes)
        out["rows"] = [dict(r.__dict__) for r in self.rows]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Requests:
        nested = ("steps", "rows", "preemptions", "step_trace")
        plain = {f.name: data[f.name] for f in fields(cls) if f.name in data and f.name not in nested}
        steps, pre, trace = (data.get(k) for k in ("steps", "preemptions", "step_trace"))
        rows = [RequestRow(**{f.name: r.get(f.name) for f in fields(RequestRow)}) for r in data.get("rows") or []]
        return cls(**plain, steps=Steps.from_dict(steps) if isinstance(steps, dict) else None, rows=rows,
                   preemptions=Preemptions.from_dict(pre) if isinstance(pre, dict) else None,
                   step_trace=StepTrace.from_dict(trace) if isinstance(trace, dict) else None)


#: Every key of the JSON section, in order.
JSON_KEYS = tuple(Requests().to_dict())
