"""Byte-level repairs applied to JSON text before it is decoded again, and how a decode error is read.

Each repair runs only after the typed decoders rejected a block, so well-formed traces never pay for them:
invalid UTF-8 is replaced (and counted), lone UTF-16 surrogate escapes become U+FFFD, and values nested too
deep for the decoder's recursion limit are replaced by ``null`` (no field that becomes a span column is ever
nested deeper than a few levels, so nothing that is kept changes).
"""

from __future__ import annotations

import codecs
import re

#: Containers nested deeper than this (counting the events array itself) are replaced by ``null``.
MAX_DEPTH = 32

_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)
_SURROGATE = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?:\\u[dD][c-fC-F][0-9a-fA-F]{2})?|\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)
_BYTE = re.compile(r"\(byte (\d+)\)")
_REPLACEMENT = "\ufffd".encode()


def fix_unicode(text: bytes) -> tuple[bytes, int, list[tuple[int, int]]]:
    """``text`` with invalid UTF-8 sequences and lone UTF-16 surrogate escapes replaced by U+FFFD; how many
    were replaced; and (offset in ``text``, bytes added) for each replacement that changed the length, so
    an offset in the repaired text can be mapped back (``original_offset``)."""
    shifts: list[tuple[int, int]] = []
    if not text.isascii():
        found: list[tuple[int, int]] = []
        _FOUND.append(found)
        try:
            decoded = text.decode("utf-8", "pipebubble-count")
        finally:
            _FOUND.pop()
        if found:
            shifts = [(start, len(_REPLACEMENT) - (end - start)) for start, end in found]
            text = decoded.encode()
        del decoded
    replaced = len(shifts)
    if b"\\" in text and b"\\u" in text and _SURROGATE.search(text):  # one byte is found by memchr, fast
        lone = 0

        def one(match: re.Match) -> bytes:
            nonlocal lone
            if len(match.group()) == 12 or _is_escaped(text, match.start()):
                return match.group()  # a whole pair, or a literal backslash followed by "u..."
            lone += 1
            return rb"\ufffd"

        text = _SURROGATE.sub(one, text)
        replaced += lone
    return text, replaced, shifts


def original_offset(offset: int, shifts: list[tuple[int, int]]) -> int:
    """An offset in text repaired by ``fix_unicode`` mapped back to the text as it was."""
    moved = 0
    for start, added in shifts:
        if start + moved >= offset:
            break
        moved += added
    return offset - moved


#: Invalid sequences found by the decoder's error handler, one list per ``fix_unicode`` call in progress.
_FOUND: list[list[tuple[int, int]]] = []


def _count_replace(exc: UnicodeDecodeError) -> tuple[str, int]:
    _FOUND[-1].append((exc.start, exc.end))
    return "\ufffd", exc.end


codecs.register_error("pipebubble-count", _count_replace)


def _is_escaped(text: bytes, pos: int) -> bool:
    """Whether the backslash at ``pos`` is itself escaped (preceded by an odd run of backslashes)."""
    run = 0
    while pos - run - 1 >= 0 and text[pos - run - 1] == 0x5C:
        run += 1
    return run % 2 == 1


def flatten_deep(text: bytes, limit: int = MAX_DEPTH) -> tuple[bytes, list[tuple[int, int]]]:
    """``text`` with every container nested deeper than ``limit`` replaced by ``null``, and (offset, bytes
    added) of each replacement, as ``fix_unicode`` gives them (an empty list: nothing was that deep).

    A deep container left open at the end (a cut-off file) is dropped with everything after it, so the
    text still reads as cut off. One regex pass over strings and brackets: time and memory are linear."""
    out, depth, last, opened = [], 0, 0, -1
    shifts: list[tuple[int, int]] = []
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token[:1] == b'"':
            continue
        if token in (b"[", b"{"):
            depth += 1
            if depth == limit + 1:
                opened = match.start()
        else:
            depth -= 1
            if depth == limit and opened >= 0:
                out.append(text[last:opened])
                out.append(b"null")
                shifts.append((opened, 4 - (match.end() - opened)))
                last, opened = match.end(), -1
    if opened >= 0:
        out.append(text[last:opened])
        shifts.append((opened, opened - len(text)))
        return b"".join(out), shifts
    out.append(text[last:])
    return (b"".join(out), shifts) if shifts else (text, shifts)


def event_ends(text: bytes) -> list[int]:
    """Offsets just past each ``}`` that closes a top-level object of ``text`` (the inside of an events
    array), following strings and brackets; exact up to the first damage in ``text``."""
    ends, depth = [], 0
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
        elif token in (b"]", b"}"):
            depth -= 1
            if depth == 0 and token == b"}":
                ends.append(match.end())
    return ends


def error_offset(exc: Exception, length: int) -> int:
    """Where in a text of ``length`` bytes the decoder gave up (the end, for truncated input)."""
    match = _BYTE.search(str(exc))
    return min(length, int(match.group(1))) if match else length


def is_truncation(exc: Exception, length: int) -> bool:
    """Whether a decode error of a ``[``...``]``-wrapped text of ``length`` bytes is only its end missing:
    the decoder ran out of input, or failed at the closing bracket that was added to it."""
    return "truncated" in str(exc) or error_offset(exc, length) >= length - 1


def one_line(exc: Exception) -> str:
    """A decode error's message as one line without its byte offset (offsets are given separately)."""
    text = _BYTE.sub("", str(exc)).strip().splitlines()
    return text[0].rstrip(" :") if text else type(exc).__name__
