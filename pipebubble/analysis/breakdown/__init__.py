"""Where every GPU's time went, for every trace: the breakdown per GPU and per profiler step, the kernel
summary and the host side (what HolisticTraceAnalysis's temporal, idle and kernel breakdowns and
``nsys stats`` report), as unions over the span table, never sums of overlapping work.

Per GPU lane (``report.Breakdown``): compute = |∪ non-communication kernels|, comm = |∪ communication
kernels|, exposed comm = |∪(comm ∪ compute)| − compute, memory = |∪ memcpy/memset|, exposed memory =
|∪ all| − |∪(compute ∪ comm)|, idle = window − |∪ all|: compute + exposed comm + exposed memory + idle =
window. The whole-window row's window is the GPU's first to last busy instant; a step row's is the step's
range (``ProfilerStep#N``, or annotations matching ``--step-regex``), work clipped to it.

Each gap between a GPU's work gets a cause from the op that ended it and the runtime call that launched
that op: ``sync`` (the launching thread was in a synchronize when the GPU went idle), ``peer`` (it was in
a collective or point-to-point call: waiting on another rank), ``host_launch`` (the launch began after the
GPU went idle: the host was late), ``other`` (launched before the gap: a stream or event dependency; or no
launch is known).

Map (one file): the breakdown rows (a GPU's lane and steps are in one file) and partial sums of the
summaries (duration value counts, so medians stay exact across files); reduce: the summaries.
"""

from pipebubble.analysis.breakdown.part import SHORT_KERNEL_NS, GpuPart, gpu_part
from pipebubble.analysis.breakdown.rows import CAUSES
from pipebubble.analysis.breakdown.summary import MAX_RANGES, host, kernels

__all__ = ["CAUSES", "MAX_RANGES", "SHORT_KERNEL_NS", "GpuPart", "gpu_part", "host", "kernels"]
