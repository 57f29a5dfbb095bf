"""Where every GPU's time went, for every trace: the breakdown per GPU and per profiler step, the kernel
summary and the host side (what HolisticTraceAnalysis's temporal, idle and kernel breakdowns and
``nsys stats`` report), as unions over the span table, never sums of overlapping work.

Per GPU lane (``report.Breakdown``): compute = |∪ non-communication kernels|, comm = |∪ communication
kernels|, exposed comm = |∪(comm ∪ compute)| − compute, memory = |∪ memcpy/memset|, exposed memory =
|∪ all| − |∪(compute ∪ comm)|, idle = window − |∪ all|: compute + exposed comm + exposed memory + idle =
window. The whole-window row's window is the GPU's first to last busy instant; a step row's is the step's
range (``ProfilerStep#N``, or annotations matching ``--step-regex``), work clipped to it.

Idle time is split by cause from the idle account (``analysis/idle``): each gap between a GPU's work,
followed to the op that ended it, its launch and what the launching thread did until then. Steps are as the
GPU lives them (``idle.steps``): a step's CPU range and the GPU work launched inside it.

Map (one file): the breakdown rows (a GPU's lane and steps are in one file) and partial sums of the
summaries (duration value counts, so medians stay exact across files); reduce: the summaries.
"""

from pipebubble.analysis.breakdown.part import SHORT_KERNEL_NS, GpuPart, gpu_part
from pipebubble.analysis.breakdown.summary import MAX_RANGES, host, kernels
from pipebubble.report.idle import CAUSES

__all__ = ["CAUSES", "MAX_RANGES", "SHORT_KERNEL_NS", "GpuPart", "gpu_part", "host", "kernels"]
