"""Renderers on fixed, hand-built reports: golden outputs (text at several widths), byte-identical reruns, width
limits. The HTML page in Chromium: test_html_page.py; the terminal's fitting and the timeline's numbers:
test_render_widths.py.

Regenerate the golden files after an intended change with
``PIPEBUBBLE_UPDATE_GOLDEN=1 pytest tests/render/test_render.py``.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from pipebubble.render import formats, render
from pipebubble.report import (
    Breakdown,
    CallStat,
    CollectiveCall,
    CollectiveRank,
    Collectives,
    Host,
    IngestSummary,
    Interference,
    KernelStat,
    Lane,
    Pipeline,
    Recommendation,
    Report,
    Segment,
    Stage,
    StepResult,
    Wait,
)
from pipebubble.report.names import short_names

GOLDEN = Path(__file__).parents[1] / "golden"
MS = 1_000_000
T0 = 1_700_000_000_000_000_000  # traces carry epoch-like clocks: the renderers must show times from the origin


def _ingest(files: int = 4) -> IngestSummary:
    return IngestSummary(files=[f"rank{r}.json" for r in range(files)], events_read=1234, spans=1000,
                         skipped={"metadata": 12}, warnings=[])


def _lane(name: str, kind: str, busy: int, window: int, rank: int = 0, stream: int | None = None) -> Lane:
    return Lane(name, kind, rank, 100 + rank, 100 + rank, 0 if kind == "gpu" else None, stream, busy, window - busy,
                T0, T0 + window)


def gpipe_schedule(p: int = 4, m: int = 4, f: int = 1 * MS, b: int = 2 * MS, comm: int = MS // 5) -> list[Segment]:
    """GPipe: all forwards flow down the stages, then all backwards flow back up; a send after each pass."""
    segs = []
    for s in range(p):
        for i in range(m):
            start = T0 + (s + i) * (f + comm)
            segs += [Segment(s, start, start + f, "forward", i, lane=f"rank{s}/gpu0/stream7"),
                     Segment(s, start + f, start + f + comm, "comm", None, lane=f"rank{s}/gpu0/stream13")]
        base = T0 + (p + m - 1) * (f + comm)
        for i in range(m):
            start = base + (p - 1 - s + i) * (b + comm)
            segs.append(Segment(s, start, start + b, "backward", m - 1 - i, lane=f"rank{s}/gpu0/stream7"))
    return sorted(segs, key=lambda g: (g.stage, g.start_ns))


def gpipe_report() -> Report:
    segs = gpipe_schedule()
    start, end = T0, max(g.end_ns for g in segs)
    # busy + idle = the window; idle = fill + drain + steady idle, and comm lies inside the idle (as the analysis)
    stages = [Stage(s, f"stage{s}", [f"rank{s}/gpu0"], 12 * MS, int(1.6 * MS), end - start - 12 * MS,
                    s * int(1.2 * MS), (3 - s) * int(2.2 * MS),
                    end - start - 12 * MS - s * int(1.2 * MS) - (3 - s) * int(2.2 * MS), 12 * MS / (end - start),
                    forward_ns=4 * MS, backward_ns=8 * MS, microbatches=4) for s in range(4)]
    waits = [Wait(3, T0 + int(3.6 * MS), int(3.6 * MS), "fill", None, "F0", step=0),
             Wait(0, T0 + int(4.8 * MS), int(6.6 * MS), "downstream", "ncclDevKernel_SendRecv(...)", "B3", step=0),
             Wait(1, T0 + int(6 * MS), int(2.2 * MS), "upstream", "F3", "B3", step=0),
             Wait(2, T0 + int(9 * MS), int(0.4 * MS), "comm", "F3", "B3", step=0)]
    pipeline = Pipeline(4, 4, "gpipe", 1, end - start, start, 0.4336, 3 / 7, 0.005, {"comm": 0.004, "upstream": 0.001},
                        0.04, 1.08, 47.62, 0.93, steps=[StepResult(0, start, end, 0.4286)], step_time_ns=end - start,
                        idle_cost_per_hour=12.5, idle_cost_per_step=0.0001,
                        effective_price_per_useful_gpu_hour=5.25,
                        recommendations=[Recommendation("m=16", "1f1b", 16, 1, 40 * MS, 0.158, 1.42),
                                         Recommendation("current: gpipe, m=4 → bubble 42.9 %", "gpipe", 4, 1,
                                                        20 * MS, 0.4286, 1.18),
                                         Recommendation("interleave v=2", "interleaved_1f1b", 4, 2, 22 * MS, 0.27,
                                                        1.1, "needs twice the model chunks")],
                        notes=["micro-batches from PP: labels"],
                        evidence=["micro-batch labels (torch_pipelining)", "send/recv between ranks"],
                        throughput_bound_with_comm=40.0, replayed_step_ns=20 * MS,
                        replay_error=(20 * MS - (end - start)) / (end - start))
    lanes = [_lane(f"rank{r}/gpu0", "gpu", 12 * MS, end - start, r) for r in range(4)]
    return Report(_ingest(), lanes, stages, pipeline, waits, None, segs)


def serving_report() -> Report:
    phases = ["prefill", "decode", "decode", "mixed", "decode", "decode", "decode", "prefill", "decode", "decode"]
    segs, t = [], T0
    for i, phase in enumerate(phases):
        dur = {"prefill": 6 * MS, "mixed": 5 * MS, "decode": 2 * MS}[phase]
        segs.append(Segment(0, t, t + dur, phase, step=i, lane="rank0/gpu0"))
        t += dur + MS // 2
    interference = {"steps": 10, "iterations": {"prefill": 2, "decode": 7, "mixed": 1, "idle": 0},
                    "source": "labels:vllm", "step_ms": {"decode": {"p50": 2.0, "p90": 2.0, "p99": 2.0},
                                                         "mixed": {"p50": 5.0, "p90": 5.0, "p99": 5.0}},
                    "decode_slowdown_when_mixed": 2.5, "tbt_ms": {"p50": 2.5, "p99": 8.5}, "generation_stalls": 2,
                    "ms_per_1k_prefill_tokens": 11.7, "chunk_for_slo_tokens": 512, "tbt_slo_ms": 50.0,
                    "step_cv": 0.61, "gpu_idle_between_steps_ns": 4_500_000,
                    "worst_episodes": [{"start_ns": T0 + 8 * MS, "dur_ns": 5 * MS, "class": "mixed",
                                        "prefill_tokens": 256, "decode_requests": 3, "slowdown": 2.5}]}
    lanes = [_lane("rank0/gpu0", "gpu", 31 * MS, t - T0), _lane("rank0/cpu/100", "cpu", 20 * MS, t - T0)]
    return Report(_ingest(1), lanes, [], None, [], Interference.from_dict(interference), segs)


def interleaved_schedule(p: int = 4, m: int = 8, v: int = 2, f: int = 3 * MS, b: int = 6 * MS,
                         hop: int = 2 * MS) -> list[Segment]:
    """Interleaved 1F1B in the shape the issue reported: p·m·v short passes a stage (its forwards and backwards
    through v chunks, a send after each), on lanes whose names are long thread ids (``rank0/pid12565/tid12565``)."""
    segs = []
    for s in range(p):
        lane = f"rank{s}/pid{12565 + s}/tid{12565 + s}"
        forwards = [(i, c) for g in range(0, m, p) for c in range(v) for i in range(g, g + p)]
        backwards = [(i, c) for g in range(0, m, p) for c in reversed(range(v)) for i in range(g, g + p)]
        warm = min((p - s - 1) * 2 + (v - 1) * p, len(forwards))
        order = [("forward", *x) for x in forwards[:warm]]
        for k in range(len(backwards)):
            order += [("forward", *forwards[warm + k])] if warm + k < len(forwards) else []
            order.append(("backward", *backwards[k]))
        t = T0 + s * (f + hop)
        for phase, mb, chunk in order:
            dur = f if phase == "forward" else b
            segs += [Segment(s, t, t + dur, phase, mb, chunk, 0, lane),
                     Segment(s, t + dur, t + dur + hop // 2, "comm", None, None, 0, lane)]
            t += dur + hop
    return sorted(segs, key=lambda g: (g.stage, g.start_ns))


def interleaved_report() -> Report:
    """A dense interleaved pipeline: the timeline cannot number every pass at 80 columns, the what-if labels
    differ only at their end (v=2, v=4) and comm is most of every stage's idle."""
    segs = interleaved_schedule()
    start, end = T0, max(g.end_ns for g in segs)
    window = end - start
    stages = []
    for s in range(4):
        mine = [g for g in segs if g.stage == s and g.phase != "comm"]
        busy = sum(g.end_ns - g.start_ns for g in mine)
        fill, drain = mine[0].start_ns - start, end - mine[-1].end_ns
        stages.append(Stage(s, f"rank{s}", [mine[0].lane], busy, int(0.8 * (window - busy)), window - busy, fill,
                            drain, window - busy - fill - drain, busy / window, forward_ns=16 * 3 * MS,
                            backward_ns=16 * 6 * MS, microbatches=8))
    waits = [Wait(3, T0, stages[3].fill_ns, "fill", None, "F0", step=0),
             Wait(0, T0 + 40 * MS, 7 * MS, "downstream", "F6", "B0", step=0),
             Wait(2, T0 + 20 * MS, 4 * MS, "upstream", "B4", "F5", step=0),
             Wait(1, T0 + 30 * MS, 2 * MS, "comm", "B7", None, step=0)]
    bubble = sum(st.idle_ns for st in stages) / (4 * window)
    recs = [Recommendation("rebalanced stages", "interleaved_1f1b", 8, 2, int(0.97 * window), 0.50, 1.03,
                           "layers moved from slow to fast stages"),
            Recommendation("current: interleaved_1f1b v=2, m=8", "interleaved_1f1b", 8, 2, window, bubble, 1.0),
            Recommendation("interleaved_1f1b v=4", "interleaved_1f1b", 8, 4, int(0.9 * window), 0.45, 1.11,
                           "each stage's model split into v equal chunks"),
            Recommendation("m=16", "interleaved_1f1b", 16, 2, int(1.5 * window), 0.6, 0.67, "same global batch")]
    pipeline = Pipeline(4, 8, "interleaved_1f1b", 2, window, start, bubble, 0.158, bubble - 0.158,
                        {"communication": bubble - 0.2, "imbalance": 0.042}, 0.07, 1.09, 58.34, 0.6,
                        steps=[StepResult(0, start, end, bubble)], step_time_ns=window, recommendations=recs,
                        evidence=["micro-batch labels (torch_pipelining)"], throughput_bound_with_comm=6.52)
    lanes = [_lane(f"rank{r}/pid{12565 + r}/tid{12565 + r}", "cpu", stages[r].busy_ns, window, r) for r in range(4)]
    return Report(_ingest(), lanes, stages, pipeline, waits, None, segs)


def lanes_report() -> Report:
    lanes = [_lane("rank0/gpu0", "gpu", 8 * MS, 10 * MS), _lane("rank0/gpu0/stream7", "gpu", 8 * MS, 10 * MS,
                                                                 stream=7),
             _lane("rank0/cpu/100", "cpu", 3 * MS, 12 * MS)]
    return Report(_ingest(1), lanes)


NOT_A_PIPELINE = ("not a pipeline: 8 ranks with no micro-batch labels, no send/recv between ranks and no pipeline"
                  " process group (use --pp-size or --stage-by to analyse one)")
STRAGGLER = "rank 7 arrived last at 5 of 8 collectives; others waited 31.2 ms for it"


def collectives_report(ranks: int = 8) -> Report:
    """A data-parallel job that is not a pipeline: rank 7 arrives last at most all-reduces and the others spin
    in their collective kernels waiting for it (stage None: the waits say their rank and lane)."""
    lane = "rank{}/gpu0".format
    per_rank = [CollectiveRank(r, 8, 0 if r == 7 else (4 + r % 3) * MS, int(31.2 * MS) if r == 7 else
                               (MS // 2 if r == 3 else 0), 5 if r == 7 else (1 if r == 3 else 0), lane(r))
                for r in range(ranks)]
    worst = [CollectiveCall("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", 3,
                            T0 + 40 * MS, int(9.5 * MS), 7, int(52.1 * MS), ranks),
             CollectiveCall("ncclDevKernel_AllGather_RING_LL(...)", 0, T0 + 2 * MS, int(2.25 * MS), 3, 9 * MS, ranks)]
    collectives = Collectives(8, per_rank, worst, straggler=7, waited_ns=sum(r.wait_ns for r in per_rank),
                              matched_by="end", unmatched=1)
    waits = [Wait(None, T0 + 40 * MS, int(9.5 * MS), "collective", "aten::mm", "ncclDevKernel_AllReduce", step=None,
                  lane=lane(0), rank=0, waited_for=7),
             Wait(None, T0 + 2 * MS, int(2.25 * MS), "collective", None, "ncclDevKernel_AllGather", lane=lane(5),
                  rank=5, waited_for=3),
             Wait(None, T0 + 60 * MS, MS, "host", "aten::add", None, lane=lane(2), rank=2)]
    lanes = [_lane(lane(r), "gpu", 70 * MS, 100 * MS, r) for r in range(ranks)]
    return Report(_ingest(ranks), lanes, [], None, waits, collectives=collectives,
                  notes=[NOT_A_PIPELINE, STRAGGLER])


ADD = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>,"
       " at::detail::Array<char*, 3> >")
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def _gpu(lane: str, rank: int, step: int | None, window: int, compute: int, comm: tuple[int, int],
         memory: tuple[int, int], causes: dict[str, int]) -> Breakdown:
    """One breakdown row; its idle is what the parts leave of the window, as the analysis defines it."""
    idle = window - compute - comm[1] - memory[1]
    assert sum(causes.values()) == idle
    overlap = (comm[0] - comm[1]) / comm[0] if comm[0] else None
    return Breakdown(lane, rank, 100 + rank, 0, step, T0 + (0 if step is None else (step - 1) * 50 * MS), window,
                     compute, comm[0], comm[1], memory[0], memory[1], idle, causes, overlap)


def gpu_time_report(gpus: int = 2) -> Report:
    """Two data-parallel GPUs over two profiler steps: their time breakdowns (whole window and per step), the
    kernels by total, and the host's runtime calls, launch delay and ranges (rank 1 waits on its peer more)."""
    rows = []
    for r in range(gpus):
        lane, slow = f"rank{r}/gpu0", r % 2
        rows += [_gpu(lane, r, None, 100 * MS + 123, 60 * MS - slow * 10 * MS, (20 * MS, 8 * MS + slow * 7 * MS),
                      (5 * MS, 2 * MS), {"cpu_ops": 12 * MS + 123 - slow * 7 * MS, "sync_stall": 8 * MS - slow * 8 * MS,
                                         "peer": 6 * MS + slow * 14 * MS, "unknown": 4 * MS + slow * 4 * MS}),
                 *(_gpu(lane, r, step, 50 * MS - step * MS, 30 * MS - slow * 5 * MS, (10 * MS, 4 * MS), (2 * MS, MS),
                        {"cpu_ops": 8 * MS - step * MS, "sync_stall": 2 * MS, "peer": 5 * MS * slow, "unknown": 5 * MS})
                   for step in (1, 2))]
    stats = [(ADD, "compute", 1200, 45 * MS, 37_500.0, 36_000.0, 20_000, 90_000, 5_123.4567, 0.45),
             (ALLREDUCE, "comm", 40, 30 * MS, 750_000.0, 700_000.0, 500_000, 2 * MS, 120_000.0, 0.3),
             ("ampere_sgemm_128x64_tn", "compute", 400, 20 * MS, 50_000.0, 50_000.0, 49_000, 51_000, 400.0, 0.2),
             ("Memcpy HtoD (Pageable -> Device)", "memcpy", 10, 4 * MS, 400_000.0, 400_000.0, 300_000, 500_000,
              50_000.0, 0.04),
             ("Memset (Device)", "memset", 5, MS, 200_000.0, 200_000.0, 200_000, 200_000, 0.0, 0.01)]
    short = short_names(row[0] for row in stats)  # as the analysis names them
    kernels = [KernelStat(short[row[0]], *row) for row in stats]
    host = Host(api=[CallStat("cudaStreamSynchronize", 10, 12 * MS, 1_200_000.0, 5 * MS),
                     CallStat("cudaLaunchKernel", 1650, 8_250_000, 5_000.0, 120_000),
                     CallStat("cudaMemcpyAsync", 10, 2 * MS, 200_000.0, 400_000)],
                ranges=[CallStat("ProfilerStep#1", 2, 98 * MS, 49 * MS, 49 * MS),
                        CallStat("ProfilerStep#2", 2, 96 * MS, 48 * MS, 48 * MS),
                        CallStat("forward", 4, 60 * MS, 15 * MS, 16 * MS)],
                launches=1650, launch_delay_mean_ns=45_000.5, launch_delay_median_ns=30_000.0,
                launch_delay_max_ns=2 * MS, short_kernels=800, short_kernel_ns=10_000)
    lanes = [_lane(f"rank{r}/gpu0", "gpu", 70 * MS, 100 * MS + 123, r) for r in range(gpus)]
    return Report(_ingest(gpus), lanes, breakdown=rows, kernels=kernels, host=host)


REPORTS = {"gpipe": gpipe_report, "interleaved": interleaved_report, "serving": serving_report,
           "lanes_only": lanes_report, "collectives": collectives_report, "gpu_time": gpu_time_report}
FORMATS = {"text": "txt", "markdown": "md", "html": "html", "json": "json"}
DOCUMENTS = ("markdown", "html", "json")  # golden at 100 columns; text has a golden file at each of WIDTHS
WIDTHS = (60, 80, 120, 200)


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("PIPEBUBBLE_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with PIPEBUBBLE_UPDATE_GOLDEN=1"
    assert text == path.read_text()


@pytest.fixture(autouse=True)
def fixed_date(monkeypatch):
    """The HTML header's date, fixed as a reproducible build fixes it, so that pages compare byte for byte."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", str(T0 // 1_000_000_000))


@pytest.mark.parametrize("fmt", DOCUMENTS)
@pytest.mark.parametrize("name", REPORTS)
def test_golden(name, fmt):
    check_golden(f"{name}.{FORMATS[fmt]}", render(REPORTS[name](), fmt, width=100))


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", REPORTS)
def test_text_golden_at_each_width(name, width):
    """The terminal report at 60, 80 (the piped default), 120 and 200 columns."""
    check_golden(f"{name}.{width}.txt", render(REPORTS[name](), "text", width=width))


@pytest.mark.parametrize("name", REPORTS)
def test_colour_and_lanes_and_zoom_golden(name):
    report = REPORTS[name]()
    check_golden(f"{name}.lanes.txt", render(report, "text", width=80, lanes=True))
    check_golden(f"{name}.window.txt", render(report, "text", width=80, window=(2 * MS, 9 * MS)))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", REPORTS)
def test_twice_is_byte_identical(name, fmt):
    assert render(REPORTS[name](), fmt, width=120, color=True) == render(REPORTS[name](), fmt, width=120, color=True)


@pytest.mark.parametrize("width", [60, 80, 200])
@pytest.mark.parametrize("lanes", [False, True])
@pytest.mark.parametrize("name", REPORTS)
def test_text_never_wider_than_width(name, width, lanes):
    text = render(REPORTS[name](), "text", width=width, lanes=lanes)
    assert "\x1b[" not in text
    assert max(len(line) for line in text.splitlines()) <= width


def test_timeline_reads_without_colour():
    text = render(gpipe_report(), "text", width=200)
    rows = [line for line in text.splitlines() if line.lstrip().startswith("s") and "│" in line]
    assert len(rows) == 4
    assert "F0" in rows[0] and "B3" in rows[0] and "·" in rows[3] and "~" in rows[0]
    assert "bubble: 43.4% measured vs 42.9% in theory" in text and "idle cost" in text


def test_colour_adds_styles_only():
    plain = render(gpipe_report(), "text", width=100)
    coloured = render(gpipe_report(), "text", width=100, color=True)
    assert "\x1b[" in coloured and "\x1b[" not in plain


def test_step_zoom_and_unknown_step():
    assert render(gpipe_report(), "text", width=100, step=0) != ""
    with pytest.raises(ValueError, match="step 5"):
        render(gpipe_report(), "text", width=100, step=5)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("interference", [{}, {"steps": 3}, {"iterations": {"decode": 3}, "worst_episodes": [{}]}])
def test_interference_with_missing_keys(fmt, interference):
    assert render(replace(serving_report(), interference=Interference.from_dict(interference)), fmt, width=80)


@pytest.mark.parametrize("fmt", FORMATS)
def test_degenerate_report(fmt):
    empty = Report(_ingest(0), [])
    one = Report(_ingest(1), [], [Stage(0, "", [], 0, 0, 0, 0, 0, 0, 0.0)], None, [], None,
                 [Segment(0, T0, T0, "forward", 0)])
    assert render(empty, fmt, width=40) and render(one, fmt, width=40)


def test_json_is_the_report():
    assert json.loads(render(gpipe_report(), "json"))["pipeline"]["schedule"] == "gpipe"


@pytest.mark.parametrize("path,fmt", [("r.md", "markdown"), ("r.html", "html"), ("r.htm", "html"),
                                      ("r.json", "json"), ("r.txt", "text"), ("r.pftrace", None), ("r", None)])
def test_format_from_suffix(path, fmt):
    found = formats.from_suffix(Path(path), "analyze")
    assert (found.name if found else None) == fmt


def test_html_is_self_contained():
    html = render(gpipe_report(), "html")
    assert "<svg" in html and "<title>" in html and "http://" not in html.replace("http://www.w3.org", "")
    assert "https://" not in html and "<script src" not in html


def test_terminal_lane_table_is_bounded_and_says_how_many_more(tmp_path):
    """Thousands of thread lanes: the terminal shows the first rows and a count of the rest; JSON has all."""
    import json as _json

    from pipebubble.options import Options, Scale
    from pipebubble.render import terminal
    from pipebubble.run import run

    events = [{"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": t, "ts": t, "dur": 2} for t in range(500)]
    path = tmp_path / "threads.json"
    path.write_text(_json.dumps({"traceEvents": events}))
    report = run([path], Options(), Scale(use_cache=False))
    assert len(report.lanes) == 500
    text = terminal.render(report, width=120)
    assert sum(line.startswith("rank0/pid1/tid") for line in text.splitlines()) == terminal.TERMINAL_LANES
    assert f"{500 - terminal.TERMINAL_LANES} more lanes not shown" in text


@pytest.mark.parametrize("fmt", ["text", "markdown", "html"])
def test_a_job_without_a_gpu_bills_cpu_time(fmt):
    """The idle per step and a finding's worth count the stages' devices: GPU-ms for a job with GPUs, CPU-ms
    for a pipeline of CPU ranks (its lanes hold no GPU); the JSON keys keep their names."""
    from pipebubble.report import Finding, Where

    found = Finding("imbalance", "stage 3 sets the pace", Where(stages=[3]), "uneven layers", {}, 2 * MS, 8 * MS,
                    "move a layer", "replay", worth_share=0.1)
    job = gpipe_report()
    gpus = replace(job, findings=[found], pipeline=replace(job.pipeline, idle_gpu_ns_per_step=20 * MS))
    cpus = replace(gpus, lanes=[replace(lane, kind="cpu", device=None) for lane in gpus.lanes])
    on_gpus, on_cpus = (render(r, fmt, width=200) for r in (gpus, cpus))
    assert "GPU-ms per step" in on_gpus and "8.00 GPU-ms" in on_gpus and "useful GPU-hour" in on_gpus
    assert "CPU-ms per step" in on_cpus and "8.00 CPU-ms" in on_cpus and "useful CPU-hour" in on_cpus
    assert "CPU-" not in on_gpus and "GPU-ms" not in on_cpus
    assert gpus.billed == "GPU" and cpus.billed == "CPU" and replace(gpus, lanes=[]).billed == "GPU"
    assert json.loads(render(cpus, "json"))["pipeline"]["idle_gpu_ns_per_step"] == cpus.pipeline.idle_gpu_ns_per_step
