"""The memory section on hand-built ``Memory`` objects: the sizes and times printed are the data's, a report
without allocator events says how to record them, the drawing is valid XML on every shape (one point, equal
times, zero bytes, 200 devices, names to escape), and each document renderer lays the tables out."""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET

import pytest
from rich.console import Console

from pipebubble.render import html, markdown, terminal
from pipebubble.render.sections.memory import ROWS_DRAWN, earliest, memory_facts, memory_svg, memory_tables, size
from pipebubble.report.memory import HOW_TO_RECORD, Memory, MemoryDevice, MemoryStage

GIB, MIB, MS = 1 << 30, 1 << 20, 1_000_000
T0 = 5_000 * MS  # the job's clock does not start at 0
SVG = "{http://www.w3.org/2000/svg}"


def device(lane: str, peak: int, at: int, points: list[list[int]] | None = None, **kw) -> MemoryDevice:
    fields = {"rank": None, "device_type": "cuda", "device": 0, "events": 1_000, "reserved_peak_bytes": None,
              "capacity_bytes": None, "start_bytes": 0, "end_bytes": 0, **kw}
    return MemoryDevice(lane=lane, peak_bytes=peak, peak_at_ns=at, timeline=points or [], **fields)


def pipeline() -> Memory:
    """Two stages of a 1F1B job on 80 GiB GPUs: s0 holds 2 micro-batches at its peak, s1 one."""
    d0 = device("rank0/gpu0", 16 * GIB, T0 + 120 * MS, [[T0, 10 * GIB], [T0 + 120 * MS, 16 * GIB],
                                                        [T0 + 300 * MS, 11 * GIB]],
                rank=0, events=4_321, reserved_peak_bytes=18 * GIB, capacity_bytes=80 * GIB)
    d1 = device("rank1/gpu0", 12 * GIB + 512 * MIB, T0 + 200 * MS, [[T0 + 10 * MS, 9 * GIB],
                                                                    [T0 + 200 * MS, 12 * GIB + 512 * MIB]],
                rank=1, events=2_000, capacity_bytes=80 * GIB, baseline="trace")
    s0 = MemoryStage(0, ["rank0/gpu0"], 16 * GIB, T0 + 120 * MS, 10 * GIB, 3 * GIB, 2, 2, 8, 80 * GIB)
    s1 = MemoryStage(1, ["rank1/gpu0"], 12 * GIB + 512 * MIB, T0 + 200 * MS, 9 * GIB, None, None)
    return Memory(events=6_321, devices=[d0, d1], stages=[s0, s1], notes=["two devices"])


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    return root


def texts(root: ET.Element) -> list[str]:
    return ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]


@pytest.mark.parametrize(("n", "text"), [(0, "0 B"), (512, "512 B"), (1023, "1,023 B"), (1536, "1.5 KiB"),
                                         (MIB - 1, "1.0 MiB"), (16 * GIB, "16.0 GiB"), (3 << 40, "3.0 TiB"),
                                         (-2 * MIB, "−2.0 MiB"), (None, "-")])
def test_size_is_binary_with_one_decimal(n, text):
    assert size(n) == text


def test_device_table_prints_the_data():
    devices = memory_tables(pipeline())[0]
    assert devices.columns == ["lane", "peak", "at ms", "reserved peak", "capacity", "of capacity", "events",
                               "baseline"]
    # times count from the earliest point (T0) unless the caller gives the timeline's origin
    assert devices.rows[0] == ["rank0/gpu0", "16.0 GiB", "120.00", "18.0 GiB", "80.0 GiB", "20.0%", "4,321",
                               "allocator"]
    assert devices.rows[1] == ["rank1/gpu0", "12.5 GiB", "200.00", "-", "80.0 GiB", "15.6%", "2,000", "trace"]
    later = memory_tables(pipeline(), origin_ns=T0 + 20 * MS, unit="us")[0]
    assert later.columns[2] == "at us" and later.rows[0][2] == "100,000.00"


def test_device_table_limit_says_how_many_more():
    memory = Memory(events=3, devices=[device(f"rank{i}/gpu0", i * MIB, T0) for i in range(3)])
    devices = memory_tables(memory, limit=1)[0]
    assert len(devices.rows) == 1
    assert devices.notes == ("2 more devices not shown: markdown, html or json list every device",)


def test_stage_table_prints_the_data_and_unknowns_as_dashes():
    stages = memory_tables(pipeline())[1]
    assert stages.columns[:9] == ["stage", "peak", "at ms", "static", "per micro-batch", "kept", "forwards",
                                  "in flight at peak", "expected"]
    assert stages.rows[0] == ["s0", "16.0 GiB", "120.00", "10.0 GiB", "3.0 GiB", "-", "8", "2", "2", "80.0 GiB",
                              "20.0%"]
    assert stages.rows[1] == ["s1", "12.5 GiB", "200.00", "9.0 GiB", "-", "-", "0", "-", "-", "-", "-"]


def test_no_stages_no_devices_no_tables():
    assert [t.title.split(" (")[0] for t in memory_tables(Memory(events=0))] == []
    only = memory_tables(Memory(events=1, devices=[device("rank0/gpu0", 0, T0)]))
    assert [t.title.split(" (")[0] for t in only] == ["Memory per device"]


def test_facts_say_the_peak_and_each_stage_as_its_parts():
    facts = memory_facts(pipeline())
    assert facts == [
        "memory: 6,321 allocator events read on 2 devices",
        "largest peak: 16.0 GiB allocated (20.0% of 80.0 GiB) on rank0/gpu0 at 120.00 ms; reserved peak 18.0 GiB",
        "1 of 2 devices count from the trace's start (memory held before it is unseen): their peaks are a floor",
        "stage 0: peak 16.0 GiB (at 120.00 ms): static 10.0 GiB, 2 micro-batches in flight holding 3.0 GiB each; the"
        " schedule holds at most 2",
        "stage 1: static 9.0 GiB, 12.5 GiB at peak (at 200.00 ms); bytes per micro-batch not measured",
        "note: two devices"]


def test_no_memory_says_how_to_record_it():
    assert memory_facts(None) == ["memory: not measured (no allocator events); record them with " + HOW_TO_RECORD]
    assert memory_facts(Memory(events=0)) == ["memory: 0 allocator events read on 0 devices"]


def test_svg_draws_one_row_per_stage_with_peak_and_static():
    root = parse(memory_svg(pipeline()))
    shown = texts(root)
    assert {"s0", "s1", "rank0/gpu0", "rank1/gpu0", "peak 16.0 GiB", "peak 12.5 GiB", "static 10.0 GiB",
            "static 9.0 GiB", "0", "10 GiB", "20 GiB", "time from the earliest point (ms)"} <= set(shown)
    assert len(list(root.iter(f"{SVG}circle"))) == 2
    dashed = [line for line in root.iter(f"{SVG}line") if line.get("stroke-dasharray")]
    assert len(dashed) == 2
    assert "0" in shown and "300" in shown  # the x-axis in ms from the earliest point


def test_svg_of_devices_escapes_lane_names():
    memory = Memory(events=2, devices=[device('<gpu & "0">', 4 * MIB, T0, [[T0, 4 * MIB]])])
    root = parse(memory_svg(memory))
    assert any('<gpu & "0">' in t for t in texts(root))
    assert not any(line.get("stroke-dasharray") for line in root.iter(f"{SVG}line"))


@pytest.mark.parametrize("memory", [
    Memory(events=0),
    Memory(events=1, devices=[device("rank0/gpu0", 0, T0, [[T0, 0]])]),  # zero bytes, one point
    Memory(events=3, devices=[device("rank0/gpu0", 8, T0, [[T0, 8], [T0, 2], [T0, 8]])]),  # equal times
    Memory(events=1, devices=[device("rank0/gpu0", 8, T0)]),  # no timeline, only the peak
    Memory(events=1, devices=[device("rank0/gpu0", 8, T0, [[T0, 8]])],
           stages=[MemoryStage(0, ["elsewhere"], 8, T0, 0, None, None)]),  # a stage whose device is not listed
    Memory(events=1, devices=[device("rank0/gpu0", -5, T0, [[T0, -5], [T0 + 1, 0]])]),  # running sums below 0
], ids=["empty", "zero-one-point", "equal-times", "no-timeline", "stage-without-device", "negative"])
def test_svg_copes_with_degenerate_shapes(memory):
    root = parse(memory_svg(memory, width=10))
    assert texts(root)
    for shape in ("circle", "path"):
        for element in root.iter(f"{SVG}{shape}"):
            assert "nan" not in "".join(element.attrib.values()).lower()


def test_svg_of_200_devices_draws_the_largest_peaks_and_says_how_many_not():
    devices = [device(f"rank{i}/gpu0", (i * 37 % 200) * MIB, T0 + i * MS, [[T0, 0], [T0 + i * MS, i]])
               for i in range(200)]
    root = parse(memory_svg(Memory(events=400, devices=devices)))
    assert len(list(root.iter(f"{SVG}circle"))) == ROWS_DRAWN
    assert f"{200 - ROWS_DRAWN} more devices not drawn (the {ROWS_DRAWN} largest peaks are; the tables list every" \
           " one)" in texts(root)
    assert "peak 199.0 MiB" in texts(root)


def test_times_count_from_the_earliest_point():
    assert earliest(pipeline()) == T0
    assert earliest(Memory(events=0)) == 0


def test_every_document_renderer_lays_the_tables_out():
    for section in memory_tables(pipeline()):
        first = section.rows[0]
        for width in (60, 120):
            console = Console(file=io.StringIO(), width=width, record=True)
            console.print(terminal.table(section, width))
            text = console.export_text()
            assert first[0] in text and max(map(len, text.splitlines())) <= width
        assert "| " + " | ".join(first) + " |" in markdown.table(section)
        assert "<td>" + "</td><td>".join(first) + "</td>" in html.table(section).replace('<td class="n"', "<td")
