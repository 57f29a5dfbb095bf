"""Which span is which micro-batch pass.

Micro-batch labels are CPU ranges: torch.distributed.pipelining ``PP:{stage}{F|B|I|W}{mb}``, GPipe's
``Forward {mb}`` / ``Backward {mb}``, zero-bubble NVTX ``F{mb}.{chunk}.{seq}``, Megatron ``forward-compute`` /
``backward-compute`` (numbered by order), or ``--microbatch-regex`` with named groups ``phase``, ``mb`` and
optionally ``chunk``. A span belongs to the innermost label whose range holds its start (CPU work) or the
start of the runtime call that launched it (GPU work, joined on the launch's correlation id).
"""

from __future__ import annotations

import re

import polars as pl

from pipebubble.analysis.intervals import top_level
from pipebubble.options import check_regex

#: (name, regex); groups: phase letter or word, mb, chunk (a virtual stage id or chunk index).
LABEL_PATTERNS = (
    ("torch_pipelining", r"^PP:(?P<chunk>\d+)(?P<phase>[FBIW])(?P<mb>\d+)$"),
    ("gpipe", r"^(?P<phase>Forward|Backward) (?P<mb>\d+)$"),
    ("zero_bubble", r"^(?P<phase>[FBW])(?P<mb>\d+)\.(?P<chunk>\d+)\.(?P<seq>\d+)$"),
    ("megatron", r"^(?P<phase>forward|backward)-compute$"),
)
PHASES = {
    "F": "forward",
    "B": "backward",
    "I": "backward",
    "W": "weight",
    "forward": "forward",
    "backward": "backward",
    "weight": "weight",
    "Forward": "forward",
    "Backward": "backward",
}


def labels(spans: pl.DataFrame, microbatch_regex: str | None = None) -> tuple[pl.DataFrame, str | None]:
    """Micro-batch labels among annotation spans: rank, pid, tid, lane, start, end, phase, microbatch, chunk;
    and which pattern matched (the first that matches any span wins)."""
    notes = spans.filter(pl.col("kind") == "annotation")
    patterns = ((("custom", microbatch_regex),) if microbatch_regex else ()) + LABEL_PATTERNS
    for name, regex in patterns:
        check_regex(regex)
        found = notes.filter(pl.col("name").str.contains(regex))
        if found.height:
            return _label_frame(found, regex, name), name
    return notes.clear().with_columns(chunk=pl.lit(None, pl.Int32)).select(*_LABEL_COLUMNS), None


_LABEL_COLUMNS = ["rank", "pid", "tid", "lane", "start", "end", "phase", "microbatch", "chunk"]


def _label_frame(found: pl.DataFrame, regex: str, pattern: str) -> pl.DataFrame:
    groups = re.compile(regex).groupindex
    parts = pl.col("name").str.extract_groups(regex)
    frame = found.drop("phase", "microbatch").with_columns(parts=parts).unnest("parts")
    phase = pl.col("phase").replace_strict(PHASES, default=None) if "phase" in groups else pl.lit("forward")
    frame = frame.with_columns(
        phase=phase,
        microbatch=pl.col("mb").cast(pl.Int32, strict=False) if "mb" in groups else pl.lit(None, pl.Int32),
        chunk=pl.col("chunk").cast(pl.Int32, strict=False) if "chunk" in groups else pl.lit(None, pl.Int32),
    )
    if "mb" not in groups:  # Megatron: the n-th forward (backward) range on a thread is micro-batch n
        frame = frame.sort("start").with_columns(microbatch=pl.int_range(pl.len()).over("lane", "phase").cast(pl.Int32))
    return frame.filter(pl.col("phase").is_not_null()).select(_LABEL_COLUMNS).sort("lane", "start")


def attribute(work: pl.DataFrame, spans: pl.DataFrame, found: pl.DataFrame) -> pl.DataFrame:
    """Give each work span the (phase, microbatch, chunk) of the label holding its start (CPU work) or its
    launch call's start (GPU work). Spans under no label get null phase. ``context`` names the top-level CPU
    operator that launched GPU work (the span's own name for CPU work), for inferring passes without labels."""
    launches = spans.filter(pl.col("kind") == "runtime").select(
        "source", "correlation", launch_lane="lane", launch_pid="pid", launch_start="start"
    )
    keyed = (
        work.join(launches, on=["source", "correlation"], how="left")
        .filter(pl.col("pid").is_null() | pl.col("launch_pid").is_null() | (pl.col("pid") == pl.col("launch_pid")))
        .unique(["source", "lane", "stream", "start", "end", "name"], keep="first", maintain_order=True)
    )
    keyed = keyed.with_columns(
        at=pl.when(pl.col("device").is_not_null()).then("launch_start").otherwise("start"),
        at_lane=pl.when(pl.col("device").is_not_null()).then("launch_lane").otherwise("lane"),
    )
    marks = found.select(
        at_lane="lane", at="start", label_end="end", label_phase="phase", label_mb="microbatch", label_chunk="chunk"
    ).sort("at_lane", "at")
    joined = keyed.sort("at_lane", "at").join_asof(
        marks, on="at", by="at_lane", strategy="backward", check_sortedness=False
    )
    inside = pl.col("at") < pl.col("label_end")
    joined = _launch_context(joined, spans)
    return joined.with_columns(
        phase=pl.when(inside).then("label_phase"),
        microbatch=pl.when(inside).then("label_mb"),
        chunk=pl.when(inside).then("label_chunk"),
    ).drop(
        "launch_lane",
        "launch_pid",
        "launch_start",
        "at",
        "at_lane",
        "label_end",
        "label_phase",
        "label_mb",
        "label_chunk",
    )


def _launch_context(keyed: pl.DataFrame, spans: pl.DataFrame) -> pl.DataFrame:
    """``context``: the top-level CPU operator holding each GPU span's launch (autograd's for backward)."""
    top = top_level(spans.filter(pl.col("kind") == "cpu_op")).select(
        at_lane="lane", at="start", op_end="end", op_name="name"
    )
    joined = keyed.sort("at_lane", "at").join_asof(
        top.sort("at_lane", "at"), on="at", by="at_lane", strategy="backward", check_sortedness=False
    )
    launched = pl.col("device").is_not_null() & (pl.col("at") < pl.col("op_end"))
    return joined.with_columns(
        context=pl.when(pl.col("device").is_null()).then("name").when(launched).then("op_name")
    ).drop("op_end", "op_name")
