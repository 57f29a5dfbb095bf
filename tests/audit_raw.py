"""An independent reading of the findings' figures from the raw trace files, to audit pipebubble's against.

Reads Kineto/Chrome JSON (gzip + json, ``parse_float=Decimal``) and Nsight Systems SQLite exports (sqlite3)
with plain Python, building on ``independent`` (its time rules, GPU operations, GPU steps and breakdown rows).
Nothing here imports pipebubble's analysis: every rule below is written from the definitions the findings'
module docstrings state (the worth of each kind) and from what an engineer reading the raw events would do.

The idle account (per GPU, ``idle_account``): every gap between the GPU's merged operations is followed to
the operation that ended it (the one starting at the gap's end; among equals the lowest correlation id), to
the runtime call that launched it (correlation id; Nsight: per process) and to that call's host thread. The
thread's time is cut into segments, each instant taking the first class that covers it:

  peer (a collective or send/recv range) > data_loader > sync_stall (a synchronize) > blocking_copy (a copy
  or memset call that is not ``Async``, or an ``Async`` one whose copy ended before it returned) > allocator
  (malloc/free) > launch (any other runtime call) > cpu_ops (an operator) > python (nothing traced).

A gap is then split:
  1. the blocking call (sync_stall, blocking_copy, allocator) or wait (peer, data_loader) the thread was in
     when the GPU ran dry, or (a blocking call) had returned from less than max(its length, 50 µs) before:
     the gap up to that reach is the call's (the refill after a blocking call); a call of any other name
     that began >= 100 µs before the gap and returned within 50 µs after it began waited for the GPU: a
     sync_stall;
  2. from there to the launch: what the thread was doing, segment by segment;
  3. from the launch to 50 µs after its call returned: ``launch``;
  4. the rest (the operation queued but not running): the thread's blocking calls over it, else
     ``dependency``. No launch known: ``unknown``.

Where an engineer reads the events otherwise, a variant says so: ``idle_account(queued_blocks=False)`` (a
blocking call the thread made after launching an operation does not hold it: its queued time is
``dependency``), ``one_off_launches`` (a launch call 100x the median is a kernel's first load, not launch
overhead).

Beside the account: the per-step rules of the other GPU-time findings (busiest GPU, whole-window facts
brought to a step), communication kernels of two ranks paired by end (``comm_pairs``, ``last_arrivals``), a
gloo pipeline's receives matched with their sends (``p2p_transfers``) and a MegaScan trace's stage time
(``megascan_busy``).
"""

from __future__ import annotations

import bisect
import re
import sqlite3
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import independent as ind

BLOCKED_NS = 100_000
RETURN_NS = 50_000
LATENCY_NS = 50_000
TINY_NS = 10_000
TINY_GAP_NS = 1_000_000

CLASSES = ("peer", "data_loader", "sync_stall", "blocking_copy", "allocator", "startup", "launch", "cpu_ops")
#: A launch this long loaded its kernel's code (a first launch), as a call that loads code does.
FIRST_LAUNCH_NS = 1_000_000
_STARTUP = re.compile(r"^(cu|cuda|hip)(Init|SetDevice|DeviceReset|DevicePrimaryCtxRetain|CtxCreate|ModuleLoad"
                      r"|LibraryLoad|ModuleGetFunction|LibraryGetKernel|GetDriverEntryPoint)"
                      r"|^(cublas|cublasLt|cudnn|cusparse|cusolver\w*|cufft|curand|rocblas|hipblas|hipblasLt|miopen)"
                      r"Create|^(nccl|rccl)CommInit")
BLOCKING = {"sync_stall", "blocking_copy", "allocator"}
WAITS = {"peer", "data_loader"}
_PEER = re.compile(r"^(gloo|nccl|mpi|ucc):|^c10d::|record_param_comms|^PP:\d+(SEND|RECV)_", re.I)
_LOADER = re.compile(r"dataloader|_next_data", re.I)
_SYNC = re.compile(r"synchroni[sz]e", re.I)
_COPY = re.compile(r"^(cuda|hip|cu)(Memcpy|Memset)", re.I)
_ALLOC = re.compile(r"^(cuda|hip|cu)(Mem)?(Malloc|Free|Alloc|HostAlloc|HostRegister|HostUnregister)", re.I)
_OPERATOR = re.compile(r"^[A-Za-z_][\w.]*::\w")
_OP_SUFFIX = re.compile(r",\s*(op_id|seq|sizes|input_op_ids)\s*=.*$")
_VERSION = re.compile(r"_v\d+$")
_LAUNCH_NAME = re.compile(r"launch", re.I)
#: Kernels that convert a tensor's layout (cuDNN's NCHW <-> NHWC), by function name.
LAYOUT = re.compile(r"nchwToNhwc|nhwcToNchw|nchw2nhwc|nhwc2nchw", re.I)
#: Host calls that launch a kernel.
LAUNCH_CALL = re.compile(r"^(cu|cuda|hip)(LaunchKernel|LaunchKernelEx|ExtModuleLaunchKernel|ModuleLaunchKernel)")
_HOST_CATS = {"cpu_op": "op", "user_annotation": "annotation", "python_function": "annotation",
              "cuda_runtime": "runtime", "cuda_driver": "runtime", "runtime": "runtime", "driver": "runtime"}


@dataclass(frozen=True)
class Span:
    """A host span: ``kind`` op, annotation or runtime; ``cls`` its class (None: labels time only)."""

    thread: tuple
    kind: str
    name: str
    start: int
    end: int
    cls: str | None = None


@dataclass(frozen=True)
class Call:
    thread: tuple
    name: str
    start: int
    end: int


@dataclass
class Raw:
    """A job read from its raw files: ``job`` (independent's GPU operations and steps), host spans per thread,
    the launching call of each GPU operation (key: (rank or pid, correlation)), host runtime calls."""

    job: ind.Job = field(default_factory=ind.Job)
    threads: dict[tuple, list[Span]] = field(default_factory=dict)
    launches: dict[tuple, Call] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)


def key(op: ind.Op) -> tuple | None:
    if op.correlation is None:
        return None
    return (op.rank if op.rank is not None else ("pid", op.pid), op.correlation)


def _classify(kind: str, name: str, held: bool, dur: int = 0) -> str | None:
    if kind in ("op", "annotation") and _PEER.search(name):
        return "peer"
    if kind in ("op", "annotation") and _LOADER.search(name):
        return "data_loader"
    if kind == "runtime":
        if _SYNC.search(name) and "wait" not in name.lower():
            return "sync_stall"
        if held or (_COPY.match(name) and "async" not in name.lower()) or name == "hipMemcpyWithStream":
            return "blocking_copy"
        if _ALLOC.match(name) and "async" not in name.lower():
            return "allocator"
        if _STARTUP.match(name) or (_LAUNCH_NAME.search(name) and dur >= FIRST_LAUNCH_NS):
            return "startup"
        return "launch"
    if kind == "op" or (kind == "annotation" and _OPERATOR.match(name)):
        return "cpu_ops"
    return None


def _finish(raw: Raw, host: list[tuple]) -> Raw:
    """Classify the host spans (``held`` copies known once every GPU op is read) and group them by thread."""
    copies = {key(o): o for o in raw.job.ops if o.cls in ("memcpy", "memset") and key(o) is not None}
    for thread, kind, name, start, end, k in host:
        held = kind == "runtime" and k in copies and copies[k].end <= end
        cls = _classify(kind, name, held, end - start)
        raw.threads.setdefault(thread, []).append(Span(thread, kind, name, start, end, cls))
    for spans in raw.threads.values():
        spans.sort(key=lambda s: (s.start, -s.end))
    return raw


def read_kineto(paths: list[Path]) -> Raw:
    raw, host = Raw(), []
    for position, path in enumerate(paths):
        doc = ind.load_json(path)
        events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
        base = int(doc.get("baseTimeNanoseconds") or 0) if isinstance(doc, dict) else 0
        rank = ind.kineto_rank(doc, path, position)
        ind_steps = raw.job.steps.setdefault(rank, {})
        starts = raw.job.launches.setdefault(rank, {})
        for e in events:
            if not isinstance(e, dict) or e.get("ph") != "X" or e.get("ts") is None or e.get("dur") is None:
                continue
            cat, name = str(e.get("cat") or "").lower(), e.get("name") or ""
            start = ind.ts_ns(e["ts"]) + base
            end = start + ind.dur_ns(e["dur"])
            args = e.get("args") if isinstance(e.get("args"), dict) else {}
            corr = args.get("correlation") if isinstance(args.get("correlation"), int) else None
            if cat in ind.GPU_CATEGORIES:
                kind = ind.GPU_CATEGORIES[cat]
                cls = ("comm" if ind._COMM.search(name) else "compute") if kind == "kernel" else kind
                raw.job.ops.append(ind.Op(f"rank{rank}/gpu{int(e['pid'])}", rank, None, int(e["pid"]), e.get("tid"),
                                          name, cls, start, end, corr))
            elif cat in _HOST_CATS:
                thread = (rank, e.get("pid"), e.get("tid"))
                kind = _HOST_CATS[cat]
                if kind == "runtime" and corr is not None:
                    starts.setdefault(corr, start)
                    raw.launches.setdefault((rank, corr), Call(thread, name, start, end))
                if kind == "runtime":
                    raw.calls.append(Call(thread, name, start, end))
                if name.startswith("ProfilerStep#"):
                    ind_steps[int(name.split("#", 1)[1])] = (start, end)
                host.append((thread, kind, name, start, end, (rank, corr) if corr is not None else None))
    return _finish(raw, host)


def read_nsys(path: Path) -> Raw:
    """Kernels, copies and memsets with their correlation ids; runtime calls and NVTX ranges per thread."""
    raw, host = Raw(), []
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        strings = dict(con.execute("SELECT id, value FROM StringIds"))
        for table, cls in (("KERNEL", None), ("MEMCPY", "memcpy"), ("MEMSET", "memset")):
            extra = "demangledName" if cls is None else "NULL"
            sql = (f"SELECT start, end, deviceId, streamId, globalPid, correlationId, {extra}"
                   f" FROM CUPTI_ACTIVITY_KIND_{table}")
            for start, end, device, stream, gpid, corr, name_id in con.execute(sql):
                pid = (gpid >> 24) & 0xFFFFFF
                name = strings.get(name_id, "") if cls is None else cls
                kind = cls or ("comm" if ind._COMM.search(name) else "compute")
                raw.job.ops.append(ind.Op(f"pid{pid}/gpu{device}", None, pid, device, stream, name, kind, start, end,
                                          corr))
        for start, end, gtid, corr, name_id in con.execute(
                "SELECT start, end, globalTid, correlationId, nameId FROM CUPTI_ACTIVITY_KIND_RUNTIME"):
            pid, tid = (gtid >> 24) & 0xFFFFFF, gtid & 0xFFFFFF
            name = _VERSION.sub("", strings.get(name_id, ""))
            thread = (None, pid, tid)
            raw.launches.setdefault((("pid", pid), corr), Call(thread, name, start, end))
            raw.calls.append(Call(thread, name, start, end))
            host.append((thread, "runtime", name, start, end, (("pid", pid), corr)))
        for start, end, text, text_id, gtid in con.execute(
                "SELECT start, end, text, textId, globalTid FROM NVTX_EVENTS WHERE end IS NOT NULL AND end >= start"):
            name = _OP_SUFFIX.sub("", text if text is not None else strings.get(text_id, "") or "")
            host.append(((None, (gtid >> 24) & 0xFFFFFF, gtid & 0xFFFFFF), "annotation", name, start, end, None))
    finally:
        con.close()
    return _finish(raw, host)


def read(paths: list[Path]) -> Raw:
    if len(paths) == 1 and str(paths[0]).endswith(".sqlite"):
        return read_nsys(paths[0])
    return read_kineto(paths)


# --------------------------------------------------------------------------- a thread's segments


@dataclass(frozen=True)
class Segment:
    start: int
    end: int
    cls: str  # one of CLASSES, or python
    op: str | None
    call: str | None


def segments(spans: list[Span]) -> list[Segment]:
    """The thread's time from its first span to its last as disjoint segments (module docstring), with the
    outermost operator and runtime call around each; before and after: python."""
    points = sorted({p for s in spans for p in (s.start, s.end)})
    out: list[Segment] = []
    active: list[Span] = []
    ordered = sorted(spans, key=lambda s: s.start)
    i = 0
    for lo, hi in zip(points, points[1:], strict=False):
        while i < len(ordered) and ordered[i].start <= lo:
            active.append(ordered[i])
            i += 1
        active = [s for s in active if s.end > lo]
        here = [s for s in active if s.start <= lo and s.end >= hi]
        found = {s.cls for s in here if s.cls}
        cls = next((c for c in CLASSES if c in found), "python")
        ops = [s for s in here if s.kind == "op" or (s.kind == "annotation" and s.cls == "cpu_ops")]
        op = _OP_SUFFIX.sub("", min(ops, key=lambda s: (s.start, -s.end)).name) if ops else None
        calls = [s for s in here if s.kind == "runtime"]
        call = min(calls, key=lambda s: (s.start, -s.end)).name if calls else None
        if cls in ("python", "cpu_ops", "peer", "data_loader"):
            call = None
        if out and out[-1].end == lo and (out[-1].cls, out[-1].op, out[-1].call) == (cls, op, call):
            out[-1] = Segment(out[-1].start, hi, cls, op, call)
        else:
            out.append(Segment(lo, hi, cls, op, call))
    return out


@dataclass(frozen=True)
class Thread:
    """A thread's segments and their starts (for bisecting)."""

    segs: list[Segment]
    starts: list[int]

    @classmethod
    def of(cls, spans: list[Span]) -> Thread:
        segs = segments(spans)
        return cls(segs, [s.start for s in segs])

    def meeting(self, lo: int, hi: int) -> list[Segment]:
        """The segments that meet [lo, hi), in order."""
        i = max(bisect.bisect_right(self.starts, lo) - 1, 0)
        out = []
        while i < len(self.segs) and self.segs[i].start < hi:
            if self.segs[i].end > lo:
                out.append(self.segs[i])
            i += 1
        return out

    def before(self, at: int):
        """The segments that began before ``at``, latest first."""
        for i in range(bisect.bisect_left(self.starts, at) - 1, -1, -1):
            yield self.segs[i]


EMPTY = Thread([], [])


def _met(thread: Thread, lo: int, hi: int, queued: bool) -> list[tuple[int, int, str, str | None, str | None]]:
    """[lo, hi) cut at the thread's segments: (start, end, cause, op, call); outside them, python (or, queued,
    dependency)."""
    out, at = [], lo
    for s in thread.meeting(lo, hi):
        a, b = max(lo, s.start), min(hi, s.end)
        if a > at:
            out.append((at, a, "dependency" if queued else "python", None, None))
        if queued and s.cls not in BLOCKING:
            out.append((a, b, "dependency", None, None))
        else:
            out.append((a, b, s.cls, s.op, s.call))
        at = b
    if at < hi:
        out.append((at, hi, "dependency" if queued else "python", None, None))
    return out


# --------------------------------------------------------------------------- the idle account


@dataclass(frozen=True)
class Piece:
    lane: str
    gap: int
    start: int
    end: int
    cause: str
    op: str | None
    call: str | None


def merged(ops: list[ind.Op]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for s, e in sorted((o.start, o.end) for o in ops):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def idle_account(raw: Raw, queued_blocks: bool = True) -> list[Piece]:
    """The pieces of every gap (module docstring). ``queued_blocks=False``: an engineer's reading of step 4,
    where the launching thread's blocking call cannot hold an operation it launched before the call began
    (the operation is ahead of the call in the GPU's queue): all queued time is ``dependency``."""
    lanes: dict[str, list[ind.Op]] = {}
    for op in raw.job.ops:
        lanes.setdefault(op.lane, []).append(op)
    threads = {t: Thread.of(spans) for t, spans in raw.threads.items()}
    pieces: list[Piece] = []
    for lane, ops in sorted(lanes.items()):
        by_start: dict[int, list[ind.Op]] = {}
        for op in ops:
            by_start.setdefault(op.start, []).append(op)
        busy = merged(ops)
        for g, ((_, gs), (ge, _)) in enumerate(zip(busy, busy[1:], strict=False)):
            if ge <= gs:
                continue
            ending = min(by_start[ge], key=lambda o: (o.correlation is None, o.correlation or 0))
            launch = raw.launches.get(key(ending)) if key(ending) else None
            found = [(gs, ge, "unknown", None, None)] if launch is None else gap_pieces(
                gs, ge, launch, threads.get(launch.thread, EMPTY), queued_blocks)
            pieces += [Piece(lane, g, *p) for p in found if p[1] > p[0]]
    return pieces


def gap_pieces(gs: int, ge: int, launch: Call, thread: Thread, queued_blocks: bool = True) -> list[tuple]:
    """The pieces (start, end, cause, op, call) of the gap [gs, ge) whose ending op ``launch`` launched from
    ``thread`` (module docstring)."""
    at, at_end = launch.start, launch.end
    out, start = [], gs
    held = next((s for s in thread.before(gs) if s.cls in BLOCKING | WAITS), None)
    if held is not None:
        reach = held.end + max(held.end - held.start, RETURN_NS) if held.cls in BLOCKING else held.end
        if gs < reach and (held.end <= at or held.cls in WAITS):
            start = min(ge, reach)
            out.append((gs, start, held.cls, held.op, held.call))
            held = True
        else:
            held = None
    if held is None:
        other = next((s for s in thread.before(gs) if s.cls == "launch" and s.call
                      and not _LAUNCH_NAME.search(s.call)), None)
        if other and other.start <= gs - BLOCKED_NS and gs <= other.end <= gs + RETURN_NS:
            start = min(ge, other.end + max(other.end - other.start, RETURN_NS))
            out.append((gs, start, "sync_stall", other.op, other.call))
    if start >= ge:
        return out
    if at >= start:
        out += _met(thread, start, at, False)
        latency_end = min(ge, max(at, at_end) + LATENCY_NS)
        mine = next((s for s in thread.meeting(at, at + 1) if s.start <= at), None)
        cause = "startup" if mine is not None and mine.cls == "startup" else "launch"
        out.append((at, latency_end, cause, mine.op if mine else None, launch.name))
        out += _queued(thread, latency_end, ge, queued_blocks)
    else:
        out += _queued(thread, start, ge, queued_blocks)
    return [p for p in out if p[1] > p[0]]


def _queued(thread: Thread, lo: int, hi: int, blocks: bool) -> list[tuple]:
    return _met(thread, lo, hi, True) if blocks else [(lo, hi, "dependency", None, None)]


# --------------------------------------------------------------------------- per step


def clip(pieces: list[Piece], lane: str, lo: int, hi: int) -> dict[str, int]:
    """Idle by cause of ``lane`` inside [lo, hi)."""
    out: dict[str, int] = {}
    for p in pieces:
        if p.lane == lane and p.end > lo and p.start < hi:
            out[p.cause] = out.get(p.cause, 0) + min(p.end, hi) - max(p.start, lo)
    return out


def step_groups(raw: Raw) -> list[list[tuple[str, int | None, dict]]]:
    """The breakdown rows grouped by step (each: (lane, step, row)); a job without steps: one group of each
    GPU's whole window."""
    rows = ind.breakdown(raw.job)
    stepped = {k: v for k, v in rows.items() if k[1] is not None}
    chosen = stepped or rows
    groups: dict[int | None, list] = {}
    for (lane, step), row in chosen.items():
        groups.setdefault(step, []).append((lane, step, row))
    # a step in which no GPU worked (a profile's cut-off last step) is none of the GPUs' steps
    worked = {k: g for k, g in groups.items() if any(r["window_ns"] > r["idle_ns"] for _, _, r in g)} or groups
    return [worked[k] for k in sorted(worked, key=lambda k: -1 if k is None else k)]


def step_ns(groups) -> int:
    return round(statistics.mean(max(r["window_ns"] for _, _, r in g) for g in groups))


def busiest(group):
    return max(group, key=lambda x: x[2]["window_ns"] - x[2]["idle_ns"])


def idle_worth(raw: Raw, pieces: list[Piece], causes: tuple[str, ...]) -> tuple[int, list[str]]:
    """The mean over steps of the idle of ``causes`` on each step's busiest GPU, and those GPUs."""
    values, lanes = [], []
    for group in step_groups(raw):
        lane, _, row = busiest(group)
        lo, hi = row["window_start_ns"], row["window_start_ns"] + row["window_ns"]
        by = clip(pieces, lane, lo, hi)
        values.append(sum(by.get(c, 0) for c in causes))
        lanes.append(lane)
    return round(statistics.mean(values)), list(dict.fromkeys(lanes))


def behind(pieces: list[Piece], lanes: list[str], causes: tuple[str, ...]) -> list[tuple]:
    """(lane, cause, op, call, ns) of ``causes`` on ``lanes`` over their whole windows, biggest first."""
    out: dict[tuple, int] = {}
    for p in pieces:
        if p.lane in lanes and p.cause in causes:
            k = (p.lane, p.cause, p.op, p.call)
            out[k] = out.get(k, 0) + p.end - p.start
    return sorted(((*k, ns) for k, ns in out.items()), key=lambda x: -x[-1])


def one_off_launches(raw: Raw, pieces: list[Piece], factor: int = 100) -> list[Piece]:
    """The ``launch`` pieces less the time inside launch calls more than ``factor`` x the median launch call
    (and their latency): a kernel's first launch loading its code, not launch overhead."""
    durations = sorted(c.end - c.start for c in raw.calls if LAUNCH_CALL.match(c.name))
    if not durations:
        return pieces
    limit = factor * statistics.median(durations)
    slow = [(c.start, c.end + LATENCY_NS) for c in raw.calls if LAUNCH_CALL.match(c.name) and c.end - c.start > limit]
    out = []
    for p in pieces:
        if p.cause != "launch":
            out.append(p)
            continue
        cut = [(max(p.start, lo), min(p.end, hi)) for lo, hi in slow if min(p.end, hi) > max(p.start, lo)]
        left = p.end - p.start - ind.union_length(cut)
        if left > 0:
            out.append(Piece(p.lane, p.gap, p.start, p.start + left, p.cause, p.op, p.call))
    return out


# --------------------------------------------------------------------------- whole-window facts


def whole_windows(groups, rows) -> dict[str, int]:
    stepped: dict[str, int] = {}
    for g in groups:
        for lane, step, row in g:
            if step is not None:
                stepped[lane] = stepped.get(lane, 0) + row["window_ns"]
    return {lane: max(row["window_ns"], stepped.get(lane, 0)) for (lane, step), row in rows.items() if step is None}


def on_step(total: int, row: dict, window: int) -> float:
    return total * min(row["window_ns"], window) / window


def busiest_lane(groups) -> str:
    work: dict[str, int] = {}
    for g in groups:
        for lane, _, row in g:
            work[lane] = work.get(lane, 0) + row["window_ns"] - row["idle_ns"]
    return max(sorted(work), key=work.get)


def tiny_gaps(ops: list[ind.Op]) -> tuple[int, int]:
    """Per lane's ops: (count, total) of the busy union's gaps whose closing op and opening op are both kernels
    under 10 µs, each at most 1 ms."""
    ordered = sorted(ops, key=lambda o: (o.start, o.end))
    count = total = 0
    end, last = None, None  # the busy period's end and the op that reached it
    for op in ordered:
        if end is not None and op.start > end:
            gap = op.start - end
            tiny = lambda o: o.cls in ("compute", "comm") and o.end - o.start < TINY_NS  # noqa: E731
            if gap <= TINY_GAP_NS and tiny(last) and tiny(op):
                count, total = count + 1, total + gap
        if end is None or op.end > end:
            end, last = op.end, op
    return count, total


def tiny_worth(raw: Raw) -> tuple[int, str, int, int]:
    """tiny_kernels' worth (``findings.kernels``' rule), its lane, and the job's tiny and all kernels."""
    groups, rows = step_groups(raw), ind.breakdown(raw.job)
    whole = whole_windows(groups, rows)
    lane = busiest_lane(groups)
    _, total = tiny_gaps([o for o in raw.job.ops if o.lane == lane])
    values = [min(round(on_step(total, row, whole[lane])), row["idle_ns"]) for g in groups for l_, _, row in g
              if l_ == lane]
    kernels = [o for o in raw.job.ops if o.cls in ("compute", "comm")]
    return round(statistics.mean(values)), lane, sum(o.end - o.start < TINY_NS for o in kernels), len(kernels)


def layout_worth(raw: Raw) -> tuple[int, int, int]:
    """layout_conversion's worth (g x busy + n x mean launch x (1 - busy) a step on the job's busiest GPU),
    and the conversions' count and time in the trace."""
    groups, rows = step_groups(raw), ind.breakdown(raw.job)
    whole = whole_windows(groups, rows)
    lane = busiest_lane(groups)
    conv = [o for o in raw.job.ops if o.cls == "compute" and LAYOUT.search(o.name.split("(")[0])]
    g_lane = sum(o.end - o.start for o in conv if o.lane == lane)
    n_lane = sum(1 for o in conv if o.lane == lane)
    launches = [c.end - c.start for c in raw.calls if LAUNCH_CALL.match(c.name)]
    mean_launch = sum(launches) / len(launches) if launches else 0.0
    values = []
    for g in groups:
        for l_, _, row in g:
            if l_ == lane:
                b = (row["window_ns"] - row["idle_ns"]) / row["window_ns"]
                gpu, n = round(on_step(g_lane, row, whole[lane])), round(on_step(n_lane, row, whole[lane]))
                values.append(round(gpu * b + n * mean_launch * (1 - b)))
    return round(statistics.mean(values)), len(conv), sum(o.end - o.start for o in conv)


def exposed_comm_worth(raw: Raw) -> int:
    return round(statistics.mean(min(r["comm_exposed_ns"] for _, _, r in g) for g in step_groups(raw)))


def exposed_copy_worth(raw: Raw) -> int:
    """The busiest GPU's exposed memory time x the copies' share of its memory-operation time, a step."""
    values = []
    for g in step_groups(raw):
        lane, _, row = busiest(g)
        mem = [o for o in raw.job.ops if o.lane == lane and o.cls in ("memcpy", "memset")]
        total = sum(o.end - o.start for o in mem)
        copies = sum(o.end - o.start for o in mem if o.cls == "memcpy")
        values.append(round(row["memory_exposed_ns"] * copies / total) if total else 0)
    return round(statistics.mean(values))


def comm_on_compute_stream(raw: Raw) -> tuple[int, dict[str, int]]:
    """The lanes whose compute stream (most compute time) runs communication kernels -> that stream, and the
    worth: per step the least over them of min(exposed communication, their communication there brought to the
    step), the mean."""
    groups, rows = step_groups(raw), ind.breakdown(raw.job)
    whole = whole_windows(groups, rows)
    compute: dict[str, dict] = {}
    comm: dict[str, dict] = {}
    for o in raw.job.ops:
        if o.stream is None or o.cls not in ("compute", "comm"):
            continue
        into = compute if o.cls == "compute" else comm
        per = into.setdefault(o.lane, {})
        per[o.stream] = per.get(o.stream, 0) + o.end - o.start
    shared = {}
    for lane, per in compute.items():
        main = max(per, key=lambda k: (per[k], -k))
        if comm.get(lane, {}).get(main, 0) > 0:
            shared[lane] = (main, comm[lane][main])
    values = []
    for g in groups:
        here = [min(r["comm_exposed_ns"], round(on_step(shared[l_][1], r, whole[l_])))
                for l_, _, r in g if l_ in shared]
        if here:
            values.append(min(here))
    return (round(statistics.mean(values)) if values else 0), {lane: s for lane, (s, _) in shared.items()}


# --------------------------------------------------------------------------- collectives across two ranks


def comm_pairs(raw: Raw, within_ns: int = 1_000_000) -> list[tuple[ind.Op, ind.Op]]:
    """Two GPUs' communication kernels paired by end (a collective's or send/recv's kernels are released
    together): each of the first lane's, in end order, with the nearest-ending unpaired one of the second
    within ``within_ns``."""
    comm: dict[str, list[ind.Op]] = {}
    for op in raw.job.ops:
        if op.cls == "comm":
            comm.setdefault(op.lane, []).append(op)
    first, second = sorted(comm)
    pairs, used = [], set()
    for x in sorted(comm[first], key=lambda o: o.end):
        near = [y for y in comm[second] if id(y) not in used and abs(y.end - x.end) <= within_ns]
        if near:
            y = min(near, key=lambda y: abs(y.end - x.end))
            used.add(id(y))
            pairs.append((x, y))
    return pairs


def last_arrivals(pairs) -> dict[str, tuple[int, int]]:
    """Per lane: (calls it arrived last to, the other's wait there summed): a kernel's start is its arrival."""
    out: dict[str, list[int]] = {}
    for x, y in pairs:
        late, early = (y, x) if y.start > x.start else (x, y)
        got = out.setdefault(late.lane, [0, 0])
        got[0] += 1
        got[1] += late.start - early.start
    return {lane: (n, ns) for lane, (n, ns) in out.items()}


# --------------------------------------------------------------------------- point-to-point between CPU stages

_PP_RANGE = re.compile(r"^PP:\d+(SEND|RECV)_")


def p2p_transfers(paths: list[Path]) -> dict[int, dict[str, int]]:
    """Per rank of a gloo pipeline (one Kineto file each): its receives' ``wait`` (before the matching send
    began) and ``transfer`` (the rest), over the receives that end inside one of its ProfilerSteps, each cut to
    that step, with the steps' count and the bytes received. An operation is its ``c10d::send`` /
    ``c10d::recv_`` call with the asynchronous ``gloo:`` range that starts inside it and a ``PP:`` range
    around it (first start to last end); its peer is the call's third input; sends and receives between two
    ranks match in order. Bytes: the tensor's dimensions x 4 (float32)."""
    ranks: dict[int, dict] = {}
    for path in paths:
        doc = ind.load_json(path)
        base = int(doc.get("baseTimeNanoseconds") or 0)
        rank = ind.kineto_rank(doc, path, 0)
        spans = []
        for e in doc["traceEvents"]:
            if isinstance(e, dict) and e.get("ph") == "X" and e.get("ts") is not None:
                start = ind.ts_ns(e["ts"]) + base
                spans.append((e["name"], start, start + ind.dur_ns(e["dur"]), e.get("args") or {}))
        ops = []
        around = [x for x in spans if x[0].startswith("gloo:") or _PP_RANGE.match(x[0])]
        for name, start, end, args in spans:
            if name not in ("c10d::send", "c10d::recv_"):
                continue
            direction = "send" if name == "c10d::send" else "recv"
            lo, hi = start, end
            for other, s, e, _ in around:
                if other == f"gloo:{direction}" and start <= s <= end:
                    hi = max(hi, e)
                if _PP_RANGE.match(other) and direction.upper() in other and s <= start and end <= e:
                    lo, hi = min(lo, s), max(hi, e)
            dims = args.get("Input Dims") or [[[]]]
            elements = 1
            for d in dims[0][0] if dims and dims[0] else []:
                elements *= d
            ops.append((direction, int(args["Concrete Inputs"][2]), lo, hi, elements * 4))
        steps = sorted((s, e) for n, s, e, _ in spans if n.startswith("ProfilerStep#"))
        ranks[rank] = {"ops": sorted(ops, key=lambda o: o[2]), "steps": steps}
    out = {}
    for rank, mine in ranks.items():
        got = {"wait": 0, "transfer": 0, "receives": 0, "bytes": 0, "steps": len(mine["steps"])}
        for peer, theirs in ranks.items():
            recvs = [o for o in mine["ops"] if o[0] == "recv" and o[1] == peer]
            sends = [o for o in theirs["ops"] if o[0] == "send" and o[1] == rank]
            for r, s in zip(recvs, sends, strict=False):
                window = next(((lo, hi) for lo, hi in mine["steps"] if lo <= r[3] < hi), None)
                if window is None:
                    continue
                turn = r[2] + min(max(s[2] - r[2], 0), r[3] - r[2])  # the send began: waiting ends
                got["wait"] += max(min(turn, window[1]) - max(r[2], window[0]), 0)
                got["transfer"] += max(min(r[3], window[1]) - max(turn, window[0]), 0)
                got["receives"] += 1
                got["bytes"] += r[4]
        out[rank] = got
    return out


def megascan_busy(path: Path) -> dict[int, float]:
    """A MegaScan merged trace (``pid`` = pipeline rank, ``B``/``E`` forward and backward ranges, ``iteration
    begin`` instants): each stage's forward + backward time per iteration, in ns."""
    events = ind.load_json(path)
    events = events.get("traceEvents", []) if isinstance(events, dict) else events
    open_: dict[tuple, list[int]] = {}
    busy: dict[int, int] = {}
    iterations: dict[int, int] = {}
    for e in sorted(events, key=lambda e: (e["ts"], e["ph"] == "B")):
        k = (e["pid"], e["tid"], e["name"])
        if e["ph"] == "B":
            open_.setdefault(k, []).append(ind.ts_ns(e["ts"]))
        elif e["ph"] == "E" and e["name"] in ("forward", "backward"):
            busy[e["pid"]] = busy.get(e["pid"], 0) + ind.ts_ns(e["ts"]) - open_[k].pop()
        elif e["ph"] == "i" and e["name"] == "iteration begin":
            iterations[e["pid"]] = iterations.get(e["pid"], 0) + 1
    return {pid: ns / iterations[pid] for pid, ns in busy.items()}
