"""The flags the commands share, defined once, and the one place they become Options.

A command lists the flags it takes as parameters typed with these aliases; ``options`` lays them over the
``[stages]`` table of pipebubble.toml (flags win) and builds the analysis ``Options``; ``scale`` says where
the per-file work runs.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, get_type_hints

import typer

from pipebubble.options import EXECUTORS, STAGE_BY, Options, Scale, merge
from pipebubble.render.choices import CSV_TABLES, TIME_UNITS
from pipebubble.render.formats import Options as RenderOptions
from pipebubble.render.formats import choices as format_choices
from pipebubble.render.formats import names as format_names

PIPELINE = "Pipeline"
OUTPUT = "Output"
SERVING = "LLM serving"
SCALE = "Scale"

StageBy = Enum("StageBy", {name: name for name in STAGE_BY}, type=str)  # type: ignore[misc]
Executor = Enum("Executor", {name: name for name in EXECUTORS}, type=str)  # type: ignore[misc]
TimeUnit = Enum("TimeUnit", {name: name for name in TIME_UNITS}, type=str)  # type: ignore[misc]
CsvTable = Enum("CsvTable", {name: name for name in CSV_TABLES}, type=str)  # type: ignore[misc]

Paths = Annotated[list[Path], typer.Argument(help="Trace files or folders of per-rank traces.")]
Output = Annotated[Path | None, typer.Option("--output", "-o", help="Write here instead of stdout.",
                                             rich_help_panel=OUTPUT)]
# --output/-o, --width and --quiet mean the same on every command (capture's -o is a folder; --out still works).
OutputDir = Annotated[Path, typer.Option("--output", "-o", "--out", help="Folder for the traces.",
                                         rich_help_panel=OUTPUT)]
Width = Annotated[int | None, typer.Option("--width", min=20, help="Columns of text output (default: the terminal's).",
                                           rich_help_panel=OUTPUT)]


def listed(names: list[str] | tuple[str, ...], last: str = "or") -> str:
    """``a, b or c``: names as a help text lists them."""
    return f"{', '.join(names[:-1])} {last} {names[-1]}" if len(names) > 1 else "".join(names)


_GATE_JSON = "JSON gives each value in the unit it names"
#: What --timeunit leaves as it is, by command: JSON, and what else keeps its own unit.
TIMES_KEPT = {"analyze": "JSON stays in ns; the timeline's axis and the serving section stay in ms",
              "check": _GATE_JSON, "diff": _GATE_JSON}


def time_unit(command: str) -> Any:
    """``--timeunit`` as ``command`` takes it: its help names that command's formats that show times."""
    shown = [name for name in format_names(command) if name != "json"]
    return Annotated[TimeUnit, typer.Option(
        "--timeunit", help=f"Unit of the times in {listed(shown, 'and')} output: {listed(TIME_UNITS)} "
        f"({TIMES_KEPT[command]}). E.g. --timeunit us.", rich_help_panel=OUTPUT)]


# Output flags: how a report is rendered (formats.Options), never what is analysed (not in the report cache's key)
TimeUnitOpt = time_unit("analyze")  # check and diff get their own (``analysing``)
Top = Annotated[int, typer.Option(
    "--top", min=1, help="Rows of the kernel, runtime API and annotation range tables, biggest total first (JSON and "
    "csv hold every one). E.g. --top 40.", rich_help_panel=OUTPUT)]
TableOpt = Annotated[CsvTable | None, typer.Option(
    "--table", help="The table --format csv writes, one row per item: "
    f"{listed([f'{t} (the default)' if t == RenderOptions.table else t for t in CSV_TABLES])}. "
    "E.g. --format csv --table breakdown -o gpu_time.csv.", rich_help_panel=OUTPUT)]
Config = Annotated[Path | None, typer.Option("--config", help="Settings file (default: pipebubble.toml or "
                                             "tool.pipebubble in pyproject.toml, searched upward).")]
StageByOpt = Annotated[StageBy | None, typer.Option(
    "--stage-by", help="What a stage is (default: rank for a folder of ranks, device for one file of several GPUs); "
    "thread: one stage per CPU thread, its GPU work following the thread that launched it.",
    rich_help_panel=PIPELINE)]
StageRules = Annotated[list[str] | None, typer.Option(
    "--stage", help="Stage NAME=REGEX over lane ids (repeat, in order).", rich_help_panel=PIPELINE)]
PpSize = Annotated[int | None, typer.Option(
    "--pp-size", help="Pipeline-parallel size when ranks also do TP/DP.", rich_help_panel=PIPELINE)]
RankOrder = Annotated[str | None, typer.Option(
    "--rank-order", help="Rank layout for --pp-size: tp-cp-ep-dp-pp (Megatron, the default) or pp-dp-tp.",
    rich_help_panel=PIPELINE)]
MicrobatchRegex = Annotated[str | None, typer.Option(
    "--microbatch-regex", help="Regex with named groups phase (F/B/W), mb and optionally chunk, for custom labels: "
    "ranges, or CPU ops and kernels that are passes themselves (such a span labels what runs inside it).",
    rich_help_panel=PIPELINE)]
WaitThreshold = Annotated[float | None, typer.Option(
    "--wait-threshold", help="Report idle gaps longer than this fraction of the step (default 0.01).",
    rich_help_panel=PIPELINE)]
GpuCost = Annotated[float | None, typer.Option(
    "--gpu-cost", help="USD per GPU-hour (a CPU rank's hour where the job holds no GPU): idle dollars and the "
    "price of a useful GPU-hour.",
    rich_help_panel=PIPELINE)]
MemoryLimit = Annotated[str | None, typer.Option(
    "--memory-limit", metavar="SIZE", help="Memory a stage's device may hold, e.g. 80GiB: what-if rows say whether "
    "they fit (default: each GPU's capacity from the trace).", rich_help_panel=PIPELINE)]
PeakFlops = Annotated[str | None, typer.Option(
    "--peak-flops", metavar="RATE", help="Dense peak FLOP/s of each device, for every dtype, e.g. 989e12 or 989T: "
    "MFU and the roofline use it instead of the table of known GPUs (a CPU job's only peak).",
    rich_help_panel=PIPELINE)]
PeakBandwidth = Annotated[str | None, typer.Option(
    "--peak-bandwidth", metavar="RATE", help="Peak memory bandwidth of each device in bytes/s, e.g. 3.35e12 or "
    "3.35T: the roofline's memory roof instead of the table's.", rich_help_panel=PIPELINE)]
StepRegex = Annotated[str | None, typer.Option(
    "--step-regex", help="Regex for engine step labels, named groups mode, prefill_tokens, decode_reqs (serving "
    "traces).", rich_help_panel=SERVING)]
TbtSlo = Annotated[float | None, typer.Option(
    "--tbt-slo", help="Time-between-tokens target in ms: the prefill chunk that keeps steps under it.",
    rich_help_panel=SERVING)]
NoAlign = Annotated[bool, typer.Option(
    "--no-align", help="Keep each rank's recorded clock (default: one clock for the job, estimated from its "
    "collectives, sends and receives)")]
ExecutorOpt = Annotated[Executor, typer.Option(
    "--executor", help="Where files are mapped: local (a process pool) or ray (a job of one file is mapped in "
    "this process, and says so).", rich_help_panel=SCALE)]
RayAddress = Annotated[str | None, typer.Option(
    "--ray-address", help="Ray cluster to use with --executor ray (default: start a local one).",
    rich_help_panel=SCALE)]
Workers = Annotated[int | None, typer.Option(
    "--workers", min=1, help="Processes (or Ray CPUs) to use (default: all cores).", rich_help_panel=SCALE)]
MemoryBudget = Annotated[str | None, typer.Option(
    "--memory-budget", metavar="SIZE", help="Memory the analysis may use, its worker processes included, e.g. 800M "
    "or 2G (at least 269M; default: an eighth of the available memory; env PIPEBUBBLE_MEMORY_BUDGET). A bigger "
    "trace is spilled to disk and read in windows.",
    rich_help_panel=SCALE)]
NoCache = Annotated[bool, typer.Option("--no-cache", help="Decode again; ignore the span and report caches.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress or notes on stderr (warnings and errors "
                                     "still).", rich_help_panel=OUTPUT)]

# Gates (check) and the tolerance (diff): typed as text so that 30% reads as a fraction and 30 is refused with a
# hint (a float flag would take 30 as 3000 %), parsed by ``thresholds`` and ``tolerance`` below.
GATES = "Gates"


def _gate(flag: str, text: str) -> Any:
    return typer.Option(flag, help=text, rich_help_panel=GATES)


MaxBubble = Annotated[str | None, _gate("--max-bubble", "Most pipeline bubble: 0.3 or 30%.")]
MaxExcessBubble = Annotated[str | None, _gate("--max-excess-bubble", "Most bubble beyond the schedule's theory: "
                                              "0.1 or 10%.")]
MinUtilization = Annotated[str | None, _gate("--min-utilization", "Least mean stage utilization (GPU busy "
                                             "fraction when not a pipeline): 0.6 or 60%.")]
MaxStageCv = Annotated[str | None, _gate("--max-stage-cv", "Most spread of stage times (std/mean): 0.1 or 10%.")]
MaxImbalance = Annotated[str | None, _gate("--max-imbalance", "Most slowest/mean stage time, at least 1: 1.2.")]
MaxWaitMs = Annotated[str | None, _gate("--max-wait-ms", "Longest wait (idle gap on a stage, or a collective's "
                                        "spin): ms, or with a unit (500us, 0.1s).")]
MaxDecodeSlowdown = Annotated[str | None, _gate("--max-decode-slowdown", "Most decode step slowdown when mixed "
                                                "with prefill, at least 1: 1.5.")]
MaxFinding = Annotated[str | None, _gate("--max-finding", "Most any finding may be worth, as a share of its step: "
                                        "0.05 or 5%.")]
MaxTtftP99 = Annotated[str | None, _gate("--max-ttft-p99", "Most p99 time to first token of the served requests: "
                                        "ms, or with a unit (500ms, 0.5s).")]
MaxTpotP99 = Annotated[str | None, _gate("--max-tpot-p99", "Most p99 time per output token: ms, or with a unit.")]
MaxQueueP99 = Annotated[str | None, _gate("--max-queue-p99", "Most p99 queue wait: ms, or with a unit.")]
MaxPreemptions = Annotated[str | None, _gate("--max-preemptions", "Most preemptions of the served requests (a "
                                             "count; from vLLM's journey tracing or phase spans).")]
Strict = Annotated[bool, typer.Option(
    "--strict", help="Fail (exit 1) when a requested gate cannot be evaluated (e.g. --max-bubble on a trace that "
    "is not a pipeline) or, for diff, when part of one report has no counterpart in the other; without it such "
    "a gate is a SKIP that says why.", rich_help_panel=GATES)]
AllowPartial = Annotated[bool, typer.Option(
    "--allow-partial", help="Judge an incomplete input (a file cut off mid-write, events lost, ranks missing "
    "against world_size, fewer steps than the baseline) by the thresholds alone, with a warning; without it "
    "such an input fails the gate (exit 1) with the reason.", rich_help_panel=GATES)]
Tolerance = Annotated[str | None, typer.Option(
    help="Relative worsening allowed, of each metric's baseline value: 5% or 0.05 (a bare 5 is refused; write "
    "500%). Default: the diff table of pipebubble.toml, else 5%.", rich_help_panel=GATES)]
DiffByChoice = Enum("DiffByChoice", {name: name for name in ("op", "kernel")}, type=str)  # type: ignore[misc]
DiffBy = Annotated[DiffByChoice | None, typer.Option(
    "--by", help="op: compare operators instead of metrics, CPU operators (by name) and GPU kernels (by full "
    "name): added, removed, changed (count, or time beyond --tolerance), per step where both mark steps; "
    "kernel: GPU kernels alone. Informational unless --max-op-regression.", rich_help_panel=GATES)]
MaxOpRegression = Annotated[str | None, typer.Option(
    "--max-op-regression", help="With --by: fail (exit 1) when an operator's time per step grew by more than "
    "this share of its baseline time (and by more than 1% of all its kind's): 10% or 0.1.", rich_help_panel=GATES)]
# check and diff offer the same formats, named by the registry without loading the writers
GateFormat = format_choices("check")
GateFormatOpt = Annotated[GateFormat, typer.Option(
    "--format", "-f", help="text, json, junit (JUnit XML for CI test reports), github (workflow commands: "
    "annotations on the trace or baseline) or markdown (a PR comment or job summary).", rich_help_panel=OUTPUT)]


def thresholds(given: dict[str, str | None], config: Any) -> dict[str, float]:
    """The gates to run (``gates.thresholds``, worded as the flags); bad input is exit 2, one line."""
    from pipebubble.errors import PipebubbleError
    from pipebubble.gates.specs import thresholds as merged

    try:
        return merged(given, config, lambda key: "--" + key.replace("_", "-"))
    except ValueError as exc:
        raise PipebubbleError(str(exc)) from None


def tolerance(text: str | None, config: Any, name: str = "--tolerance") -> float:
    """``--tolerance`` (or the flag ``name``), else the config file's tolerance, else 5%; refused (exit 2, one
    line) as ``thresholds`` are."""
    from pipebubble.errors import PipebubbleError
    from pipebubble.gates.specs import tolerance as allowed

    try:
        return allowed(text, config, name)
    except ValueError as exc:
        raise PipebubbleError(str(exc)) from None


#: The analysis and scale flags every analysing command takes: (annotation, default) by parameter name.
ANALYSIS_FLAGS: dict[str, tuple[Any, Any]] = {
    "stage_by": (StageByOpt, None),
    "stage": (StageRules, None),
    "pp_size": (PpSize, None),
    "rank_order": (RankOrder, None),
    "microbatch_regex": (MicrobatchRegex, None),
    "wait_threshold": (WaitThreshold, None),
    "gpu_cost": (GpuCost, None),
    "memory_limit": (MemoryLimit, None),
    "peak_flops": (PeakFlops, None),
    "peak_bandwidth": (PeakBandwidth, None),
    "step_regex": (StepRegex, None),
    "tbt_slo": (TbtSlo, None),
    "no_align": (NoAlign, False),
    "executor": (ExecutorOpt, Executor.local),
    "ray_address": (RayAddress, None),
    "workers": (Workers, None),
    "memory_budget": (MemoryBudget, None),
    "no_cache": (NoCache, False),
}
SCALE_FLAGS = ("executor", "ray_address", "workers", "memory_budget", "no_cache")


def analysing(command: Callable) -> Callable:
    """Give ``command`` every analysis and scale flag, defined once here: it declares ``options: Options``
    and ``scale: Scale`` parameters (and ``config``, the settings file) and receives them built from the
    flags and ``pipebubble.toml``; its ``--help`` lists the flags as if it had declared each one (its
    ``--timeunit`` naming its own formats)."""
    hints = get_type_hints(command, include_extras=True)
    own = [p.replace(annotation=_as_on(command.__name__, hints[p.name]))
           for p in inspect.signature(command).parameters.values() if p.name not in ("options", "scale")]
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)
             for name, (annotation, default) in ANALYSIS_FLAGS.items()]

    @functools.wraps(command)
    def run(**given: Any) -> Any:
        flags = {name: given.pop(name) for name in ANALYSIS_FLAGS}
        scale_flags = {name: flags.pop(name) for name in SCALE_FLAGS}
        return command(**given, options=options(given.get("config"), **flags), scale=scale(**scale_flags))

    run.__signature__ = inspect.Signature([*own, *extra])  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in (*own, *extra)}
    del run.__wrapped__  # typer reads the signature above, not the command's own
    return run


def _as_on(command: str, annotation: Any) -> Any:
    """A flag as ``command`` takes it: ``--timeunit`` names the command's own formats (``time_unit``)."""
    return time_unit(command) if annotation == TimeUnitOpt and command in TIMES_KEPT else annotation


def options(
    config: Path | None = None,
    *,
    stage_by: Enum | None = None,
    stage: list[str] | None = None,
    pp_size: int | None = None,
    rank_order: str | None = None,
    microbatch_regex: str | None = None,
    wait_threshold: float | None = None,
    gpu_cost: float | None = None,
    memory_limit: str | None = None,
    peak_flops: str | None = None,
    peak_bandwidth: str | None = None,
    step_regex: str | None = None,
    tbt_slo: float | None = None,
    no_align: bool = False,
) -> Options:
    """The analysis options: the config file's ``[stages]`` table with the flags that were given on top."""
    from pipebubble import config as configuration

    flags = {
        "stage_by": stage_by.value if stage_by is not None else None,
        "stage": stage,
        "pp_size": pp_size,
        "rank_order": rank_order,
        "microbatch_regex": microbatch_regex,
        "wait_threshold": wait_threshold,
        "gpu_cost": gpu_cost,
        "memory_limit": memory_limit,
        "peak_flops": peak_flops,
        "peak_bandwidth": peak_bandwidth,
        "step_regex": step_regex,
        "tbt_slo": tbt_slo,
        "align": False if no_align else None,
    }
    return Options.from_settings(merge(configuration.load(config).stages, **flags))


def scale(executor: Enum | str = "local", workers: int | None = None, ray_address: str | None = None,
          memory_budget: str | None = None, no_cache: bool = False) -> Scale:
    from pipebubble import budget

    name = executor.value if isinstance(executor, Enum) else executor
    given = budget.parse(memory_budget) if memory_budget is not None else None
    return Scale(name, workers, ray_address, use_cache=not no_cache, memory_budget=given)
