"""Point-to-point sends and receives matched across ranks: how long each receive waited for its peer's send,
and how long the transfer took.

Map (one file, ``p2p_part``): one row per send or receive outside every collective range (NCCL runs
all_to_all as grouped send/recv; ``collectives`` tells those apart). One operation is the ranges torch
records for it on its thread (``PP:1SEND_F0`` around ``c10d::send`` around ``record_param_comms`` and
``nccl:send``; gloo's asynchronous ``gloo:send`` starts inside ``c10d::send`` and may outlast it): its times
are its GPU kernel's where it launched one (``SendRecv``), else its ranges' first start to last end. The
micro-batch and pass come from a ``PP:{stage}SEND_{F|B}{mb}`` name or the pass label holding the operation.
The span table keeps no event arguments, so ``peer``, ``bytes`` and ``tag`` (Kineto's ``c10d::send``
inputs, NCCL's NVTX payload) stay null.

Reduce (``match``): a send and a receive are one transfer when the receive's rank is the send's peer, the
send's rank the receive's peer, and they are the same (``seq``-th) operation of that direction between the
two, as NCCL and gloo match them (in order, per pair of ranks and tag). An unknown peer is inferred from the
pipeline's stage order: a forward pass's activation goes to the next stage (the next virtual stage where a
``PP:`` name gives it), a backward pass's gradient to the one before; the pass is the operation's label, else
the pass that ended before a send or began after a receive on its stage. Nothing compares two ranks'
clocks. A receive posted before its send began spins until then: ``wait`` = clip(send start − receive
start, 0, receive length), ``transfer`` = the rest of the receive.
"""

from __future__ import annotations

import polars as pl

from pipebubble.analysis.comm.collectives import P2P, comm_ranges
from pipebubble.analysis.intervals import ENGINE, top_level
from pipebubble.analysis.launches import EVENT_KEY, with_launch
from pipebubble.analysis.pipeline.labels import labels
from pipebubble.spans import owner

SCHEMA = {"who": pl.Int64, "rank": pl.Int32, "lane": pl.String, "direction": pl.String, "peer": pl.Int64,
          "seq": pl.Int64, "start": pl.Int64, "end": pl.Int64, "bytes": pl.Int64, "tag": pl.Int64,
          "microbatch": pl.Int32, "phase": pl.String, "stage_id": pl.Int32}
PAIR_SCHEMA = {"send_who": pl.Int64, "recv_who": pl.Int64, "seq": pl.Int64, "send_start": pl.Int64,
               "send_end": pl.Int64, "recv_start": pl.Int64, "recv_end": pl.Int64, "bytes": pl.Int64,
               "tag": pl.Int64, "wait": pl.Int64, "transfer": pl.Int64}
#: ``PP:{stage}SEND_F{mb}`` / ``RECV_B{mb}``: torch.distributed.pipelining's names for its transfers.
_PP = r"^PP:(\d+)(?:SEND|RECV)_([FBW])(\d+)"
_PHASE = {"F": "forward", "B": "backward", "W": "weight"}
#: Library ranges that run asynchronously (gloo's work records its send until it completes): they join the
#: operation whose range they start in, and never open one of their own where one holds them.
_ASYNC = r"^(gloo|mpi|ucc):"


def empty() -> pl.DataFrame:
    """The part of a file without point-to-point operations."""
    return pl.DataFrame(schema=SCHEMA)


def p2p_part(spans: pl.DataFrame, ranges: tuple[pl.DataFrame, pl.DataFrame] | None = None) -> pl.DataFrame:
    """Map: one row per point-to-point operation of the file (``SCHEMA``); no rows without any. ``ranges``:
    the file's ``collectives.comm_ranges``, when already found (the send and receive ranges are its second)."""
    if spans.is_empty():
        return empty()
    _, p2p = ranges if ranges is not None else comm_ranges(spans)
    if p2p.is_empty():
        return empty()
    ops = _operations(p2p)
    ops = _with_kernels(_with_pass(ops, spans), spans)
    seq = pl.int_range(pl.len()).over("who", "direction", "peer")
    ops = ops.sort("who", "start", "end").with_columns(seq=seq).select(list(SCHEMA)).cast(SCHEMA)  # type: ignore[arg-type]
    return ops.collect(engine=ENGINE)


def _operations(p2p: pl.DataFrame) -> pl.LazyFrame:
    """One row per operation: the outermost synchronous range (``op``) of its direction on its thread and
    every range of that direction starting inside it (a grouped send and receive are two operations), its
    first start, last end, and the micro-batch, pass and stage id its ``PP:`` name gives."""
    p2p = p2p.lazy().with_columns(key=pl.format("{}|{}", "lane", "kind"))
    sync = p2p.filter(~pl.col("name").str.contains(_ASYNC))
    anchors = top_level(sync, "key").with_row_index("op").collect(engine=ENGINE)
    marks = anchors.lazy().select("key", at="start", op="op", op_end="end")  # each key's in order of start
    probe = p2p.with_columns(at=pl.col("start")).sort("at")
    hit = probe.join_asof(marks, on="at", by="key", strategy="backward", check_sortedness=False)
    inside = hit.filter(pl.col("op").is_not_null() & (pl.col("at") < pl.col("op_end")))
    loose = hit.filter(pl.col("op").is_null() | (pl.col("at") >= pl.col("op_end"))).drop("op", "op_end")
    loose = top_level(loose, "key")
    loose = loose.with_columns(op=pl.int_range(pl.len(), dtype=pl.UInt32) + anchors.height)
    rows = pl.concat([inside.drop("op_end"), loose], how="diagonal_relaxed")
    pp = pl.col("name").str.extract_groups(_PP)
    rows = rows.with_columns(pp=pp)
    return rows.group_by("op").agg(
        who=owner().first(), rank=pl.col("rank").first(), lane=pl.col("lane").first(),
        direction=pl.col("kind").first(), start=pl.col("start").min(), end=pl.col("end").max(),
        stage_id=pl.col("pp").struct.field("1").drop_nulls().first().cast(pl.Int32),
        pp_phase=pl.col("pp").struct.field("2").drop_nulls().first(),
        pp_mb=pl.col("pp").struct.field("3").drop_nulls().first().cast(pl.Int32),
    )


def _with_kernels(ops: pl.LazyFrame, spans: pl.DataFrame) -> pl.LazyFrame:
    """An operation that launched communication kernels takes their times and GPU lane (a grouped send and
    receive share theirs)."""
    if not ((spans["kind"] == "comm") & spans["device"].is_not_null()).any():
        return ops
    kernels = spans.lazy().filter((pl.col("kind") == "comm") & pl.col("device").is_not_null())
    launched = with_launch(kernels, spans.lazy(), how="inner", key=EVENT_KEY).select(
        k_lane="lane", k_start="start", k_end="end", lane="at_lane", at="at"
    ).sort("lane", "at")
    hits = []
    for direction in P2P:
        marks = ops.filter(pl.col("direction") == direction).select("lane", "op", at="start", op_end="end")
        hits.append(launched.join_asof(marks.sort("lane", "at"), on="at", by="lane", strategy="backward",
                                       check_sortedness=False))
    hit = pl.concat(hits).filter(pl.col("op").is_not_null() & (pl.col("at") < pl.col("op_end")))
    per = hit.group_by("op").agg(k_lane=pl.col("k_lane").first(), k_start=pl.col("k_start").min(),
                                 k_end=pl.col("k_end").max())
    joined = ops.join(per, on="op", how="left")
    return joined.with_columns(
        lane=pl.coalesce("k_lane", "lane"), start=pl.coalesce("k_start", "start"), end=pl.coalesce("k_end", "end")
    ).drop("k_lane", "k_start", "k_end")


def _with_pass(ops: pl.LazyFrame, spans: pl.DataFrame) -> pl.LazyFrame:
    """``microbatch``/``phase``: the ``PP:`` name's, else those of the pass label holding the operation on
    its thread; ``peer``, ``bytes``, ``tag`` unknown (null)."""
    ops = ops.with_columns(phase=pl.col("pp_phase").replace_strict(_PHASE, default=None), microbatch="pp_mb")
    found, _ = labels(spans)
    if found["device"].is_null().any():
        notes = found.lazy().filter(pl.col("device").is_null()).select(
            "lane", at="start", l_end="end", l_phase="phase", l_mb="microbatch").sort("at")
        look = ops.select("op", "lane", at="start").sort("at").join_asof(
            notes, on="at", by="lane", strategy="backward", check_sortedness=False
        ).filter(pl.col("at") < pl.col("l_end"))
        ops = ops.join(look.select("op", "l_phase", "l_mb"), on="op", how="left").with_columns(
            phase=pl.coalesce("phase", "l_phase"), microbatch=pl.coalesce("microbatch", pl.col("l_mb").cast(pl.Int32))
        )
    return ops.with_columns(**{c: pl.lit(None, pl.Int64) for c in ("peer", "bytes", "tag")})


def stage_of(rows: pl.DataFrame, work: pl.DataFrame) -> dict[int, int]:
    """Participant -> stage: the stage its operations' lanes ran work on (else its process's or rank's
    lanes), the most common."""
    if rows.is_empty() or work.is_empty():
        return {}
    lanes = work.lazy().select("stage", "lane").unique()
    exact = rows.lazy().join(lanes, on="lane")
    prefix = pl.col("lane").str.split("/").list.first()
    loose = rows.lazy().with_columns(key=prefix).join(lanes.with_columns(key=prefix).drop("lane").unique(), on="key")
    loose = loose.join(exact.select("who").unique(), on="who", how="anti")
    both = pl.concat([exact.select("who", "stage"), loose.select("who", "stage")])
    per = both.group_by("who").agg(pl.col("stage").mode().min()).collect(engine=ENGINE)
    return {int(w): int(s) for w, s in per.iter_rows()}


def match(
    rows: pl.DataFrame, stages: dict[int, int] | None = None, passes: pl.DataFrame | None = None
) -> tuple[pl.DataFrame, dict[str, int]]:
    """Reduce: every send paired with its receive (``PAIR_SCHEMA``), and the operations left unpaired by
    reason (every operation is one or the other). ``stages`` (participant -> stage position) and ``passes``
    (the stages' compute: stage, phase, start, end) let unknown peers be inferred."""
    if rows.is_empty():
        return pl.DataFrame(schema=PAIR_SCHEMA), {}
    rows = _infer_peers(rows.with_row_index("row"), stages or {}, passes)
    unknown = rows["peer"].null_count()
    known = rows.lazy().filter(pl.col("peer").is_not_null()).sort("who", "start", "end")
    known = known.with_columns(seq=pl.int_range(pl.len()).over("who", "direction", "peer"))
    sends = known.filter(pl.col("direction") == "send")
    recvs = known.filter(pl.col("direction") == "recv")
    cols = ["start", "end", "bytes", "tag", "microbatch", "row"]
    joined = sends.select("who", "peer", "seq", *cols).join(
        recvs.select("who", "peer", "seq", *cols), left_on=["who", "peer", "seq"], right_on=["peer", "who", "seq"],
        suffix="_r",
    )

    def differ(c: str) -> pl.Expr:
        return pl.col(c).is_not_null() & pl.col(f"{c}_r").is_not_null() & (pl.col(c) != pl.col(f"{c}_r"))

    clash = differ("bytes") | differ("tag")
    mb = differ("microbatch")
    joined = joined.with_columns(clash=clash, mb=mb & ~clash).collect(engine=ENGINE)
    recv_len = pl.col("end_r") - pl.col("start_r")
    wait = (pl.col("start") - pl.col("start_r")).clip(0).clip(upper_bound=recv_len)
    pairs = joined.lazy().filter(~pl.col("clash") & ~pl.col("mb")).select(
        send_who="who", recv_who="peer", seq="seq", send_start="start", send_end="end", recv_start="start_r",
        recv_end="end_r", bytes=pl.coalesce("bytes", "bytes_r"), tag=pl.coalesce("tag", "tag_r"), wait=wait,
    ).with_columns(transfer=pl.col("recv_end") - pl.col("recv_start") - pl.col("wait")).cast(PAIR_SCHEMA)
    matched = joined.lazy().select(pl.concat_list("row", "row_r").alias("row")).explode("row")
    lone = known.join(matched, on="row", how="anti").group_by("direction").len()
    clashes = joined.lazy().select(pl.col("clash").sum(), pl.col("mb").sum())
    pairs, lone, clashes = pl.collect_all([pairs.sort("recv_who", "recv_start"), lone, clashes], engine=ENGINE)
    alone = dict(lone.iter_rows())
    counts = {
        "peer unknown": unknown,
        "size or tag differ": 2 * int(clashes["clash"][0]),
        "micro-batch differs": 2 * int(clashes["mb"][0]),
        "no matching recv": int(alone.get("send", 0)),
        "no matching send": int(alone.get("recv", 0)),
    }
    return pairs, {k: v for k, v in counts.items() if v}


def pair(rows: pl.DataFrame, stages: dict[int, int] | None = None, passes: pl.DataFrame | None = None) -> pl.DataFrame:
    """Each send paired with its receive (``match``, without the unpaired counts)."""
    return match(rows, stages, passes)[0]


def _infer_peers(rows: pl.DataFrame, stages: dict[int, int], passes: pl.DataFrame | None) -> pl.DataFrame:
    """Fill unknown peers from the pipeline: the ``PP:`` stage id's neighbour where one is named, else the
    neighbouring stage the operation's pass sends to or receives from, else a first or last stage's one
    neighbour."""
    if not stages or rows.filter(pl.col("peer").is_null()).is_empty():
        return rows
    who_at = {s: w for w, s in sorted(stages.items(), reverse=True)}  # the lowest participant of each stage
    rows = rows.with_columns(pos=pl.col("who").replace_strict(stages, default=None, return_dtype=pl.Int64))
    if passes is not None and passes.height:
        rows = _pass_around(rows, passes)
    # a forward send and a backward receive face the next stage; a backward send and a forward receive the last
    ahead = (pl.col("direction") == "send") == (pl.col("phase") == "forward")
    step = pl.when(pl.col("phase").is_in(["forward", "backward"])).then(pl.when(ahead).then(1).otherwise(-1))
    last = max(stages.values())
    lone = pl.when(pl.col("pos") == 0).then(1).when(pl.col("pos") == last).then(-1)

    def at(offset: pl.Expr) -> pl.Expr:
        return (pl.col("pos") + offset).replace_strict(who_at, default=None, return_dtype=pl.Int64)

    by_stage = pl.coalesce(at(step), at(lone)) if last >= 1 else at(step)
    named = rows.filter(pl.col("stage_id").is_not_null()).group_by("stage_id").agg(pl.col("who").min())
    vstage = dict(named.iter_rows())
    by_id = (pl.col("stage_id").cast(pl.Int64) + step).replace_strict(vstage, default=None, return_dtype=pl.Int64)
    peer = pl.coalesce("peer", by_id, by_stage) if vstage else pl.coalesce("peer", by_stage)
    return rows.with_columns(peer=peer).drop("pos")


def _pass_around(rows: pl.DataFrame, passes: pl.DataFrame) -> pl.DataFrame:
    """An operation without a pass takes the one it belongs to on its stage: a send the pass that ended last
    before it began, a receive the pass that began first after it ended."""
    known = passes.filter(pl.col("phase").is_in(["forward", "backward"])).select(
        pos=pl.col("stage").cast(pl.Int64), p_start="start", p_end="end", p_phase="phase"
    )
    if known.is_empty():
        return rows
    ends = known.sort("p_end").select("pos", "p_end", before="p_phase")
    starts = known.sort("p_start").select("pos", "p_start", after="p_phase")
    out = rows.filter(pl.col("pos").is_not_null())
    out = out.sort("start").join_asof(ends, left_on="start", right_on="p_end", by="pos", strategy="backward",
                                      check_sortedness=False)
    out = out.sort("end").join_asof(starts, left_on="end", right_on="p_start", by="pos", strategy="forward",
                                    check_sortedness=False)
    guess = pl.when(pl.col("direction") == "send").then("before").otherwise("after")
    out = out.with_columns(phase=pl.coalesce("phase", guess)).drop("p_end", "p_start", "before", "after")
    return pl.concat([out, rows.filter(pl.col("pos").is_null())], how="vertical_relaxed")


def in_windows(pairs: pl.DataFrame, stages: dict[int, int], wins: pl.DataFrame) -> pl.DataFrame:
    """Each receiving stage's wait and transfer inside the step windows (``stage``, ``p2p_wait_ns``,
    ``p2p_transfer_ns``): a receive's waiting stretch and its transfer, each cut to the window its end lies
    in (a receiving stage's clock)."""
    schema = {"stage": pl.Int32, "p2p_wait_ns": pl.Int64, "p2p_transfer_ns": pl.Int64}
    if pairs.is_empty() or wins.is_empty():
        return pl.DataFrame(schema=schema)
    rows = pairs.with_columns(stage=pl.col("recv_who").replace_strict(stages, default=None, return_dtype=pl.Int32))
    rows = rows.filter(pl.col("stage").is_not_null()).sort("recv_end")
    rows = rows.join_asof(wins.sort("window_start"), left_on="recv_end", right_on="window_start",
                          strategy="backward", check_sortedness=False).filter(pl.col("window_end").is_not_null())
    lo, hi = pl.col("window_start"), pl.col("window_end")
    turn = pl.col("recv_start") + pl.col("wait")

    def cut(a: pl.Expr, b: pl.Expr) -> pl.Expr:
        return (pl.min_horizontal(b, hi) - pl.max_horizontal(a, lo)).clip(0)

    sums = rows.group_by("stage").agg(
        p2p_wait_ns=cut(pl.col("recv_start"), turn).sum(), p2p_transfer_ns=cut(turn, pl.col("recv_end")).sum()
    )
    return sums.cast(schema).sort("stage")  # type: ignore[arg-type]



def reduce_pipeline(
    ops: pl.DataFrame, work: pl.DataFrame, wins: pl.DataFrame
) -> tuple[pl.DataFrame, dict[int, tuple[int, int]], dict | None, pl.DataFrame | None]:
    """The pipeline section's point-to-point part, from every file's operations and the stages' work: the
    paired receives by stage (``stage``, ``start``, ``end``, ``wait_end``, ``from_stage``, ``from_who``: for the
    waits), each stage's (wait, transfer) inside the windows ``wins``, the summary (pairs, wait_ns,
    transfer_ns, unpaired by reason; None without operations) and the pairs (``match``: for the critical path
    and the late ranks; None without operations)."""
    recv_schema = {"stage": pl.Int32, "start": pl.Int64, "end": pl.Int64, "wait_end": pl.Int64,
                   "from_stage": pl.Int32, "from_who": pl.Int64}
    if ops is None or ops.is_empty():
        return pl.DataFrame(schema=recv_schema), {}, None, None
    stages = stage_of(ops, work)
    passes = work.filter((pl.col("role") == "compute") & pl.col("phase").is_not_null())
    pairs, unpaired = match(ops, stages, passes)
    sums = in_windows(pairs, stages, wins)
    per = {int(s): (int(w), int(t)) for s, w, t in sums.iter_rows()}
    position = {"return_dtype": pl.Int32, "default": None}
    recvs = pairs.select(
        stage=pl.col("recv_who").replace_strict(stages, **position), start="recv_start", end="recv_end",
        wait_end=pl.col("recv_start") + pl.col("wait"),
        from_stage=pl.col("send_who").replace_strict(stages, **position), from_who="send_who",
    ).filter(pl.col("stage").is_not_null() & pl.col("from_stage").is_not_null())
    summary = {"pairs": pairs.height, "wait_ns": int(sums["p2p_wait_ns"].sum()),
               "transfer_ns": int(sums["p2p_transfer_ns"].sum()), "unpaired": unpaired}
    return recvs.cast(recv_schema), per, summary, pairs  # type: ignore[arg-type]
