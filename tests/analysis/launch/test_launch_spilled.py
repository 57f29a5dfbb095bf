"""A trace spilled to disk and not read whole skips the GPU annotations, launch queues and launch delays, and
says so; read whole, it gives them as in memory."""

from __future__ import annotations

from conftest import shared

from pipebubble.analysis.launch.summary import SKIPPED
from pipebubble.options import Options, Scale
from pipebubble.run import run


def test_a_spilled_trace_not_read_whole_skips_them_with_a_note(monkeypatch):
    path = shared("kineto", "resnet_v100_ns_resolution.json.gz")
    in_memory = run([path], Options(), Scale(use_cache=False))
    assert in_memory.gpu_annotations and in_memory.launch_queue and in_memory.launch_delays
    assert SKIPPED.format(1) not in in_memory.notes
    monkeypatch.setenv("PIPEBUBBLE_SPILL_BYTES", "1")
    spilled = run([path], Options(), Scale(use_cache=True))
    assert (spilled.gpu_annotations, spilled.launch_queue, spilled.launch_delays) == ([], [], [])
    assert SKIPPED.format(1) in spilled.notes
