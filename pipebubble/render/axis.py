"""The axes of the HTML page's charts (the SVGs of ``sections``): tick values in 1, 2, 5 × 10^k steps, labelled in
the unit that suits them (a time in ns, us, ms or s; bytes in B, KiB, MiB, GiB or TiB; a share in %), an x-axis
and a y-axis with tick marks, labels and their unit, and text kept inside the drawing: placed beside a point on
the side it fits, wrapped between words, never cut inside one. Layout only: every value placed is the report's.

Text widths are estimated for the page's SVG font, 12px monospace (``html.CSS``): 0.6 em a character, in the
drawing's own units since the text scales with it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from html import escape

CHAR_W = 7.2  # one character of the SVG font, in the drawing's units
TICK = 4  # a tick mark's length
LINE_H = 13  # between two lines of text
COLOUR, GRID = "#666666", "#e6e6e6"  # the axis line and its ticks; grid lines across the plot
PX_PER_TICK = 90  # about one tick per this many units of axis (a label is at most a few characters)

TIME = (("ns", 1), ("us", 1_000), ("ms", 1_000_000), ("s", 1_000_000_000))
BYTES = (("B", 1), ("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("TiB", 1 << 40))


@dataclass(frozen=True)
class Scale:
    """The ticks of an axis: their values (in the data's own units: ns, bytes, a share of 1), the unit their
    labels are written in, and the labels; ``lo``, ``hi``: the range the axis spans (at least the data's)."""

    lo: float
    hi: float
    ticks: tuple[float, ...]
    unit: str
    labels: tuple[str, ...]


def nice_step(raw: float) -> float:
    """The smallest 1, 2 or 5 × 10^k at least ``raw`` (1 for a raw step of nothing)."""
    if not raw > 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw * (1 - 1e-9))


def count_for(length: float) -> int:
    """How many ticks an axis ``length`` units long holds (at least 2)."""
    return max(int(length // PX_PER_TICK), 2)


def _scale(lo: float, hi: float, step: float, unit: str, per: float, extend: bool, suffix: str = "",
           bare_zero: bool = False) -> Scale:
    """Ticks every ``step`` units of ``per`` from the first at or after ``lo`` to the last at or before ``hi``
    (``extend``: the axis grows to the first tick at or after ``hi``), with the decimals the step needs."""
    first = math.ceil(lo / per / step - 1e-9)
    last = (math.ceil if extend else math.floor)(hi / per / step + (-1e-9 if extend else 1e-9))
    values = [k * step for k in range(first, max(last, first) + 1)]
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    top = max(hi, values[-1] * per) if extend else hi
    labels = tuple(f"{v:.{decimals}f}" + ("" if bare_zero and not v else suffix) for v in values)
    return Scale(lo, top, tuple(v * per for v in values), unit, labels)


def time_scale(lo: float, hi: float, count: int = 8) -> Scale:
    """About ``count`` ticks over [lo, hi] ns, in the largest unit a tick step holds whole (ticks 500 ms apart
    read ``0 500 1000`` in ms, 2 s apart ``0 2 4`` in s): whole numbers, no separators."""
    step_ns = max(nice_step((hi - lo) / max(count, 1)), 1.0)
    unit, per = next((u, p) for u, p in reversed(TIME) if p <= step_ns * (1 + 1e-9))
    return _scale(lo, hi, round(step_ns / per, 9), unit, per, extend=False)


def bytes_scale(top: float, count: int = 3) -> Scale:
    """About ``count`` ticks from 0 up to the first at or above ``top`` bytes, in the largest binary unit
    ``top`` holds one of, each label but 0 with its unit (``0``, ``10 GiB``, ``20 GiB``)."""
    unit, per = next(((u, p) for u, p in reversed(BYTES) if p <= top), BYTES[0])
    step = nice_step(top / per / max(count, 1))
    if per == 1:
        step = max(step, 1.0)  # no fraction of a byte
    return _scale(0, max(top, 1), step, unit, per, extend=True, suffix=f" {unit}", bare_zero=True)


def share_scale(count: int = 4) -> Scale:
    """Ticks over a share from 0 to 1, labelled in % (``0% 50% 100%``)."""
    return _scale(0, 1, nice_step(100 / max(count, 1)), "%", 0.01, extend=False, suffix="%")


def width(text: str) -> float:
    """``text``'s estimated width in the drawing's units."""
    return len(text) * CHAR_W


def inside(x: float, text: str, lo: float, hi: float, anchor: str = "middle") -> float:
    """The x at which ``text``, anchored so, lies within [lo, hi] (as near ``x`` as it can)."""
    w = width(text)
    left = x - {"start": 0, "middle": w / 2, "end": w}[anchor]
    shift = max(lo - left, 0) or min(hi - (left + w), 0)
    return x + shift


def beside(x: float, text: str, lo: float, hi: float, gap: float = 4) -> tuple[float, str]:
    """Where a label of a point at ``x`` goes: just right of it, else just left of it, within [lo, hi]:
    (its x, its text-anchor)."""
    if x + gap + width(text) <= hi:
        return max(x + gap, lo), "start"
    if x - gap - width(text) >= lo:
        return x - gap, "end"
    return inside(x, text, lo, hi, "middle"), "middle"


def wrap(text: str, chars: int) -> list[str]:
    """``text`` in lines of at most ``chars`` characters, broken between words only (a word longer than a line
    has a line of its own, whole)."""
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= chars:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines


def text(x: float, y: float, words: str, anchor: str = "start", fill: str = "") -> str:
    colour = f' fill="{fill}"' if fill else ""
    return f'<text x="{x:.1f}" y="{y:.1f}"{colour} text-anchor="{anchor}">{escape(words)}</text>'


def line(x1: float, y1: float, x2: float, y2: float, stroke: str = COLOUR, dash: str = "") -> str:
    dashed = f' stroke-dasharray="{dash}"' if dash else ""
    return f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{stroke}"{dashed}/>'


def x_axis(scale: Scale, x: Callable[[float], float], y: float, left: float, right: float, title: str,
           view_w: float) -> list[str]:
    """An x-axis along ``y`` from ``left`` to ``right``: its line, a tick mark and label at each tick (a label
    kept within the drawing's ``view_w``) and, under the labels at the right end, ``title`` with the unit."""
    out = [line(left, y, right, y)]
    for value, label in zip(scale.ticks, scale.labels, strict=True):
        px = x(value)
        if left - 0.5 <= px <= right + 0.5:
            out += [line(px, y, px, y + TICK),
                    f'<text x="{inside(px, label, 0, view_w):.1f}" y="{y + TICK + 11:.1f}"'
                    f' text-anchor="middle">{escape(label)}</text>']
    words = f"{title} ({scale.unit})"
    return [*out, text(inside(right, words, 0, view_w, "end"), y + TICK + 11 + LINE_H, words, "end")]


def y_axis(scale: Scale, y: Callable[[float], float], x: float, top: float, bottom: float,
           grid_to: float | None = None) -> list[str]:
    """A y-axis along ``x`` from ``top`` to ``bottom``: its line, a tick mark and label (right-aligned to its
    left) at each tick and, with ``grid_to``, a faint line across the plot at each tick."""
    out = [line(x, top, x, bottom)]
    for value, label in zip(scale.ticks, scale.labels, strict=True):
        py = y(value)
        if top - 0.5 <= py <= bottom + 0.5:
            out += [line(x - TICK, py, x, py), text(x - TICK - 2, py + 4, label, "end")]
            out += [line(x + 1, py, grid_to, py, GRID)] if grid_to is not None and value else []
    return out
