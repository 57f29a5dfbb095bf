"""Memory copies by direction and host memory: the map's part per file and the job's reduce.

A copy's direction and host memory are its name's, as ``breakdown.facts`` reads them (Kineto's ``Memcpy HtoD
(Pageable -> Device)``: ``HtoD``, ``pageable``; Nsight's ``Memcpy HtoD``: ``HtoD``, host memory unknown); its
size is the span table's ``bytes`` (Kineto's ``bytes`` arg, Nsight's CUPTI ``bytes``). Per lane, direction
and host memory: the copies, their bytes, the sum of their durations (``busy_ns``) and that sum over the
copies whose size is known (``sized_ns``), which GB/s divides: bytes per ns is GB/s. Durations need no clock,
so the part crosses ranks as it is.
"""

from __future__ import annotations

import polars as pl

from pipebubble.analysis.breakdown.facts import copy_direction, host_memory
from pipebubble.analysis.intervals import engine_for
from pipebubble.options import Options
from pipebubble.report.memcpy import Memcpy, MemcpyRow

KEYS = ("rank", "lane", "direction", "host_memory")
#: A file's part: one row per lane (and its rank, which splits a batch's part), direction and host memory.
SCHEMA = {"rank": pl.Int32, "lane": pl.String, "direction": pl.String, "host_memory": pl.String, "count": pl.Int64,
          "bytes": pl.Int64, "busy_ns": pl.Int64, "sized_ns": pl.Int64}


def empty() -> pl.DataFrame:
    return pl.DataFrame(schema=SCHEMA)


def memcpy_part(spans: pl.DataFrame | pl.LazyFrame, options: Options, meta: dict | None = None) -> pl.DataFrame:
    """The file's copies per lane, direction and host memory (``SCHEMA``); no rows without a copy. ``spans``
    may be a spilled table's scan (aggregated as it streams)."""
    copies = spans.lazy().filter(pl.col("kind") == "memcpy").select(
        "rank",
        "lane",
        direction=copy_direction(pl.col("name")),
        host_memory=host_memory(pl.col("name")),
        size="bytes",
        dur=pl.col("end") - pl.col("start"),
    )
    return _summed(copies.group_by(*KEYS).agg(
        count=pl.len().cast(pl.Int64), bytes=_known_sum("size"), busy_ns=pl.col("dur").sum(),
        sized_ns=pl.col("dur").filter(pl.col("size").is_not_null()).sum(),
    )).collect(engine=engine_for(spans))


def _known_sum(column: str) -> pl.Expr:
    """The sum of ``column``'s known values; null where none is known (never 0 for unknown)."""
    return pl.when(pl.col(column).is_not_null().any()).then(pl.col(column).sum())


def _summed(frame: pl.LazyFrame) -> pl.LazyFrame:
    return frame.select(*(pl.col(c).cast(t) for c, t in SCHEMA.items())).sort(*KEYS, nulls_last=True)


def memcpy_report(parts: list[pl.DataFrame]) -> Memcpy | None:
    """The job's copies: per direction and host memory over every lane, and per lane; None without a copy."""
    rows = pl.concat([empty(), *parts], how="vertical_relaxed")
    if not rows.height:
        return None
    again = dict(count=pl.col("count").sum(), bytes=_known_sum("bytes"), busy_ns=pl.col("busy_ns").sum(),
                 sized_ns=pl.col("sized_ns").sum())
    lanes = _summed(rows.lazy().group_by(*KEYS).agg(**again))
    job = _summed(rows.lazy().with_columns(rank=pl.lit(None, pl.Int32), lane=pl.lit(None, pl.String))
                  .group_by(*KEYS).agg(**again))
    lanes, job = pl.collect_all([lanes.with_columns(gbps=_gbps()), job.with_columns(gbps=_gbps())])
    return Memcpy(rows=_rows(job), lanes=_rows(lanes))


def _gbps() -> pl.Expr:
    """Bytes over the time of the sized copies (bytes per ns = GB/s); null without either."""
    return pl.when(pl.col("sized_ns") > 0).then(pl.col("bytes") / pl.col("sized_ns"))


def _rows(frame: pl.DataFrame) -> list[MemcpyRow]:
    return [MemcpyRow(**{k: v for k, v in row.items() if k not in ("rank", "sized_ns")})
            for row in frame.iter_rows(named=True)]
