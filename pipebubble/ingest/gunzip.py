"""Gunzip a trace: one inflate loop for both the in-memory and the streamed path, so both read the same.

Every gzip member is read in turn (``gzip -c a b > c`` writes several); zero bytes after a complete member
(padding from a preallocated file) are ignored. A member cut short or corrupt keeps what was inflated
before it and gives a warning; nothing inflated at all is a TraceFormatError.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from pipebubble.errors import TraceFormatError

#: Compressed bytes fed to the inflater at a time (both paths use the same, so both fail at the same byte).
CHUNK = 8 << 20


def inflate(path: Path, chunks: Iterable[bytes], write: Callable[[bytes], object]) -> str | None:
    """Inflate the gzip members in ``chunks`` into ``write``; a warning when the data ends badly."""
    member, written, at_boundary = zlib.decompressobj(wbits=31), 0, False
    for chunk in chunks:
        while chunk:
            if at_boundary:
                chunk = chunk.lstrip(b"\x00")
                if not chunk:
                    break
                member, at_boundary = zlib.decompressobj(wbits=31), False
            try:
                piece = member.decompress(chunk)
            except zlib.error as exc:
                if not written:
                    raise TraceFormatError(path, f"corrupt gzip data ({exc})") from None
                return f"{path}: gzip data corrupt after {written} bytes of JSON ({exc}); read up to there"
            write(piece)
            written += len(piece)
            chunk, at_boundary = (member.unused_data, True) if member.eof else (b"", False)
    if not written:
        raise TraceFormatError(path, "corrupt gzip data (nothing could be decompressed)")
    return None if at_boundary else f"{path}: gzip stream cut off after {written} bytes of JSON"


def file_chunks(path: Path) -> Iterator[bytes]:
    """The compressed file in ``CHUNK``-sized reads."""
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            yield chunk


def in_memory(path: Path) -> tuple[bytes, str | None]:
    """The whole gunzipped text and the warning, if any."""
    pieces: list[bytes] = []
    warning = inflate(path, file_chunks(path), pieces.append)
    return b"".join(pieces), warning
