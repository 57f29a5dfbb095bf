"""Reduce: the critical path of each step across ranks, from every file's ``CriticalPart`` on the job's clock,
the matched collectives (``collectives.match``) and the send/recv pairs (``p2p.match``).

Each run's start was released by one of: the stream's previous run (stream order), its launch (the host
launched it after the stream went idle), another stream's run of its GPU that ended after both (an event
wait; only when it ended more than ``part.MERGE_GAP_NS`` later), and for a collective kernel the last
arrival on another rank (``last``), for a receive its send's start. The latest of them binds, as in any
longest-path walk. Walking back from the step's end: a run's time is its class's; at its start the path
follows what released it (the gap between is ``waiting``; a launch's latency is ``host``); a collective
kernel whose last member arrived from another rank is communication from that arrival on, and the path
jumps to the last member's kernel there (its own spin before is not on the path).

On a host thread the path is ``host`` back through the thread's busy stretches (``part.THREAD_SCHEMA``) and
the pauses between them, until one of:

- a call that blocked on the GPU (a synchronize, a blocking copy, the allocator) returned: ``waiting`` from
  the run that released it to its return, then on that run;
- the thread was idle while another thread of its process launched GPU work (the autograd engine's thread
  running the backward the main thread waits for, a communication thread): ``waiting`` from the end of that
  thread's last launching stretch before (or now, where it is still busy) to now, then on that thread.

Each move ends where the next begins, so the segments tile the step: their lengths add up to its duration.

A step is the job's step N as the GPU lives it (``part``: the host's range extended to the end of the GPU
work launched inside it): from the first participant's start of it to the last one's end, the walk starting
where the one that ended last was at that end: on the GPU run it was running when its step ended on the GPU
(after its host range), else on the thread that ran the range. A job without steps is one step: from its
first GPU work to its last, the walk starting at the run that ended last.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

import polars as pl

from pipebubble.analysis.comm.collectives import pid_of, rank_of
from pipebubble.analysis.critical.part import MERGE_GAP_NS, CriticalPart
from pipebubble.analysis.pipeline.report import stacked
from pipebubble.report.critical import CriticalPath, PathSegment, PathShare

KINDS = ("compute", "memory", "comm", "host", "waiting")
#: Segments a step keeps (the longest, in time order); its composition counts every one.
MAX_SEGMENTS = 500


def critical_paths(parts: list[CriticalPart], matched: pl.DataFrame | None,
                   pairs: pl.DataFrame | None) -> list[CriticalPath]:
    """Reduce: every step's critical path (module docstring), in step order; none without GPU work.
    ``parts``: each file's part, shifted onto the job's clock; ``matched``: ``collectives.match``'s rows;
    ``pairs``: ``p2p.match``'s (None: the job has none)."""
    nodes, blocks, steps, threads = _joined(parts) if parts else (pl.DataFrame(), None, None, None)
    if nodes.is_empty():
        return []
    graph = _Graph(_released(nodes, matched, pairs), blocks, threads)
    return [_path(graph, *window) for window in _windows(nodes, steps)]


def median_path(paths: list[CriticalPath]) -> CriticalPath | None:
    """The step of median length (the lower middle one of an even count)."""
    ordered = sorted(paths, key=lambda p: (p.length_ns, p.step if p.step is not None else -1))
    return ordered[(len(ordered) - 1) // 2] if ordered else None


def _joined(parts: list[CriticalPart]) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Every file's nodes, blocks, steps and threads, nodes numbered 0, 1, ... across files (a batch's part
    split by participant keeps its batch's numbers: each part's are moved past the highest before)."""
    offsets, offset = [], 0
    for part in parts:
        offsets.append(offset)
        offset += int(part.nodes["node"].max() or 0) + 1 if part.nodes.height else 0
    nodes = _moved([p.nodes for p in parts], offsets, "node").sort("node")
    blocks = _moved([p.blocks for p in parts], offsets, "release")
    dense = {"old": nodes["node"], "new": pl.int_range(nodes.height, dtype=pl.Int64, eager=True)}
    renumber = pl.col("release").replace_strict(dense["old"], dense["new"], default=None)
    return (nodes.with_columns(node=dense["new"]), blocks.with_columns(release=renumber),
            pl.concat([p.steps for p in parts]), pl.concat([p.threads for p in parts]))


def _moved(frames: list[pl.DataFrame], offsets: list[int], column: str) -> pl.DataFrame:
    """``frames`` one under the other (``stacked``), each one's ``column`` moved by its offset: one query,
    not one a frame."""
    shift = pl.col("part").replace_strict(list(range(len(offsets))), offsets, return_dtype=pl.Int64)
    return stacked(frames).with_columns(pl.col(column) + shift).drop("part")


def _released(nodes: pl.DataFrame, matched: pl.DataFrame | None, pairs: pl.DataFrame | None) -> pl.DataFrame:
    """``nodes`` sorted by ``node``, with what released each one's start: ``from_kind`` (stream, event,
    launch or null), ``from_node``, ``from_at``; and ``peer``, ``peer_at``: the other rank's kernel whose
    arrival released a collective kernel or a receive, and when."""
    by = ["lane", "stream"]
    g = nodes.sort(*by, "start", "end").with_columns(prev=pl.col("node").shift(1).over(by),
                                                     prev_end=pl.col("end").shift(1).over(by))
    ends = g.select("who", "lane", x_node="node", x_end="end", x_stream="stream").sort("x_end")
    g = g.sort("start").join_asof(ends, left_on="start", right_on="x_end", by=["who", "lane"], strategy="backward",
                                  allow_exact_matches=False, check_sortedness=False)
    low = pl.lit(-(2**62))
    base = pl.max_horizontal(pl.col("prev_end").fill_null(low), pl.col("at").fill_null(low))
    event = pl.col("x_end").is_not_null() & (pl.col("x_stream").ne_missing(pl.col("stream"))) & (
        pl.col("x_end") > base + MERGE_GAP_NS)
    launch = pl.col("at").is_not_null() & (pl.col("at") > pl.col("prev_end").fill_null(low))
    kind = (pl.when(event).then(pl.lit("event")).when(launch).then(pl.lit("launch"))
            .when(pl.col("prev").is_not_null()).then(pl.lit("stream")))
    g = g.with_columns(from_kind=kind).with_columns(
        from_node=pl.when(pl.col("from_kind") == "event").then("x_node").otherwise("prev"),
        from_at=pl.when(pl.col("from_kind") == "event").then("x_end").when(pl.col("from_kind") == "launch")
        .then("at").otherwise("prev_end"))
    peers = pl.concat([_collective_peers(g, matched), _send_peers(g, pairs)]).unique("node", keep="first")
    return g.join(peers, on="node", how="left").sort("node")


_PEERS = {"node": pl.Int64, "peer": pl.Int64, "peer_at": pl.Int64}


def _collective_peers(nodes: pl.DataFrame, matched: pl.DataFrame | None) -> pl.DataFrame:
    """node, peer, peer_at: each collective kernel whose call's last member was another participant, that
    member's kernel and its arrival (matched rows are kernels, found by participant and times)."""
    if matched is None or matched.is_empty():
        return pl.DataFrame(schema=_PEERS)
    call = ["group", "kind", "call"]
    rows = matched.join(nodes.select("who", "start", "end", "node"), on=["who", "start", "end"])
    last = rows.filter(pl.col("who") == pl.col("last_who")).select(*call, peer="node")
    out = rows.filter((pl.col("who") != pl.col("last_who")) & (pl.col("last") > pl.col("start"))).join(last, on=call)
    return out.select("node", "peer", peer_at="last").cast(_PEERS)  # type: ignore[arg-type]


def _send_peers(nodes: pl.DataFrame, pairs: pl.DataFrame | None) -> pl.DataFrame:
    """node, peer, peer_at: each receive kernel posted before its send began, the send's kernel and start
    (``p2p`` names a participant by ``spans.owner``: its rank, else its process)."""
    if pairs is None or pairs.is_empty():
        return pl.DataFrame(schema=_PEERS)
    owner = pl.when(pl.col("who") >= 0).then("who").otherwise(-1 - pl.col("who"))
    keyed = nodes.select("node", "start", "end", who=owner)
    late = pairs.filter(pl.col("send_start") > pl.col("recv_start"))
    recv = late.join(keyed, left_on=["recv_who", "recv_start", "recv_end"], right_on=["who", "start", "end"])
    sent = recv.join(keyed.rename({"node": "peer"}), left_on=["send_who", "send_start", "send_end"],
                     right_on=["who", "start", "end"])
    return sent.select("node", "peer", peer_at="send_start").cast(_PEERS)  # type: ignore[arg-type]


def _windows(nodes: pl.DataFrame, steps: pl.DataFrame) -> list[tuple]:
    """(step, start, end, start state) per job step: the steps' span over participants, the walk starting
    where the one that ended last was (module docstring); one window over all GPU work without steps."""
    if steps.is_empty():
        last = nodes.sort("end", "node").row(-1, named=True)
        return [(None, int(nodes["start"].min()), last["end"], ("node", last["node"]))]
    spans = steps.sort("end", "who").group_by("step", maintain_order=True).agg(
        start=pl.col("start").min(), end=pl.col("end").last(), lane=pl.col("lane").last(), who=pl.col("who").last(),
        on_gpu=(pl.col("end") > pl.col("cpu_end")).last())
    spans = _running(spans.sort("step"), nodes)
    return [(r["step"], r["start"], r["end"], ("node", r["node"]) if r["on_gpu"] and r["node"] is not None
             else ("host", r["lane"], r["who"])) for r in spans.iter_rows(named=True)]


def _running(ends: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """``ends`` (who, end) with ``node``: the run of that participant running at ``end`` (begun before it and
    ending at or after it; of several streams', the one ending first), null where none is."""
    stream = pl.col("stream").fill_null(-1)
    runs = nodes.select("who", "lane", "node", "start", stream=stream, node_end="end").sort("start")
    probes = ends.with_row_index("probe").select("probe", "who", "end").join(
        runs.select("who", "lane", "stream").unique(), on="who")
    found = probes.sort("end").join_asof(runs, left_on="end", right_on="start", by=["who", "lane", "stream"],
                                         strategy="backward", allow_exact_matches=False, check_sortedness=False)
    best = found.filter(pl.col("node_end") >= pl.col("end")).sort("node_end", "node").unique("probe", keep="first")
    return ends.with_row_index("probe").join(best.select("probe", "node"), on="probe", how="left").sort(
        "probe").drop("probe")


#: A missing value in the walk's integer columns (times lie within ±2**62).
NULL = -(2**63)
#: What a run's span holds besides compute: the kind each column of it counts as.
_INNER = (("memory", "memory_ns"), ("host", "host_ns"), ("waiting", "wait_ns"))
_INTS = ("who", "start", "end", "memory_ns", "host_ns", "wait_ns", "from_node", "from_at", "peer", "peer_at")


class _Graph:
    """The nodes as arrays indexed by node id (``NULL`` for missing values; strings as codes into
    ``names``: a few bytes a node, for millions of them), each thread's blocked calls in order of return,
    its busy stretches (``busy``; those that launched GPU work, ``launching``) and the other threads of its
    process (``siblings``)."""

    def __init__(self, nodes: pl.DataFrame, blocks: pl.DataFrame, threads: pl.DataFrame) -> None:
        lanes = pl.format("{}/stream{}", "lane", pl.col("stream").fill_null(-1))
        strings = nodes.select(lane=lanes, at_lane="at_lane", cls="cls", from_kind="from_kind")
        self.names = pl.concat([strings[c] for c in strings.columns]).unique(maintain_order=True).to_list()
        code = {name: k for k, name in enumerate(self.names)}  # the None key codes the nulls
        self.col = {c: nodes[c].fill_null(NULL).to_list() for c in _INTS}
        self.col |= {c: strings[c].replace_strict(code, return_dtype=pl.Int64).to_list() for c in strings.columns}
        self.blocks: dict[str, tuple[list[int], list[tuple]]] = {}
        for part in blocks.sort("end", "start").partition_by("lane", maintain_order=True):
            rows = list(part.select("end", "release", "release_end").iter_rows())
            self.blocks[part["lane"][0]] = ([r[0] for r in rows], rows)
        self.busy: dict[str, tuple[list[int], list[int]]] = {}
        self.launching: dict[str, tuple[list[int], list[int]]] = {}
        process: dict[tuple, list[str]] = {}
        ordered = threads.sort("lane", "start")
        columns = (ordered[c].to_list() for c in ("who", "pid", "lane", "start", "end", "launches"))
        for who, pid, lane, lo, hi, launches in zip(*columns, strict=True):
            if lane not in self.busy:
                self.busy[lane], self.launching[lane] = ([], []), ([], [])
                process.setdefault((who, pid), []).append(lane)
            for kept in (self.busy[lane], self.launching[lane]) if launches else (self.busy[lane],):
                kept[0].append(lo)
                kept[1].append(hi)
        #: the other threads of each thread's process
        self.siblings = {lane: [o for o in lanes if o != lane] for lanes in process.values() for lane in lanes}

    def text(self, column: str, node: int) -> str | None:
        """A string column's value at ``node``."""
        return self.names[self.col[column][node]]

    def block_before(self, lane: str, t: int) -> tuple | None:
        """(end, release, release_end) of the call on ``lane`` that blocked last, returning by ``t``."""
        ends, rows = self.blocks.get(lane, ([], []))
        k = bisect_right(ends, t) - 1
        return rows[k] if k >= 0 else None

    def stretch_at(self, lane: str, t: int) -> tuple[int, int] | None:
        """(start, end) of ``lane``'s busy stretch that began before ``t`` and lasts until ``t`` at least."""
        starts, ends = self.busy.get(lane, ([], []))
        k = bisect_left(starts, t) - 1
        return (starts[k], ends[k]) if k >= 0 and ends[k] >= t else None

    def idle_since(self, lane: str, t: int) -> int | None:
        """When ``lane``'s last busy stretch ending before ``t`` ended (None: none did)."""
        ends = self.busy.get(lane, ([], []))[1]
        k = bisect_left(ends, t) - 1
        return ends[k] if k >= 0 else None

    def handed_to(self, lane: str, since: int | None, t: int) -> tuple[str, int] | None:
        """(thread, when): the thread of ``lane``'s process that launched GPU work last before ``t`` while
        ``lane`` was idle (after ``since``), and when that stretch ended (``t`` if it still ran)."""
        best = None
        for other in self.siblings.get(lane, []):
            starts, ends = self.launching[other]
            k = bisect_left(starts, t) - 1
            if k < 0:
                continue
            at = min(ends[k], t)
            if (since is None or at > since) and (best is None or at > best[1]):
                best = (other, at)
        return best


class _Walk:
    """One step's walk back: the segments met (who, lane, start, end, kind) and each participant's ns by kind."""

    def __init__(self, graph: _Graph, start: int) -> None:
        self.g, self.floor = graph, start
        self.segments: list[list] = []
        self.by: dict[int, dict[str, int]] = {}

    def emit(self, who: int, lane: str, lo: int, hi: int, kind: str, node: int | None = None) -> None:
        """[lo, hi] (cut to the step) as ``kind``; a run's own time split as its span holds it."""
        lo = max(lo, self.floor)
        if hi <= lo:
            return
        who, lo, hi = int(who), int(lo), int(hi)
        self._count(who, kind, hi - lo, node)
        last = self.segments[-1] if self.segments else None
        if last is not None and last[:2] == [who, lane] and last[4] == kind and last[2] == hi:
            last[2] = lo
        else:
            self.segments.append([who, lane, lo, hi, kind])

    def _count(self, who: int, kind: str, ns: int, node: int | None) -> None:
        mine = self.by.setdefault(who, dict.fromkeys(KINDS, 0))
        if node is None or kind not in ("compute", "memory"):
            mine[kind] += ns
            return
        c = self.g.col
        span = int(c["end"][node] - c["start"][node])
        inner = {k: int(c[col][node]) for k, col in _INNER}
        shares = {k: v * ns // span for k, v in inner.items()} if span else {}
        for k, v in shares.items():
            mine[k] += v
        mine["compute"] += ns - sum(shares.values())


def _path(graph: _Graph, step: int | None, start: int, end: int, state: tuple) -> CriticalPath:
    """The step's critical path: the walk from ``state`` at ``end`` back to ``start``."""
    walk = _Walk(graph, start)
    t, seen, c = end, set(), graph.col
    while t > start:
        if state[0] == "host":
            state, t = _host(walk, state, t)
            continue
        if state[0] == "end":
            break
        node = state[1]
        if node in seen:  # no progress (runs of no length released by each other)
            walk.emit(c["who"][node], graph.text("lane", node), start, t, "waiting")
            break
        seen.add(node)
        peer, cls = int(c["peer"][node]), graph.text("cls", node)
        if peer != NULL and cls == "comm":
            arrival = min(int(c["peer_at"][node]), t)
            walk.emit(c["who"][node], graph.text("lane", node), arrival, t, "comm")
            node, t = peer, arrival
        else:
            walk.emit(c["who"][node], graph.text("lane", node), c["start"][node], t, cls, node)
            t = min(int(c["start"][node]), t)
        state, t = _release(walk, node, t)
    return _finished(walk, step, start, end)


def _host(walk: _Walk, state: tuple, t: int) -> tuple[tuple, int]:
    """One move back on a host thread from ``t`` (module docstring): through a busy stretch to the call that
    blocked last in it or to its start, through a pause to the thread it waited for, or (idle with no other
    thread launching) back to its last busy stretch; at the step's start, the end of the walk."""
    g, (_, lane, who) = walk.g, state
    stretch = g.stretch_at(lane, t)
    if stretch is not None:
        block = g.block_before(lane, t)
        if block is not None and block[0] > stretch[0]:
            b_end, node, released = block
            walk.emit(who, lane, b_end, t, "host")
            walk.emit(who, lane, released, b_end, "waiting")
            return ("node", node), min(released, t)
        walk.emit(who, lane, stretch[0], t, "host")
        return state, stretch[0]
    since = g.idle_since(lane, t)
    other = g.handed_to(lane, since, t)
    if other is not None:
        thread, at = other
        walk.emit(who, lane, at, t, "waiting")
        return ("host", thread, who), at
    if since is None:
        walk.emit(who, lane, walk.floor, t, "host")
        return ("end",), walk.floor
    walk.emit(who, lane, since, t, "host")
    return state, since


def _release(walk: _Walk, node: int, t: int) -> tuple[tuple, int]:
    """Where the path goes from ``node``'s start (at ``t``): what released it, the gap emitted."""
    g = walk.g
    kind, who = g.text("from_kind", node), int(g.col["who"][node])
    at = walk.floor if kind is None else min(int(g.col["from_at"][node]), t)
    if kind == "launch":
        walk.emit(who, g.text("at_lane", node), at, t, "host")
        return ("host", g.text("at_lane", node), who), at
    walk.emit(who, g.text("lane", node), at, t, "waiting")
    return ("node", int(g.col["from_node"][node])) if kind is not None else ("end",), at


def _finished(walk: _Walk, step: int | None, start: int, end: int) -> CriticalPath:
    """The path's segments in time order (the longest ``MAX_SEGMENTS``) and each participant's share."""
    segments = walk.segments[::-1]
    kept = segments if len(segments) <= MAX_SEGMENTS else sorted(
        sorted(segments, key=lambda s: s[2] - s[3])[:MAX_SEGMENTS], key=lambda s: s[2])
    out = [PathSegment(rank_of(w), pid_of(w), lane, lo, hi, kind) for w, lane, lo, hi, kind in kept]
    shares = [PathShare(rank_of(w), pid_of(w), *(ns[k] for k in KINDS))
              for w, ns in sorted(walk.by.items(), key=lambda item: (item[0] < 0, abs(item[0])))]
    return CriticalPath(step, start, end - start, out, shares, len(segments))
