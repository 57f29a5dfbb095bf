"""The format registry: every registered format renders a real report, suffixes resolve per command, an
explicit name wins, output is deterministic, and the document renderers follow the one section order."""

from __future__ import annotations

import ast
import gzip
import json
from fractions import Fraction
from functools import cache
from pathlib import Path

import pytest
from test_render import fixed_date  # noqa: F401  (autouse: the HTML header's date is fixed)

from pipebubble import render
from pipebubble.render import formats, sections

SAMPLE = Path(__file__).parents[2] / "sample_traces" / "pipeline_1f1b"
RENDER_DIR = Path(render.__file__).parent
pytestmark = pytest.mark.skipif(not SAMPLE.exists(), reason="sample traces absent")


@cache
def report_and_spans():
    """The sample's report and span table, decoded afresh (no cache)."""
    from pipebubble.options import Options, Scale
    from pipebubble.run import with_spans

    return with_spans([SAMPLE], Options(), Scale(use_cache=False))


def subject(command: str):
    """What ``command``'s formats render: a Report, its gates, a diff of it with itself, or a theory."""
    from pipebubble.gates import check, diff

    report, _ = report_and_spans()
    if command in ("analyze", "export"):
        return report
    if command == "check":
        return check(report.to_dict(), {"max_bubble": 0.3, "max_imbalance": 1.2, "max_decode_slowdown": 2.0})
    if command == "diff":
        return diff(report.to_dict(), report.to_dict(), 0.05)
    return theory()


def theory():
    from pipebubble.analysis.schedule.schedules import make_schedule
    from pipebubble.analysis.schedule.whatif import StageTimes, ideal_step_time_ns, simulate
    from pipebubble.render.theory import Theory

    times = StageTimes.uniform((1_000_000,) * 4, 8, Fraction(2))
    return Theory([("gpipe / 1f1b", "(p-1)/(m+p-1)", Fraction(3, 11))], simulate(make_schedule("1f1b", 4, 8, 1),
                                                                                 times), ideal_step_time_ns(times))


ALL = [(command, fmt) for command in formats.COMMANDS for fmt in formats.formats_for(command)]


@pytest.mark.parametrize("command,fmt", ALL, ids=[f"{c}-{f.name}" for c, f in ALL])
def test_every_format_renders_and_is_deterministic(command, fmt):
    options = formats.Options(spans=report_and_spans()[1], width=120)
    first = fmt.render(subject(command), options)
    assert isinstance(first, bytes if fmt.binary else str) and first
    assert fmt.render(subject(command), options) == first


@pytest.mark.parametrize("name", [f.name for f in render.report_formats()])
def test_render_entry_point(name):
    report, spans = report_and_spans()
    out = render.render(report, name, spans=spans, width=100)
    fmt = formats.get("analyze" if name in formats.names("analyze") else "export", name)
    assert isinstance(out, bytes if fmt.binary else str)
    assert out == render.render(report, name, spans=spans, width=100)


def test_perfetto_needs_the_spans_and_unknown_names_are_refused():
    report, _ = report_and_spans()
    for name in formats.names("export"):
        with pytest.raises(ValueError, match="span table"):
            render.render(report, name)
    with pytest.raises(ValueError, match="expected one of text, json"):
        render.render(report, "pdf")


def test_gzipped_chrome_json_is_the_chrome_json():
    report, spans = report_and_spans()
    plain = render.render(report, "perfetto-json", spans=spans)
    assert gzip.decompress(render.render(report, "perfetto-json-gz", spans=spans)).decode() == plain
    assert any(e["ph"] == "X" for e in json.loads(plain)["traceEvents"])


@pytest.mark.parametrize("command", ["analyze", "export"])
def test_each_suffix_maps_to_its_format(command):
    for fmt in formats.formats_for(command):
        for suffix in fmt.suffixes:
            assert formats.from_suffix(f"out{suffix}", command) is fmt
            assert formats.from_suffix(f"dir.d/OUT{suffix.upper()}", command) is fmt
            assert formats.pick(command, None, Path(f"out{suffix}")) is fmt


def test_json_means_the_report_for_analyze_and_chrome_json_for_export():
    assert formats.pick("analyze", None, "r.json").name == "json"
    assert formats.pick("export", None, "r.json").name == "perfetto-json"
    assert formats.pick("export", None, "r.json.gz").name == "perfetto-json-gz"
    assert formats.from_suffix("r.json", "analyze").name == "json"
    assert formats.from_suffix("r.pftrace", "analyze") is None


@pytest.mark.parametrize("command,path", [("analyze", "out.pdf"), ("analyze", "r.json.gz"), ("export", "x.txt"),
                                          ("export", "trace")])
def test_unknown_suffix_raises_one_line_naming_the_accepted(command, path):
    with pytest.raises(ValueError) as info:
        formats.pick(command, None, Path(path))
    message = str(info.value)
    assert "\n" not in message and path in message
    assert all(suffix in message for suffix in formats.suffixes(command))


def test_explicit_name_wins_over_suffix_and_default_applies():
    assert formats.pick("analyze", "html", "report.md").name == "html"
    assert formats.pick("analyze", formats.choices("analyze")("markdown"), "out.pdf").name == "markdown"
    assert formats.pick("analyze").name == "text" and formats.pick("analyze", None, "report").name == "text"
    with pytest.raises(ValueError, match="expected one of text, json, markdown, html"):
        formats.pick("analyze", "junit")


def test_check_diff_and_theory_keep_choosing_by_format_only():
    assert formats.pick("check", None, "gates.xml").name == "text"  # as before: -o only names the file
    assert formats.pick("check", "junit", "gates.log").name == "junit"
    assert formats.names("check") == formats.names("diff") == ["text", "json", "junit", "github", "markdown"]
    assert formats.names("theory") == ["text", "json"]
    assert formats.default("diff") == "text" and formats.default("export") is None


def test_choices_are_the_names():
    for command in formats.COMMANDS:
        assert [member.value for member in formats.choices(command)] == formats.names(command)


def _order(text: str, titles: list[str]) -> list[int]:
    return [text.index(title) for title in titles if title in text]


def test_document_renderers_follow_the_one_section_order():
    report, _ = report_and_spans()
    titles = ["Findings", "Timeline", "Stages", "Biggest waits", "What if", "Lanes"]
    for name in ("text", "markdown", "html"):
        at = _order(render.render(report, name, width=120), titles)
        assert len(at) >= 5 and at == sorted(at), name
    assert sections.SECTIONS[:2] == ("findings", "facts") and sections.SECTIONS[-2:] == ("lanes", "legend")


def test_renderers_never_print_nor_import_typer_nor_the_cli():
    for path in RENDER_DIR.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id != "print", path.name
            if isinstance(node, ast.Import | ast.ImportFrom):
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                assert not any(m.split(".")[0] == "typer" or m.startswith("pipebubble.cli") for m in modules), \
                    path.name
