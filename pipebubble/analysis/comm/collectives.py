"""Collectives matched across ranks: who arrived last, and how long the others spun waiting for it.

Map (one file): every collective call of every participant (a rank; a GPU process where the file names no
ranks): its kind (``all_reduce``, ``all_to_all`` ...), when it arrived (its collective kernel's start; a CPU
collective range's where the participant has no GPU collectives) and when it finished. A kernel's kind is
its launch's outermost communication range (``c10d::alltoall_base_`` around ``nccl:all_to_all`` around
``ncclSend``): NCCL runs all_to_all as ``SendRecv`` kernels, so the kernel name alone would call it
point-to-point. Calls whose outermost range is a send or a receive are point-to-point, not collectives:
they are counted (``p2p_send``, ``p2p_recv``) as evidence of a pipeline, and left out of the matching.

Reduce: calls of one kind on every participant that end together are one collective (``match``; inside
the participants' common profile window). Within a pipeline, only ranks of the same stage are matched (its
data-parallel peers): other stages run their own groups' collectives at other times (a collective over all
stages, such as a global gradient norm, is not matched there). A candidate whose last member arrives after
another member's kernel ended is not one collective (or the ranks' clocks disagree): it is counted
unmatched, never reported. For each call: the last participant's arrival; a participant's wait is
``min(its end, last arrival) − its start`` (its kernel spinning, not working).
"""

from __future__ import annotations

import polars as pl

from pipebubble.analysis.intervals import ENGINE, engine_for, top_level
from pipebubble.analysis.launches import EVENT_KEY, with_launch
from pipebubble.report import THIN_CALLS, CollectiveCall, CollectiveRank, Collectives, Support, Wait
from pipebubble.spans import COMM_NAMES

CALL_COLUMNS = ["who", "rank", "lane", "kind", "seq", "start", "end", "by_name"]


def participant() -> pl.Expr:
    """Who a call belongs to: its rank (≥ 0), or, where the trace names no ranks (an Nsight export without
    them), its process as ``−1 − pid``: never a process id where a rank belongs."""
    return pl.coalesce(pl.col("rank").cast(pl.Int64), -1 - pl.col("pid"))


def rank_of(who: int) -> int | None:
    """The rank of a participant (None: a process)."""
    return who if who >= 0 else None


def pid_of(who: int) -> int | None:
    """The process id of a participant without a rank (None: a rank)."""
    return -1 - who if who < 0 else None

#: (kind, regex) tried in order on a lower-cased range or kernel name; the first match names the kind.
KINDS = (
    ("all_to_all", r"all_?to_?all"),
    ("all_gather", r"all_?gather"),
    ("reduce_scatter", r"reduce_?scatter"),
    ("all_reduce", r"all_?reduce"),
    ("broadcast", r"broadcast"),
    ("barrier", r"barrier"),
    ("dispatch", r"deep_ep.*dispatch|dispatch.*nvshmem"),
    ("combine", r"deep_ep.*combine|combine.*nvshmem"),
    ("send_recv", r"sendrecv"),
    ("send", r"pp:\d+send_|(^|[:_])i?send|ncclsend"),
    ("recv", r"pp:\d+recv_|(^|[:_])i?recv|ncclrecv"),
    ("reduce", r"(^|[:_])reduce|_reduce_"),
    ("gather", r"(^|[:_])gather"),
    ("scatter", r"(^|[:_])scatter"),
)
P2P = ("send", "recv")


def kind_of(name: pl.Expr) -> pl.Expr:
    """The collective kind named by a range or kernel name (null: none)."""
    lower = name.str.to_lowercase()
    expr = pl.lit(None, pl.String)
    for kind, regex in reversed(KINDS):
        expr = pl.when(lower.str.contains(regex)).then(pl.lit(kind)).otherwise(expr)
    return expr


def comm_ranges(spans: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The file's communication ranges, each with its ``kind``: the outermost collective ranges, and the send
    and receive ranges outside every one of them (point-to-point; those inside are a collective's own)."""
    ranges = pl.col("device").is_null() & pl.col("kind").is_in(["annotation", "cpu_op", "comm"])
    kinds = _range_kinds(spans.lazy().filter(ranges))
    named = spans.lazy().filter(ranges & pl.col("name").is_in(kinds["name"].implode())).with_columns(
        kind=pl.col("name").replace_strict(kinds["name"], kinds["kind"], return_dtype=pl.String))
    named = named.collect(engine=ENGINE)
    p2p = pl.col("kind").is_in(P2P)
    groups = top_level(named.filter(~p2p))
    return groups, outside(named.filter(p2p), groups)


def _range_kinds(ranges: pl.LazyFrame) -> pl.DataFrame:
    """name, kind: the distinct names of ``ranges`` that name communication, with their collective kind. The
    regexes run once per name, not once per range."""
    names = ranges.select(pl.col("name").unique()).filter(
        pl.col("name").str.contains(COMM_NAMES) | pl.col("name").str.contains(NCCL_NVTX))
    return names.with_columns(kind=kind_of(pl.col("name"))).filter(pl.col("kind").is_not_null()).collect(
        engine=ENGINE)


def collective_part(spans: pl.DataFrame, ranges: tuple[pl.DataFrame, pl.DataFrame] | None = None,
                    windows: pl.DataFrame | None = None) -> tuple[pl.DataFrame, dict]:
    """Map: one file's collective calls (``CALL_COLUMNS``, plus its ``window`` rows: each participant's first
    and last traced instant, kind null) and facts: point-to-point send/recv counts and ProfilerStep lengths.
    ``ranges``: the file's ``comm_ranges``, when already found; ``windows``: its ``participant_windows``,
    when ``spans`` holds only the communication rows of a bigger table."""
    empty = pl.DataFrame(schema={c: t for c, t in _SCHEMA.items()})
    if spans.is_empty():
        return empty, {"p2p_send": 0, "p2p_recv": 0, "step_ns": []}
    groups, p2p = ranges if ranges is not None else comm_ranges(spans)
    counts = _p2p_counts(p2p)
    ranges = pl.concat([groups, p2p])
    gpu = _gpu_calls(spans, ranges)
    cpu = groups.lazy().with_columns(who=participant()).filter(~pl.col("who").is_in(pl.lit(gpu["who"]).implode()))
    own = ["who", "rank", "lane", "kind", "start", "end", "by_name"]
    calls = pl.concat([gpu.lazy().select(own), cpu.with_columns(by_name=pl.lit(False)).select(own)],
                      how="vertical_relaxed")
    calls = calls.filter(~pl.col("kind").is_in(P2P)).sort("who", "start", "end")
    calls = calls.with_columns(seq=pl.int_range(pl.len(), dtype=pl.Int64).over("who", "kind"))
    windows = participant_windows(spans) if windows is None else windows
    steps = spans["kind"] == "step"
    facts = {
        "p2p_send": int(counts.get("send", 0)),
        "p2p_recv": int(counts.get("recv", 0)),
        "step_ns": (spans["end"].filter(steps) - spans["start"].filter(steps)).to_list(),
    }
    out = pl.concat([calls.select(CALL_COLUMNS), windows.lazy().select(CALL_COLUMNS)], how="vertical_relaxed")
    return out.cast(_SCHEMA).collect(engine=ENGINE), facts  # type: ignore[arg-type]


def participant_windows(spans: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """Each participant's first and last traced instant, as ``window`` rows of a collective part (kind null)."""
    windows = spans.lazy().with_columns(who=participant()).group_by("who").agg(
        rank=pl.col("rank").first(), lane=pl.lit(None, pl.String), start=pl.col("start").min(), end=pl.col("end").max()
    ).with_columns(kind=pl.lit(None, pl.String), seq=pl.lit(None, pl.Int64), by_name=pl.lit(None, pl.Boolean))
    return windows.collect(engine=engine_for(spans))


_SCHEMA = {"who": pl.Int64, "rank": pl.Int32, "lane": pl.String, "kind": pl.String, "seq": pl.Int64,
           "start": pl.Int64, "end": pl.Int64, "by_name": pl.Boolean}
NCCL_NVTX = r"^nccl[A-Z]"  # NCCL's own NVTX ranges (ncclSend, ncclAllReduce) as Nsight records them


def _p2p_counts(p2p: pl.DataFrame) -> dict[str, int]:
    """Sends and receives per kind: on each thread, the count of the name seen most often (one send is a
    ``c10d::send`` and the ``gloo:send`` it opens, which may outlast it: asynchronous, so not nested)."""
    if p2p.is_empty():
        return {}
    per_name = p2p.lazy().group_by("lane", "kind", "name").len()
    per_lane = per_name.group_by("lane", "kind").agg(pl.col("len").max())
    return dict(per_lane.group_by("kind").agg(pl.col("len").sum()).collect(engine=ENGINE).iter_rows())


def outside(inner: pl.DataFrame, outer: pl.DataFrame) -> pl.DataFrame:
    """The spans of ``inner`` that start outside every span of ``outer`` (disjoint, per lane)."""
    if inner.is_empty() or outer.is_empty():
        return inner
    marks = outer.lazy().select("lane", at="start", outer_end="end").sort("lane", "at")
    probe = inner.lazy().with_columns(at=pl.col("start")).sort("lane", "at")
    hit = probe.join_asof(marks, on="at", by="lane", strategy="backward", check_sortedness=False)
    found = hit.filter(pl.col("outer_end").is_null() | (pl.col("at") >= pl.col("outer_end"))).select(inner.columns)
    return found.collect(engine=ENGINE)


def _gpu_calls(spans: pl.DataFrame, ranges: pl.DataFrame) -> pl.DataFrame:
    """Collective kernels, each of the kind of its launch's outermost communication range (its own name's
    kind where the launch is not inside one). A kernel whose launch is not in the trace (a window opened
    mid-call) takes the kind of the next kernel of its name on its stream: NCCL's all_to_all runs as
    ``SendRecv`` kernels, and the cut call is still the all_to_all its successors are."""
    kernels = spans.lazy().filter((pl.col("kind") == "comm") & pl.col("device").is_not_null())
    if not ((spans["kind"] == "comm") & spans["device"].is_not_null()).any():
        return kernels.select(who=pl.lit(None, pl.Int64), rank="rank", lane="lane", kind=pl.lit(None, pl.String),
                              start="start", end="end", by_name=pl.lit(None, pl.Boolean)).collect(engine=ENGINE)
    joined = with_launch(kernels, spans.lazy(), key=EVENT_KEY)
    marks = ranges.lazy().select(at_lane="lane", at="start", range_end="end", range_kind="kind").sort("at_lane", "at")
    joined = joined.sort("at_lane", "at").join_asof(
        marks, on="at", by="at_lane", strategy="backward", check_sortedness=False
    )
    inside = pl.col("at") < pl.col("range_end")
    ranged = pl.when(inside & pl.col("range_kind").is_not_null()).then("range_kind")
    joined = joined.sort("lane", "start").with_columns(ranged=ranged).with_columns(
        ranged=pl.when(pl.col("at").is_null()).then(pl.col("ranged").backward_fill().over("lane", "name"))
        .otherwise("ranged")
    )
    kind = pl.coalesce("ranged", kind_of(pl.col("name")))
    return joined.with_columns(who=participant(), kind=kind.fill_null("collective"),
                               by_name=pl.col("ranged").is_null()).sort("who", "start").collect(engine=ENGINE)


#: Members' kernels of one collective end together (the last arrival releases them all); they are matched
#: when their ends lie within this much (plus 1% of the call's length) of each other.
END_TOLERANCE_NS = 1_000_000
#: Why a participant's call is in no matched collective (``Collectives.left_out``).
LEFT_OUT = {
    "outside_window": "a member's trace cannot hold it (it ended before that trace began or began after it ended)",
    "no_peer": "no member of its group is in these traces",
    "unmatched": "no call of some member ends with it",
    "not_together": "the last member arrived after another had finished (not one collective, or clocks disagree)",
}


def match(calls: pl.DataFrame, group_of: dict[int, int] | None = None) -> tuple[pl.DataFrame, dict[str, int]]:
    """Reduce, first half: the calls of every file as matched collectives, one row per (call, participant):
    ``group``, ``kind``, ``seq`` (the participant's own number for the call, from its first call in its trace),
    ``who``, ``rank``, ``lane``, ``start``, ``end``, ``last`` (the call's last arrival), ``last_who``, ``wait``
    (ns spun before it); and how many participants' calls are in no matched call, by reason (``LEFT_OUT``):
    matched rows and those counts account for every call of every participant. ``group_of`` (participant ->
    group) keeps matching inside groups (a pipeline's stages).

    Matching is by end, whatever each participant's profile window: in each group and kind, the participant
    with the most calls is the reference; each of its calls takes, from every peer, the call of that kind
    ending nearest to it, if it ends within ``END_TOLERANCE_NS`` (+1%). Order alone would pair the wrong calls
    wherever one trace lacks a call (a sampled or filtered trace, a window opening mid-step); a window filter
    would drop the calls a late participant is latest at, the ones its peers spun longest in."""
    windows = calls.filter(pl.col("kind").is_null())
    real = calls.filter(pl.col("kind").is_not_null())
    group = pl.col("who").replace_strict(group_of, default=None, return_dtype=pl.Int64) if group_of else pl.lit(0)
    real = real.with_columns(group=group.cast(pl.Int64)).with_row_index("row")
    windows = windows.with_columns(group=group.cast(pl.Int64)).filter(pl.col("group").is_not_null())
    common = windows.group_by("group").agg(lo=pl.col("start").max(), hi=pl.col("end").min(), members=pl.len())
    real = real.join(common, on="group", how="left").with_columns(pl.col("members").fill_null(1))
    real = _kinds_by_peers(real)
    alone = real.filter(pl.col("members") <= 1)
    real = real.filter(pl.col("members") > 1)
    if real.is_empty():
        return _MATCHED.clear(), _reasons(real, alone, real["row"])
    counts = real.group_by("group", "kind", "who").len()
    ref = counts.sort("len", "who", descending=[True, False]).group_by("group", "kind", maintain_order=True).first()
    refs = real.join(ref.select("group", "kind", ref="who"), on=["group", "kind"])
    refs = refs.filter(pl.col("who") == pl.col("ref"))
    refs = refs.sort("end").with_columns(call=pl.int_range(pl.len()).over("group", "kind"))
    probe = refs.select("group", "kind", "call", "members", a_end="end", a_len=pl.col("end") - pl.col("start"))
    probe = probe.join(real.select("group", "who").unique(), on="group").sort("a_end")
    candidates = real.select("group", "kind", "who", "row", c_end="end").sort("c_end")
    hit = probe.join_asof(candidates, left_on="a_end", right_on="c_end", by=["group", "kind", "who"],
                          strategy="nearest", check_sortedness=False)
    off = (pl.col("c_end") - pl.col("a_end")).abs()
    hit = hit.filter(off <= END_TOLERANCE_NS + pl.col("a_len") // 100).with_columns(off=off)
    hit = hit.sort("off").unique("row", keep="first")  # a call nearest to two reference calls joins the nearer
    per = ["group", "kind", "call"]
    rows = hit.select(*per, "members", "row").join(real.drop("group", "kind", "members"), on="row")
    complete = rows.filter(pl.len().over(per) == pl.col("members"))
    together = pl.col("start").max().over(per) <= pl.col("end").min().over(per)
    matched = complete.filter(together)
    # The last to arrive: the latest start (the lowest participant among equal starts).
    last_who = pl.col("who").sort_by("start", "who", descending=[True, False]).first().over(per)
    matched = matched.with_columns(last=pl.col("start").max().over(per), last_who=last_who).with_columns(
        wait=(pl.min_horizontal("end", "last") - pl.col("start")).clip(lower_bound=0)
    )
    left = _reasons(real, alone, matched["row"], complete["row"])
    return matched.select(_MATCHED.columns).cast(_MATCHED.schema), left  # type: ignore[arg-type]


def _kinds_by_peers(real: pl.DataFrame) -> pl.DataFrame:
    """A kernel whose kind only its own name gave (its launch and ranges are not in the trace, and no later
    kernel of its name on its stream says more: a window cut mid-call) takes the kind of the peers' call
    ending nearest to it, within the matching tolerance: NCCL runs all_reduce and all_to_all alike as
    ``SendRecv`` kernels, and its peers' traces know which call it was."""
    if "by_name" not in real.columns or not real["by_name"].fill_null(False).any():
        return real
    known = real.filter(~pl.col("by_name").fill_null(False)).select(
        "group", k_who="who", k_kind="kind", k_end="end").sort("k_end")
    if known.is_empty():
        return real
    guess = real.filter(pl.col("by_name").fill_null(False)).select("row", "group", "who", "start", "end").sort("end")
    near = guess.join_asof(known, left_on="end", right_on="k_end", by="group", strategy="nearest",
                           check_sortedness=False)
    ok = (pl.col("k_end") - pl.col("end")).abs() <= END_TOLERANCE_NS + (pl.col("end") - pl.col("start")) // 100
    found = dict(near.filter(ok & (pl.col("k_who") != pl.col("who"))).select("row", "k_kind").iter_rows())
    if not found:
        return real
    return real.with_columns(kind=pl.col("row").replace_strict(found, default=pl.col("kind"), return_dtype=pl.String))


def _reasons(real: pl.DataFrame, alone: pl.DataFrame, matched: pl.Series,
             complete: pl.Series | None = None) -> dict[str, int]:
    """Why each call of ``real`` not in ``matched`` was left out (``LEFT_OUT``), counted; ``alone``'s calls
    have no peer in the traces."""
    rest = real.filter(~pl.col("row").is_in(matched.implode()))
    outside = (pl.col("end") < pl.col("lo")) | (pl.col("start") > pl.col("hi"))
    in_complete = pl.col("row").is_in(complete.implode()) if complete is not None else pl.lit(False)
    reason = pl.when(outside).then(pl.lit("outside_window")).when(in_complete).then(pl.lit("not_together")).otherwise(
        pl.lit("unmatched"))
    counts = dict(rest.select(reason=reason).group_by("reason").len().iter_rows()) if rest.height else {}
    if alone.height:
        counts["no_peer"] = alone.height
    return {k: int(counts[k]) for k in LEFT_OUT if counts.get(k)}


_MATCHED = pl.DataFrame(schema={"group": pl.Int64, "kind": pl.String, "call": pl.Int64, "seq": pl.Int64,
                                "who": pl.Int64, "rank": pl.Int32, "lane": pl.String, "start": pl.Int64,
                                "end": pl.Int64, "last": pl.Int64, "last_who": pl.Int64, "wait": pl.Int64})

def summarize(matched: pl.DataFrame, left_out: dict[str, int] | None = None, worst: int = 10,
              world: int | None = None) -> Collectives | None:
    """Per-participant wait and lateness, the worst calls, the straggler and how strong the evidence is, over
    the matched calls. ``world``: the job's ranks, when the traces hold only some of them."""
    if matched.is_empty():
        return None
    left_out = left_out or {}
    per = ["group", "kind", "call"]
    calls = matched.group_by(per).agg(
        start=pl.col("start").min(),
        skew=pl.col("last").first() - pl.col("start").min(),
        last_who=pl.col("last_who").first(),
        seq=pl.col("seq").filter(pl.col("who") == pl.col("last_who")).first(),
        waited=pl.col("wait").sum(),
        n=pl.len(),
    )
    late = calls.filter(pl.col("skew") > 0).group_by("last_who").agg(late=pl.col("waited").sum(), last=pl.len())
    ranks = (
        matched.group_by("who")
        .agg(lane=pl.col("lane").drop_nulls().first(), calls=pl.len(), wait=pl.col("wait").sum())
        .join(late, left_on="who", right_on="last_who", how="left")
        .with_columns(pl.col("late", "last").fill_null(0))
        .sort(pl.col("who") < 0, pl.col("who").abs())
    )
    rows = [
        CollectiveRank(rank_of(r["who"]), r["calls"], r["wait"], r["late"], r["last"], r["lane"], pid_of(r["who"]))
        for r in ranks.iter_rows(named=True)
    ]
    top = calls.sort("waited", "start", descending=[True, False]).head(worst)
    worst_calls = [
        CollectiveCall(r["kind"], r["seq"], r["start"], r["skew"], rank_of(r["last_who"]), r["waited"], r["n"],
                       pid_of(r["last_who"]))
        for r in top.iter_rows(named=True)
    ]
    total = int(matched["wait"].sum())
    leader = max(range(len(rows)), key=lambda k: (rows[k].late_ns, -k))
    is_straggler = total and rows[leader].late_ns * 2 >= total
    support = Support(calls.height, len(rows), world if world and world > len(rows) else None,
                      rows[leader].last if is_straggler else None)
    left = sum(left_out.values())
    return Collectives(
        calls.height, rows, worst_calls, rows[leader].rank if is_straggler else None, total, "end", left,
        straggler_pid=rows[leader].pid if is_straggler else None, left_out=left_out,
        participant_calls=matched.height + left, support=support,
    )


def straggler_note(collectives: Collectives) -> str | None:
    """The headline about the rank (or process) the others waited for, when one stands out: how often it came
    last, its peers' spin at those calls in all (summed over peers and calls: not the step time a fix gives
    back, which its finding says), and how many calls and ranks say so."""
    if collectives.straggler is None and collectives.straggler_pid is None:
        return None
    row = next(r for r in collectives.ranks
               if (r.rank, r.pid) == (collectives.straggler, collectives.straggler_pid))
    who = f"rank {row.rank}" if row.rank is not None else f"process {row.pid} ({row.lane})"
    return (
        f"{who} arrived last at {row.last} of {collectives.calls} collectives; "
        f"others waited {row.late_ns / 1e6:,.1f} ms in all at those calls, summed over peers and calls"
        + support_words(collectives)
    )


def support_words(collectives: Collectives) -> str:
    """What makes a claim across ranks thin (``thin_reasons``), as a clause; empty when nothing does."""
    thin = thin_reasons(collectives)
    return f" (thin evidence: {', '.join(thin)})" if thin else ""


def thin_reasons(collectives: Collectives) -> list[str]:
    """What makes a claim across ranks thin: fewer than ``THIN_CALLS`` calls, some ranks of a bigger job."""
    s = collectives.support
    if s is None:
        return []
    return ([f"only {s.calls} call{'s' * (s.calls != 1)}"] if s.calls < THIN_CALLS else []) + (
        [f"{s.ranks:,} of {s.world:,} ranks traced"] if s.world is not None else [])


def waits(
    matched: pl.DataFrame, threshold_ns: float, stage_of: dict[int, int] | None = None, limit: int | None = None
) -> tuple[list[Wait], int]:
    """Every participant's spin at a matched collective longer than ``threshold_ns``, as a ``collective``
    wait naming the rank (or process) that arrived last: the ``limit`` longest, and how many there are in all."""
    if matched.is_empty():
        return [], 0
    good = matched.filter((pl.col("wait") > 0) & (pl.col("wait") > threshold_ns))
    total = good.height
    good = good.sort("wait", "start", "who", descending=[True, False, False])
    good = good.head(limit) if limit is not None else good
    out = [
        Wait(
            stage=(stage_of or {}).get(r["who"]),
            start_ns=r["start"],
            dur_ns=r["wait"],
            cause="collective",
            before=None,
            after=f"{r['kind']} #{r['seq']}",
            lane=r["lane"],
            rank=rank_of(r["who"]),
            waited_for=rank_of(r["last_who"]),
            pid=pid_of(r["who"]),
            waited_for_pid=pid_of(r["last_who"]),
        )
        for r in good.iter_rows(named=True)
    ]
    return out, total
