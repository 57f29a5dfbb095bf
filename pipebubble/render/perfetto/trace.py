"""The Perfetto trace as data, and its two encodings: TrackEvent protobuf and Chrome JSON.

The foreign format is described by small dataclasses (as pyinstrument's speedscope renderer does):

- ``Track``: a TracePacket.track_descriptor (uuid, name, parent_uuid, description; ``counter`` for a
  CounterDescriptor; ``order`` for sibling_order_rank under a parent whose child_ordering is EXPLICIT; tracks of
  one ``merge_key`` show as one track, SIBLING_MERGE_BEHAVIOR_BY_SIBLING_MERGE_KEY). With a ``pid`` and no
  ``tid`` it is a process's track (a ProcessDescriptor: pid, process_name), with both a thread's (a
  ThreadDescriptor: pid, tid, thread_name, under its process's track): Perfetto's process and thread tables
  come from these, one row per descriptor, so there is one of each per process and per thread. Every other
  track is a child of one of them (parent_uuid), or global.
- ``Slice``: a TrackEvent TYPE_SLICE_BEGIN / TYPE_SLICE_END pair on one track, with its category and
  debug_annotations (nested values as dict_entries / array_values).
- ``Flow``: an arrow through slices in order: TrackEvent.flow_ids on each, terminating_flow_ids on the last.
- ``CounterPoint``: a TrackEvent TYPE_COUNTER with double_counter_value.

Slices of one track must nest (the builder guarantees it). Each track's begins and ends are written by walking
its slices as a stack, and the tracks are merged in time order, so at one instant a track's ends precede its
begins and a zero-length slice ends before the next begins. Event names, categories and annotation names are
interned (TracePacket.interned_data), as Perfetto's SDK writes them.
"""

from __future__ import annotations

import heapq
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

SEQUENCE_ID = 1  # one writer: every packet is on the same trusted sequence
_INT64 = 2**63


@dataclass(frozen=True)
class Track:
    uuid: int
    name: str
    parent: int | None = None
    counter: bool = False
    description: str | None = None
    order: int | None = None
    merge_key: str | None = None
    explicit: bool = False  # child_ordering EXPLICIT: its children sit by ``order``
    pid: int | None = None  # a process's track, or with ``tid`` a thread's
    tid: int | None = None


@dataclass(frozen=True)
class Slice:
    track: int
    start_ns: int
    end_ns: int
    name: str
    args: tuple[tuple[str, Any], ...] = ()
    category: str | None = None


@dataclass(frozen=True)
class Flow:
    id: int
    category: str
    slices: tuple[int, ...]  # indexes into ExportTrace.slices, in the arrow's order


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
    flows: list[Flow] = field(default_factory=list)
    _by_key: dict[tuple, int] = field(default_factory=dict)

    def track(self, key: tuple, name: str, parent: int | None = None, **more: Any) -> int:
        """The uuid of the track for ``key``, made on first use (uuids count up, so output is stable)."""
        if key not in self._by_key:
            self._by_key[key] = len(self.tracks) + 1
            self.tracks.append(Track(len(self.tracks) + 1, name, parent, **more))
        return self._by_key[key]

    def has(self, key: tuple) -> bool:
        return key in self._by_key


# --- protobuf ---


def to_proto(trace: ExportTrace) -> bytes:
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TracePacket, TrackDescriptor

    out = Trace()
    for track in trace.tracks:
        packet = out.packet.add()
        packet.trusted_packet_sequence_id = SEQUENCE_ID
        if track.uuid == 1:
            packet.sequence_flags = TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
        _describe(packet.track_descriptor, track, TrackDescriptor)
    interned = _Interned()
    ids = _flow_ids(trace)
    for ts, kind, item in _events(trace):
        packet = out.packet.add()
        packet.timestamp, packet.trusted_packet_sequence_id = ts, SEQUENCE_ID
        packet.sequence_flags = TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
        _event(packet, kind, item, interned, ids)
    return out.SerializeToString()


def _describe(desc, track: Track, TrackDescriptor) -> None:
    desc.uuid, desc.name = track.uuid, track.name
    if track.pid is not None and track.tid is not None:
        desc.thread.pid, desc.thread.tid, desc.thread.thread_name = track.pid, track.tid, track.name
    elif track.pid is not None:
        desc.process.pid, desc.process.process_name = track.pid, track.name
    if track.parent is not None:
        desc.parent_uuid = track.parent
    if track.description:
        desc.description = track.description
    if track.counter:
        desc.counter.SetInParent()
    if track.explicit:
        desc.child_ordering = TrackDescriptor.EXPLICIT
    if track.order is not None:
        desc.sibling_order_rank = track.order
    if track.merge_key is not None:
        desc.sibling_merge_behavior = TrackDescriptor.SIBLING_MERGE_BEHAVIOR_BY_SIBLING_MERGE_KEY
        desc.sibling_merge_key = track.merge_key


class _Interned:
    """Interning ids per table (event names, categories, annotation names), given out on first use."""

    def __init__(self) -> None:
        self.tables: dict[str, dict[str, int]] = {"event_names": {}, "event_categories": {},
                                                  "debug_annotation_names": {}}

    def iid(self, packet, table: str, text: str) -> int:
        known = self.tables[table]
        if text not in known:
            known[text] = len(known) + 1
            entry = getattr(packet.interned_data, table).add()
            entry.iid, entry.name = known[text], text
        return known[text]


def _flow_ids(trace: ExportTrace) -> dict[int, tuple[list[int], list[int]]]:
    """Per slice index: the flows it starts or passes on, and those it ends."""
    ids: dict[int, tuple[list[int], list[int]]] = {}
    for flow in trace.flows:
        for i, s in enumerate(flow.slices):
            ids.setdefault(s, ([], []))[i == len(flow.slices) - 1].append(flow.id)
    return ids


def _event(packet, kind: str, item: Any, interned: _Interned, ids: dict) -> None:
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TrackEvent

    event = packet.track_event
    if kind == "counter":
        event.track_uuid, event.type, event.double_counter_value = item.track, TrackEvent.TYPE_COUNTER, item.value
        return
    index, s = item
    event.track_uuid = s.track
    if kind == "end":
        event.type = TrackEvent.TYPE_SLICE_END
        return
    event.type = TrackEvent.TYPE_SLICE_BEGIN
    event.name_iid = interned.iid(packet, "event_names", s.name)
    if s.category:
        event.category_iids.append(interned.iid(packet, "event_categories", s.category))
    for name, value in s.args:
        ann = event.debug_annotations.add()
        ann.name_iid = interned.iid(packet, "debug_annotation_names", name)
        _annotate(ann, value)
    passing, ending = ids.get(index, ((), ()))
    event.flow_ids.extend(passing)
    event.terminating_flow_ids.extend(ending)


def _annotate(ann, value: Any, depth: int = 0) -> None:
    """A JSON value as a DebugAnnotation: objects as dict_entries, arrays as array_values."""
    if isinstance(value, bool):
        ann.bool_value = value
    elif isinstance(value, int) and -_INT64 <= value < _INT64:
        ann.int_value = value
    elif isinstance(value, float):
        ann.double_value = value
    elif isinstance(value, (dict, list)) and not value:
        ann.legacy_json_value = json.dumps(value)  # an empty value still shows as one
    elif isinstance(value, dict) and depth < 16:
        for k, v in value.items():
            entry = ann.dict_entries.add()
            entry.name = str(k)
            _annotate(entry, v, depth + 1)
    elif isinstance(value, list) and depth < 16:
        for v in value:
            _annotate(ann.array_values.add(), v, depth + 1)
    elif value is None:
        ann.legacy_json_value = "null"
    else:
        ann.string_value = value if isinstance(value, str) else json.dumps(value)


def _events(trace: ExportTrace) -> Iterator[tuple[int, str, Any]]:
    """Every begin, end and counter point in time order; within a track, in stack order."""
    by_track: dict[int, list[tuple[int, Slice]]] = {}
    for i, s in enumerate(trace.slices):
        by_track.setdefault(s.track, []).append((i, s))
    streams = [_stack_walk(sorted(items, key=lambda p: (p[1].start_ns, -p[1].end_ns, p[0])))
               for _, items in sorted(by_track.items())]
    counters = sorted(((c.ts_ns, "counter", c) for c in trace.counters), key=lambda e: (e[0], e[2].track))
    return heapq.merge(*streams, counters, key=lambda e: e[0])


def _stack_walk(items: list[tuple[int, Slice]]) -> Iterator[tuple[int, str, tuple[int, Slice]]]:
    """One track's begins and ends: before a slice begins, every open slice that ended by then ends."""
    stack: list[tuple[int, Slice]] = []
    for item in items:
        while stack and stack[-1][1].end_ns <= item[1].start_ns:
            done = stack.pop()
            yield done[1].end_ns, "end", done
        yield item[1].start_ns, "begin", item
        stack.append(item)
    while stack:
        done = stack.pop()
        yield done[1].end_ns, "end", done


# --- Chrome JSON ---


def to_chrome_json(trace: ExportTrace) -> str:
    """The same tracks as Chrome JSON: top-level tracks are processes, the tracks below them threads (sorted
    by ``thread_sort_index``; one ``process_name`` per pid, one ``thread_name`` per pid and tid), flows as
    ``s``/``t``/``f`` events bound to their slices' starts. Times are µs from the earliest event (a double
    cannot hold epoch nanoseconds exactly); ``otherData.origin_ns`` says where."""
    times = [s.start_ns for s in trace.slices] + [c.ts_ns for c in trace.counters]
    origin = min(times, default=0)
    where = _pids_tids(trace)
    events = _metadata(trace, where)
    for s in trace.slices:
        pid, tid = where[s.track]
        event = {"ph": "X", "name": s.name, "pid": pid, "tid": tid, "ts": (s.start_ns - origin) / 1000,
                 "dur": (s.end_ns - s.start_ns) / 1000, "args": dict(s.args)}
        if s.category:
            event["cat"] = s.category
        events.append(event)
    for flow in trace.flows:
        for i, index in enumerate(flow.slices):
            s = trace.slices[index]
            pid, tid = where[s.track]
            ph = "s" if i == 0 else "f" if i == len(flow.slices) - 1 else "t"
            events.append({"ph": ph, "id": flow.id, "cat": flow.category, "name": flow.category, "pid": pid,
                           "tid": tid, "ts": (s.start_ns - origin) / 1000, **({"bp": "e"} if ph == "f" else {})})
    names = {t.uuid: t.name for t in trace.tracks}
    events += [{"ph": "C", "name": names[c.track], "pid": where[c.track][0], "tid": 0,
                "ts": (c.ts_ns - origin) / 1000, "args": {"value": c.value}} for c in trace.counters]
    body = {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"origin_ns": origin}}
    return json.dumps(body, separators=(",", ":")) + "\n"


def _pids_tids(trace: ExportTrace) -> dict[int, tuple[int, int]]:
    """Each track's (pid, tid) in Chrome JSON, where a thread is the only track a process holds: a process's
    track is its pid (tid 0), a thread's track its pid and tid; every other track (a GPU stream, passes, the
    overlaps of a thread) is a thread of its own in the process above it, and a global one a process of its
    own, with an id above every pid and tid the tracks name."""
    named = [v for t in trace.tracks for v in (t.pid, t.tid) if v is not None]
    own = itertools.count(max(named, default=0) + 1)
    where: dict[int, tuple[int, int]] = {}
    for t in trace.tracks:  # a parent is made before its children
        if t.parent is None:
            where[t.uuid] = (t.pid if t.pid is not None else next(own), 0)
        else:
            where[t.uuid] = (where[t.parent][0], t.tid if t.tid is not None else next(own))
    return where


def _metadata(trace: ExportTrace, where: dict[int, tuple[int, int]]) -> list[dict]:
    events: list[dict] = []
    tops = 0
    for t in trace.tracks:
        pid, tid = where[t.uuid]
        if t.parent is None:
            tops += 1
            events += [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": t.name}},
                       {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": tops}}]
        elif not t.counter:
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": t.name}})
            if t.order is not None:
                events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                               "args": {"sort_index": t.order}})
    return events
