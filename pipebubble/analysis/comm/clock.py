"""One clock for the job: each trace file's clock offset, estimated from the job itself.

Each host stamps its own trace (Kineto makes times absolute with the host's ``baseTimeNanoseconds``), and two
hosts agree only as well as NTP or PTP keeps them: milliseconds apart is common. Ranks of one file share its
clock, so the unknown is one offset per file (``o_f``: its recorded times are the true ones plus ``o_f``).
The job itself measures them, strongest evidence first:

- **collectives**: the members' kernels of one collective end together (the last arrival releases them all), so
  for two files the median over their common calls of (end in f − end in the reference) is ``o_f − o_ref``.
  Calls are paired without trusting the clocks: every pairing within ``MAX_OFFSET_NS`` votes for its difference
  and the difference most calls agree on wins (the nearest to 0 among equals);
- **send/recv**: a send's kernel and its recv's end together: the median of (recv end − send end);
- **passes**: a pass starts after the pass it depends on ended (forward of a micro-batch on stage s after stage
  s−1's, backward on s−1 after s's). These bound ``o_s − o_{s−1}`` from both sides; recorded clocks that satisfy
  the bounds are kept (nothing says otherwise), else the nearest bound is taken: the least change that makes
  every dependency hold. (The middle of the bounds assumes forward and backward gaps alike; in a pipeline the
  forward side is tight, the next stage waiting for its activation, and the backward side can be loose by ms.)

Offsets are solved over a spanning forest of the strongest edges, each tree on the clock most of its files share
(those get 0). An edge that disagrees with the tree by more than its noise, or whose own difference moves
over the trace (drift), is reported, and the files it touches keep their recorded clocks: one offset per file
cannot explain them, and a guess would move every number that crosses ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import polars as pl

#: Largest clock offset searched for (NTP keeps hosts within ~10 ms; a badly kept one drifts further).
MAX_OFFSET_NS = 100_000_000
#: Width of the voting bins: the ends of one collective agree within microseconds to a few hundred (a ring's last step).
BIN_NS = 250_000
#: Reference calls per file pair (spread over the trace) used to vote: enough to find the offset.
VOTERS = 64
#: Offsets this small are the spread of collective releases, not a clock: reported and applied as 0.
NOISE_NS = 20_000
#: An offset above this is worth a line of text.
NOTE_NS = 50_000
#: Evidence kinds, strongest first.
EVIDENCE = ("collectives", "send_recv", "passes")


@dataclass(frozen=True)
class Edge:
    """``o_b − o_a`` = ``offset`` (or, for passes, within [``low``, ``high``]) by ``support`` calls, pairs or
    passes; ``residual`` is the median distance of the single differences from it; ``drift`` how much the
    difference moved from the first half of the trace to the second."""

    a: int
    b: int
    offset: int
    support: int
    evidence: str
    residual: int = 0
    drift: int = 0
    low: int | None = None
    high: int | None = None


@dataclass(frozen=True)
class FileClock:
    """One file's offset from the job's clock: subtract ``offset`` from its times (0 where it is not aligned)."""

    offset: int = 0
    residual: int | None = None
    evidence: str | None = None
    support: int = 0
    problem: str | None = None


def collective_edges(calls: pl.DataFrame) -> list[Edge]:
    """Edges from collective ends: ``calls`` has ``file``, ``group``, ``kind``, ``end`` (one row per call of a
    participant). In each group, every file against the file with the most calls there."""
    # A kernel whose kind only its name gave (no launch, no range: a cut call, or a trace without ranges)
    # could be any call: it does not vote, or dense unnamed kernels would outvote chance.
    by_name = pl.col("by_name").fill_null(False) if "by_name" in calls.columns else pl.lit(False)
    calls = calls.filter(~by_name).select("file", "group", "kind", "end").drop_nulls()
    if calls.is_empty() or calls["file"].n_unique() < 2:
        return []
    counts = calls.group_by("group", "file").len().sort("len", "file", descending=[True, False])
    ref = counts.group_by("group", maintain_order=True).first().select("group", ref="file")
    calls = calls.join(ref, on="group")
    mine = calls.filter(pl.col("file") == pl.col("ref"))
    others = calls.filter(pl.col("file") != pl.col("ref"))
    if others.is_empty():
        return []
    voters = _spread(mine.sort("end").with_row_index("call"))
    pairs = _candidates(voters, others)
    if pairs.is_empty():
        return []
    return _edges_from_differences(_chosen(pairs), "collectives")


def _spread(calls: pl.DataFrame) -> pl.DataFrame:
    """At most ``VOTERS`` calls per group, evenly spread over the trace."""
    n = pl.len().over("group")
    stride = ((n + VOTERS - 1) // VOTERS).clip(lower_bound=1)
    return calls.filter((pl.int_range(pl.len()).over("group") % stride) == 0)


def _candidates(voters: pl.DataFrame, others: pl.DataFrame) -> pl.DataFrame:
    """Every (reference call, other file's call of its kind) within ``MAX_OFFSET_NS`` of each other: ``d`` =
    other end − reference end. Joined on buckets of ``MAX_OFFSET_NS`` (the reference's and its two neighbours)."""
    bucket = pl.col("end") // MAX_OFFSET_NS
    left = voters.select("group", "kind", "ref", "call", ref_end="end", bucket=bucket + pl.lit([-1, 0, 1])).explode(
        "bucket"
    )
    right = others.select("group", "kind", "file", "end", bucket=bucket)
    pairs = left.join(right, on=["group", "kind", "bucket"]).with_columns(d=pl.col("end") - pl.col("ref_end"))
    return pairs.filter(pl.col("d").abs() <= MAX_OFFSET_NS).select("group", "ref", "file", "call", "ref_end", "d")


def _chosen(pairs: pl.DataFrame) -> pl.DataFrame:
    """Per (reference, file): the difference most reference calls vote for (bins of ``BIN_NS`` on two grids half
    a bin apart; the nearest to 0 among equals), then each call's difference nearest to it within a bin."""
    key = ["ref", "file"]
    best = []
    for shift in (0, BIN_NS // 2):
        binned = pairs.with_columns(bin=(pl.col("d") + shift) // BIN_NS)
        votes = binned.group_by(*key, "bin").agg(votes=pl.col("call").n_unique())
        best.append(votes.with_columns(centre=pl.col("bin") * BIN_NS + BIN_NS // 2 - shift))
    votes = pl.concat(best).sort(
        [*key, "votes", pl.col("centre").abs(), "centre"], descending=[False, False, True, False, False]
    )
    winner = votes.group_by(key, maintain_order=True).first().select(*key, "centre")
    near = pairs.join(winner, on=key).with_columns(off=(pl.col("d") - pl.col("centre")).abs())
    near = near.filter(pl.col("off") <= BIN_NS).sort("off", "d", "call").unique([*key, "call"], keep="first",
                                                                                 maintain_order=True)
    return near.select(a="ref", b="file", at="ref_end", d="d")


def _edges_from_differences(rows: pl.DataFrame, evidence: str) -> list[Edge]:
    """One edge per (a, b) from its single differences ``d`` (at time ``at``): their median, the median distance
    from it, and the drift (second half's median − first half's)."""
    rows = rows.sort("at").with_columns(
        half=pl.int_range(pl.len()).over("a", "b") * 2 >= pl.len().over("a", "b")
    )
    per = rows.group_by("a", "b").agg(
        offset=pl.col("d").median(),
        support=pl.len(),
        first=pl.col("d").filter(~pl.col("half")).median(),
        second=pl.col("d").filter(pl.col("half")).median(),
        d=pl.col("d"),
    )
    per = per.with_columns(
        residual=(pl.col("d").list.eval((pl.element() - pl.element().median()).abs().median()).list.first()),
        drift=(pl.col("second") - pl.col("first")).fill_null(0),
    ).sort("a", "b")
    return [
        Edge(r["a"], r["b"], round(r["offset"]), r["support"], evidence, round(r["residual"] or 0), round(r["drift"]))
        for r in per.iter_rows(named=True)
    ]


def send_recv_edges(pairs: pl.DataFrame) -> list[Edge]:
    """Edges from sends paired with their recvs: ``pairs`` has ``send_file``, ``recv_file``, ``send_end``,
    ``recv_end``. A pair ends together: ``o_recv − o_send`` = recv end − send end."""
    if pairs.is_empty():
        return []
    rows = pairs.filter(pl.col("send_file") != pl.col("recv_file")).select(
        a="send_file", b="recv_file", at="send_end", d=pl.col("recv_end") - pl.col("send_end")
    ).drop_nulls()
    return _edges_from_differences(rows, "send_recv") if rows.height else []


def pass_edges(passes: pl.DataFrame) -> list[Edge]:
    """Edges from pass order: ``passes`` has ``file``, ``stage``, ``phase`` (forward/backward), ``step``,
    ``microbatch``, ``start``, ``end`` (one row per pass: its compute's first start and last end). Forward of a
    micro-batch on stage s starts after s−1's ended: ``o_s − o_{s−1} ≤ start_s − end_{s−1}``; backward on s−1
    after s's: ``o_s − o_{s−1} ≥ end_s − start_{s−1}``. With ``replica`` (a DP × PP job), within each replica."""
    if passes.is_empty():
        return []
    key = ["step", "microbatch", "phase", *(["replica"] if "replica" in passes.columns else [])]
    this = passes.select(*key, "stage", "file", "start", "end")
    prev = this.select(*key, stage=pl.col("stage") + 1, p_file="file", p_start="start", p_end="end")
    both = this.join(prev, on=[*key, "stage"]).filter(pl.col("file") != pl.col("p_file"))
    forward = both.filter(pl.col("phase") == "forward").group_by("p_file", "file").agg(
        high=(pl.col("start") - pl.col("p_end")).min(), nf=pl.len()
    )
    backward = both.filter(pl.col("phase") == "backward").group_by("p_file", "file").agg(
        low=(pl.col("end") - pl.col("p_start")).max(), nb=pl.len()
    )
    bounds = forward.join(backward, on=["p_file", "file"], how="full", coalesce=True).sort("p_file", "file")
    edges = []
    for r in bounds.iter_rows(named=True):
        low, high = r["low"], r["high"]
        if low is None or high is None:
            continue  # one side alone bounds nothing
        offset = min(max(0, low), high)  # the least change to the recorded clocks that respects every bound
        support = (r["nf"] or 0) + (r["nb"] or 0)
        edges.append(Edge(r["p_file"], r["file"], offset, support, "passes", low=low, high=high))
    return edges


def solve(edges: list[Edge], files: int, names: list[str] | None = None) -> tuple[list[FileClock], list[str]]:
    """Every file's offset from the edges (a spanning forest, strongest edges first), each tree on the clock
    most of its files share; and the problems found (drift, contradictions), each a sentence naming the files
    (``names``, by default their numbers)."""
    names = names or [f"file {f}" for f in range(files)]
    problems: list[str] = []
    usable = []
    for e in edges:
        if e.evidence != "passes" and abs(e.drift) > max(NOTE_NS, 4 * e.residual):
            problems.append(f"{names[e.a]} and {names[e.b]}: the {e.evidence} offset moves by {e.drift / 1e3:,.0f} µs "
                            "over the trace (clock drift)")
            continue
        if e.low is not None and e.high is not None and e.low > e.high:
            problems.append(f"{names[e.a]} and {names[e.b]}: passes contradict every single offset "
                            f"(bounds {e.low / 1e3:,.0f} > {e.high / 1e3:,.0f} µs)")
            continue
        usable.append(e)
    usable.sort(key=lambda e: (EVIDENCE.index(e.evidence), -e.support, e.a, e.b))
    parent = list(range(files))

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    tree, rest = [], []
    for e in usable:
        ra, rb = root(e.a), root(e.b)
        if ra == rb:
            rest.append(e)
        else:
            parent[rb] = ra
            tree.append(e)
    offsets, via = _walk(tree, files)
    bad = set()
    for e in rest:
        if e.a in offsets and e.b in offsets and not _agrees(e, offsets[e.b] - offsets[e.a]):
            problems.append(f"{names[e.a]} and {names[e.b]}: {e.evidence} give {e.offset / 1e3:,.0f} µs, "
                            "the other evidence "
                            f"{(offsets[e.b] - offsets[e.a]) / 1e3:,.0f} µs")
            bad.add(root(e.a))
    clocks = _anchor(offsets, via, files, root)
    clocks = [FileClock(problem="contradiction") if root(f) in bad else c for f, c in enumerate(clocks)]
    return clocks, problems


def _agrees(e: Edge, found: int) -> bool:
    if e.low is not None and e.high is not None:
        return e.low - NOISE_NS <= found <= e.high + NOISE_NS
    return abs(found - e.offset) <= max(4 * NOISE_NS, 4 * e.residual)


def _walk(tree: list[Edge], files: int) -> tuple[dict[int, int], dict[int, Edge]]:
    """Offsets relative to each tree's lowest file, and the edge each file was reached by."""
    links: dict[int, list[tuple[int, int, Edge]]] = {}
    for e in tree:
        links.setdefault(e.a, []).append((e.b, e.offset, e))
        links.setdefault(e.b, []).append((e.a, -e.offset, e))
    offsets: dict[int, int] = {}
    via: dict[int, Edge] = {}
    for start in range(files):
        if start in offsets or start not in links:
            continue
        offsets[start] = 0
        todo = [start]
        while todo:
            node = todo.pop()
            for other, d, e in links.get(node, []):
                if other not in offsets:
                    offsets[other] = offsets[node] + d
                    via[other] = e
                    todo.append(other)
    return offsets, via


def _anchor(offsets: dict[int, int], via: dict[int, Edge], files: int, root) -> list[FileClock]:
    """Each tree put on the clock most of its files share (within ``NOISE_NS``; the lowest file's among
    equals). An offset within the noise of what measured it (``NOISE_NS``, or three standard errors of its
    edge's median) is no evidence of another clock: 0."""
    trees: dict[int, list[int]] = {}
    for f in sorted(offsets):
        trees.setdefault(root(f), []).append(f)
    out = [FileClock() for _ in range(files)]
    for members in trees.values():
        best, count = offsets[members[0]], 0
        for f in members:
            n = sum(1 for g in members if abs(offsets[g] - offsets[f]) <= NOISE_NS)
            if n > count:
                best, count = offsets[f], n
        shared = sorted(offsets[f] for f in members if abs(offsets[f] - best) <= NOISE_NS)
        centre = shared[len(shared) // 2]
        for f in members:
            e = via.get(f) or next((x for x in via.values() if x.a == f), None)
            value = offsets[f] - centre
            if abs(value) <= _noise(e):
                value = 0
            residual = e.residual if e is not None and e.evidence != "passes" else None
            out[f] = FileClock(value, residual, e.evidence if e else None, e.support if e else 0)
    return out


def _noise(edge: Edge | None) -> float:
    if edge is None:
        return NOISE_NS
    return max(NOISE_NS, 3 * edge.residual / max(edge.support, 1) ** 0.5)


def estimate(stages: list, comms: list, names: list[str] | None = None, gpu_lanes: list[str] | None = None
             ) -> tuple[list[FileClock], list[str]]:
    """Every file's offset from the job's parts: ``stages[f]`` and ``comms[f]`` are file f's ``StagePart`` and
    ``CommPart`` (or None); ``gpu_lanes`` the job's GPU lanes (sends and receives on them are kernels, which
    end together; a CPU send returns when it is queued)."""
    from pipebubble.analysis.job import stage_groups
    from pipebubble.analysis.pipeline.report import combine, tagged

    files = len(comms)
    frames = [tagged(c.calls, "file", f) for f, c in enumerate(comms) if c is not None]
    calls = pl.concat(frames, how="vertical_relaxed") if frames else pl.DataFrame()
    parts = [replace(s, work=tagged(s.work, "file", f)) for f, s in enumerate(stages)
             if s is not None and not s.facts.get("no_evidence") and s.work.height]
    edges: list[Edge] = []
    if calls.height:
        calls = calls.filter(pl.col("kind").is_not_null())
        group_of = stage_groups(parts, calls)
        group = pl.col("who").replace_strict(group_of, default=None, return_dtype=pl.Int64) if group_of else pl.lit(0)
        edges += collective_edges(calls.with_columns(group=group).filter(pl.col("group").is_not_null()))
    if len(parts) >= 2:
        _, work, _, facts = combine(parts)
        edges += send_recv_edges(_kernel_pairs(comms, work, gpu_lanes or []))
        if work.height and not facts["inferred"]:
            edges += pass_edges(_passes(work, facts["pattern"]))
    return solve(edges, files, names)


def _kernel_pairs(comms: list, work: pl.DataFrame, gpu_lanes: list[str]) -> pl.DataFrame:
    """Sends paired with their recvs (``p2p.pair``, by order: no clock needed) where both are GPU kernels, with
    the files that hold them (``send_file``, ``recv_file``, ``send_end``, ``recv_end``)."""
    from pipebubble.analysis.comm import p2p
    from pipebubble.analysis.pipeline.report import tagged

    frames = [tagged(c.p2p, "file", f) for f, c in enumerate(comms)
              if c is not None and c.p2p.height]
    ops = pl.concat(frames, how="vertical_relaxed").filter(pl.col("lane").is_in(gpu_lanes)) if frames else None
    if ops is None or ops.is_empty() or not work.height:
        return pl.DataFrame()
    file_of = dict(ops.select("who", "file").unique("who").iter_rows())

    def file(who: str) -> pl.Expr:
        return pl.col(who).replace_strict(file_of, default=None, return_dtype=pl.Int64)

    passes = work.filter((pl.col("role") == "compute") & pl.col("phase").is_not_null())
    pairs = p2p.pair(ops.drop("file"), p2p.stage_of(ops, work), passes)
    return pairs.select(send_file=file("send_who"), recv_file=file("recv_who"), send_end="send_end",
                        recv_end="recv_end")


def _passes(work: pl.DataFrame, pattern: str | None) -> pl.DataFrame:
    """One row per labelled forward or backward pass: its compute's first start and last end, ``stage`` the
    place in the chain activations follow (torch pipelining's stage id, which interleaving gives each chunk;
    else the stage, where passes carry no chunk)."""
    labelled = work.filter(
        (pl.col("role") == "compute") & pl.col("phase").is_in(["forward", "backward"])
        & pl.col("microbatch").is_not_null()
    )
    if pattern == "torch_pipelining":
        labelled = labelled.filter(pl.col("chunk").is_not_null()).with_columns(stage=pl.col("chunk"))
    else:
        labelled = labelled.filter(pl.col("chunk").is_null())
    return labelled.group_by("file", "replica", "stage", "phase", pl.col("step").fill_null(0), "microbatch").agg(
        start=pl.col("start").min(), end=pl.col("end").max()
    )
