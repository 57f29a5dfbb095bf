"""Kernel-level findings: tiny kernels' launch overhead (``tiny_kernels``) and layout conversions
(``layout_conversion``).

Both rest on whole-window facts (``Host.facts``), so both are read on the job's busiest GPU (the most work over
all steps, ``per_lane.busiest_lane``), each fact brought to each of its steps at the rate it ran.

- tiny_kernels: kernels that run under ``Host.short_kernel_ns`` (10 µs) cost the host a launch, and an eager
  operator's dispatch, longer than the GPU takes to run them, so the GPU waits between them. Worth, per step:
  the GPU's idle between two consecutive tiny kernels (``Host.facts.tiny_gaps``: gaps of its busy union whose
  both ends are tiny kernels, each at most 1 ms: a longer gap is another cause's), at most the step's idle;
  the mean over steps. What fusing them or replaying them as one graph gives back; their run time is not
  counted.
- layout_conversion: cuDNN's NCHW <-> NHWC conversions (``nchwToNhwc``, ``nhwcToNchw``, ``convertTensor``,
  transposes; ``Host.facts.streams`` tag ``layout``), which channels_last removes. Per step, their GPU time g
  and count n; the step gives back g where the GPU sets the pace and their launches (n x the mean launch
  call) where the host does. Worth = g x b + n x l x (1 - b), with b the share of the step the GPU is busy
  and l the mean launch call (``Host.api``); the mean over steps.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from pipebubble.analysis.breakdown.facts import LAYOUT
from pipebubble.analysis.findings import framework as fw
from pipebubble.analysis.findings.common import finding, gpu_step, gpus, mean, ms, step_rows
from pipebubble.analysis.findings.per_lane import busiest_lane, by_lane, on_step, whole_windows
from pipebubble.report import Breakdown, KernelStat, Report
from pipebubble.report.findings import Finding, Where

#: The runtime calls that launch a kernel (their mean duration is a launch's host cost).
LAUNCH_CALL = re.compile(r"^(cu|cuda|hip)(LaunchKernel|LaunchKernelEx|ExtModuleLaunchKernel|ModuleLaunchKernel"
                         r"|LaunchCooperativeKernel)\w*$")
#: Layout-conversion kernel names shown in a title.
SHOWN = 2


def findings(report: Report) -> list[Finding]:
    """The tiny-kernel and layout-conversion findings (none without breakdown rows or facts)."""
    groups = step_rows(report)
    if gpu_step(groups) is None or report.host is None:
        return []
    return [f for f in (tiny_kernels(report, groups), layout_conversion(report, groups)) if f is not None]


def tiny_kernels(report: Report, groups: list) -> Finding | None:
    """Kernels under 10 µs: the idle between them on the busiest GPU (module docstring)."""
    host, step = report.host, gpu_step(groups)
    whole = whole_windows(report)
    gaps = {g.lane: g for g in host.facts.tiny_gaps}
    top = busiest_lane(groups)
    worth = mean([min(on_step(gaps[b.lane].total_ns, b, whole, len(top)), b.idle_ns) if b.lane in gaps else 0
                  for b in top])
    if worth <= 0:
        return None
    kernels = [s for s in host.facts.streams if s.kind in ("compute", "comm")]
    count, tiny = sum(s.count for s in kernels), sum(s.tiny for s in kernels)
    total, tiny_ns = sum(s.total_ns for s in kernels), sum(s.tiny_ns for s in kernels)
    lanes = [top[0].lane]
    used = [gaps[lane] for lane in lanes if lane in gaps]
    evidence = {
        "kernels": count, "tiny_kernels": tiny, "tiny_share_of_kernels": tiny / count if count else None,
        "tiny_share_of_kernel_time": tiny_ns / total if total else None, "tiny_kernel_ns": host.short_kernel_ns,
        "gaps": {g.lane: {"count": g.count, "total_ns": g.total_ns} for g in used},
        "gap_ns_per_step": worth, "max_gap_ns": used[0].max_gap_ns if used else None, "busiest_gpus": lanes,
        "frameworks": fw.seen(report),
    }
    frameworks = fw.framework(report)
    return finding(
        "tiny_kernels",
        f"{tiny:,} of {count:,} kernels run under {host.short_kernel_ns / 1000:g} µs"
        + (f" ({tiny_ns / total:.1%} of kernel time)" if total else "")
        + f"; the busiest GPU ({', '.join(lanes)}) idles {ms(worth)} {step.per_words} between them",
        Where(gpus=lanes),
        "each tiny kernel costs the host a launch (and an operator's dispatch) longer than the GPU takes to run"
        " it, so the GPU waits between them",
        evidence, worth, gpus(report), step, _tiny_action(frameworks),
        f"per {step.per}, the idle of the job's busiest GPU between two consecutive kernels under"
        f" {host.short_kernel_ns / 1000:g} µs (gaps up to {(used[0].max_gap_ns if used else 0) / 1e6:g} ms; a"
        f" longer one is another cause's), its whole-window total brought to the {step.per} at the rate it ran, at"
        f" most the {step.per}'s idle; mean over {step.per}s. What fusing them or replaying them as one graph"
        " gives back",
    )


def layout_conversion(report: Report, groups: list) -> Finding | None:
    """cuDNN's layout conversions: their GPU time and launches a step (module docstring)."""
    host, step = report.host, gpu_step(groups)
    layout = [s for s in host.facts.streams if s.tag == "layout"]
    if not layout:
        return None
    whole = whole_windows(report)
    times = by_lane(layout, lambda s: True)
    counts: dict[str, int] = {}
    for s in layout:
        counts[s.lane] = counts.get(s.lane, 0) + s.count
    launch = _mean_launch(report)
    top = busiest_lane(groups)
    parts = [_conversions(b, times, counts, whole, len(top), launch) for b in top]
    worth = mean([p.worth for p in parts])
    if worth <= 0:
        return None
    lanes = [top[0].lane]
    names = [k for k in report.kernels if k.kind == "compute" and re.search(LAYOUT, _full(k).split("(")[0])]
    gpu_ns, per_step = mean([p.gpu_ns for p in parts]), mean([p.count for p in parts])
    evidence = {
        "conversions": sum(counts.values()), "conversion_ns": sum(times.values()),
        "per_step": {"count": per_step, "gpu_ns": gpu_ns, "busy_share": sum(p.busy for p in parts) / len(parts)},
        "launch_call_mean_ns": launch, "busiest_gpus": lanes,
        "kernels": {_full(k): {"count": k.count, "total_ns": k.total_ns} for k in names},
    }
    shown = ", ".join(str(k.name) for k in names[:SHOWN])  # as the kernel table names them
    return finding(
        "layout_conversion",
        f"layout conversions ({shown}): {per_step:,} kernels and {ms(gpu_ns)} of GPU time {step.per_words} on"
        f" {', '.join(lanes)} ({sum(counts.values()):,} in the trace)",
        Where(gpus=lanes),
        "cuDNN converts NCHW tensors to NHWC and back around convolutions whose fast kernels want NHWC",
        evidence, worth, gpus(report), step,
        "run convolutions in channels_last: model.to(memory_format=torch.channels_last) and every input batch"
        " x.to(memory_format=torch.channels_last) (with AMP, cuDNN then picks NHWC tensor-core kernels and needs no"
        " conversions)",
        f"per {step.per}, on the job's busiest GPU, the conversions' GPU time where it is busy and their launches"
        f" (count x the mean launch call) where it idles: g x busy share + n x launch x (1 - busy share), g and n"
        f" brought to the {step.per} at the rate they ran; mean over {step.per}s",
    )


class Conversions(NamedTuple):
    """One step's conversions on its busiest GPU: time, count, the GPU's busy share and the worth."""

    gpu_ns: int
    count: int
    busy: float
    worth: int


def _conversions(b: Breakdown, times: dict[str, int], counts: dict[str, int], whole: dict[str, int], steps: int,
                 launch: float) -> Conversions:
    """The conversions of ``b``'s step (module docstring): g x busy share + n x launch x (1 - busy share)."""
    busy = (b.window_ns - b.idle_ns) / b.window_ns if b.window_ns else 1.0
    gpu = on_step(times.get(b.lane, 0), b, whole, steps)
    n = on_step(counts.get(b.lane, 0), b, whole, steps)
    return Conversions(gpu, n, busy, round(gpu * busy + n * launch * (1 - busy)))


def _mean_launch(report: Report) -> float:
    """The mean duration of the host's kernel-launch calls (0 where none is recorded)."""
    calls = [c for c in report.host.api if c.name and LAUNCH_CALL.match(c.name)]
    count = sum(c.count for c in calls)
    return sum(c.total_ns for c in calls) / count if count else 0.0


def _full(kernel: KernelStat) -> str:
    """The name the trace gives a kernel (the table's ``name`` is its short form)."""
    return kernel.name_full or kernel.name or ""


def _tiny_action(frameworks: set[str]) -> str:
    if "cuda_graphs" in frameworks:
        action = ("the job already replays CUDA graphs: the tiny kernels between replays run eagerly; fuse them"
                  " (torch.compile) or capture them into the graph")
    else:
        action = ("fewer, bigger kernels: torch.compile fuses chains of small operations; CUDA graphs"
                  " (torch.compile(mode='reduce-overhead'), torch.cuda.graphs) launch many as one; fused or foreach"
                  " optimizers (fused=True)")
    if "torchrec" in frameworks:
        action += ("; TorchRec: table-batched embeddings (FBGEMM TBE) and fused feature permutes cut the per-feature"
                   " kernels")
    return action
