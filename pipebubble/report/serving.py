"""The serving part of the report: prefill/decode interference as frozen data, times in ns.

The JSON form is public (ARCHITECTURE.md): its keys are the ones the section has always had, times in ms
rounded to 4 decimals (``ms4``), and beside each ms key its ``_ns`` twin at full precision
(``step_ms`` / ``step_ns``, ``ms_per_decode_request`` / ``ns_per_decode_request`` ...). ``from_dict`` reads
the ``_ns`` keys when present and the ms keys otherwise (a report saved before they existed).

A step's duration is max(its CPU range, the GPU span of the work it launched); ``clock`` says which of the
two timed most steps, and the per-class ``step_cpu_*``, ``step_gpu_*`` and ``launch_lag_*`` quantiles give
both parts and the wait from the range's start to its first GPU instant.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

#: Quantiles by name ("p50", "p90", "p99") in ns; a statistic of ns, so it may be fractional.
Quantiles = dict[str, float | None]


def ms4(ns: float | None) -> float | None:
    """ns as the JSON report writes ms: rounded to 4 decimals (100 ns), the precision it always had."""
    return None if ns is None else round(ns / 1e6, 4)


def _ns(ms: float | None) -> float | None:
    return None if ms is None else ms * 1e6


def _each(values: dict[str, Any] | None, convert) -> dict[str, Any] | None:
    return None if values is None else {k: convert(v) for k, v in values.items()}


@dataclass(frozen=True)
class StepClass:
    """One class of engine step (prefill, decode, mixed, idle): how many ran, the quantiles of their
    durations (None when none ran), the median GPU span of those that launched GPU work, and the quantiles
    of the two parts of a duration (CPU range; GPU span, of the steps that launched GPU work) and of the
    launch lag (first GPU instant − range start)."""

    name: str
    steps: int = 0
    durations_ns: Quantiles | None = None
    gpu_p50_ns: float | None = None
    cpu_ns: Quantiles | None = None
    gpu_ns: Quantiles | None = None
    lag_ns: Quantiles | None = None


@dataclass(frozen=True)
class Episode:
    """A time-between-tokens interval that held prompt work (``cls`` is the JSON's ``class``)."""

    start_ns: int | None = None
    dur_ns: int | None = None
    cls: str | None = None  # mixed | prefill
    prefill_tokens: int | None = None
    decode_requests: int | None = None
    slowdown: float | None = None  # dur / median pure-decode interval

    def to_dict(self) -> dict[str, Any]:
        return {"start_ns": self.start_ns, "dur_ns": self.dur_ns, "class": self.cls,
                "prefill_tokens": self.prefill_tokens, "decode_requests": self.decode_requests,
                "slowdown": self.slowdown}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Episode:
        return cls(data.get("start_ns"), data.get("dur_ns"), data.get("class"), data.get("prefill_tokens"),
                   data.get("decode_requests"), data.get("slowdown"))


@dataclass(frozen=True)
class Interference:
    """Prefill/decode interference in LLM serving (definitions: ``analysis/serving/interference.py``)."""

    steps: int | None = None
    classes: list[StepClass] = field(default_factory=list)
    source: str | None = None  # labels:vllm, labels:sglang+inferred ...
    decode_slowdown_when_mixed: float | None = None
    tbt_ns: Quantiles | None = None  # time between tokens: p50, p99
    tbt_intervals: int | None = None
    generation_stalls: int | None = None
    decode_slowdown_when_prefill: float | None = None
    worst_episodes: list[Episode] = field(default_factory=list)
    ns_per_1k_prefill_tokens: float | None = None  # the step-time fit dur = a + b·tokens + c·decodes: 1000·b
    ns_per_decode_request: float | None = None  # c
    step_fit_intercept_ns: float | None = None  # a
    chunk_for_slo_tokens: int | None = None
    tbt_slo_ms: float | None = None  # the option, as it was given
    step_cv: float | None = None
    host_gap_ns: Quantiles | None = None  # p50, p99 of the host time between steps; None: no gap
    gpu_idle_between_steps_ns: int | None = None
    engine_threads: int | None = None
    clock: str | None = None  # gpu | cpu: what timed most steps that launched GPU work (cpu: none launched)
    clock_note: str | None = None  # the clock and why, in words, as every format prints it
    steps_timed_by_gpu: int | None = None  # steps whose GPU span outlasted their CPU range
    steps_with_gpu_work: int | None = None
    overlapped_steps: int | None = None  # steps whose range opened before the previous step's work ended

    def to_dict(self) -> dict[str, Any]:
        """The JSON section: today's keys in their order, each ms key followed by its ``_ns`` twin."""
        full = {
            "steps": self.steps,
            "iterations": {c.name: c.steps for c in self.classes},
            "source": self.source,
            "step_ms": {c.name: _each(c.durations_ns, ms4) for c in self.classes if c.durations_ns is not None},
            "step_ns": {c.name: c.durations_ns for c in self.classes if c.durations_ns is not None},
            "decode_slowdown_when_mixed": self.decode_slowdown_when_mixed,
            "tbt_ms": _each(self.tbt_ns, ms4),
            "tbt_ns": self.tbt_ns,
            "tbt_intervals": self.tbt_intervals,
            "generation_stalls": self.generation_stalls,
            "decode_slowdown_when_prefill": self.decode_slowdown_when_prefill,
            "worst_episodes": [e.to_dict() for e in self.worst_episodes],
            **_twins("ms_per_1k_prefill_tokens", "ns_per_1k_prefill_tokens", self.ns_per_1k_prefill_tokens),
            **_twins("ms_per_decode_request", "ns_per_decode_request", self.ns_per_decode_request),
            **_twins("step_fit_intercept_ms", "step_fit_intercept_ns", self.step_fit_intercept_ns),
            "chunk_for_slo_tokens": self.chunk_for_slo_tokens,
            "tbt_slo_ms": self.tbt_slo_ms,
            "tbt_slo_ns": _ns(self.tbt_slo_ms),
            "step_cv": self.step_cv,
            "host_gap_ms": _each(self.host_gap_ns, ms4),
            "host_gap_ns": self.host_gap_ns,
            "gpu_idle_between_steps_ns": self.gpu_idle_between_steps_ns,
            "gpu_step_ms": self._gpu_step(ms4),
            "gpu_step_ns": self._gpu_step(lambda ns: ns),
            "engine_threads": self.engine_threads,
            "clock": self.clock,
            "clock_note": self.clock_note,
            "steps_timed_by_gpu": self.steps_timed_by_gpu,
            "steps_with_gpu_work": self.steps_with_gpu_work,
            "overlapped_steps": self.overlapped_steps,
            **self._parts("step_cpu", "cpu_ns"),
            **self._parts("step_gpu", "gpu_ns"),
            **self._parts("launch_lag", "lag_ns"),
        }
        return full

    def _parts(self, key: str, attr: str) -> dict[str, dict]:
        """``{key}_ms`` / ``{key}_ns``: {class: quantiles} of the classes that have them."""
        ran = {c.name: getattr(c, attr) for c in self.classes if getattr(c, attr) is not None}
        return {f"{key}_ms": {k: _each(q, ms4) for k, q in ran.items()}, f"{key}_ns": ran}

    def _gpu_step(self, convert) -> dict[str, float | None] | None:
        """{class: median GPU span} of the classes that launched GPU work; None when no step did."""
        ran = {c.name: convert(c.gpu_p50_ns) for c in self.classes if c.gpu_p50_ns is not None}
        return ran or None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Interference:
        """The section from its JSON form (``_ns`` keys preferred, ms keys of older reports otherwise)."""
        def ns(ms_key: str, ns_key: str):
            return data[ns_key] if ns_key in data else _ns(data.get(ms_key))

        def quantiles(ms_key: str, ns_key: str) -> Quantiles | None:
            return data[ns_key] if ns_key in data else _each(data.get(ms_key), _ns)

        known = [f.name for f in fields(cls)]
        plain = {k: data[k] for k in known if k in data and k not in ("classes", "worst_episodes")}
        return cls(
            **{k: v for k, v in plain.items() if k not in _NS_FIELDS},
            classes=_classes(data),
            worst_episodes=[Episode.from_dict(e) for e in data.get("worst_episodes") or []],
            tbt_ns=quantiles("tbt_ms", "tbt_ns"),
            ns_per_1k_prefill_tokens=ns("ms_per_1k_prefill_tokens", "ns_per_1k_prefill_tokens"),
            ns_per_decode_request=ns("ms_per_decode_request", "ns_per_decode_request"),
            step_fit_intercept_ns=ns("step_fit_intercept_ms", "step_fit_intercept_ns"),
            host_gap_ns=quantiles("host_gap_ms", "host_gap_ns"),
        )


_NS_FIELDS = {"tbt_ns", "ns_per_1k_prefill_tokens", "ns_per_decode_request", "step_fit_intercept_ns",
              "host_gap_ns"}


def _twins(ms_key: str, ns_key: str, ns: float | None) -> dict[str, float | None]:
    return {ms_key: ms4(ns), ns_key: ns}


def _per_class(data: dict[str, Any], key: str) -> dict[str, Quantiles]:
    """{class: quantiles in ns} from ``{key}_ns``, else from ``{key}_ms``; {} when neither is there."""
    return data.get(f"{key}_ns") or _each(data.get(f"{key}_ms"), lambda q: _each(q, _ns)) or {}


def _classes(data: dict[str, Any]) -> list[StepClass]:
    """Step classes from ``iterations``, ``step_*``, ``gpu_step_*`` and the parts' keys, in the order they
    first appear."""
    counts = data.get("iterations") or {}
    durations = _per_class(data, "step")
    gpu = data.get("gpu_step_ns") or _each(data.get("gpu_step_ms"), _ns) or {}
    parts = [_per_class(data, key) for key in ("step_cpu", "step_gpu", "launch_lag")]
    names = dict.fromkeys([*counts, *durations, *gpu, *(n for part in parts for n in part)])
    return [StepClass(n, counts.get(n, 0), durations.get(n), gpu.get(n), *(part.get(n) for part in parts))
            for n in names]


#: Every key of the JSON section, in order.
JSON_KEYS = tuple(Interference(tbt_ns={}, host_gap_ns={}).to_dict())
