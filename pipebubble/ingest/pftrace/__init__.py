"""Perfetto protobuf traces (``.pftrace``): TrackEvent slices on their tracks, as pipebubble's own ``export``
writes them (``render/perfetto/trace.py``) and as other TrackEvent writers (PyTorch's profiler, the Perfetto
SDK) do.

What is read: TracePacket.track_descriptor (uuid, parent_uuid, name, description, process pid and name, thread
pid and tid), TracePacket.interned_data (event names, categories, debug-annotation names; per
trusted_packet_sequence_id, cleared by SEQ_INCREMENTAL_STATE_CLEARED), trace_packet_defaults' default track, and
TrackEvent TYPE_SLICE_BEGIN / TYPE_SLICE_END pairs (a stack per track), legacy complete events (phase ``X`` with
duration_us). Instants, counters and the export's own overlays (passes, waits, critical path) are counted in
``skipped``.

Where a slice goes: the export names each lane track's lane in its description (``rank0/gpu0/stream7``,
``rank0/pid12/tid34``) and each span's kind, correlation, external id, micro-batch and phase in its debug
annotations (unless the source's args had such a key: then the source's value is read). A foreign writer's
thread tracks become ``rank{r}/pid{p}/tid{t}`` lanes, with the rank from a ``rankN`` file name or the file's
position; kinds come from categories as for Chrome JSON (``json/spans.py``). GPU work on a track of no known
device sits on the device its process id names, as in Chrome JSON.

The outer framing (``Trace.packet``, field 1) is walked here, so a file cut off mid-packet is read up to its
last whole packet, with a warning; each whole packet is decoded by protobuf (a dependency of ``perfetto``).
"""

from __future__ import annotations

import re
from itertools import pairwise
from pathlib import Path

from pipebubble.errors import TraceFormatError
from pipebubble.ingest.base import FileResult

SUFFIXES = (".pftrace", ".perfetto-trace")
#: The tag of ``Trace.packet`` (field 1, length-delimited): every top-level record of a trace starts with it.
_TRACE_PACKET_TAG = 0x0A
#: Whole packets decoded at a time (the decoded messages of a chunk are several times its bytes).
CHUNK_BYTES = 4 << 20
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)")


def sniff(path: Path) -> bool:
    """A file whose first bytes are a ``Trace.packet`` framing a plausible packet, or a ``.pftrace`` name whose
    text is not JSON (torch 2.13's profiler writes its Chrome JSON under whatever name it is given, a
    ``.pftrace`` one included: that is the JSON reader's)."""
    import zlib

    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
        if head[:2] == b"\x1f\x8b":
            head = zlib.decompressobj(wbits=31).decompress(head, 64)
    except (OSError, zlib.error):  # unreadable, or a gzip stream too short to say: decided by its name
        head = b""
    if head.lstrip()[:1] in (b"{", b"["):
        return False
    if path.name.lower().endswith(SUFFIXES):
        return True
    if len(head) < 3 or head[0] != _TRACE_PACKET_TAG:
        return False
    try:
        _, pos = _varint(head, 1)
    except (IndexError, ValueError):
        return False
    if pos >= len(head):
        return False
    tag = head[pos]
    return (tag & 7) in (0, 1, 2, 5) and (tag >> 3) != 0


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _whole_packets(data: bytes, path: Path) -> tuple[list[int], str | None]:
    """(packet boundaries about every ``CHUNK_BYTES`` from 0 to the end of the last whole packet, a warning
    where the rest was not read)."""
    cuts = [0]
    pos, n, count = 0, len(data), 0
    while pos < n:
        if pos - cuts[-1] >= CHUNK_BYTES:
            cuts.append(pos)
        if data[pos] != _TRACE_PACKET_TAG:
            if count == 0:
                raise TraceFormatError(path, "not a Perfetto protobuf trace (no TracePacket at its start)")
            return [*cuts, pos], f"{path}: unreadable bytes at offset {pos}; read up to its last whole packet"
        try:
            length, body = _varint(data, pos + 1)
        except (IndexError, ValueError):
            length, body = n, n + 1  # the framing itself is cut off
        if body + length > n:
            if count == 0 and body + length > n + 1 and pos == 0 and n > 64 and length > 16 * n:
                raise TraceFormatError(path, "not a Perfetto protobuf trace (its first packet's length is impossible)")
            return [*cuts, pos], f"{path}: trace cut off; read up to its last whole packet, {n - pos} bytes unreadable"
        pos, count = body + length, count + 1
    return [*cuts, pos], None


def read(path: Path, position: int = 0) -> FileResult:
    from google.protobuf.message import DecodeError
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace

    from pipebubble.ingest.pftrace.decode import Decoder

    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TraceFormatError(path, f"cannot read: {exc.strerror or exc}") from None
    if data[:2] == b"\x1f\x8b":
        import gzip
        import zlib

        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceFormatError(path, f"bad gzip: {exc}") from None
    cuts, warning = _whole_packets(data, path)
    end = cuts[-1]
    decoder = Decoder(path)
    view = memoryview(data)
    for a, b in pairwise(cuts):  # a chunk of whole packets at a time: the decoded messages stay small
        try:
            chunk = Trace.FromString(view[a:b])
        except (DecodeError, RecursionError) as exc:
            raise TraceFormatError(path, f"not a Perfetto protobuf trace ({exc})") from None
        for packet in chunk.packet:
            decoder.packet(packet)
        del chunk
    rank = _rank(path, position)
    table = decoder.table(rank)
    warnings = [w for w in (warning,) if w] + decoder.warnings
    ranks = table["rank"].drop_nulls().unique().to_list() if table.height else []
    meta = {"rank": ranks[0] if len(ranks) == 1 else (rank if not ranks else None),
            "unread_bytes": len(data) - end, "process_names": decoder.process_names,
            "thread_names": decoder.thread_names}
    return FileResult(str(path), table, decoder.events, decoder.skipped, warnings, meta, "perfetto")


def _rank(path: Path, position: int) -> int:
    match = _RANK_IN_NAME.search(Path(path).name)
    if match is not None and len(match.group(1)) <= 9:
        return int(match.group(1))
    return position


