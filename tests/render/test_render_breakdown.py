"""The GPU time breakdown, kernel and host sections in every document format, on hand-built reports; CSV of
every --table (read back with the csv module); --timeunit and --top; the terminal's caps and its fitting of
wide tables; and the real CLI, piped or with NO_COLOR, on a saved report and on a bundled sample."""

from __future__ import annotations

import csv
import html
import io
import json
import re
from dataclasses import replace
from html.parser import HTMLParser

import pytest
from runs import SAMPLE, run_cli
from test_render import ADD, MS, T0, collectives_report, fixed_date, gpipe_report, gpu_time_report  # noqa: F401

from pipebubble.render import cells, choices, csv_table, formats, render, sections, terminal
from pipebubble.render.sections import gputime
from pipebubble.report import KernelStat, Report
from pipebubble.report.idle import CAUSES

DOCUMENTS = ("text", "markdown", "html")
TITLES = ["GPU time (", "GPU idle by cause", "GPU time per profiler step", "Kernels and memory operations", "Host",
          "Runtime API calls", "Annotation ranges", "Lanes"]


def untagged(text: str) -> str:
    """A page's text without its tags (a heading's explanation is set in smaller type), entities read back."""
    return html.unescape(re.sub(r"<[^>]+>", "", text))


def rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


@pytest.mark.parametrize("fmt", DOCUMENTS)
def test_sections_in_every_document_in_order(fmt):
    out = untagged(render(gpu_time_report(), fmt, width=160))
    at = [out.index(title) for title in TITLES]
    assert at == sorted(at), fmt
    for text in ("rank1/gpu0", "exp comm ms", "CPU ops ms", "33.00", "33.0%", "25.0%", "cudaStreamSynchronize",
                 "ProfilerStep#2", "1,650 kernel launches", "mean 0.05 ms, median 0.03 ms, max 2.00 ms",
                 "short kernels: 800 shorter than 10 us", "top 5 of 5 by total", "memset"):
        assert text in out, (fmt, text)


def test_sections_come_after_the_pipeline_and_collectives():
    report = replace(gpipe_report(), breakdown=gpu_time_report().breakdown, kernels=gpu_time_report().kernels)
    for fmt in DOCUMENTS:
        out = untagged(render(report, fmt, width=160))
        assert out.index("What if") < out.index("GPU time (") < out.index("Kernels and") < out.index("Lanes (")


def test_the_breakdown_rows_read_as_the_report_says():
    report = gpu_time_report()
    table = gputime.breakdown_table(report)
    assert table.columns == ["gpu", "window ms", "compute ms", "exp comm ms", "exp mem ms", "idle ms", "idle",
                             "overlap"]
    assert table.rows[1] == ["rank1/gpu0", "100.00", "50.00", "15.00", "2.00", "33.00", "33.0%", "25.0%"]
    idle = gputime.idle_table(report)
    assert idle.columns == ["gpu", "idle ms", "sync ms", "CPU ops ms", "peer ms", "unknown ms"]  # causes held
    assert idle.rows[1] == ["rank1/gpu0", "33.00", "0.00", "5.00", "20.00", "8.00"]
    steps = gputime.step_table(report)
    assert [row[:2] for row in steps.rows] == [["rank0/gpu0", "1"], ["rank0/gpu0", "2"], ["rank1/gpu0", "1"],
                                               ["rank1/gpu0", "2"]]
    assert steps.rows[2][2:] == ["49.00", "51.0%", "8.2%", "38.8%"]


def test_step_rows_follow_the_gpu_order_whatever_the_report_order():
    report = gpu_time_report()
    shuffled = replace(report, breakdown=report.breakdown[::-1])  # rank1's rows first, its steps backwards
    assert [r[:2] for r in gputime.step_table(shuffled).rows] == [["rank1/gpu0", "1"], ["rank1/gpu0", "2"],
                                                                  ["rank0/gpu0", "1"], ["rank0/gpu0", "2"]]


def test_empty_sections_are_left_out():
    for fmt in DOCUMENTS:
        out = render(Report(lanes=gpu_time_report().lanes), fmt, width=120)
        for title in TITLES[:-1]:
            assert title not in out, (fmt, title)
    no_causes = replace(gpu_time_report(), breakdown=[replace(b, idle_causes={}) for b in gpu_time_report().breakdown])
    assert not gputime.idle_table(no_causes).rows and gputime.breakdown_table(no_causes).rows


def test_unknown_launch_delay_and_extra_causes_are_shown_as_such():
    report = gpu_time_report()
    host = replace(report.host, launch_delay_mean_ns=None, launch_delay_median_ns=None, launch_delay_max_ns=None)
    assert "launch delay unknown" in gputime.host_facts(replace(report, host=host))[0]
    odd = replace(report, breakdown=[replace(b, idle_causes={**b.idle_causes, "gc": 1}) for b in report.breakdown])
    assert gputime.idle_table(odd).columns[-1] == "gc ms"
    assert "idle_gc_ms" in rows(csv_table.render(odd, "breakdown"))[0]


class Bars(HTMLParser):
    """The stacked bars of the page: for each GPU, its parts' widths and titles."""

    def __init__(self):
        super().__init__()
        self.bars: list[list[tuple[float, str]]] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "div" and attrs.get("class") == "gb":
            self.bars.append([])
        elif tag == "i" and self.bars and "width:" in (attrs.get("style") or ""):
            self.bars[-1].append((float(re.search(r"width:([\d.]+)%", attrs["style"]).group(1)), attrs["title"]))


def test_html_draws_a_stacked_bar_per_gpu_that_fills_its_window():
    page = render(gpu_time_report(5), "html")
    parser = Bars()
    parser.feed(page)
    assert len(parser.bars) == 5
    for bar in parser.bars:
        assert [title.split(": ")[1].rsplit(" ", 3)[0] for _, title in bar] == [p for p, _ in gputime.PARTS]
        assert sum(width for width, _ in bar) == pytest.approx(100, abs=0.02)
    assert parser.bars[1][1] == (15.0, "rank1/gpu0: exposed comm 15.00 ms (15.0%)")
    assert "https://" not in page and "<script" not in page and "<link" not in page


@pytest.mark.parametrize("table", choices.CSV_TABLES)
def test_every_csv_table_has_a_header_even_without_rows(table):
    for report in (Report(), gpu_time_report(), gpipe_report()):
        text = render(report, "csv", table=table)
        header = next(csv.reader(io.StringIO(text)))
        assert header and all(re.fullmatch(r"[a-z0-9_]+", name) for name in header), header
        assert not any(name.endswith("_ns") for name in header)  # the default unit is ms
        assert len(rows(text)) == len(csv_table.TABLES[table][1](report))


def test_csv_kernels_in_us_read_back_exactly():
    got = rows(render(gpu_time_report(), "csv", table="kernels", timeunit="us"))
    assert list(got[0]) == ["name", "name_full", "class", "count", "total_us", "mean_us", "median_us", "min_us",
                            "max_us", "std_us", "share"]
    assert (got[0]["name"], got[0]["name_full"]) == ("vectorized_elementwise_kernel", ADD)  # commas and all, quoted
    assert (got[0]["class"], got[0]["count"], got[0]["total_us"], got[0]["mean_us"]) == ("compute", "1200", "45000",
                                                                                         "37.5")
    assert got[0]["std_us"] == "5.123457" and float(got[0]["share"]) == 0.45  # a mean to the thousandth of a ns
    assert [r["class"] for r in got] == ["compute", "comm", "compute", "memcpy", "memset"]


def test_csv_breakdown_has_the_idle_causes_as_columns_and_exact_times():
    got = rows(render(gpu_time_report(), "csv", table="breakdown"))
    assert len(got) == 6 and got[0]["step"] == "" and got[1]["step"] == "1"  # unknown: an empty cell
    first = got[0]
    assert first["window_ms"] == "100.000123" and first["idle_ms"] == "30.000123"
    assert first["window_start_ms"] == str(T0 // MS)
    causes = [f"idle_{c}_ms" for c in CAUSES]
    assert list(first)[-len(causes) - 1:] == [*causes, "overlap"] and "idle_causes" not in first
    for row in got:  # the parts add up to the window, the causes to idle, in the file's own digits
        parts = sum(float(row[k]) for k in ("compute_ms", "comm_exposed_ms", "memory_exposed_ms", "idle_ms"))
        assert parts == pytest.approx(float(row["window_ms"]), abs=1e-9)
        # a cause the report does not hold (a hand-built one holds four) is an empty cell: unknown, not 0
        assert sum(float(row[k] or 0) for k in causes) == pytest.approx(float(row["idle_ms"]), abs=1e-9)
    ns = rows(render(gpu_time_report(), "csv", table="breakdown", timeunit="ns"))
    assert ns[0]["window_ns"] == "100000123" and ns[0]["window_start_ns"] == str(T0)
    assert rows(render(gpu_time_report(), "csv", table="breakdown", timeunit="s"))[0]["window_s"] == "0.100000123"


def test_csv_lanes_waits_and_stages():
    lanes = rows(render(gpu_time_report(), "csv", table="lanes", timeunit="us"))
    assert lanes[0]["busy_us"] == "70000" and lanes[0]["window_us"] == "100000.123" and lanes[0]["stream"] == ""
    assert float(lanes[0]["idle_fraction"]) == pytest.approx(0.3, abs=1e-5)
    waits = rows(render(gpipe_report(), "csv", table="waits"))
    assert waits[1]["cause"] == "downstream" and waits[1]["dur_ms"] == "6.6" and waits[0]["before"] == ""
    assert waits[1]["before"] == "ncclDevKernel_SendRecv(...)"
    stages = rows(render(gpipe_report(), "csv", table="stages"))
    assert [s["stage"] for s in stages] == ["0", "1", "2", "3"]
    assert stages[0]["busy_ms"] == "12" and stages[0]["lanes"] == "rank0/gpu0" and stages[1]["fill_ms"] == "1.2"


def test_csv_numbers_have_no_thousands_separators():
    for table in choices.CSV_TABLES:
        for row in rows(render(gpu_time_report(), "csv", table=table, timeunit="ns")):
            for key, value in row.items():
                if key.endswith("_ns") and value:
                    assert re.fullmatch(r"-?\d+(\.\d+)?", value), (table, key, value)


def test_unknown_table_or_unit_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="expected one of kernels, breakdown, lanes, waits, stages"):
        render(gpu_time_report(), "csv", table="gpus")
    with pytest.raises(ValueError, match="expected one of ns, us, ms, s"):
        render(gpu_time_report(), "csv", timeunit="min")
    with pytest.raises(ValueError, match="expected one of ns, us, ms, s"):
        render(gpu_time_report(), "text", timeunit="min")


def test_the_registry_knows_csv_and_the_flags_choices_are_the_renderers():
    assert formats.pick("analyze", None, "gpu.csv").name == "csv" and "csv" in formats.names("analyze")
    assert tuple(csv_table.TABLES) == choices.CSV_TABLES and tuple(cells.UNITS) == choices.TIME_UNITS


@pytest.mark.parametrize("unit,factor", [("ns", 1), ("us", 1_000), ("ms", MS), ("s", 1_000_000_000)])
def test_timeunit_labels_the_columns_and_scales_the_times(unit, factor):
    text = render(gpu_time_report(), "text", width=200, timeunit=unit)
    for label in ("window", "compute", "exp comm", "idle", "CPU ops", "total", "mean", "median", "std", "busy"):
        assert f"{label} {unit}" in text, label
    assert f"GPU time ({unit};" in text and "launch delay (launch call start to GPU start) mean" in text
    idle = cells.time(33 * MS + 123, unit)
    assert idle in text and idle == f"{(33 * MS + 123) / factor:,.{cells.UNITS[unit][1]}f}"
    for fmt in ("markdown", "html"):
        assert f"total {unit}" in render(gpu_time_report(), fmt, timeunit=unit)


def test_timeunit_reaches_every_table_and_fact_but_the_timeline_and_serving():
    text = render(gpipe_report(), "text", width=200, timeunit="us")
    for label in ("step 23,600.00 us", "busy", "at us", "step us", "busy us"):
        assert label in text, label
    assert "ms" not in text.split("Timeline")[0]  # the header lines are in us
    assert text.count("Timeline") == 1 and "Stages (us over the step windows W" in text
    ranks = sections.table(collectives_report(), "collective_ranks", T0, sections.Layout("s"))
    assert ranks.columns[3:5] == ["wait s", "late s"] and ranks.rows[0][4] == "0.0312"
    assert "collective wait: 0.0340 s over all ranks" in render(collectives_report(), "text", width=200, timeunit="s")


def test_cells_time_formats_each_unit():
    assert cells.time(1_234_567, "ns") == "1,234,567" and cells.time(1_234_567, "us") == "1,234.57"
    assert cells.time(1_234_567, "ms") == "1.23" and cells.time(1_234_567_890, "s") == "1.2346"
    assert cells.time(None, "us") == "-" and cells.time(37_500.0, "ns") == "37,500"
    assert cells.natural(10_000) == "10 us" and cells.natural(2_500_000) == "2.5 ms" and cells.natural(500) == "500 ns"


def test_top_sets_the_rows_of_the_kernel_api_and_range_tables():
    report = gpu_time_report()
    table = gputime.kernel_table(report, top=2)
    assert len(table.rows) == 2 and table.title.startswith("Kernels and memory operations (top 2 of 5")
    assert table.notes == ("3 more operations not shown: --top, --format csv --table kernels or json list them",)
    assert len(gputime.api_table(report, 1).rows) == 1 and len(gputime.range_table(report, 2).rows) == 2
    for fmt in DOCUMENTS:
        out = render(report, fmt, width=200, top=1)
        assert "top 1 of 5" in out and "top 1 of 3 by total" in out and "ampere_sgemm" not in out, fmt
    assert len(rows(render(report, "csv", top=1))) == 5  # the csv holds every kernel


def test_the_terminal_caps_gpus_and_steps_and_the_documents_list_them_all():
    report = gpu_time_report(100)
    text = terminal.render(report, width=120)
    gpu_rows = [line for line in text.splitlines() if re.match(r"rank\d+/gpu0 +[\d,.]+ +[\d,.]+ +[\d,.]+ +[\d,.]+ +"
                                                               r"[\d,.]+ +[\d,.]+%", line)]
    assert len(gpu_rows) == terminal.TERMINAL_GPUS
    assert f"{100 - terminal.TERMINAL_GPUS} more GPUs not shown" in text
    assert f"{200 - terminal.TERMINAL_STEPS} more step rows not shown" in text
    markdown = render(report, "markdown")
    assert sum(bool(re.match(r"\| rank\d+/gpu0 \| [\d,.]+ \| [\d,.]+ \| [\d,.]+ \| [\d,.]+ \| [\d,.]+ \| [\d.]+%",
                             line)) for line in markdown.splitlines()) == 100
    assert sum(bool(re.match(r"\| rank\d+/gpu0 \| [12] \|", line)) for line in markdown.splitlines()) == 200
    assert "more GPUs not shown" not in markdown


@pytest.mark.parametrize("width", [60, 80, 100, 140])
@pytest.mark.parametrize("unit", ["ns", "ms"])
def test_a_wide_table_stacks_its_headers_then_names_what_it_leaves_out(width, unit):
    text = render(gpu_time_report(), "text", width=width, timeunit=unit)
    assert max(len(line) for line in text.splitlines()) <= width
    fitted = terminal.fit(gputime.kernel_table(gpu_time_report(), unit=unit), width)
    shown, dropped = fitted.section, fitted.dropped
    for row in shown.rows:  # every number shown is whole: cells of a numeric column are never cut
        for i in shown.numeric:
            assert re.search(rf"(?<![\d,.]){re.escape(row[i])}(?![\d,.])", text), (row[i], width)
    if dropped:
        assert f"not shown at {width} columns: {', '.join(dropped)}" in text.replace("\n  ", " ")


def test_fit_keeps_a_table_that_fits_as_it_is():
    table = gputime.breakdown_table(gpu_time_report())
    assert terminal.fit(table, 200) == terminal.Fit(table, [], terminal.GAP, (None,) * len(table.columns))
    stacked = terminal.fit(table, 80)
    assert stacked.section.columns[1] == "window\nms" and stacked.dropped == []
    narrow = terminal.fit(table, 50)
    assert narrow.dropped and narrow.section.columns[0] == "gpu"
    assert len(narrow.section.columns) + len(narrow.dropped) == len(table.columns)


def test_a_saved_report_reads_back_its_kernels_and_renders_the_same():
    report = gpu_time_report()
    data = json.loads(json.dumps(report.to_dict()))
    assert data["kernels"][0]["class"] == "compute" and "kind" not in data["kernels"][0]
    again = Report.from_dict(data)
    assert isinstance(again.kernels[0], KernelStat) and again.host == report.host
    for fmt in (*DOCUMENTS, "csv"):
        assert render(again, fmt, width=100) == render(report, fmt, width=100)


@pytest.mark.parametrize("env", [{"NO_COLOR": "1"}, {}])
def test_cli_on_a_saved_report_is_plain_when_piped(tmp_path, env):
    saved = tmp_path / "report.json"
    saved.write_text(json.dumps(gpu_time_report().to_dict()))
    proc = run_cli("analyze", str(saved), "--width", "100", "--timeunit", "us", "--top", "2", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b[" not in proc.stdout and max(len(line) for line in proc.stdout.splitlines()) <= 100
    for text in ("GPU time (us;", "GPU idle by cause", "exp comm us", "top 2 of 5", "Host", "Runtime API calls (top 2"):
        assert text in proc.stdout, text
    out = tmp_path / "gpu.csv"
    proc = run_cli("analyze", str(saved), "--table", "breakdown", "--timeunit", "us", "-o", str(out), env=env)
    assert proc.returncode == 0, proc.stderr
    assert rows(out.read_text())[0]["window_us"] == "100000.123"


def test_cli_refuses_table_without_csv_and_an_unknown_unit(tmp_path):
    saved = tmp_path / "report.json"
    saved.write_text(json.dumps(gpu_time_report().to_dict()))
    proc = run_cli("analyze", str(saved), "--table", "lanes")
    assert proc.returncode == 2 and "--table chooses the table of --format csv" in proc.stderr
    assert run_cli("analyze", str(saved), "--timeunit", "min").returncode == 2


@pytest.mark.parametrize("table", choices.CSV_TABLES)
def test_cli_csv_of_the_sample_matches_its_json(table):
    report = json.loads(run_cli("analyze", str(SAMPLE), "--format", "json").stdout)
    proc = run_cli("analyze", str(SAMPLE), "--format", "csv", "--table", table, "--timeunit", "ns")
    assert proc.returncode == 0, proc.stderr
    got = rows(proc.stdout)
    where = {"memory": ("memory", "devices"), "memory_stages": ("memory", "stages"), "flops": ("flops", "by_gpu"),
             "flops_ops": ("flops", "ops"), "flops_stages": ("flops", "by_stage"),
             "flops_steps": ("flops", "by_step")}.get(table, (table,))
    items = report
    for key in where:
        items = (items or {}).get(key) if isinstance(items, dict) else None
    items = items or []
    assert len(got) == len(items)
    for row, item in zip(got, items, strict=True):  # with --timeunit ns the columns are the JSON keys
        for key, value in item.items():
            if isinstance(value, int | str) and not isinstance(value, bool) and key in row:
                assert row[key] == str(value), (table, key)


def test_cli_text_of_the_sample_is_plain_and_has_the_sections_its_report_holds():
    report = json.loads(run_cli("analyze", str(SAMPLE), "--format", "json").stdout)
    proc = run_cli("analyze", str(SAMPLE), "--width", "80", env={"NO_COLOR": "1"})
    assert proc.returncode == 0, proc.stderr
    assert "\x1b[" not in proc.stdout and max(len(line) for line in proc.stdout.splitlines()) <= 80
    assert ("GPU time (ms;" in proc.stdout) == any(b["step"] is None for b in report["breakdown"])
    assert ("Kernels and memory operations" in proc.stdout) == bool(report["kernels"])
    assert ("Host\n" in proc.stdout) == (report["host"] is not None)


def test_ranges_the_report_does_not_list_are_counted():
    report = gpu_time_report()
    many = replace(report, host=replace(report.host, ranges_total=5000))
    table = gputime.range_table(many, 2)
    assert table.title.endswith("(top 2 of 5,000 by total)")
    assert table.notes == ("4,998 more names not shown: --top or --format json lists the 3 with the most time",)
    assert gputime.range_table(report, 3).notes == ()
