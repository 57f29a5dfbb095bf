"""The chain of waits behind a late arrival: a late rank that itself spun in communication in its window
(cause ``comm``) was held by another rank; follow it to that rank and what made it late, and so on.

In the window [opened, arrival) of the late call, the late rank's longest wait is found among its spins at
other matched collectives (another group's, where someone else arrived last: ``collectives.match``'s
``wait``) and its receives that waited for their send (``p2p.match``'s ``wait``). The rank waited for is that
collective's last arrival, or the send's rank. Its own lateness there: at a collective, its row of
``late.per_call`` (cause and all); at a send, which has no peers to compare with, the class it spent most
time in before the send (its window of ``part.windows``, read as an excess over nothing). A cause ``comm``
is followed again, at most ``DEPTH`` links.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from pipebubble.analysis.comm.collectives import rank_of
from pipebubble.analysis.rootcause.late import PER_CALL, cause_of
from pipebubble.analysis.rootcause.part import CLASSES

DEPTH = 3


@dataclass(frozen=True)
class Link:
    """One wait of the chain: ``waiter`` spun ``waited_ns`` at ``at`` (``all_reduce #3``, ``recv``) for
    ``rank``, whose own lateness there had ``cause``."""

    waiter: int | None
    rank: int | None
    at: str
    waited_ns: int
    cause: str


def follow(who: int, opened: int, arrival: int, matched: pl.DataFrame, pairs: pl.DataFrame | None,
           calls: pl.DataFrame, windows: pl.DataFrame, depth: int = DEPTH) -> list[Link]:
    """The chain of waits from ``who``'s window [opened, arrival): empty when it spun in nothing there."""
    wait = _longest_wait(who, opened, arrival, matched, pairs)
    if wait is None or depth <= 0:
        return []
    held, at, ns, key = wait
    row = _lateness_at(held, key, calls, windows)
    cause = row["cause"] if row is not None else "unknown"
    link = Link(rank_of(who), rank_of(held), at, ns, cause)
    if cause != "comm" or row is None or held == who:
        return [link]
    return [link, *follow(held, row["opened"], row["arrival"], matched, pairs, calls, windows, depth - 1)]


def _longest_wait(who: int, opened: int, arrival: int, matched: pl.DataFrame, pairs: pl.DataFrame | None):
    """(held by, at, ns, key) of ``who``'s longest spin starting in [opened, arrival): a matched call it did
    not arrive last to (key: the call's group, kind, call) or a receive (key: the send's start); None: none."""
    inside = (pl.col("start") >= opened) & (pl.col("start") < arrival)
    spins = matched.filter((pl.col("who") == who) & (pl.col("last_who") != who) & (pl.col("wait") > 0) & inside)
    found = []
    if spins.height:
        top = spins.sort("wait", descending=True).row(0, named=True)
        found.append((top["wait"], top["last_who"], f"{top['kind']} #{top['seq']}", tuple(top[c] for c in PER_CALL)))
    if pairs is not None and pairs.height:
        recvs = pairs.rename({"recv_start": "start"}).filter(
            (pl.col("recv_who") == who) & (pl.col("wait") > 0) & inside)
        if recvs.height:
            top = recvs.sort("wait", descending=True).row(0, named=True)
            found.append((top["wait"], top["send_who"], f"recv #{top['seq']}", top["send_start"]))
    if not found:
        return None
    ns, held, at, key = max(found, key=lambda f: f[0])
    return held, at, ns, key


def _lateness_at(held: int, key, calls: pl.DataFrame, windows: pl.DataFrame) -> dict | None:
    """The held-by rank's lateness row at the wait: its ``per_call`` row at a collective (key: group, kind,
    call), its window before the send at a receive (key: the send's start; cause from its own classes)."""
    if isinstance(key, tuple):
        match = pl.all_horizontal(pl.col(c) == v for c, v in zip(PER_CALL, key, strict=True))
        rows = calls.filter(match & (pl.col("who") == held))
        return rows.row(0, named=True) if rows.height else None
    mine = windows.filter(pl.col("who") == held)
    sends = mine.filter((pl.col("kind") == "send") & (pl.col("arrival") == key))
    if sends.is_empty():
        return None
    send = sends.row(0, named=True)
    before = mine.filter(pl.col("step").eq_missing(send["step"]) & (pl.col("end") <= key)).sort("end").tail(1)
    prev = before.row(0, named=True) if before.height else None
    since = {f"x_{c}": send[f"a_{c}"] - (prev[f"e_{c}"] if prev else 0) for c in CLASSES}
    own = pl.DataFrame([{**send, **since}]).with_columns(cause=cause_of())
    return {**own.row(0, named=True), "opened": prev["end"] if prev else send["origin"]}
