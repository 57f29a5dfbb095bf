"""The GPU time sections as strings: each GPU's window split into compute, exposed communication, exposed memory
and idle, its idle by cause, the same per profiler step, the kernels by total time, and the host side (runtime
API calls, launch delay, short kernels, annotation ranges). Only formatting: every number is read from
``Report.breakdown``, ``Report.kernels`` and ``Report.host`` as it is.

The per-step rows are many (GPUs × steps): the per-step table shows the step rows GPU by GPU, in the order of
the whole-window table; a caller's ``limit`` (the terminal's) keeps the first rows and says how many more.
"""

from __future__ import annotations

from pipebubble.render.cells import Table, natural, num, pct, share, time
from pipebubble.render.choices import TOP
from pipebubble.report import Breakdown, CallStat, Report
from pipebubble.report.idle import CAUSES

#: An idle cause as a column says it (``report.idle.WORDS`` has the long form).
COLUMNS = {"sync_stall": "sync", "blocking_copy": "copy", "allocator": "alloc", "startup": "start-up",
           "cpu_ops": "CPU ops", "python": "Python", "launch": "launch", "peer": "peer", "data_loader": "loader",
           "dependency": "dep", "unknown": "unknown"}
# What a stacked bar shows, in order: (label, Breakdown field); they add up to the window
PARTS = (("compute", "compute_ns"), ("exposed comm", "comm_exposed_ns"), ("exposed memory", "memory_exposed_ns"),
         ("idle", "idle_ns"))
EVERY = "--format csv --table breakdown, json, markdown or html list every one"


def whole(report: Report) -> list[Breakdown]:
    """Each GPU's whole-window row (step null), in report order."""
    return [b for b in report.breakdown if b.step is None]


def per_step(report: Report) -> list[Breakdown]:
    """The per-step rows, GPU by GPU in the whole-window rows' order, each GPU's steps in order."""
    order = {b.lane: i for i, b in enumerate(whole(report))}
    rows = [b for b in report.breakdown if b.step is not None]
    return sorted(rows, key=lambda b: (order.get(b.lane, len(order)), b.lane, b.step))


def _capped(rows: list, limit: int | None, what: str, where: str = EVERY) -> tuple[list, tuple[str, ...]]:
    """``rows`` cut to ``limit`` and the note saying how many more ``what`` there are."""
    shown = rows if limit is None else rows[:limit]
    hidden = len(rows) - len(shown)
    return shown, ((f"{hidden:,} more {what} not shown: {where}",) if hidden else ())


def breakdown_table(report: Report, limit: int | None = None, unit: str = "ms") -> Table:
    """One row per GPU over its whole window: the four parts that add up to it, idle's share, the overlap."""
    shown, notes = _capped(whole(report), limit, "GPUs")
    rows = [[b.lane, time(b.window_ns, unit), *(time(getattr(b, key), unit) for _, key in PARTS),
             share(b.idle_ns, b.window_ns), pct(b.overlap)] for b in shown]
    columns = ["gpu", f"window {unit}", f"compute {unit}", f"exp comm {unit}", f"exp mem {unit}", f"idle {unit}",
               "idle", "overlap"]
    return Table(f"GPU time ({unit}; compute + exposed (exp) comm + exposed memory + idle = window, the GPU's first"
                 " to last busy instant; overlap = share of comm hidden under compute)",
                 columns, rows, frozenset(range(1, 8)), notes, drop=("overlap", "idle"))


def causes(rows: list[Breakdown]) -> list[str]:
    """The idle causes to show: the known ones some GPU has time of, in ``CAUSES`` order, then any other the
    report holds (a report saved by another version)."""
    held = {key for b in rows for key, ns in b.idle_causes.items() if ns}
    return [*(c for c in CAUSES if c in held), *sorted(held - set(CAUSES))]


def idle_table(report: Report, limit: int | None = None, unit: str = "ms") -> Table:
    """Each GPU's idle split by what the host was doing when the GPU went idle (no rows when no GPU says)."""
    every = whole(report)
    keys = causes(every)
    shown, notes = _capped(every if keys else [], limit, "GPUs")
    rows = [[b.lane, time(b.idle_ns, unit), *(time(b.idle_causes.get(key), unit) for key in keys)] for b in shown]
    columns = ["gpu", f"idle {unit}", *(f"{COLUMNS.get(key, key.replace('_', ' '))} {unit}" for key in keys)]
    return Table(f"GPU idle by cause ({unit}; each gap followed to the launch of the op that ended it and what its"
                 " host thread did until then: sync: a synchronize and the refill after it; copy: a blocking copy;"
                 " alloc: cudaMalloc/cudaFree; start-up: code loading, initialisation, first launches; CPU ops:"
                 " host operators; Python: Python or untraced time; launch:"
                 " the launch call and its latency; peer: a collective or send/recv call; loader: the data loader;"
                 " dep: launched before the GPU went idle (an event or another stream); unknown: no launch"
                 " recorded, or outside the GPU's work)",
                 columns, rows, frozenset(range(1, len(columns))), notes)


def step_table(report: Report, limit: int | None = None, unit: str = "ms") -> Table:
    """Each GPU's profiler steps: the step's window and the shares of it computing, in exposed comm, idle."""
    shown, notes = _capped(per_step(report), limit, "step rows")
    rows = [[b.lane, str(b.step), time(b.window_ns, unit), share(b.compute_ns, b.window_ns),
             share(b.comm_exposed_ns, b.window_ns), share(b.idle_ns, b.window_ns)] for b in shown]
    return Table("GPU time per profiler step (shares of the step's window: ProfilerStep#N or --step-regex)",
                 ["gpu", "step", f"window {unit}", "compute", "exp comm", "idle"], rows, frozenset(range(1, 6)),
                 notes)


def kernel_table(report: Report, top: int = TOP, unit: str = "ms") -> Table:
    """The GPU operations with the biggest total (the report lists them so), like nsys's cuda_gpu_kern_sum."""
    every = report.kernels
    shown, notes = _capped(every, top, "operations", "--top, --format csv --table kernels or json list them")
    rows = [[k.name, k.kind, num(k.count), time(k.total_ns, unit), pct(k.share),
             *(time(v, unit) for v in (k.mean_ns, k.median_ns, k.min_ns, k.max_ns, k.std_ns))] for k in shown]
    columns = ["kernel", "class", "count", f"total {unit}", "share", f"mean {unit}", f"median {unit}", f"min {unit}",
               f"max {unit}", f"std {unit}"]
    return Table(f"Kernels and memory operations (top {len(shown)} of {len(every)} by total; share = of all GPU"
                 " operation time, summed over streams)", columns, rows, frozenset(range(2, 10)), notes,
                 drop=(f"std {unit}", f"min {unit}", f"max {unit}", f"median {unit}", "class"))


def host_facts(report: Report, unit: str = "ms") -> list[str]:
    """One line each: the launches and their delay, the short kernels (none without a host section)."""
    h = report.host
    if h is None:
        return []
    delay = ("launch delay unknown" if h.launch_delay_mean_ns is None else
             f"launch delay (launch call start to GPU start) mean {time(h.launch_delay_mean_ns, unit)} {unit},"
             f" median {time(h.launch_delay_median_ns, unit)} {unit}, max {time(h.launch_delay_max_ns, unit)} {unit}")
    launches = f"{h.launches:,} kernel launches; {delay}" if h.launches else \
        "no kernel launches (no GPU work was matched to a launch call)"
    short = [f"short kernels: {h.short_kernels:,} shorter than {natural(h.short_kernel_ns)}"] if report.kernels else []
    return [launches, *short]


def _calls(title: str, column: str, calls: list[CallStat], top: int, unit: str, total: int = 0) -> Table:
    """``calls`` by total, the first ``top``; ``total``: how many names there are when the report lists fewer."""
    total = max(total, len(calls))
    shown = calls[:top]
    listed = "--top or --format json lists " + ("them all" if total == len(calls) else
                                                f"the {len(calls):,} with the most time")
    notes = (f"{total - len(shown):,} more names not shown: {listed}",) if total > len(shown) else ()
    rows = [[c.name, num(c.count), time(c.total_ns, unit), time(c.mean_ns, unit), time(c.max_ns, unit)]
            for c in shown]
    return Table(f"{title} (top {len(shown)} of {total:,} by total)",
                 [column, "count", f"total {unit}", f"mean {unit}", f"max {unit}"], rows, frozenset(range(1, 5)), notes,
                 drop=(f"max {unit}", f"mean {unit}"))


def api_table(report: Report, top: int = TOP, unit: str = "ms") -> Table:
    """Runtime and driver API calls by total, like nsys's cuda_api_sum."""
    return _calls("Runtime API calls", "call", report.host.api if report.host else [], top, unit)


def range_table(report: Report, top: int = TOP, unit: str = "ms") -> Table:
    """Annotation (NVTX, record_function) ranges by total, like nsys's nvtx_sum."""
    h = report.host
    return _calls("Annotation ranges (NVTX, record_function)", "range", h.ranges if h else [], top, unit,
                  h.ranges_total if h else 0)
