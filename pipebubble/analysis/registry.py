"""The per-file analyses (the map side of ``run.mapper``), registered under one signature, and the loop that
runs them over a file or over a batch of rank files.

Each is ``f(spans, options, meta=None, **reads) -> part``: ``spans`` one file's span table (any subset of a
job's spans, possibly empty), ``options`` the job's ``Options``, ``meta`` what the file says about the job
(its ingest ``FileResult.meta``: ``world_size``, ``pg_config``; None: nothing), and ``reads`` what else of
the file it takes, by keyword, as its entry declares (``Analysis.reads``; None where not given):

- ``inputs``: the table's ``breakdown.part.inputs`` (its GPU operations and their launches, its steps as the
  GPU lives them, its idle account), built once for all that read them; not given, an analysis builds its own;
- ``stages``: the file's stage part (the ``stages`` analysis's, which runs before);
- ``allocations``: its allocator events (``FileResult.memory``);
- ``request_table``: its served requests (``FileResult.requests``);
- ``request_steps``: its engine's traced scheduler steps (``FileResult.request_steps``).

Pure: no I/O, no printing; every one returns its documented empty part for a table with nothing it can use,
never raises for it (``tests/analysis/test_analyses.py`` runs them all on the empty table and on one-span
tables). ``ANALYSES`` lists them in the order they run, each under the name of the ``FilePart`` field its
part fills; ``parts_of`` runs them over one file, ``parts_together`` over files of one rank each at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache
from typing import Any, NamedTuple

import polars as pl

from pipebubble.analysis.breakdown import GpuPart, gpu_part
from pipebubble.analysis.breakdown.part import GpuInputs
from pipebubble.analysis.breakdown.part import inputs as gpu_inputs
from pipebubble.analysis.breakdown.strips import empty_bins, strip_bins
from pipebubble.analysis.comm.collectives import NCCL_NVTX, collective_part, comm_ranges
from pipebubble.analysis.comm.p2p import p2p_part
from pipebubble.analysis.critical import CriticalPart, critical_part
from pipebubble.analysis.flops import FlopsPart, flops_part
from pipebubble.analysis.intervals import engine_for
from pipebubble.analysis.job import CommPart
from pipebubble.analysis.lanes import lane_table
from pipebubble.analysis.launch import LaunchPart, launch_part
from pipebubble.analysis.memcpy import memcpy_part
from pipebubble.analysis.memory import MemoryPart, memory_part
from pipebubble.analysis.pipeline.part import StagePart, stage_part, stage_parts
from pipebubble.analysis.requests.part import RequestsPart, has_request_events, requests_part
from pipebubble.analysis.rootcause.part import windows as arrival_windows
from pipebubble.analysis.serving.interference import interference
from pipebubble.analysis.serving.steps_inferred import DECODE_KERNELS, GRAPH_LAUNCH, STEP_FRAMES, TRAINING_KERNELS
from pipebubble.analysis.serving.steps_llm import LABEL_PATTERNS as STEP_LABELS
from pipebubble.options import Options
from pipebubble.report import Interference, Segment
from pipebubble.spans import COMM_NAMES, GPU_WORK

Meta = dict[str, Any] | None


class Given(NamedTuple):
    """What a file hands its analyses beside its spans: its ``meta`` and its own tables (``reads``)."""

    meta: dict
    allocations: pl.DataFrame | None = None
    request_table: pl.DataFrame | None = None
    request_steps: pl.DataFrame | None = None


@dataclass(frozen=True)
class Analysis:
    """A per-file analysis as the map runs it: ``run`` (the module's one signature), what else of the file it
    ``reads``, and ``together``: for files of one rank each mapped at once (``parts_together``), the parts it
    gives from their spans together, ``together(spans, options, files, **reads) -> {rank: part}`` (``files``:
    each rank's ``Given``, in the batch's order; ``reads``: the batch's ``inputs``, where it reads them); a rank
    it leaves out, or every rank where it has none, is mapped alone."""

    run: Callable[..., Any]
    reads: tuple[str, ...] = ()
    together: Callable[..., dict[int, Any]] | None = None


def lanes_part(spans: pl.DataFrame, options: Options, meta: Meta = None) -> pl.DataFrame:
    """Busy and idle per lane (``lanes.LANE_COLUMNS``); no rows when no span is work."""
    return lane_table(spans)


def lanes_together(spans: pl.DataFrame, options: Options, files: dict[int, Given]) -> dict[int, pl.DataFrame]:
    lanes = lanes_part(spans, options)
    rows = _by(lanes, "rank")
    return {rank: rows.get(rank, lanes.clear()) for rank in files}


def stages_part(spans: pl.DataFrame, options: Options, meta: Meta = None) -> StagePart | None:
    """The file's stages' labelled work; None when it holds no pipeline stage (or is the whole job and holds
    one stage). A file alone sees the job's size only from its metadata, so ``meta`` gives ``world_size``
    when ``options.world`` is unset and the file's process groups (``pg_config``)."""
    if not spans.height:
        return None
    meta = meta or {}
    world = options.world or meta.get("world_size")
    return stage_part(spans, options.pipeline, world, options.files == 1, meta.get("pg_config"))


def stages_together(spans: pl.DataFrame, options: Options, files: dict[int, Given]) -> dict[int, StagePart | None]:
    """``stages_part`` of every rank at once; those it cannot map together (``pipeline.part.stage_parts``)
    left out."""
    if options.files == 1:
        return {}
    groups = {rank: (given.meta or {}).get("pg_config") for rank, given in files.items()}
    return dict(stage_parts(spans, options.pipeline, groups))


Serving = tuple[Interference | None, list[Segment]]


def serving_part(spans: pl.DataFrame, options: Options, meta: Meta = None) -> Serving:
    """Prefill/decode interference and per-step timeline segments; (None, []) without engine steps."""
    return interference(spans, step_regex=options.serving.step_regex, tbt_slo_ms=options.serving.tbt_slo_ms)


def serving_together(spans: pl.DataFrame, options: Options, files: dict[int, Given]) -> dict[int, Serving]:
    """(None, []) for the ranks that show no sign of engine steps (``serving_ranks``); the others left out."""
    engines = serving_ranks(spans, options)
    return {} if engines is None else {rank: (None, []) for rank in files if rank not in engines}


def serving_ranks(spans: pl.DataFrame, options: Options) -> set[int] | None:
    """Of several files of one rank each (``spans``: theirs, concatenated), the ranks whose spans show a sign
    of engine steps (``serving_part`` finds none in the others): a step label, or, where steps would be
    inferred (``steps_inferred``: no training kernel), an engine's step frame, a decode kernel or a graph
    launch. None with a custom step regex (every file is then looked at)."""
    if options.serving.step_regex:
        return None
    names = spans.lazy().select("rank", "kind", gpu=pl.col("device").is_not_null(), name="name").unique()
    cpu_range = (pl.col("kind") == "annotation") & ~pl.col("gpu")
    signs = names.group_by("rank").agg(
        label=(cpu_range & _named_like(regex for _, regex in STEP_LABELS)).any(),
        training=((pl.col("kind") == "kernel") & pl.col("name").str.contains(TRAINING_KERNELS)).any(),
        frame=(cpu_range & pl.col("name").str.contains(STEP_FRAMES)).any(),
        decode=((pl.col("kind").is_in(GPU_WORK) & pl.col("gpu") & pl.col("name").str.contains(DECODE_KERNELS))
                | ((pl.col("kind") == "runtime") & pl.col("name").str.contains(GRAPH_LAUNCH))).any(),
    )
    engine = pl.col("label") | (~pl.col("training") & (pl.col("frame") | pl.col("decode")))
    return set(signs.filter(engine).select("rank").collect(engine=engine_for(spans))["rank"].to_list())


def may_hold_steps(spans: pl.LazyFrame, options: Options) -> bool:
    """Whether ``serving_part`` of a table's annotations alone can find engine steps: some annotation's
    name is a step label (``--step-regex``'s, else the built-in ones) or an engine's step frame. Told from
    the distinct names, so a big table's annotations are read only when they may hold steps."""
    names = spans.filter(pl.col("kind") == "annotation").select(pl.col("name").unique())
    regexes = [options.serving.step_regex] if options.serving.step_regex else [
        *(regex for _, regex in STEP_LABELS), STEP_FRAMES]
    return bool(names.select(_named_like(regexes).any()).collect(engine=engine_for(spans)).item())


def _named_like(regexes) -> pl.Expr:
    """A span whose name any of ``regexes`` matches."""
    return pl.any_horizontal(pl.col("name").str.contains(regex) for regex in regexes)


def comm_part(spans: pl.DataFrame, options: Options, meta: Meta = None, inputs: GpuInputs | None = None
              ) -> CommPart:
    """The file's collective calls per participant, its send/recv counts (``collectives``), its
    point-to-point operations (``p2p``) and each arrival's window (``rootcause.part``, the GPU's idle split
    by the idle account of ``inputs``); no rows without communication."""
    return comm_of(spans, step_regex=options.serving.step_regex, pieces=None if inputs is None else inputs.pieces)


def comm_together(spans: pl.DataFrame, options: Options, files: dict[int, Given], inputs: GpuInputs | None = None
                  ) -> dict[int, CommPart]:
    """``comm_part`` of every rank at once, split by participant; the job-wide facts (send/recv counts, step
    lengths) with the first."""
    comm = comm_part(spans, options, inputs=inputs)
    calls, p2p, windows = _by(comm.calls, "who"), _by(comm.p2p, "who"), _by(comm.windows, "who")
    first = next(iter(files))
    return {rank: CommPart(calls.get(rank, comm.calls.clear()),
                           comm.facts if rank == first else {"p2p_send": 0, "p2p_recv": 0, "step_ns": []},
                           p2p.get(rank, comm.p2p.clear()), windows.get(rank, comm.windows.clear()))
            for rank in files}


def comm_of(spans: pl.DataFrame, windows: pl.DataFrame | None = None, step_regex: str | None = None,
            pieces: pl.DataFrame | None = None) -> CommPart:
    """``comm_part`` of ``spans`` (``pieces``: its idle account); ``windows``: the participants' traced windows
    (``collectives.participant_windows``), when ``spans`` holds only a bigger table's ``comm_rows``: the
    arrivals' windows are then left empty (what a rank did before an arrival is not among those rows)."""
    ranges = comm_ranges(spans)  # read once for both: a regex over every CPU range of the file
    calls, facts = collective_part(spans, ranges, windows)
    p2p = p2p_part(spans, ranges)
    if windows is not None:
        return CommPart(calls, facts, p2p)
    return CommPart(calls, facts, p2p, arrival_windows(spans, calls, p2p, step_regex, pieces))


def comm_rows(spans: pl.LazyFrame) -> pl.DataFrame:
    """The rows of a big table that ``comm_part`` reads, and that ``stages_part`` reads of a file with no
    pipeline evidence (``pipeline.part.no_evidence``), in the table's order: ranges named like communication,
    annotations (labels), profiler steps, communication kernels and the calls that launched them, and the
    first row of each lane (what names the stages)."""
    kernels = (pl.col("kind") == "comm") & pl.col("device").is_not_null()
    ids = spans.filter(kernels & pl.col("correlation").is_not_null()).select(pl.col("correlation").unique())
    indexed = spans.with_row_index("_row")
    firsts = indexed.group_by("rank", "pid", "device", "stream", "lane").agg(pl.col("_row").min())
    ids, firsts = pl.collect_all([ids, firsts])
    ranges = pl.col("device").is_null() & pl.col("kind").is_in(["annotation", "cpu_op", "comm"])
    wanted = (
        kernels
        | pl.col("kind").is_in(["annotation", "step"])
        | (ranges & (pl.col("name").str.contains(COMM_NAMES) | pl.col("name").str.contains(NCCL_NVTX)))
        | ((pl.col("kind") == "runtime") & pl.col("correlation").is_in(ids["correlation"].implode()))
        | pl.col("_row").is_in(firsts["_row"].implode())
    )
    return indexed.filter(wanted).drop("_row").collect()


def breakdown_part(spans: pl.DataFrame, options: Options, meta: Meta = None, inputs: GpuInputs | None = None
                   ) -> GpuPart:
    """Every GPU's time breakdown (whole window and per step) and the kernel and host summaries' partial
    sums (``breakdown``); no rows without GPU work."""
    return gpu_part(spans, options.serving.step_regex, alone=options.files == 1, given=inputs)


def breakdown_together(spans: pl.DataFrame, options: Options, files: dict[int, Given], inputs: GpuInputs | None = None
                       ) -> dict[int, GpuPart]:
    """``breakdown_part`` of every rank at once: each rank's rows and idle account; the summaries' partial
    sums with the first, empty with the others."""
    gpu = breakdown_part(spans, options, inputs=inputs)
    idle, first = _by(gpu.idle, "rank"), next(iter(files))
    rest = replace(gpu, delay={"count": 0, "total": 0, "max": None, "median": None}, short=0,
                   **{k: getattr(gpu, k).clear() for k in GpuPart.FRAMES})
    return {rank: replace(gpu if rank == first else rest, rows=[row for row in gpu.rows if row.rank == rank],
                          idle=idle.get(rank, gpu.idle.clear())) for rank in files}


def strips_part(spans: pl.DataFrame, options: Options, meta: Meta = None, inputs: GpuInputs | None = None
                ) -> pl.DataFrame:
    """The timeline strips' bins per GPU lane and step (``breakdown.strips``); no rows without GPU work."""
    return strip_bins(spans, options.serving.step_regex, given=inputs)


def strips_together(spans: pl.DataFrame, options: Options, files: dict[int, Given], inputs: GpuInputs | None = None
                    ) -> dict[int, pl.DataFrame]:
    bins = _by(strips_part(spans, options, inputs=inputs), "rank")
    return {rank: bins.get(rank, empty_bins()) for rank in files}


def critical_path_part(spans: pl.DataFrame, options: Options, meta: Meta = None, inputs: GpuInputs | None = None
                       ) -> CriticalPart:
    """The file's part of the critical path (``critical.part``: runs, blocked host calls, steps, threads'
    busy stretches), on the steps the breakdown reads; empty without GPU work."""
    return critical_part(spans, options.serving.step_regex, None if inputs is None else inputs.steps)


def critical_together(spans: pl.DataFrame, options: Options, files: dict[int, Given], inputs: GpuInputs | None = None
                      ) -> dict[int, CriticalPart]:
    part = critical_path_part(spans, options, inputs=inputs)
    each = part.by_participant()
    return {rank: each.get(rank, part.cleared()) for rank in files}


def requests_of(spans: pl.DataFrame, options: Options, meta: Meta = None,
                request_table: pl.DataFrame | None = None, request_steps: pl.DataFrame | None = None
                ) -> RequestsPart | None:
    """The served requests (the file's request table, else an engine's request events in its spans) with
    their engine steps and traced scheduler steps (``requests.part``); None without any."""
    return requests_part(request_table, spans, options.serving.step_regex, request_steps)


def requests_together(spans: pl.DataFrame, options: Options, files: dict[int, Given]) -> dict[int, None]:
    """None for the files without a request table, when no span of the batch is a request event (looked for
    once over the batch, not once a file); the others left out."""
    if has_request_events(spans):
        return {}
    return {rank: None for rank, given in files.items()
            if given.request_table is None and given.request_steps is None}


def memory_of(spans: pl.DataFrame | pl.LazyFrame, options: Options, meta: Meta = None,
              allocations: pl.DataFrame | None = None, stages: StagePart | None = None) -> MemoryPart | None:
    """The file's allocator events summarised (``memory.part``) with its profiler steps (``spans`` may be a
    spilled table's scan) and its stages' passes; None without allocator events."""
    if allocations is None:
        return None
    steps = spans.filter(pl.col("kind") == "step").select("lane", "name", "start", "end")
    steps = steps.collect() if isinstance(steps, pl.LazyFrame) else steps
    return memory_part(allocations, steps, None if stages is None else stages.work)


def launch_of(spans: pl.DataFrame, options: Options, meta: Meta = None, inputs: GpuInputs | None = None
              ) -> LaunchPart:
    """The file's GPU annotations, each GPU stream's launch queue and the launch delays per operator
    (``launch``); empty frames without them."""
    return launch_part(spans, options.serving.step_regex, alone=options.files == 1, given=inputs)


def launch_together(spans: pl.DataFrame, options: Options, files: dict[int, Given], inputs: GpuInputs | None = None
                    ) -> dict[int, LaunchPart]:
    """``launch_of`` of every rank at once: the batch's part (sums by name and stream, which add up over
    files) with the first rank, empty with the others."""
    first = next(iter(files))
    part = launch_of(spans, options, inputs=inputs)
    return {rank: part if rank == first else LaunchPart() for rank in files}


def memcpy_together(spans: pl.DataFrame, options: Options, files: dict[int, Given]) -> dict[int, pl.DataFrame]:
    """``memcpy_part`` of every rank at once, split by rank."""
    copies = memcpy_part(spans, options)
    rows = _by(copies, "rank")
    return {rank: rows.get(rank, copies.clear()) for rank in files}


def flops_of(spans: pl.DataFrame, options: Options, meta: Meta = None, inputs: GpuInputs | None = None
             ) -> FlopsPart | None:
    """Each counted operator's FLOPs and bytes and the GPU time it launched, per lane, step and dtype
    (``flops.part``); None where no operator has shapes or a ``flops`` arg."""
    if isinstance(spans, pl.LazyFrame) or "dims" not in spans.columns:
        return None
    got = flops_part(spans, *((inputs.gpu, inputs.launch, inputs.steps) if inputs is not None else ()))
    return got if got.lanes.height else None


def flops_together(spans: pl.DataFrame, options: Options, files: dict[int, Given], inputs: GpuInputs | None = None
                   ) -> dict[int, FlopsPart | None]:
    """``flops_of`` of every rank at once: each rank's lanes; the operators and unmodelled time with the first."""
    part = flops_of(spans, options, inputs=inputs)
    if part is None:
        return dict.fromkeys(files)
    lanes, first = _by(part.lanes, "rank"), next(iter(files))
    return {rank: replace(part if rank == first else FlopsPart(), lanes=lanes.get(rank, part.lanes.clear()))
            for rank in files}


def _by(frame: pl.DataFrame, column: str) -> dict:
    """``frame``'s rows by the value of ``column``, in their order (one pass, not a filter per value)."""
    if column not in frame.columns:
        return {}
    return {rows[column][0]: rows for rows in frame.partition_by(column, maintain_order=True)}


#: name (the ``FilePart`` field its part fills) -> analysis, in the order they run (``memory`` reads
#: ``stages``).
ANALYSES: dict[str, Analysis] = {
    "lanes": Analysis(lanes_part, together=lanes_together),
    "stages": Analysis(stages_part, together=stages_together),
    "serving": Analysis(serving_part, together=serving_together),  # its interference and segments
    "comm": Analysis(comm_part, ("inputs",), comm_together),
    "gpu": Analysis(breakdown_part, ("inputs",), breakdown_together),
    "strips": Analysis(strips_part, ("inputs",), strips_together),
    "critical": Analysis(critical_path_part, ("inputs",), critical_together),
    "requests": Analysis(requests_of, ("request_table", "request_steps"), requests_together),
    "memory": Analysis(memory_of, ("allocations", "stages")),
    "memcpy": Analysis(memcpy_part, together=memcpy_together),  # copies by lane, direction and host memory
    "launch": Analysis(launch_of, ("inputs",), launch_together),
    "flops": Analysis(flops_of, ("inputs",), flops_together),
}


def parts_of(spans: pl.DataFrame | pl.LazyFrame, options: Options, given: Given, known: dict | None = None
             ) -> dict[str, Any]:
    """Every analysis's part of one file, by name: those ``known`` as they are (a batch's share, what a spilled
    table's windows gave), the others run over ``spans`` in order, each given what it reads."""
    parts = dict(known or {})
    inputs = cache(lambda: gpu_inputs(spans, options.serving.step_regex))

    def read(name: str) -> Any:
        return inputs() if name == "inputs" else parts[name] if name in parts else getattr(given, name)

    for name, analysis in ANALYSES.items():
        if name not in parts:
            parts[name] = analysis.run(spans, options, given.meta, **{k: read(k) for k in analysis.reads})
    return parts


def parts_together(spans: pl.DataFrame, options: Options, files: dict[int, Given]) -> dict[int, dict[str, Any]]:
    """Of files of one rank each, no two of the same rank nor sharing a lane name (``spans``: theirs,
    concatenated; ``files``: each rank's ``Given``, in the batch's order), the parts each analysis gives at
    once (``Analysis.together``: a pass over all their spans, split by rank), by rank then name; the
    batch's ``inputs`` built once. What a rank lacks is mapped alone (``parts_of``)."""
    shares: dict[int, dict[str, Any]] = {rank: {} for rank in files}
    inputs = cache(lambda: gpu_inputs(spans, options.serving.step_regex))
    for name, analysis in ANALYSES.items():
        if analysis.together is not None:
            reads = {"inputs": inputs()} if "inputs" in analysis.reads else {}  # the rest is each rank's
            for rank, part in analysis.together(spans, options, files, **reads).items():
                shares[rank][name] = part
    return shares
