"""One output layer for check and diff: JUnit that validates against the junit-10 schema, GitHub lines that
parse as workflow commands, Markdown that folds passing rows, and one way of showing times and fractions."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import pytest
from synth import simulate, write_pipeline

from pipebubble.gates import check, diff
from pipebubble.render import cells
from pipebubble.render.gates import FORMATS, annotation, number, pair, render_check, render_diff

xmlschema = pytest.importorskip("xmlschema", reason="the dev extra installs xmlschema")

SCHEMA = Path(__file__).with_name("junit10.xsd")
FORWARD = [10_000, 12_000, 10_000, 10_000]


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, dict]:
    from pipebubble.run import run

    root = tmp_path_factory.mktemp("outputs")
    slow = [10_000, 15_000, 10_000, 10_000]
    folders = {"base": write_pipeline(root / "base", simulate("1f1b", 4, 8, FORWARD, [2 * f for f in FORWARD])),
               "slow": write_pipeline(root / "slow", simulate("1f1b", 4, 8, slow, [2 * f for f in slow]))}
    return {name: run([path]).to_dict() for name, path in folders.items()}


def checked(report: dict, strict: bool = False):
    result = check(report, {"max_bubble": 0.01, "min_utilization": 0.1, "max_wait_ms": 1e9,
                            "max_decode_slowdown": 2.0}, strict)
    return replace(result, source="runs/pr 12, try:2/", timestamp="2025-01-02T03:04:05", seconds=1.5)


def diffed(reports: dict, strict: bool = False, other: dict | None = None):
    result = diff(reports["base"], other or reports["slow"], 0.05, strict)
    return replace(result, base="perf/baseline.json", new="trace/", timestamp="2025-01-02T03:04:05", seconds=2.25)


def subjects(reports) -> list[tuple[str, object]]:
    toy = {**reports["base"], "pipeline": None, "stages": [], "waits": []}  # parts the base has, the new lacks
    return [("check", checked(reports["base"])), ("check", checked(reports["base"], strict=True)),
            ("diff", diffed(reports)), ("diff", diffed(reports, strict=True, other=toy)),
            ("diff", diffed(reports, other=reports["base"]))]


def render(command: str, subject, fmt: str, timeunit: str = "ms") -> str:
    return (render_check if command == "check" else render_diff)(subject, fmt, timeunit)


def test_every_format_of_both_commands_renders_deterministically(reports):
    for command, subject in subjects(reports):
        for fmt in FORMATS:
            assert render(command, subject, fmt) == render(command, subject, fmt) != ""
    with pytest.raises(ValueError, match="expected one of text, json, junit, github, markdown"):
        render_check(checked(reports["base"]), "html")


def test_junit_validates_against_the_junit_10_schema(reports):
    schema = xmlschema.XMLSchema(str(SCHEMA))
    for command, subject in subjects(reports):
        text = render(command, subject, "junit")
        schema.validate(text)  # raises, naming the element, on anything Jenkins' junit-10 would refuse
        root = ET.fromstring(text)
        suite = root.find("testsuite")
        assert root.tag == "testsuites" and suite is not None
        for attribute in ("tests", "failures", "errors", "skipped", "time", "timestamp"):
            assert suite.get(attribute) is not None, attribute
        cases = suite.findall("testcase")
        assert int(suite.get("tests")) == len(cases)
        assert int(suite.get("failures")) == len(suite.findall("testcase/failure"))
        assert int(suite.get("errors")) == len(suite.findall("testcase/error"))
        assert int(suite.get("skipped")) == len(suite.findall("testcase/skipped"))


def test_the_schema_refuses_what_jenkins_refuses(reports):
    """A control: the schema is no rubber stamp (a suite without ``errors``, as this tool once wrote, fails)."""
    schema = xmlschema.XMLSchema(str(SCHEMA))
    root = ET.fromstring(render_check(checked(reports["base"]), "junit"))
    del root.find("testsuite").attrib["errors"]
    assert not schema.is_valid(ET.tostring(root, encoding="unicode"))
    root.find("testsuite").set("errors", "0")
    root.find("testsuite").set("time", "1.5s")
    assert not schema.is_valid(ET.tostring(root, encoding="unicode"))


def test_junit_holds_each_metric_value_threshold_and_unit(reports):
    result = checked(reports["base"], strict=True)
    suite = ET.fromstring(render_check(result, "junit")).find("testsuite")
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    bubble = next(g for g in result.gates if g.name == "bubble")
    assert float(props["bubble.value"]) == bubble.value and float(props["bubble.threshold"]) == 0.01
    assert props["bubble.unit"] == "fraction" and props["wait.unit"] == "ms"
    assert (suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("1", "1", "0")  # strict: error
    assert suite.get("timestamp") == "2025-01-02T03:04:05" and suite.get("time") == "1.500"
    loose = ET.fromstring(render_check(checked(reports["base"]), "junit")).find("testsuite")
    assert (loose.get("errors"), loose.get("skipped")) == ("0", "1")
    d = diffed(reports)
    props = {p.get("name"): p.get("value") for p in ET.fromstring(render_diff(d, "junit")).iter("property")}
    step = next(x for x in d.deltas if x.key == "pipeline.step_time_ns")
    assert float(props["pipeline.step_time_ns.baseline"]) == step.base
    assert float(props["pipeline.step_time_ns.value"]) == step.new
    assert float(props["pipeline.step_time_ns.threshold"]) == pytest.approx(step.base * 1.05)
    assert props["pipeline.step_time_ns.unit"] == "ns" and props["tolerance"] == "0.05"


COMMAND = re.compile(r"::(?P<name>[a-z]+)(?: (?P<props>[^:]*))?::(?P<message>.*)")


def parse_workflow_command(line: str) -> tuple[str, dict[str, str], str]:
    """A workflow command as the runner reads one (actions/toolkit's command format): ``::name k=v,k=v::data``,
    properties with %, CR, LF, ':' and ',' escaped, the data with %, CR and LF."""
    match = COMMAND.fullmatch(line)
    assert match, line
    props = {}
    for pair_ in filter(None, (match["props"] or "").split(",")):
        key, _, value = pair_.partition("=")
        props[key] = (value.replace("%0D", "\r").replace("%0A", "\n").replace("%3A", ":").replace("%2C", ",")
                      .replace("%25", "%"))
    message = match["message"].replace("%0D", "\r").replace("%0A", "\n").replace("%25", "%")
    return match["name"], props, message


def commands(text: str) -> list[tuple[str, dict[str, str], str]]:
    return [parse_workflow_command(line) for line in text.splitlines() if line.startswith("::")]


def test_github_lines_parse_as_workflow_commands_pointing_at_the_input(reports):
    found = commands(render_check(checked(reports["base"]), "github"))
    assert [name for name, _, _ in found] == ["error", "warning"]  # the failed gate, the skipped one
    assert all(props["file"] == "runs/pr 12, try:2/" for _, props, _ in found)  # ':' and ',' survive escaping
    assert found[0][1]["title"] == "pipebubble check: bubble fail" and found[0][2].startswith("bubble ")
    assert "%" in found[0][2]  # a fraction's % sign, escaped and read back
    strict = commands(render_check(checked(reports["base"], strict=True), "github"))
    assert [name for name, _, _ in strict] == ["error", "error"]
    found = commands(render_diff(diffed(reports), "github"))
    assert found and {name for name, _, _ in found} <= {"error", "notice", "warning"}
    assert all(props["file"] == "perf/baseline.json" for _, props, _ in found)
    errors = [message for name, _, message in found if name == "error"]
    assert len(errors) == len(diffed(reports).regressions) and any(m.startswith("stage 1 busy") for m in errors)
    assert all(line.startswith("::") or not line.startswith(":") for line in
               render_diff(diffed(reports), "github").splitlines())


def test_annotation_escapes_newlines_and_separators():
    line = annotation("error", "50% worse\nsee: a, b", "t:1,2", "a,b:c")
    assert "\n" not in line
    assert parse_workflow_command(line) == ("error", {"file": "a,b:c", "title": "t:1,2"}, "50% worse\nsee: a, b")


def test_markdown_folds_passing_rows_into_a_count(reports):
    d = diffed(reports)
    text = render_diff(d, "markdown")
    shown, folded = text.split("<details>")
    rows = [line for line in shown.splitlines() if line.startswith("| ") and not line.startswith("| metric")]
    assert len(rows) == len(d.regressions) + len(d.improvements)
    quiet = len(d.deltas) - len(rows)
    assert f"<summary>{quiet} within tolerance</summary>" in folded
    same = render_diff(diffed(reports, other=reports["base"]), "markdown")
    assert "**passed**" in same and "| metric |" not in same.split("<details>")[0]


def test_no_ns_names_on_values_shown_in_a_time_unit_and_timeunit_applies(reports):
    d = diffed(reports)
    for fmt in ("text", "markdown", "github"):
        text = render_diff(d, fmt)
        assert "_ns" not in text and "step time" in text
    step = next(x for x in d.deltas if x.key == "pipeline.step_time_ns")
    assert f"step time {cells.time(step.base, 'us')} us -> {cells.time(step.new, 'us')} us" in render_diff(
        d, "text", "us")
    bubble = next(x for x in d.deltas if x.key == "pipeline.bubble_fraction")
    assert f"bubble {cells.pct(bubble.base)} -> {cells.pct(bubble.new)}" in render_diff(d, "text", "us")
    assert f"| bubble | {cells.pct(bubble.base)} | {cells.pct(bubble.new)} |" in render_diff(d, "markdown")


def test_fractions_read_as_analyze_shows_them_and_close_values_never_read_the_same():
    assert number(0.4913, "fraction") == cells.pct(0.4913) == "49.1%"
    assert number(50.0, "ms", "us") == "50,000.00 us" and number(1.2345, "ratio") == "1.23"
    assert pair(0.30004, 0.3, "fraction") == ("30.004%", "30.000%")
    assert pair(0.5, 0.3, "fraction") == ("50.0%", "30.0%")
