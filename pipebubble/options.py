"""Every option of an analysis, in one place, and the one function that builds them from settings.

Settings are what the command line and ``pipebubble.toml`` name (``stage_by``, ``pp_size``, ``step_regex`` ...):
``from_settings`` turns them into ``Options``; ``merge`` lays command-line flags over a config table. The
analysis modules take these dataclasses and never see a flag or a file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from pipebubble.errors import StageSpecError

RANK_ORDERS = ("tp-cp-ep-dp-pp", "tp-pp-dp", "pp-dp-tp")
STAGE_BY = ("rank", "device", "process", "stream", "thread")
EXECUTORS = ("local", "ray")


@dataclass(frozen=True)
class StageOptions:
    """Who is a stage and how passes are labelled (see ``analysis.stages`` and ``analysis.labels``).
    ``stage_by`` thread: one stage per CPU thread, its GPU work following it; ``microbatch_regex`` (named
    groups phase, mb, chunk) finds labels among annotations, else among work spans that are passes themselves."""

    stage_by: str | None = None  # rank | device | process | stream | thread
    rules: tuple[tuple[str, str], ...] = ()  # (name, regex on lane id)
    pp_size: int | None = None
    rank_order: str = "tp-cp-ep-dp-pp"
    microbatch_regex: str | None = None


@dataclass(frozen=True)
class PipelineOptions:
    stages: StageOptions = field(default_factory=StageOptions)
    wait_threshold: float = 0.01  # a gap counts as a wait above this fraction of its step window
    gpu_cost: float | None = None  # USD per GPU-hour
    memory_limit: int | None = None  # bytes a stage's device may hold (None: each GPU's own capacity)


@dataclass(frozen=True)
class ServingOptions:
    step_regex: str | None = None  # named groups: mode, prefill_reqs, prefill_tokens, decode_reqs, bs, toks
    tbt_slo_ms: float | None = None


@dataclass(frozen=True)
class Options:
    """What the analysis of a job needs to know. ``world`` and ``files`` describe the job and are filled in
    by the run (a file mapped apart cannot see how many others there are)."""

    pipeline: PipelineOptions = field(default_factory=PipelineOptions)
    serving: ServingOptions = field(default_factory=ServingOptions)
    world: int | None = None  # ranks in the job, when a part sees only some
    files: int = 0  # files in the job: a file alone with one stage is no pipeline
    align: bool = True  # put every rank on one clock estimated from the job (``analysis.clock``)
    peak_flops: float | None = None  # FLOP/s of each device, every dtype (None: the table of known devices)
    peak_bandwidth: float | None = None  # bytes/s of each device's memory (None: the table's)

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> Options:
        """Options from settings as the CLI and config files name them (absent or None: the default)."""
        unknown = sorted(set(settings) - set(SETTINGS))
        if unknown:
            raise StageSpecError(f"unknown setting {unknown[0]!r} (expected one of {', '.join(SETTINGS)})")
        s = {**SETTINGS, **{k: v for k, v in settings.items() if v is not None}}
        rules = tuple(parse_rule(rule) for rule in s["stage"] or ())
        for regex in (s["microbatch_regex"], s["step_regex"]):
            if regex is not None:
                check_regex(regex)
        stages = StageOptions(s["stage_by"], rules, s["pp_size"], s["rank_order"], s["microbatch_regex"])
        pipeline = PipelineOptions(stages, float(s["wait_threshold"]), s["gpu_cost"], _size(s["memory_limit"]))
        return cls(pipeline, ServingOptions(s["step_regex"], s["tbt_slo"]), align=bool(s["align"]),
                   peak_flops=_rate(s["peak_flops"], "peak FLOP/s"),
                   peak_bandwidth=_rate(s["peak_bandwidth"], "peak bandwidth"))

    def settings(self) -> dict[str, Any]:
        """The settings these options were built from (the report cache's key)."""
        st, pl, sv = self.pipeline.stages, self.pipeline, self.serving
        return {
            "stage_by": st.stage_by,
            "stage": [f"{name}={regex}" for name, regex in st.rules],
            "pp_size": st.pp_size,
            "rank_order": st.rank_order,
            "microbatch_regex": st.microbatch_regex,
            "wait_threshold": pl.wait_threshold,
            "gpu_cost": pl.gpu_cost,
            "memory_limit": pl.memory_limit,
            "peak_flops": self.peak_flops,
            "peak_bandwidth": self.peak_bandwidth,
            "step_regex": sv.step_regex,
            "tbt_slo": sv.tbt_slo_ms,
            "align": self.align,
        }


#: Every analysis setting and its default: the keys of ``[stages]`` in pipebubble.toml and of the flags.
SETTINGS: dict[str, Any] = {
    "stage_by": None,
    "stage": (),
    "pp_size": None,
    "rank_order": "tp-cp-ep-dp-pp",
    "microbatch_regex": None,
    "wait_threshold": 0.01,
    "gpu_cost": None,
    "memory_limit": None,
    "peak_flops": None,
    "peak_bandwidth": None,
    "step_regex": None,
    "tbt_slo": None,
    "align": True,
}


@dataclass(frozen=True)
class Scale:
    """Where the per-file work runs: this process and a local pool, or a Ray cluster."""

    executor: str = "local"
    workers: int | None = None  # processes (or Ray CPUs); None: all cores
    ray_address: str | None = None
    use_cache: bool = True
    memory_budget: int | None = None  # bytes (None: PIPEBUBBLE_MEMORY_BUDGET, else budget.py's default)


def merge(config: dict[str, Any], **flags: Any) -> dict[str, Any]:
    """A config table with the flags that were given laid over it (None or empty: not given)."""
    given = {k: v for k, v in flags.items() if v is not None and v != [] and v != ()}
    return {**config, **given}


def _size(value: Any) -> int | None:
    """A size setting in bytes: an int as it is, a text such as ``80GiB`` parsed (``parse_size``)."""
    if value is None or isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return parse_size(str(value), "memory limit")


_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30,
          "ti": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?)?b?\s*$", re.IGNORECASE)


def parse_size(text: str, what: str) -> int:
    """Bytes in ``text``: a number, optionally with a unit (k, M, G, T: powers of 1000; Ki, Mi, Gi, Ti:
    of 1024; a trailing B is allowed). ``what`` names the size in the error."""
    found = _SIZE.match(str(text))
    if not found or float(found.group(1)) <= 0:
        raise StageSpecError(f"{what} {text!r} is not a size (say 800M, 1.5G or a number of bytes)")
    return int(float(found.group(1)) * _UNITS[(found.group(2) or "").lower()])


def check_regex(regex: str) -> None:
    try:
        re.compile(regex)
    except re.error as exc:
        raise StageSpecError(f"bad regex {regex!r}: {exc}") from None


def parse_rule(text: str) -> tuple[str, str]:
    """``NAME=REGEX`` from the command line."""
    name, sep, regex = text.partition("=")
    if not sep or not name or not regex:
        raise StageSpecError(f"--stage expects NAME=REGEX, got {text!r}")
    check_regex(regex)
    return name, regex


_RATE_UNITS = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}


def _rate(value: Any, what: str) -> float | None:
    """A rate setting per second: a number as it is, a text such as ``989T`` or ``3.35e12`` parsed (K, M, G, T,
    P: powers of 1,000); refused (exit 2) unless positive and finite."""
    if value is None:
        return None
    text = str(value).strip()
    unit = text[-1:].upper() if text[-1:].isalpha() and text[-1:].upper() in _RATE_UNITS else ""
    try:
        rate = float(text[: len(text) - len(unit)]) * _RATE_UNITS[unit]
    except ValueError:
        rate = float("nan")
    if not (rate > 0 and rate < float("inf")):
        raise StageSpecError(f"{what} must be a positive number per second such as 989e12 or 989T, not {text!r}")
    return rate
