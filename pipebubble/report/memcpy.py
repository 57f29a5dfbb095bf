"""The memory-copy part of the report, as frozen data: bytes are int, times int64 ns.

A row counts the copies of one direction (CUPTI's ``HtoD``, ``DtoH``, ``DtoD``, ``PtoP`` ...; null where a
copy's name says none) and host memory (``pinned``, ``pageable``; null for a device-to-device copy or where
the trace does not say), over the job (``rows``) or one device lane (``lanes``, with its ``lane``).
``busy_ns`` is the sum of the copies' durations (not their union: two copies at once each count), ``gbps``
the bytes over the time of the copies whose size the trace records (bytes per ns is GB/s); null where
none does (``analysis/memcpy.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class MemcpyRow:
    direction: str | None
    host_memory: str | None
    count: int
    bytes: int | None
    busy_ns: int
    gbps: float | None
    lane: str | None = None  # the device lane (``lanes``' rows); null in the job's rows


@dataclass(frozen=True)
class Memcpy:
    """The job's copies by direction and host memory (``rows``), and the same per device lane (``lanes``)."""

    rows: list[MemcpyRow] = field(default_factory=list)
    lanes: list[MemcpyRow] = field(default_factory=list)
