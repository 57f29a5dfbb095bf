"""A section's table and the formatting of its cells, shared by the section builders (``sections``,
``collectives``) and laid out by each renderer in its own way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]]
    numeric: frozenset[int] = frozenset()  # right-aligned column indexes
    notes: tuple[str, ...] = ()  # footnotes, referred to as [1], [2] in the rows


def ms(ns: int | float | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:,.2f}"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"  # no space: a line never wraps between number and sign


def signed_pct(x: float) -> str:
    """``+3.1%`` or ``−16.2%`` (a minus sign, not a hyphen)."""
    return ("+" if x >= 0 else "−") + pct(abs(x))


def num(x: Any, digits: int = 2) -> str:
    if x is None:
        return "-"
    return f"{x:,}" if isinstance(x, int) else f"{x:,.{digits}f}"


def bar(fraction: float, width: int = 10) -> str:
    full = round(max(0.0, min(fraction, 1.0)) * width)
    return "█" * full + "░" * (width - full)
