"""A section's table and the formatting of its cells, shared by the section builders (``sections``,
``collectives``, ``gputime``) and laid out by each renderer in its own way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: The time units of the text, Markdown, HTML and CSV outputs (``--timeunit``): ns per unit, and the digits a
#: table shows after the point (2 in ms keeps the 10 µs the reports always showed).
WORD_REACH = 3  # a cut name's end may take this many more characters from its start to begin on a whole word
UNKNOWN = "-"  # what a table cell shows for an unknown value (the CSV leaves it empty)
UNITS: dict[str, tuple[int, int]] = {"ns": (1, 0), "us": (1_000, 2), "ms": (1_000_000, 2), "s": (1_000_000_000, 4)}


@dataclass(frozen=True)
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]]
    numeric: frozenset[int] = frozenset()  # right-aligned column indexes
    notes: tuple[str, ...] = ()  # footnotes, referred to as [1], [2] in the rows
    # columns a narrow terminal may leave out, the least useful first (named as in ``columns``); past these it
    # leaves out the rightmost
    drop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # an unknown value (a kernel or call without a name) shows as every unknown cell does; every renderer
        # lays out strings only
        if any(not isinstance(cell, str) for row in self.rows for cell in row):
            rows = [[UNKNOWN if cell is None else str(cell) for cell in row] for row in self.rows]
            object.__setattr__(self, "rows", rows)


def per(unit: str) -> int:
    """ns in one ``unit``; an unknown unit raises ValueError naming the known ones."""
    if unit not in UNITS:
        raise ValueError(f"unknown time unit {unit!r}: expected one of {', '.join(UNITS)}")
    return UNITS[unit][0]


def time(ns: int | float | None, unit: str = "ms") -> str:
    """``ns`` in ``unit`` with thousands separators (``1,234.56``); whole nanoseconds stay exact."""
    if ns is None:
        return UNKNOWN
    factor, digits = per(unit), UNITS[unit][1]
    if factor == 1 and isinstance(ns, int):
        return f"{ns:,}"
    return f"{ns / factor:,.{digits}f}"


def ms(ns: int | float | None) -> str:
    return time(ns, "ms")


def natural(ns: int) -> str:
    """A threshold in the unit that reads best: ``10 us``, ``2.5 ms``."""
    unit = next((u for u in ("s", "ms", "us") if abs(ns) >= UNITS[u][0]), "ns")
    return f"{ns / UNITS[unit][0]:g} {unit}"


def pct(x: float | None) -> str:
    return UNKNOWN if x is None else f"{100 * x:.1f}%"  # no space: a line never wraps between number and sign


def share(part: int | float | None, whole: int | float | None) -> str:
    """``part`` as a percentage of ``whole`` ("-" when either is unknown or the whole is empty)."""
    return UNKNOWN if part is None or not whole else pct(part / whole)


def signed_pct(x: float) -> str:
    """``+3.1%`` or ``−16.2%`` (a minus sign, not a hyphen)."""
    return ("+" if x >= 0 else "−") + pct(abs(x))


def num(x: Any, digits: int = 2) -> str:
    if x is None:
        return UNKNOWN
    return f"{x:,}" if isinstance(x, int) else f"{x:,.{digits}f}"


def bar(fraction: float, width: int = 10) -> str:
    full = round(max(0.0, min(fraction, 1.0)) * width)
    return "█" * full + "░" * (width - full)


def shorten(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters, cut in the middle (``interleav… v=4``): the start says what
    it is and the end tells neighbours apart (``v=2`` from ``v=4``, ``stream7`` from ``stream13``). A C++
    name's argument or template list goes first (``ncclDevKernel_AllReduce_Sum_bf16_RING_LL(…)``)."""
    while len(text) > width:
        collapsed = _collapse(text)
        if collapsed == text:
            break
        text = collapsed
    if len(text) <= width:
        return text
    if width < 2:
        return text[:width]
    head = (width * 3) // 5  # the start weighs more: a name's kind comes first
    tail = width - 1 - head
    word = text.rfind(" ", len(text) - tail - WORD_REACH, len(text) - tail)  # end on a whole word ("v=2, m=8")
    if tail and word > head:
        head, tail = head - (len(text) - tail - word - 1), len(text) - word - 1
    return text[:head].rstrip() + "…" + (text[-tail:].lstrip() if tail else "")


def _collapse(text: str) -> str:
    """``text`` with its last bracketed list of parameters (one holding ", " or "*") written ``(…)``/``<…>``."""
    for opening, closing in (("(", ")"), ("<", ">")):
        end = len(text)
        while (start := text.rfind(opening, 0, end)) > 0:
            close = _matching(text, start, opening, closing)
            inner = text[start + 1:close]
            if close > 0 and inner != "…" and (", " in inner or "*" in inner):
                return text[:start + 1] + "…" + text[close:]
            end = start
    return text


def _matching(text: str, start: int, opening: str, closing: str) -> int:
    depth = 0
    for i in range(start, len(text)):
        depth += (text[i] == opening) - (text[i] == closing)
        if depth == 0:
            return i
    return -1


SIZES = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")  # binary: what allocators and nvidia-smi count in


def size(n: int | float | None) -> str:
    """Bytes in binary units with one decimal (``512 B``, ``1.5 KiB``, ``16.0 GiB``); a negative size (a
    micro-batch that frees more than it holds) keeps its sign, a minus as ``cells.signed_pct`` writes it."""
    if n is None:
        return UNKNOWN
    value, step = abs(n), 0
    while round(value, 1) >= 1024 and step < len(SIZES) - 1:
        value, step = value / 1024, step + 1
    sign = "−" if n < 0 else ""
    return f"{sign}{value:,.0f} B" if step == 0 else f"{sign}{value:,.1f} {SIZES[step]}"
