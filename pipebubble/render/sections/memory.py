"""The memory section as strings and one drawing: each device's allocator peak and each pipeline stage's static
bytes plus its micro-batches in flight (``report.memory``), as facts, tables and an inline SVG of the allocated
bytes over time, one small multiple per stage (else per device) on one scale. Only formatting and layout: every
number is read from the ``Memory`` as it is.

Times count from ``origin_ns``: a renderer passes the timeline's origin so that a peak's time reads like a
wait's; without one they count from the memory's earliest point.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

from pipebubble.render import axis
from pipebubble.render.cells import Table, num, share, shorten, size, time
from pipebubble.report.memory import HOW_TO_RECORD, Memory, MemoryDevice, MemoryStage

ROWS_DRAWN = 32  # small multiples in the drawing (the largest peaks); the tables list every device and stage
EVERY = "markdown, html or json list every device"
# the drawing's own units (it scales to the page): the y-axis' labels left of a plot, a row, a plot inside a row,
# the drawing's caption, the x-axis under the rows, right of the plots; GAP: above a plot, the row's name
LABEL_W, ROW_H, GAP, PLOT_H, TOP_H, RIGHT = 70, 80, 20, 56, 20, 20
AXIS_H = axis.TICK + 11 + axis.LINE_H + 8
LINE, AREA, PEAK, STATIC = "#0072b2", "#56b4e9", "#d55e00", "#555555"  # Okabe–Ito, as the timeline's colours


def earliest(memory: Memory) -> int:
    """The memory's earliest point: of its timelines and peaks (0 when it holds none)."""
    times = [point[0] for d in memory.devices for point in d.timeline]
    times += [d.peak_at_ns for d in memory.devices] + [st.peak_at_ns for st in memory.stages]
    return min(times, default=0)


def memory_facts(memory: Memory | None, origin_ns: int | None = None, unit: str = "ms") -> list[str]:
    """One line per fact: the events read, the largest peak (where, when, of what capacity), the devices whose
    totals count from the trace's start, each stage's peak as static + in flight × per micro-batch, the notes.
    No memory: how to record allocator events."""
    if memory is None:
        return ["memory: not measured (no allocator events); record them with " + HOW_TO_RECORD]
    zero = earliest(memory) if origin_ns is None else origin_ns
    count = len(memory.devices)
    lines = [f"memory: {memory.events:,} allocator events read on {count:,} device{'s' * (count != 1)}"]
    top = max(memory.devices, key=lambda d: d.peak_bytes, default=None)
    lines += [_largest(top, zero, unit)] if top is not None else []
    unseen = sum(d.baseline == "trace" for d in memory.devices)
    lines += [f"{unseen:,} of {count:,} devices count from the trace's start (memory held before it is unseen):"
              " their peaks are a floor"] if unseen else []
    lines += [_stage_fact(st, zero, unit) for st in memory.stages]
    return lines + [f"note: {n}" for n in memory.notes]


def _largest(d: MemoryDevice, zero: int, unit: str) -> str:
    capacity = f" ({share(d.peak_bytes, d.capacity_bytes)} of {size(d.capacity_bytes)})" if d.capacity_bytes else ""
    reserved = f"; reserved peak {size(d.reserved_peak_bytes)}" if d.reserved_peak_bytes is not None else ""
    return (f"largest peak: {size(d.peak_bytes)} allocated{capacity} on {d.lane} at"
            f" {time(d.peak_at_ns - zero, unit)} {unit}{reserved}")


def _stage_fact(st: MemoryStage, zero: int, unit: str) -> str:
    """``stage 1: peak 16.3 GiB (at 120.00 ms): static 10.0 GiB, 3 micro-batches in flight holding 2.0 GiB
    each``: the peak as measured, its parts as the analysis found them (``report.memory``; a backward's
    transient allocations make up the rest)."""
    at = f" (at {time(st.peak_at_ns - zero, unit)} {unit})"
    if st.per_microbatch_bytes is None or st.inflight_at_peak is None:
        return (f"stage {st.stage}: static {size(st.static_bytes)}, {size(st.peak_bytes)} at peak{at}; bytes per"
                " micro-batch not measured")
    schedule = f"; the schedule holds at most {st.expected_inflight}" if st.expected_inflight is not None else ""
    return (f"stage {st.stage}: peak {size(st.peak_bytes)}{at}: static {size(st.static_bytes)}, "
            f"{st.inflight_at_peak} micro-batch{'es' * (st.inflight_at_peak != 1)} in flight holding"
            f" {size(st.per_microbatch_bytes)} each{schedule}")


def shown(report) -> bool:
    """Whether a report has a memory section: allocator events were read, or it is a pipeline (whose what-if
    rows are then "not measured", and the section says how to record them)."""
    return report.memory is not None or report.pipeline is not None


def memory_tables(memory: Memory, origin_ns: int | None = None, unit: str = "ms",
                  limit: int | None = None) -> list[Table]:
    """The devices table and, for a pipeline, the stages table (a table without rows is left out); ``limit``:
    at most that many device rows, with a note of how many more."""
    zero = earliest(memory) if origin_ns is None else origin_ns
    tables = [device_table(memory, zero, unit, limit)] + ([stage_table(memory, zero, unit)] if memory.stages else [])
    return [t for t in tables if t.rows]


def device_table(memory: Memory, origin_ns: int, unit: str = "ms", limit: int | None = None) -> Table:
    """One row per device, in report order: its allocated peak, when, the allocator's reserved peak, the
    device's capacity and the peak's share of it, the events read and what its totals count from."""
    shown = memory.devices if limit is None else memory.devices[:limit]
    rows = [[d.lane, size(d.peak_bytes), time(d.peak_at_ns - origin_ns, unit), size(d.reserved_peak_bytes),
             size(d.capacity_bytes), share(d.peak_bytes, d.capacity_bytes), num(d.events), d.baseline]
            for d in shown]
    hidden = len(memory.devices) - len(shown)
    notes = (f"{hidden:,} more devices not shown: {EVERY}",) if hidden else ()
    return Table("Memory per device (peak: the largest total allocated, at: when first reached; reserved: with"
                 " the allocator's cache; baseline: allocator = its own totals, trace = sums since the trace began)",
                 ["lane", "peak", f"at {unit}", "reserved peak", "capacity", "of capacity", "events", "baseline"],
                 rows, frozenset(range(1, 7)), notes, drop=("baseline", "events", "reserved peak", f"at {unit}"))


def stage_table(memory: Memory, origin_ns: int, unit: str = "ms") -> Table:
    """One row per stage: its peak and when, the static part, one micro-batch's bytes (what a backward frees,
    a median), what the step keeps to its end per forward, the micro-batches in flight at the peak against
    what the schedule holds, capacity."""
    rows = [[f"s{st.stage}", size(st.peak_bytes), time(st.peak_at_ns - origin_ns, unit), size(st.static_bytes),
             size(st.per_microbatch_bytes), size(st.kept_per_microbatch_bytes), num(st.forwards_measured),
             num(st.inflight_at_peak), num(st.expected_inflight), size(st.capacity_bytes),
             share(st.peak_bytes, st.capacity_bytes)]
            for st in memory.stages]
    return Table("Memory per stage (static: held before the step's first forward; per micro-batch: from its"
                 " forward until its backward frees it, the median a backward frees; kept: held to the step's end,"
                 " per forward; expected: the most the schedule holds, GPipe m, 1F1B p−s)",
                 ["stage", "peak", f"at {unit}", "static", "per micro-batch", "kept", "forwards",
                  "in flight at peak", "expected", "capacity", "of capacity"],
                 rows, frozenset(range(1, 11)), drop=("forwards", f"at {unit}", "kept", "capacity"))


@dataclass(frozen=True)
class Row:
    """One small multiple: its label (and the lane it draws, when a stage), the points, the peak, the static
    level (stages only)."""

    label: str
    lane: str
    points: list[list[int]]
    peak_bytes: int
    peak_at_ns: int
    static_bytes: int | None = None


def small_multiples(memory: Memory) -> list[Row]:
    """Per stage, the timeline of its device with the largest peak (the one its peak is on), else per device."""
    if not memory.stages:
        return [Row(d.lane, "", d.timeline, d.peak_bytes, d.peak_at_ns) for d in memory.devices]
    by_lane = {d.lane: d for d in memory.devices}
    out = []
    for st in memory.stages:
        device = max((by_lane[lane] for lane in st.lanes if lane in by_lane), key=lambda d: d.peak_bytes,
                     default=None)
        out.append(Row(f"s{st.stage}", device.lane if device else "", device.timeline if device else [],
                       st.peak_bytes, st.peak_at_ns, st.static_bytes))
    return out


def memory_svg(memory: Memory, width: int = 1000, origin_ns: int | None = None, limit: int = ROWS_DRAWN) -> str:
    """The allocated bytes over time as an inline SVG: one row per stage (else per device), the largest ``limit``
    peaks in report order, each a step area with its peak marked and labelled and, for a stage, its static
    level dashed; one byte scale on every row's y-axis (ticks in 1-2-5 steps of a binary unit) and one x-axis
    of the time from ``origin_ns`` (without one, from the earliest point) in the unit its ticks need."""
    every = small_multiples(memory)
    keep = sorted(sorted(range(len(every)), key=lambda i: -every[i].peak_bytes)[:limit])
    shown = [every[i] for i in keep]
    frame = Frame.of(shown, max(width, LABEL_W + 100), earliest(memory) if origin_ns is None else origin_ns,
                     "the timeline's start" if origin_ns is not None else "the earliest point")
    height = TOP_H + ROW_H * len(shown) + AXIS_H + (16 if len(every) > len(shown) else 0)
    what = "stage" if memory.stages else "device"
    caption = _caption(what) if shown else "no device timeline to draw"
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {frame.width} {height}" width="100%"'
           f' preserveAspectRatio="xMinYMin meet" role="img" aria-label="memory timeline" font-family="monospace"'
           ' font-size="12">',
           f'<text x="4" y="14">{escape(caption)}</text>']
    for i, row in enumerate(shown):
        out += _row(row, frame, TOP_H + i * ROW_H)
    out += frame.axis(TOP_H + ROW_H * len(shown) + 4) if shown else []
    if len(every) > len(shown):
        out.append(f'<text x="4" y="{height - 4}">{len(every) - len(shown):,} more {what}s not drawn (the'
                   f" {len(shown):,} largest peaks are; the tables list every one)</text>")
    return "\n".join([*out, "</svg>"])


def _caption(what: str) -> str:
    """What the drawing shows, in its first line (the page around it may have no legend)."""
    if what == "stage":
        return ("allocated bytes over time, one row per stage (its device with the largest peak), one scale;"
                " dot: peak; dashed: static")
    return "allocated bytes over time, one row per device, one scale; dot: peak"


@dataclass(frozen=True)
class Frame:
    """Where the rows draw: the time span every row shares, the byte scale (its top the first tick at or above
    the highest level), the drawing's width, time zero and what it is."""

    start: int
    end: int
    scale: axis.Scale
    width: int
    origin_ns: int
    zero: str = "the earliest point"

    @property
    def top(self) -> float:
        return self.scale.hi

    @staticmethod
    def of(shown: list[Row], width: int, origin_ns: int, zero: str = "the earliest point") -> Frame:
        times = [p[0] for r in shown for p in r.points] + [r.peak_at_ns for r in shown]
        levels = [p[1] for r in shown for p in r.points] + [r.peak_bytes for r in shown]
        levels += [r.static_bytes for r in shown if r.static_bytes is not None]
        start = min(times, default=origin_ns)
        end = max(times, default=start)
        # points at one instant: drawn over a millisecond, so the axis has ticks to read
        return Frame(start, end if end > start else start + 1_000_000, axis.bytes_scale(max(levels, default=0)),
                     width, origin_ns, zero)

    def x(self, t: int) -> float:
        return LABEL_W + (self.width - LABEL_W - RIGHT) * (t - self.start) / max(self.end - self.start, 1)

    def y(self, level: int, y0: int) -> float:
        return y0 + GAP + PLOT_H * (1 - max(level, 0) / self.top)

    def axis(self, y: int) -> list[str]:
        """The x-axis under the rows: the time from the origin, its ticks in the unit they need."""
        right = self.width - RIGHT
        scale = axis.time_scale(self.start - self.origin_ns, self.end - self.origin_ns, axis.count_for(right - LABEL_W))
        return axis.x_axis(scale, lambda t: self.x(t + self.origin_ns), y, LABEL_W, right, f"time from {self.zero}",
                           self.width)


def _row(row: Row, frame: Frame, y0: int) -> list[str]:
    """A row's name above its plot, its y-axis (the byte scale), its step area and line, its static level and
    its peak."""
    room = int((frame.width - RIGHT - LABEL_W) // axis.CHAR_W)  # characters of the name line
    name = [_label(row.label if row.lane else shorten(row.label, room), row.label, LABEL_W, y0 + GAP - 6, "#222")]
    if row.lane:
        at = LABEL_W + axis.width(row.label + "  ")
        name.append(_label(shorten(row.lane, max(room - len(row.label) - 2, 8)), row.lane, at, y0 + GAP - 6, STATIC))
    scale = axis.y_axis(frame.scale, lambda v: frame.y(v, y0), LABEL_W, frame.y(frame.top, y0), frame.y(0, y0),
                        grid_to=frame.width - RIGHT)
    return [*name, *scale, *_steps(row, frame, y0), *_static(row, frame, y0), _peak(row, frame, y0)]


def _label(text: str, title: str, x: float, y: int, fill: str) -> str:
    """A row's name (a lane's cut only past the drawing's width), the whole of it in its tooltip."""
    return f'<g><title>{escape(title)}</title><text x="{x:.1f}" y="{y}" fill="{fill}">{escape(text)}</text></g>'


def _steps(row: Row, frame: Frame, y0: int) -> list[str]:
    """The allocated total as steps: each point's level holds until the next point."""
    points = sorted(row.points)
    if not points:
        return []
    x0, y_first, base = frame.x(points[0][0]), frame.y(points[0][1], y0), frame.y(0, y0)
    steps = "".join(f" H{frame.x(t):.1f} V{frame.y(level, y0):.1f}" for t, level in points[1:])
    line = f"M{x0:.1f},{y_first:.1f}{steps}"
    area = f"M{x0:.1f},{base:.1f} V{y_first:.1f}{steps} V{base:.1f} Z"
    return [f'<path d="{area}" fill="{AREA}" fill-opacity="0.35" stroke="none"/>',
            f'<path d="{line}" fill="none" stroke="{LINE}" stroke-width="1.2"/>']


def _static(row: Row, frame: Frame, y0: int) -> list[str]:
    """A stage's static bytes as a dashed level across its row, labelled at the right under the line (over it
    where the line is the plot's floor)."""
    if row.static_bytes is None:
        return []
    y = frame.y(row.static_bytes, y0)
    text = f"static {size(row.static_bytes)}"
    right = frame.width - RIGHT
    return [f'<line x1="{LABEL_W}" y1="{y:.1f}" x2="{frame.width - RIGHT}" y2="{y:.1f}" stroke="{STATIC}"'
            f' stroke-dasharray="4 3"><title>{escape(row.label)}: {text} (held with no micro-batch in flight)'
            f'</title></line><text x="{axis.inside(right, text, LABEL_W, right, "end"):.1f}"'
            f' y="{y + 12 if y + 12 <= frame.y(0, y0) else y - 3:.1f}" text-anchor="end" fill="{STATIC}">{text}</text>']


def _peak(row: Row, frame: Frame, y0: int) -> str:
    """The peak as a dot with its size beside it, inside the plot: right of the dot, else left of it; above it
    where the plot has room, else below it."""
    x, y = frame.x(row.peak_at_ns), frame.y(row.peak_bytes, y0)
    at = f"{time(row.peak_at_ns - frame.origin_ns)} ms"
    text = f"peak {size(row.peak_bytes)}"
    tx, anchor = axis.beside(x, text, LABEL_W + 2, frame.width - RIGHT, 5)
    ty = y - 5 if y - 15 >= frame.y(frame.top, y0) else y + 14
    return (f'<g><title>{escape(row.label)}: {text} at {at}</title><circle cx="{x:.1f}" cy="{y:.1f}" r="3"'
            f' fill="{PEAK}"/><text x="{tx:.1f}" y="{ty:.1f}" text-anchor="{anchor}" fill="{PEAK}">{text}</text></g>')
