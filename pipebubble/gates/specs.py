"""The gates ``check`` knows (``GATES``: the flag key, also the [check] table's, to what it measures) and how
a threshold or tolerance is written: fractions as ``0.3`` or ``30%``, ratios as ``1.2`` or ``1.2x``, times in
ms or with a unit. Anything a gate could only misread is a ValueError of one line with a hint.
"""

from __future__ import annotations

import math
import re
from typing import Any, NamedTuple

from pipebubble.gates.requests import COUNT_GATES
from pipebubble.gates.requests import GATES as REQUEST_GATES

# Units of a value: "fraction" (0..1, shown as a percentage), "ratio" (dimensionless), "ms" or "ns" (time),
# "count" (a number of things).


class GateSpec(NamedTuple):
    metric: str
    bound: str  # max: the value must be <= the threshold; min: >=
    unit: str
    floor: float = 0.0  # the least threshold that means anything (a slowest/mean ratio is never below 1)
    label: str = ""


# gate key (the flag without its dashes) -> what it measures; the keys are the [check] table's too
GATES: dict[str, GateSpec] = {
    "max_bubble": GateSpec("bubble", "max", "fraction", label="bubble"),
    "max_excess_bubble": GateSpec("excess_bubble", "max", "fraction", label="excess bubble"),
    "min_utilization": GateSpec("utilization", "min", "fraction", label="utilization"),
    "max_stage_cv": GateSpec("stage_cv", "max", "ratio", label="stage time CV"),
    "max_imbalance": GateSpec("imbalance", "max", "ratio", 1.0, "imbalance"),
    "max_wait_ms": GateSpec("wait", "max", "ms", label="longest wait"),
    "max_decode_slowdown": GateSpec("decode_slowdown", "max", "ratio", 1.0, "decode slowdown"),
    "max_finding": GateSpec("finding", "max", "fraction", label="largest finding"),
    **{key: GateSpec(metric, "max", "ms", label=label) for key, (metric, label) in REQUEST_GATES.items()},
    **{key: GateSpec(metric, "max", "count", label=label) for key, (metric, label) in COUNT_GATES.items()},
}
TIME_SUFFIXES = {"ns": 1e-6, "us": 1e-3, "µs": 1e-3, "ms": 1.0, "s": 1e3}  # to ms


def _number(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{what}: expected a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{what}: not a finite number")
    if value < 0:
        raise ValueError(f"{what}: must not be negative")
    return value


def parse_fraction(value: object, where: str, most: float | None = 1.0) -> float:
    """``0.3`` or ``"30%"`` -> 0.3. A bare number above 1 is refused (``30`` is 3000 %: "did you mean 30%?"),
    as are negative, NaN and infinite values and, with ``most``, a percentage above ``most``."""
    text = str(value).strip()
    what = f"{where} {text}"
    if text.endswith("%"):
        fraction = _number(text[:-1].strip(), what) / 100
        if most is not None and fraction > most:
            raise ValueError(f"{what}: more than {most:.0%}")
        return fraction
    fraction = _number(text, what)
    if fraction > 1:
        raise ValueError(f"{what}: a bare number is a fraction ({fraction / 100:g} means {fraction:g}%); did you "
                         f"mean {fraction:g}%?")
    return fraction


DEFAULT_TOLERANCE = 0.05  # diff's, when neither the caller nor pipebubble.toml gives one


def thresholds(given: dict[str, object], config: Any, name: Any) -> dict[str, float]:
    """The gates to run: the config file's [check] table with the thresholds given on top, each parsed by
    ``parse_threshold``; ``name(key)`` is how the caller words a gate (``--max-bubble``, ``max_bubble``).
    None at all, or a value a gate could only misread, is a ValueError of one line."""
    found = {key: parse_threshold(key, value, f"{config.path}: check.{key.replace('_', '-')}")
             for key, value in config.thresholds.items()}
    found |= {key: parse_threshold(key, value, name(key)) for key, value in given.items() if value is not None}
    if not found:
        raise ValueError(f"no gates: give a threshold such as {name('max_bubble')} 30%, or a [check] table in "
                         "pipebubble.toml")
    return found


def tolerance(given: object, config: Any, name: str) -> float:
    """The given tolerance (``name``: how the caller words it), else the config file's, else 5 %."""
    if given is not None:
        return parse_tolerance(given, name)
    return config.tolerance if config.tolerance is not None else DEFAULT_TOLERANCE  # checked when it was read


def parse_tolerance(value: object, where: str = "--tolerance") -> float:
    """A relative tolerance: ``0.05`` or ``"5%"`` (``"150%"`` for more than 1; a bare ``5`` is refused)."""
    return parse_fraction(value, where, most=None)


def parse_threshold(key: str, value: object, where: str | None = None) -> float:
    """The threshold of gate ``key`` from a flag or the config file (``where`` names it in the message).
    Fractions take ``0.3`` or ``30%``; ratios ``1.2``, ``1.2x`` or ``10%``; times ms, or a number with ns, us,
    ms or s. Raises ValueError, one line with a hint, for anything a gate could only misread."""
    if key not in GATES:
        raise ValueError(f"unknown gate {key!r}: expected one of {', '.join(GATES)}")
    spec, where = GATES[key], where or key
    text = str(value).strip()
    if spec.unit == "fraction":
        return parse_fraction(text, where)
    if spec.unit == "count":
        return _number(text, f"{where} {text}")
    if spec.unit == "ms":
        number, unit = re.fullmatch(r"(.*?)\s*(ns|us|µs|ms|s)?", text).groups()  # type: ignore[union-attr]
        return _number(number, f"{where} {text}") * TIME_SUFFIXES[unit or "ms"]
    ratio = parse_fraction(text, where, most=None) if text.endswith("%") else _number(
        text.removesuffix("x").strip(), f"{where} {text}")
    if ratio < spec.floor:
        raise ValueError(f"{where} {text}: {spec.label} is at least {spec.floor:g}; did you mean "
                         f"{spec.floor + ratio:g}?")
    return ratio


