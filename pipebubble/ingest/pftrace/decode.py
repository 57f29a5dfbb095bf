"""TracePackets to span columns: track descriptors, interned names per sequence, TrackEvent slices matched
begin to end per track, and each track's lane (``ingest/pftrace``'s docstring says what is read and how)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from pipebubble import spans

_SLICE_BEGIN, _SLICE_END, _INSTANT, _COUNTER = 1, 2, 3, 4
_SEQ_CLEARED = 1
_OVERLAY = "pipebubble."  # categories of the export's passes, waits and critical path
_WANTED = {"kind": "kind", "correlation": "correlation", "external_id": "external_id",
           "External id": "external_id", "microbatch": "microbatch", "phase": "phase"}
_TEXT = ("kind", "phase")
_SCALARS = ("int_value", "uint_value", "string_value")
_STREAM_DESC = re.compile(r"^(?P<lane>.+)/stream(?P<stream>-?\d+)$")
_GPU_IN_LANE = re.compile(r"/gpu(-?\d+)$")
_PID_IN_LANE = re.compile(r"(?:^|/)pid(-?\d+)(?:/|$)")
_TID_IN_LANE = re.compile(r"/tid(-?\d+)$")
_THREAD_NAME = re.compile(r"thread (-?\d+)$")
_RANK_IN_LANE = re.compile(r"^rank(\d+)/")


class Decoder:
    """Packets to columns: one list per span column, the slices' begins matched to their ends per track."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events = 0
        self.skipped: Counter[str] = Counter()
        self.warnings: list[str] = []
        self.tracks: dict[int, dict] = {}
        self.interned: dict[int, tuple[dict, dict, dict]] = {}  # sequence -> names, categories, annotation names
        self.default_track: dict[int, int] = {}
        self.open: dict[int, list[int]] = {}
        self.process_names: dict[str, str] = {}  # by pid, as the JSON reader keys them
        self.thread_names: dict[str, str] = {}  # by "pid/tid"
        # columns
        self.track: list[int] = []
        self.name: list[str | None] = []
        self.cat: list[str | None] = []
        self.start: list[int] = []
        self.end: list[int | None] = []
        self.args: dict[str, list] = {k: [] for k in set(_WANTED.values())}

    def packet(self, p) -> None:
        seq = p.trusted_packet_sequence_id
        if p.sequence_flags & _SEQ_CLEARED or p.incremental_state_cleared:
            self.interned[seq] = ({}, {}, {})
        if p.HasField("trace_packet_defaults"):
            d = p.trace_packet_defaults
            if d.HasField("track_event_defaults") and d.track_event_defaults.HasField("track_uuid"):
                self.default_track[seq] = d.track_event_defaults.track_uuid
        if p.HasField("interned_data"):
            tables = self.interned.setdefault(seq, ({}, {}, {}))
            data = p.interned_data
            entries_of = (data.event_names, data.event_categories, data.debug_annotation_names)
            for table, entries in zip(tables, entries_of, strict=True):
                for e in entries:
                    table[e.iid] = e.name
        if p.HasField("track_descriptor"):
            self.describe(p.track_descriptor)
        if p.HasField("track_event"):
            self.events += 1
            self.event(p, p.track_event, seq)
        elif not (p.HasField("track_descriptor") or p.HasField("interned_data")):
            self.skipped["other_packet"] += 1

    def describe(self, d) -> None:
        info: dict = {"name": d.name or None, "parent": d.parent_uuid if d.HasField("parent_uuid") else None,
                      "description": d.description or None, "pid": None, "tid": None, "counter": d.HasField("counter")}
        if d.HasField("process"):
            info["pid"] = d.process.pid
            if d.process.process_name:
                self.process_names[str(d.process.pid)] = d.process.process_name
                info["name"] = info["name"] or d.process.process_name
        if d.HasField("thread"):
            info["pid"], info["tid"] = d.thread.pid, d.thread.tid
            if d.thread.thread_name:
                self.thread_names[f"{d.thread.pid}/{d.thread.tid}"] = d.thread.thread_name
                info["name"] = info["name"] or d.thread.thread_name
        self.tracks[d.uuid] = info

    def event(self, p, e, seq: int) -> None:
        kind = e.type
        track = e.track_uuid or self.default_track.get(seq)  # uuid 0 is no track
        if kind == _SLICE_END:
            stack = self.open.get(track)
            if not stack:
                self.skipped["unmatched_end"] += 1
                return
            i = stack.pop()
            if i < 0:  # a begin not kept (already counted)
                return
            ts = p.timestamp
            if ts < self.start[i] or ts >= spans.TIME_LIMIT_NS:
                self.skipped["bad_time"] += 1
                self.end[i] = -1  # dropped when the table is made
            else:
                self.end[i] = ts
            return
        legacy = e.legacy_event.phase if kind == 0 and e.HasField("legacy_event") else None
        complete = legacy == ord("X")
        if kind == _INSTANT or legacy in (ord("i"), ord("I")):
            self.skipped["instant"] += 1
            return
        if kind == _COUNTER:
            self.skipped["counter"] += 1
            return
        if kind != _SLICE_BEGIN and not complete:
            self.skipped["unsupported_event"] += 1
            return
        if track is None:
            self.skipped["no_track"] += 1
            if kind == _SLICE_BEGIN:
                self.open.setdefault(None, []).append(-1)  # nothing to end, but keep the stack balanced
            return
        names, cats, ann_names = self.interned.get(seq) or ({}, {}, {})
        if e.name_iid:
            name = names.get(e.name_iid)
        elif e.name:
            name = e.name
        elif complete and e.legacy_event.HasField("name_iid"):
            name = names.get(e.legacy_event.name_iid)
        else:
            name = None
        cat = (cats.get(e.category_iids[0]) if e.category_iids else e.categories[0] if e.categories else None)
        ts = p.timestamp
        if ts >= spans.TIME_LIMIT_NS:
            self.skipped["out_of_range"] += 1
            if kind == _SLICE_BEGIN:
                self.open.setdefault(track, []).append(-1)
            return
        found = dict.fromkeys(self.args)
        for a in e.debug_annotations:
            iid = a.name_iid
            key = _WANTED.get(ann_names.get(iid) if iid else a.name)
            if key is None or found[key] is not None:
                continue
            which = a.WhichOneof("value")
            value = getattr(a, which) if which in _SCALARS else None
            found[key] = value if key in _TEXT else _as_int(value)
        i = len(self.start)
        self.track.append(track)
        self.name.append(name)
        self.cat.append(cat)
        self.start.append(ts)
        for k, col in self.args.items():
            col.append(found[k])
        if complete:
            dur = e.legacy_event.duration_us * 1000
            self.end.append(ts + dur if ts + dur < spans.TIME_LIMIT_NS else -1)
        else:
            self.end.append(None)
            self.open.setdefault(track, []).append(i)

    def table(self, rank: int):
        import polars as pl

        from pipebubble.ingest.json.spans import CATEGORY_KINDS, DEVICE_KINDS, HOST_SYNC

        unclosed = sum(1 for stack in self.open.values() for i in stack if i >= 0)
        if unclosed:
            self.skipped["unclosed"] += unclosed
        raw = pl.DataFrame({"track": self.track, "name": self.name, "cat": self.cat, "start": self.start,
                            "end": self.end, **{f"_{k}": v for k, v in self.args.items()}},
                           schema={"track": pl.Int64, "name": pl.String, "cat": pl.String, "start": pl.Int64,
                                   "end": pl.Int64, "_kind": pl.String, "_correlation": pl.Int64,
                                   "_external_id": pl.Int64, "_microbatch": pl.Int64, "_phase": pl.String})
        overlay = pl.col("cat").str.starts_with(_OVERLAY).fill_null(False)
        self._count("pipebubble_overlay", raw.filter(overlay).height)
        raw = raw.filter(~overlay)
        bad = pl.col("end").is_null() | (pl.col("end") < 0)
        raw = raw.filter(~bad)  # unclosed and bad-time slices, already counted
        if not raw.height:
            return spans.empty()
        tracks = self.track_table(rank)
        unknown = ~pl.col("track").is_in(tracks["track"].implode())
        self._count("unknown_track", raw.filter(unknown).height)
        raw = raw.filter(~unknown).join(tracks, on="track", how="left", maintain_order="left")
        ints = {c: pl.col(f"_{c}") for c in ("correlation", "external_id", "microbatch")}
        known = pl.col("cat").str.to_lowercase().replace_strict(CATEGORY_KINDS, default="cpu_op")
        by_cat = (pl.when(pl.col("name").str.starts_with("ProfilerStep#")).then(pl.lit("step"))
                  .when((known == "kernel") & pl.col("name").str.contains(spans.COMM_KERNELS)).then(pl.lit("comm"))
                  .when((known == "annotation") & pl.col("name").str.contains(spans.COLLECTIVE_RANGES))
                  .then(pl.lit("comm"))
                  .when((known == "runtime") & pl.col("name").str.contains(HOST_SYNC)).then(pl.lit("sync"))
                  .otherwise(known))
        given = pl.when(pl.col("_kind").is_in(list(spans.KINDS))).then(pl.col("_kind"))
        frame = raw.with_columns(kind=pl.coalesce(given, by_cat), **ints)
        # GPU work on a track of no known device: the device its process id names (as in Chrome JSON).
        to_gpu = pl.col("kind").is_in(list(DEVICE_KINDS)) & pl.col("device").is_null() & pl.col("pid").is_not_null()
        fits = pl.col("pid").is_between(-spans.INT32, spans.INT32 - 1)
        frame = frame.with_columns(
            device=pl.when(to_gpu & fits).then(pl.col("pid")).otherwise(pl.col("device")),
            stream=pl.when(to_gpu & fits).then(pl.col("tid")).otherwise(pl.col("stream")),
            lane=pl.when(to_gpu & fits).then(pl.format("rank{}/gpu{}", pl.col("rank"), pl.col("pid")))
            .otherwise(pl.col("lane")),
            pid=pl.when(to_gpu & fits).then(None).otherwise(pl.col("pid")),
            tid=pl.when(to_gpu & fits).then(None).otherwise(pl.col("tid")),
        )
        oob = (pl.col("microbatch").is_not_null() & ~pl.col("microbatch").is_between(-spans.INT32, spans.INT32 - 1))
        frame = frame.with_columns(microbatch=pl.when(oob).then(None).otherwise(pl.col("microbatch")),
                                   source=pl.lit(str(self.path)))
        frame = frame.with_columns(phase=pl.col("_phase"))
        return spans.conform(frame)

    def _count(self, reason: str, n: int) -> None:
        if n:
            self.skipped[reason] += n

    def track_table(self, rank: int):
        """Per track: rank, pid, tid, device, stream and lane (``rank0/gpu0``, ``rank0/pid1/tid2``)."""
        import polars as pl

        rows = []
        for uuid, info in self.tracks.items():
            if info["counter"]:
                continue
            rows.append({"track": uuid, **self.place(uuid, info, rank)})
        schema = {"track": pl.Int64, "rank": pl.Int64, "pid": pl.Int64, "tid": pl.Int64, "device": pl.Int64,
                  "stream": pl.Int64, "lane": pl.String}
        table = pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)
        fits = pl.col("rank").is_between(0, spans.INT32 - 1) & pl.col("device").is_between(
            -spans.INT32, spans.INT32 - 1).fill_null(True)
        bad = table.filter(~fits.fill_null(True))
        if bad.height:
            self.warnings.append(f"{self.path}: {bad.height} tracks with a rank or device beyond Int32, not read")
        return table.filter(fits.fill_null(True))

    def place(self, uuid: int, info: dict, rank: int) -> dict:
        desc, name = info["description"], info["name"] or ""
        if desc and "/" in desc:  # pipebubble's export: the lane id
            stream_m = _STREAM_DESC.match(desc)
            lane, stream = (stream_m.group("lane"), int(stream_m.group("stream"))) if stream_m else (desc, None)
            gpu = _GPU_IN_LANE.search(lane)
            pid = _PID_IN_LANE.search(lane)
            tid = _TID_IN_LANE.search(lane) or (_THREAD_NAME.search(name) if not gpu else None)
            r = _RANK_IN_LANE.match(lane)
            return {"rank": int(r.group(1)) if r else None, "pid": int(pid.group(1)) if pid else None,
                    "tid": int(tid.group(1)) if tid else None, "device": int(gpu.group(1)) if gpu else None,
                    "stream": stream if gpu else None, "lane": lane}
        pid, tid, up = info["pid"], info["tid"], info["parent"]
        seen = {uuid}
        while pid is None and up is not None and up in self.tracks and up not in seen:
            seen.add(up)
            pid, up = self.tracks[up]["pid"], self.tracks[up]["parent"]
        if tid is not None:
            lane = f"rank{rank}/pid{pid}/tid{tid}"
        elif pid is not None:
            lane = f"rank{rank}/pid{pid}/{name or f'track{uuid}'}"
        else:
            lane = f"rank{rank}/{name or f'track{uuid}'}"
        return {"rank": rank, "pid": pid, "tid": tid, "device": None, "stream": None, "lane": lane}


def _as_int(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if -spans.INT64 <= value < spans.INT64 else None
    if isinstance(value, str) and value.lstrip("-").isdigit() and len(value) < 19:
        return int(value)
    return None
