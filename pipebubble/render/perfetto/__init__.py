"""The Perfetto writer (``pipebubble export``): the annotated trace for ui.perfetto.dev, built here from the span
table and the Report (``build``: the original spans with their own arguments and flow arrows, the passes, the
waits and a utilization counter); the trace as data and its two encodings, TrackEvent protobuf and Chrome JSON
(``trace``); and each span's own arguments and flow arrows, read again from the source files by the export alone
and joined onto the span table before ``build`` (``flows``). No other renderer imports this room.

One process per rank (per process of an Nsight report, named ``pid N``): a process track (its pid: ``ids``)
holding, in this order: the rank's passes, its bubbles and waits, one track per GPU stream and one thread track
per CPU thread (its tid: ``ids``), each named shortly (``GPU 0 stream 7``, ``thread 123``; the lane id is the
track's description). So Perfetto's process table has a row per rank and its thread table one per thread.

A Perfetto track shows a slice stack, so slices on one track must nest: spans are placed in (start, longer
first) order, each under the innermost open slice that encloses it; one that overlaps without nesting (an async
op past its caller, two kernels of one stream that the profiler saw overlap) goes on a track under its lane's
own (``overlapping · thread 123``, ``overlapping 2 · thread 123``; those of one lane share a merge key, which
the UI draws as one track), never on a second thread track. An end past its parent's by at most
``NEST_SLACK_NS`` (two roundings of µs to ns) is clipped to it.

A span's slice carries its category, the source event's ``args`` (shapes, types, ids, as the profiler wrote
them) and pipebubble's columns (kind, correlation, micro-batch, phase) where the source has no such key, and
the flows ``flows.attach`` found for it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from pipebubble.render.perfetto.ids import Ids
from pipebubble.render.perfetto.trace import CounterPoint, ExportTrace, Flow, Slice, Track, to_chrome_json, to_proto
from pipebubble.render.sections.timeline import PHASES
from pipebubble.report import Report, Wait

__all__ = ["CounterPoint", "ExportTrace", "Flow", "Slice", "Track", "build", "to_chrome_json", "to_proto"]

COMPUTE = frozenset(PHASES) - {"comm"}
NEST_SLACK_NS = 2
_ORDER = {"passes": 0, "waits": 1, "critical": 2}  # then GPU streams (from 10), CPU threads, counters
_SPAN_FIELDS = ("kind", "correlation", "external_id", "microbatch", "phase")
_TRACE_SUFFIX = re.compile(r"(\.pt\.trace)?(\.json(\.gz)?|\.sqlite|\.nsys-rep|\.qdrep)$")
_RANK_LANE = re.compile(r"^rank(\d+)/")


def build(spans: pl.DataFrame, report: Report) -> ExportTrace:
    out = ExportTrace()
    layout = _Layout(out, spans, report)
    add_spans(out, spans, layout)
    add_passes(out, report, layout)
    add_waits(out, report, layout)
    add_critical_path(out, report, layout)
    add_utilization(out, report, layout)
    return out


class _Layout:
    """Where things go: each lane's group (rank, else process, else file), the groups' names, the stage each
    group runs, and each group's placement stacks."""

    def __init__(self, out: ExportTrace, spans: pl.DataFrame, report: Report) -> None:
        self.out = out
        lanes = spans.select("source", "rank", "pid", "tid", "device", "stream", "lane").unique()
        lanes = lanes.sort("rank", "pid", "source", "device", "stream", "tid", "lane", nulls_last=True)
        self.files = lanes.filter(pl.col("rank").is_null())["source"].n_unique()
        self.stage_of = {lane: s.stage for s in report.stages for lane in s.lanes}
        self.group_of_lane: dict[str, tuple] = {}
        self.stages: dict[tuple, set[int]] = {}
        self.pids: dict[tuple, set[int]] = {}
        for row in lanes.iter_rows(named=True):
            key = self.group_key(row)
            self.group_of_lane.setdefault(row["lane"], key)
            self.pids.setdefault(key, set()).update(() if row["pid"] is None else (row["pid"],))
            if self.stage_of.get(row["lane"]) is not None:
                self.stages.setdefault(key, set()).add(self.stage_of[row["lane"]])
        for lane, stage in self.stage_of.items():  # a stage's lanes that ran no span still name their rank's
            key = self.of_lane(lane)
            if key is not None:
                self.stages.setdefault(key, set()).add(stage)
        self.levels: dict[tuple, list[list[tuple[int, int]]]] = {}
        self.order: dict[tuple, int] = {}
        self.ids = Ids([*lanes["pid"], *lanes.filter(pl.col("device").is_null())["tid"]])
        self.pid_of: dict[tuple, int] = {}
        for row in lanes.iter_rows(named=True):  # every group and lane track exists before any slice
            self.lane_track(row, 0)

    def group_key(self, row: dict) -> tuple:
        if row["rank"] is not None:
            return ("rank", row["rank"])
        if row["pid"] is not None:
            return ("pid", row["source"], row["pid"])
        return ("file", row["source"])

    def group(self, key: tuple) -> int:
        """The uuid of a group's top-level track, named shortly: ``rank 3 · stage 1``, ``pid 144``."""
        if not self.out.has(key):
            name = {"rank": lambda: f"rank {key[1]}", "pid": lambda: f"pid {key[2]}",
                    "file": lambda: _stem(key[1]), "stage": lambda: f"stage {key[1]}",
                    "unplaced": lambda: "unplaced"}[key[0]]()
            if key[0] == "pid" and self.files > 1:
                name += f" · {_stem(key[1])}"
            stages = sorted(self.stages.get(key, ()))
            if len(stages) == 1 and key[0] != "stage":
                name += f" · stage {stages[0]}"
            self.pid_of[key] = self.ids.process(self.pids.get(key, set()))
            self.out.track(key, name, explicit=True, pid=self.pid_of[key])
        return self.out.track(key, "")

    def child(self, gkey: tuple, what: tuple, name: str, level: int, description: str | None = None,
              counter: bool = False, tid: int | None = None) -> int:
        """A track under group ``gkey`` (a thread's, given the recorded ``tid``); level > 0 is a spill of level
        0, under it (``overlapping · thread 9``, ``overlapping 2 · thread 9``), sharing one merge key with the
        other spills."""
        key = (gkey, what)
        if key not in self.order:
            self.order[key] = _ORDER.get(what[0], 10 + len(self.order))
        if level == 0:
            if self.out.has((key, 0)):
                return self.out.track((key, 0), name)
            parent, pid = self.group(gkey), self.pid_of[gkey]
            ids = {"pid": pid, "tid": self.ids.thread(pid, tid)} if tid is not None else {}
            return self.out.track((key, 0), name, parent, counter=counter, description=description,
                                  order=self.order[key], **ids)
        parent = self.child(gkey, what, name, 0, description, counter, tid)
        merge = "/".join(str(w) for w in what if w is not None)
        spill = "overlapping" + (f" {level}" if level > 1 else "")
        return self.out.track((key, level), f"{spill} · {name}", parent, description=description,
                              order=self.order[key], merge_key=merge)

    def lane_track(self, row: dict, level: int) -> int:
        gkey = self.group_key(row)
        if row["device"] is not None:
            name = f"GPU {row['device']}" + (f" stream {row['stream']}" if row["stream"] is not None else "")
            lane = row["lane"] + (f"/stream{row['stream']}" if row["stream"] is not None else "")
        elif row["tid"] is not None:
            name = f"thread {row['tid']}"
            if len(self.pids.get(gkey, ())) > 1:
                name = f"pid {row['pid']} {name}"
            return self.child(gkey, ("lane", row["lane"], row["stream"]), name, level, description=row["lane"],
                              tid=row["tid"])
        else:
            name = lane = row["lane"]
        return self.child(gkey, ("lane", row["lane"], row["stream"]), name, level, description=lane)

    def of_lane(self, lane: str | None) -> tuple | None:
        """The group a lane (or a stream lane, ``…/stream7``) belongs to; a ``rankN/`` lane not in the spans
        still goes to rank N."""
        if lane is None:
            return None
        base = re.sub(r"/stream\d+$", "", lane)
        if base in self.group_of_lane:
            return self.group_of_lane[base]
        match = _RANK_LANE.match(lane)
        return ("rank", int(match.group(1))) if match else None

    def of_stage(self, stage: int | None) -> tuple | None:
        """The first group (by rank) whose lanes run ``stage``."""
        found = next((k for k, s in self.stages.items() if stage in s), None)
        if found is not None:
            return found
        lanes = sorted(lane for lane, s in self.stage_of.items() if s == stage)
        return next((g for g in map(self.of_lane, lanes) if g is not None), None) if stage is not None else None

    def place(self, key: tuple, start: int, end: int) -> tuple[int, int]:
        """(level, end): the innermost open slice that encloses [start, end) on one of the key's tracks, else
        the first track with nothing open, else a new one. ``end`` comes back clipped within the slack."""
        levels = self.levels.setdefault(key, [])
        best, free = None, None
        for i, stack in enumerate(levels):
            while stack and stack[-1][1] <= start:
                stack.pop()
            if not stack:
                free = i if free is None else free
            elif end <= stack[-1][1] + NEST_SLACK_NS and (best is None or stack[-1][0] > levels[best][-1][0]):
                best = i
        level = best if best is not None else free if free is not None else len(levels)
        if level == len(levels):
            levels.append([])
        stack = levels[level]
        end = min(end, stack[-1][1]) if stack else end
        stack.append((start, end))
        return level, end


def _stem(source: str) -> str:
    """A trace file's name without its trace suffixes: ``torchrun_2xh100_nccl`` (never its folders)."""
    return _TRACE_SUFFIX.sub("", Path(source).name) or Path(source).name


def add_spans(out: ExportTrace, spans: pl.DataFrame, layout: _Layout) -> None:
    """One slice per span on its lane's track (or a spill of it), with its args and flows."""
    extra = [c for c in ("args", "category", "flows") if c in spans.columns]
    cols = ["source", "rank", "pid", "tid", "device", "stream", "lane", "name", "start", "end", *_SPAN_FIELDS,
            *extra]
    steps: dict[int, list[tuple[int, int, str]]] = {}
    tracks: dict[tuple, int] = {}
    ordered = spans.select(cols).sort("start", pl.col("end"), descending=[False, True], maintain_order=True)
    for row in ordered.iter_rows(named=True):
        key = (layout.group_key(row), row["lane"], row["stream"])
        level, end = layout.place(key, row["start"], row["end"])
        track = tracks.get((key, level)) or tracks.setdefault((key, level), layout.lane_track(row, level))
        source = _source_args(row.get("args"))
        out.slices.append(Slice(track, row["start"], end, row["name"] or "?", _span_args(row, source),
                                row.get("category") or str(row["kind"])))
        for f in row.get("flows") or ():
            steps.setdefault(f["id"], []).append((f["step"], len(out.slices) - 1, f["cat"]))
    out.flows += [Flow(fid, s[0][2], tuple(i for _, i, _ in sorted(s))) for fid, s in sorted(steps.items())
                  if len(s) > 1]


def _source_args(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = msgspec.json.decode(text)
    except (msgspec.DecodeError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def _span_args(row: dict, source: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """The source's args as it wrote them, then each span column it has no key for (``External id`` counts as
    ``external_id``)."""
    have = {k.lower().replace(" ", "_") for k in source}
    ours = tuple((k, row[k] if isinstance(row[k], int) else str(row[k])) for k in _SPAN_FIELDS
                 if row[k] is not None and k not in have)
    return (*source.items(), *ours)


def add_passes(out: ExportTrace, report: Report, layout: _Layout) -> None:
    """The report's timeline: each pass as F3 / B3 (or prefill, decode) on its rank's ``passes`` track."""
    for seg in sorted(report.timeline, key=lambda s: (s.stage, s.start_ns, -s.end_ns)):
        gkey = layout.of_lane(seg.lane) or layout.of_stage(seg.stage) or ("stage", seg.stage)
        level, end = layout.place((gkey, "passes"), seg.start_ns, seg.end_ns)
        track = layout.child(gkey, ("passes",), "passes", level)
        letter = PHASES.get(seg.phase, PHASES["other"])[0]
        name = letter + str(seg.microbatch) if seg.microbatch is not None else seg.phase
        args = tuple((k, v) for k, v in (("stage", seg.stage), ("phase", seg.phase), ("microbatch", seg.microbatch),
                                         ("chunk", seg.chunk), ("step", seg.step)) if v is not None)
        out.slices.append(Slice(track, seg.start_ns, end, name, args, "pipebubble.pass"))


def add_waits(out: ExportTrace, report: Report, layout: _Layout) -> None:
    """Every wait (bubble) as a slice named by its cause on its rank's waits track (waits of one rank's lanes
    may overlap: spills merge into the one track). ``waited_for`` (the rank that arrived last) is in the
    args."""
    title = "bubbles and waits" if report.pipeline is not None else "collective waits"  # outside a pipeline
    for w in sorted(report.waits, key=_wait_order):  # the only waits are at collectives (analysis/comm/collectives.py)
        gkey = _wait_group(layout, w)
        level, end = layout.place((gkey, "waits"), w.start_ns, w.start_ns + w.dur_ns)
        track = layout.child(gkey, ("waits",), title, level)
        args = tuple((k, v) for k, v in (("cause", w.cause), ("before", w.before), ("after", w.after),
                                         ("stage", w.stage), ("lane", w.lane), ("step", w.step), ("rank", w.rank),
                                         ("waited_for", w.waited_for)) if v is not None)
        out.slices.append(Slice(track, w.start_ns, end, f"wait: {w.cause}", args, "pipebubble.wait"))


def add_critical_path(out: ExportTrace, report: Report, layout: _Layout) -> None:
    """The median step's critical path as slices named by their kind on a "critical path" track of each lane
    group it crosses (the report keeps the segments of that step only)."""
    for path in report.critical_path:
        for seg in path.segments:
            gkey = layout.of_lane(seg.lane) or ("rank", seg.rank)
            level, end = layout.place((gkey, "critical"), seg.start_ns, seg.end_ns)
            track = layout.child(gkey, ("critical",), "critical path", level)
            args = (("step", path.step), ("lane", seg.lane)) if path.step is not None else (("lane", seg.lane),)
            out.slices.append(Slice(track, seg.start_ns, end, f"critical: {seg.kind}", args, "pipebubble.critical"))


def _wait_order(w: Wait) -> tuple:
    return (w.start_ns, -w.dur_ns, w.stage is None, w.stage or 0, w.rank is None, w.rank or 0, w.lane or "")


def _wait_group(layout: _Layout, w: Wait) -> tuple:
    """Its lane's group, else its rank's (a collective participant without a rank is a process), else its
    stage's, else the unplaced group."""
    found = layout.of_lane(w.lane)
    if found is None and w.rank is not None:
        found = ("rank", w.rank) if ("rank", w.rank) in layout.pids else next(
            (k for k in layout.pids if k[0] == "pid" and k[2] == w.rank), ("rank", w.rank))
    return found or layout.of_stage(w.stage) or (("stage", w.stage) if w.stage is not None else ("unplaced",))


def add_utilization(out: ExportTrace, report: Report, layout: _Layout) -> None:
    """Fraction of stages computing at each instant (from the passes); without passes, each device lane's busy
    fraction over its window, under its rank."""
    if report.timeline:
        _stage_counter(out, report)
        return
    for lane in report.lanes:
        if lane.kind == "gpu" and lane.stream is None:
            gkey = layout.of_lane(lane.lane) or ("file", lane.lane)
            name = f"GPU {lane.device} utilization" if lane.device is not None else f"{lane.lane} utilization"
            track = layout.child(gkey, ("util", lane.lane), name, 0, description=lane.lane, counter=True)
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
