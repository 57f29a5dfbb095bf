"""The annotated trace for ui.perfetto.dev: the original spans, the passes, the waits and a utilization counter.

The foreign format is described by three small dataclasses (as pyinstrument's speedscope renderer does), built
from the span table and the Report, then written as Perfetto TrackEvent protobuf or as Chrome JSON:

- ``Track``: a TracePacket.track_descriptor (uuid, name, parent_uuid; ``counter`` for a CounterDescriptor).
- ``Slice``: a TrackEvent TYPE_SLICE_BEGIN / TYPE_SLICE_END pair on one track, with debug_annotations as args.
- ``CounterPoint``: a TrackEvent TYPE_COUNTER with double_counter_value.

A Perfetto track shows a slice stack, so slices on one track must nest; spans of one lane that overlap without
nesting (two streams' kernels, overlapping async ops) are spread over numbered sibling tracks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import polars as pl

from pipebubble.render.timeline import PHASES
from pipebubble.report import Report, Wait

COMPUTE = frozenset(PHASES) - {"comm"}
SEQUENCE_ID = 1  # one writer: every packet is on the same trusted sequence


@dataclass(frozen=True)
class Track:
    uuid: int
    name: str
    parent: int | None = None
    counter: bool = False


@dataclass(frozen=True)
class Slice:
    track: int
    start_ns: int
    end_ns: int
    name: str
    args: tuple[tuple[str, str | int], ...] = ()


@dataclass(frozen=True)
class CounterPoint:
    track: int
    ts_ns: int
    value: float


@dataclass
class ExportTrace:
    tracks: list[Track] = field(default_factory=list)
    slices: list[Slice] = field(default_factory=list)
    counters: list[CounterPoint] = field(default_factory=list)
    _by_key: dict[tuple, int] = field(default_factory=dict)

    def track(self, key: tuple, name: str, parent: int | None = None, counter: bool = False) -> int:
        """The uuid of the track for ``key``, made on first use (uuids count up, so output is stable)."""
        if key not in self._by_key:
            self._by_key[key] = len(self.tracks) + 1
            self.tracks.append(Track(len(self.tracks) + 1, name, parent, counter))
        return self._by_key[key]


def build(spans: pl.DataFrame, report: Report) -> ExportTrace:
    out = ExportTrace()
    add_spans(out, spans)
    add_passes(out, report)
    add_waits(out, report)
    add_utilization(out, report)
    return out


def _group(row: dict) -> tuple[tuple, str]:
    if row["stage"] is not None:
        return ("stage", row["stage"]), f"stage {row['stage']}"
    if row["rank"] is not None:
        return ("rank", row["rank"]), f"rank {row['rank']}"
    return ("source", row["source"]), str(row["source"])


def add_spans(out: ExportTrace, spans: pl.DataFrame) -> None:
    """One track per lane (per stream on a GPU) under its stage, or its rank when no stage is known."""
    cols = ["source", "rank", "lane", "stream", "stage", "kind", "name", "start", "end", "microbatch", "phase"]
    stacks: dict[tuple, list[list[int]]] = {}  # lane key -> per sibling track, the open slices' ends
    for row in spans.select(cols).sort("start", pl.col("end"), descending=[False, True]).iter_rows(named=True):
        gkey, gname = _group(row)
        parent = out.track(gkey, gname)
        lane = row["lane"] + (f"/stream{row['stream']}" if row["stream"] is not None else "")
        key = (gkey, lane)
        level = _fit(stacks.setdefault(key, []), row["start"], row["end"])
        name = lane + (f" #{level + 1}" if level else "")
        track = out.track((key, level), name, parent)
        args = tuple((k, row[k]) for k in ("kind", "microbatch", "phase") if row[k] is not None)
        out.slices.append(Slice(track, row["start"], row["end"], row["name"] or "?", args))


def _fit(levels: list[list[int]], start: int, end: int) -> int:
    """The first sibling track where [start, end) nests inside what is open there (or on an empty stack)."""
    for i, stack in enumerate(levels):
        while stack and stack[-1] <= start:
            stack.pop()
        if not stack or end <= stack[-1]:
            stack.append(end)
            return i
    levels.append([end])
    return len(levels) - 1


def add_passes(out: ExportTrace, report: Report) -> None:
    """The report's timeline: each pass as F3 / B3 (or prefill, decode) on a track per stage."""
    group = out.track(("analysis",), "pipebubble: passes")
    for seg in report.timeline:
        track = out.track(("passes", seg.stage), f"s{seg.stage} passes", group)
        letter = PHASES.get(seg.phase, PHASES["other"])[0]
        name = letter + str(seg.microbatch) if seg.microbatch is not None else seg.phase
        args = tuple((k, v) for k, v in (("phase", seg.phase), ("microbatch", seg.microbatch), ("chunk", seg.chunk),
                                         ("step", seg.step)) if v is not None)
        out.slices.append(Slice(track, seg.start_ns, seg.end_ns, name, args))


def add_waits(out: ExportTrace, report: Report) -> None:
    """Every wait (bubble) as a slice named by its cause, on a track per stage; a collective wait of a job that
    is not a pipeline goes on the waiting rank's own track, beside its lanes. ``waited_for`` (the rank that
    arrived last) is in the args."""
    group = out.track(("waits",), "pipebubble: bubbles and waits")
    stacks: dict[tuple, list[list[int]]] = {}  # track key -> per sibling track, the open slices' ends
    for w in sorted(report.waits, key=_wait_order):
        key, name, parent = _wait_track(out, w, group)
        end = w.start_ns + w.dur_ns
        level = _fit(stacks.setdefault(key, []), w.start_ns, end)  # waits of one rank's lanes may overlap
        track = out.track((key, level), name + (f" #{level + 1}" if level else ""), parent)
        args = tuple((k, v) for k, v in (("cause", w.cause), ("before", w.before), ("after", w.after),
                                         ("lane", w.lane), ("step", w.step), ("rank", w.rank),
                                         ("waited_for", w.waited_for)) if v is not None)
        out.slices.append(Slice(track, w.start_ns, end, f"wait: {w.cause}", args))


def _wait_order(w: Wait) -> tuple:
    """By track (stages first, then ranks), then by time, the longer first: the order ``_fit`` needs."""
    return (w.stage is None, w.stage or 0, w.rank is None, w.rank or 0, w.start_ns, -w.dur_ns)


def _wait_track(out: ExportTrace, w: Wait, group: int) -> tuple[tuple, str, int]:
    """(key, name, parent) of the track a wait goes on: its stage's under the waits group, else its rank's."""
    if w.stage is not None or w.rank is None:
        where = f"s{w.stage}" if w.stage is not None else "unplaced"
        return ("wait", w.stage), f"{where} waits", group
    return ("rank waits", w.rank), "collective waits", out.track(("rank", w.rank), f"rank {w.rank}")


def add_utilization(out: ExportTrace, report: Report) -> None:
    """Fraction of stages computing at each instant (from the passes); without passes, each device lane's busy
    fraction over its window."""
    if report.timeline:
        _stage_counter(out, report)
        return
    for lane in report.lanes:
        if lane.kind == "gpu" and lane.stream is None:
            track = out.track(("util", lane.lane), f"utilization {lane.lane}", counter=True)
            out.counters += [CounterPoint(track, lane.window_start_ns, 1 - lane.idle_fraction),
                             CounterPoint(track, lane.window_end_ns, 0.0)]


def _stage_counter(out: ExportTrace, report: Report) -> None:
    stages = sorted({s.stage for s in report.timeline} | {s.stage for s in report.stages})
    track = out.track(("util",), "utilization (stages computing / p)", counter=True)
    edges = sorted((t, d, s.stage) for s in report.timeline if s.phase in COMPUTE
                   for t, d in ((s.start_ns, 1), (s.end_ns, -1)))
    depth: dict[int, int] = {}
    for i, (t, d, stage) in enumerate(edges):
        depth[stage] = depth.get(stage, 0) + d
        if i + 1 == len(edges) or edges[i + 1][0] != t:  # one point per instant, after all its edges
            busy = sum(1 for v in depth.values() if v > 0)
            out.counters.append(CounterPoint(track, t, busy / len(stages)))


def to_proto(trace: ExportTrace) -> bytes:
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TracePacket, TrackEvent
    from perfetto.trace_builder.proto_builder import TraceProtoBuilder

    builder = TraceProtoBuilder()
    for i, track in enumerate(trace.tracks):
        packet = builder.add_packet()
        packet.trusted_packet_sequence_id = SEQUENCE_ID
        if i == 0:
            packet.sequence_flags = TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
        desc = packet.track_descriptor
        desc.uuid, desc.name = track.uuid, track.name
        if track.parent is not None:
            desc.parent_uuid = track.parent
        if track.counter:
            desc.counter.SetInParent()
    for ts, _, kind, item in _events(trace):
        packet = builder.add_packet()
        packet.timestamp, packet.trusted_packet_sequence_id = ts, SEQUENCE_ID
        event = packet.track_event
        event.track_uuid = item.track
        if kind == "counter":
            event.type, event.double_counter_value = TrackEvent.TYPE_COUNTER, item.value
        elif kind == "end":
            event.type = TrackEvent.TYPE_SLICE_END
        else:
            event.type, event.name = TrackEvent.TYPE_SLICE_BEGIN, item.name
            for name, value in item.args:
                ann = event.debug_annotations.add()
                ann.name = name
                if isinstance(value, int):
                    ann.int_value = value
                else:
                    ann.string_value = str(value)
    return builder.serialize()


def _events(trace: ExportTrace) -> list[tuple[int, tuple, str, object]]:
    """Events in time order; at one instant, ends (inner first) before begins (outer first), so slices nest."""
    events: list[tuple[int, tuple, str, object]] = []
    for i, s in enumerate(trace.slices):
        events.append((s.start_ns, (1, -s.end_ns, i), "begin", s))
        events.append((s.end_ns, (0, -s.start_ns, -i), "end", s))
    events += [(c.ts_ns, (2, 0, i), "counter", c) for i, c in enumerate(trace.counters)]
    return sorted(events, key=lambda e: (e[0], e[1]))


def to_chrome_json(trace: ExportTrace) -> str:
    """The same tracks as Chrome JSON: top-level tracks are processes, their children threads. Times are µs from
    the earliest event (a double cannot hold epoch nanoseconds exactly); ``otherData.origin_ns`` says where."""
    times = [s.start_ns for s in trace.slices] + [c.ts_ns for c in trace.counters]
    origin = min(times, default=0)
    pids = {t.uuid: i + 1 for i, t in enumerate(x for x in trace.tracks if x.parent is None)}
    where = {t.uuid: (pids[t.parent], t.uuid) if t.parent is not None else (pids[t.uuid], 0) for t in trace.tracks}
    events: list[dict] = []
    for t in trace.tracks:
        pid, tid = where[t.uuid]
        meta = ("thread_name", tid) if t.parent is not None else ("process_name", 0)
        events.append({"ph": "M", "name": meta[0], "pid": pid, "tid": meta[1], "args": {"name": t.name}})
    for s in trace.slices:
        pid, tid = where[s.track]
        events.append({"ph": "X", "name": s.name, "pid": pid, "tid": tid, "ts": (s.start_ns - origin) / 1000,
                       "dur": (s.end_ns - s.start_ns) / 1000, "args": dict(s.args)})
    names = {t.uuid: t.name for t in trace.tracks}
    events += [{"ph": "C", "name": names[c.track], "pid": where[c.track][0], "tid": 0,
                "ts": (c.ts_ns - origin) / 1000, "args": {"value": c.value}} for c in trace.counters]
    body = {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"origin_ns": origin}}
    return json.dumps(body, separators=(",", ":")) + "\n"
