"""Memory, the pipeline's fourth knob: the allocator events of every device summarised (peak, when, per step,
a timeline to draw) and, for a pipeline, what each stage holds: its static part, the bytes one micro-batch
holds from its forward until its backward frees them, and how many micro-batches were in flight at its peak.
From those, what a schedule would need (``predict``).

Map (one file, ``part``): the allocator events are many (a third of a trace's events, with
``profile_memory=True``), so they are summarised where they are read: per device, per profiler step, a
timeline of at most ``TIMELINE_POINTS`` points, and per stage of the file its passes' memory. Reduce
(``summary``): stages numbered as the job's, times onto the job's clock, capacities and the schedule's
expected in-flight counts added.
"""

from pipebubble.analysis.memory.part import TIMELINE_POINTS, MemoryPart, memory_part
from pipebubble.analysis.memory.predict import inflight_max, predicted_peak
from pipebubble.analysis.memory.summary import memory_report

__all__ = ["TIMELINE_POINTS", "MemoryPart", "inflight_max", "memory_part", "memory_report", "predicted_peak"]
