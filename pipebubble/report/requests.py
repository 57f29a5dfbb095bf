"""The requests part of the report: served requests' latencies as frozen data, times in ns (definitions:
``analysis/requests``).

JSON (the contract, ARCHITECTURE.md): ``requests: {count, ttft_ns, queue_ns, tpot_ns, e2e_ns (each {p50, p90,
p99}), prefill_ns, prompt_tokens, completion_tokens, with_tpot, window_ns, ttft_split_ns, ttft_p99_without_queue_ns,
steps, kv_cache, notes}``; a percentile set is null when no request states the value.
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

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["steps"] = None if self.steps is None else self.steps.to_dict()
        out["notes"] = list(self.notes)
        out["rows"] = [dict(r.__dict__) for r in self.rows]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Requests:
        plain = {f.name: data[f.name] for f in fields(cls) if f.name in data and f.name not in ("steps", "rows")}
        steps = data.get("steps")
        rows = [RequestRow(**{f.name: r.get(f.name) for f in fields(RequestRow)}) for r in data.get("rows") or []]
        return cls(**plain, steps=Steps.from_dict(steps) if isinstance(steps, dict) else None, rows=rows)


#: Every key of the JSON section, in order.
JSON_KEYS = tuple(Requests().to_dict())
