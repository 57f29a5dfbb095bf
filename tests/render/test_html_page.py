"""The HTML page: one offline file whose header names the inputs, the date and the version and shows the headline
numbers as cards; a colour per wait cause; a timeline that scales to the window; tooltips that say a wait's
cause, peer and passes; a missed TBT SLO highlighted; a stacked bar per stage and per GPU.

The structural tests always run (they read the page's markup and CSS); the screenshot test opens the pages in
headless Chromium at 800 and 1400 px and skips where no Chromium is installed (Debian's ``chromium``)."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import pytest
from test_render import (
    MS,
    T0,
    collectives_report,
    fixed_date,  # noqa: F401  (autouse: the HTML header's date is fixed)
    gpipe_report,
    gpipe_schedule,
    gpu_time_report,
    interleaved_report,
    serving_report,
)

from pipebubble import __version__
from pipebubble.render import html, render
from pipebubble.render.sections import pipeline

CHROMIUM = next((found for name in ("chromium", "chromium-browser", "google-chrome")
                 if (found := shutil.which(name))), None)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--hide-scrollbars",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# the page's own document width against its viewport's, written where --dump-dom shows it
PROBE = ("<script>document.body.setAttribute('data-probe', [document.documentElement.scrollWidth,"
         " document.documentElement.clientWidth].join(' '))</script>")


def missed_slo() -> object:
    """The serving report with a 5 ms time-between-tokens target: its p99 (8.5 ms) misses it."""
    report = serving_report()
    return replace(report, interference=replace(report.interference, tbt_slo_ms=5.0))


PAGES = {"gpipe": gpipe_report, "interleaved": interleaved_report, "serving_missed": missed_slo,
         "gpu_time": gpu_time_report, "collectives": collectives_report}
# numbers each page must show, in its header cards and its tables
KEY_NUMBERS = {"gpipe": ["43.4%", "42.9%", "23.60 ms", "1.42x", "$12.50/h", "50.8%"],
               "interleaved": ["35.1%", "222.00 ms", "1.11x", "interleaved_1f1b v=4"],
               "serving_missed": ["8.50 ms", "TBT SLO missed: p99 8.50 ms over 5.00 ms"],
               "gpu_time": ["33.0%", "rank1/gpu0", "45.00"],
               "collectives": ["34.00 ms", "rank 7"]}


class Page(HTMLParser):
    """What the tests look at: the tags with their attributes, the SVG's rect titles, the CSS."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.titles: list[str] = []
        self.css = ""
        self._in: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, {k: v or "" for k, v in attrs}))
        self._in.append(tag)

    def handle_endtag(self, tag):
        if self._in and self._in[-1] == tag:
            self._in.pop()

    def handle_data(self, data):
        if self._in and self._in[-1] == "title" and "svg" in [t for t, _ in self.tags]:
            self.titles.append(data)
        elif self._in and self._in[-1] == "style":
            self.css += data

    def all(self, tag: str, cls: str | None = None) -> list[dict[str, str]]:
        return [a for t, a in self.tags if t == tag and (cls is None or cls in a.get("class", "").split())]


def test_the_timeline_scales_to_the_window_and_nothing_is_wider_than_a_small_screen():
    for name, build in PAGES.items():
        page = Page(render(build(), "html"))
        for svg in page.all("svg"):
            assert svg["width"] == "100%" and re.fullmatch(r"0 0 \d+ \d+", svg["viewbox"]), name
        fixed = [int(px) for px in re.findall(r"(?:^|[;{,])(?:min-)?width:(\d+)px", page.css)]
        fixed += [int(px) for px in re.findall(r"flex:0 0 (\d+)px", page.css)]
        assert fixed and max(fixed) <= 200, fixed  # labels and swatches only; the rest is % or flexible
        for _, attrs in page.tags:
            assert not re.search(r"width:\s*\d{3,}px", attrs.get("style", "")), attrs
            assert not re.fullmatch(r"\d{4,}", attrs.get("width", "")), attrs
        assert 'name="viewport"' in render(build(), "html")


def test_the_header_names_inputs_date_version_and_shows_the_headline_as_cards():
    text = render(gpipe_report(), "html")
    assert "4 inputs: rank0.json, rank1.json, rank2.json, …" in text and "rank3.json" in text
    assert f"generated 2023-11-14 22:13 UTC by pipebubble {__version__}" in text
    cards = re.findall(r'<div class="card[^"]*"><b>([^<]*)</b><span>([^<]*)</span>', text)
    assert cards[:4] == [("43.4%", "bubble, measured"), ("42.9%", "bubble in theory"),
                         ("56.6%", "utilization (1 − bubble)"), ("23.60 ms", "step")]
    assert ("1.42x", "best what-if: m=16") in cards and ("$12.50/h", "idle cost") in cards
    lanes_only = render(gpu_time_report(), "html")
    assert '<div class="card"><b>33.0%</b><span>idle, most idle GPU (rank1/gpu0)</span>' in lanes_only


def test_the_date_is_the_reproducible_builds_one_or_now(monkeypatch):
    assert html.generated() == "2023-11-14 22:13 UTC"
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", html.generated())
    assert "generated 2001-02-03 04:05 UTC" in render(gpipe_report(), "html").replace(
        html.generated(), "2001-02-03 04:05 UTC")


def test_each_wait_cause_and_phase_has_its_own_colour():
    assert len(set(html.WAIT_COLOURS.values())) == len(html.WAIT_COLOURS)
    assert len(set(html.COLOURS.values())) == len(html.COLOURS)
    assert html.WAIT_COLOURS["fill"] != html.WAIT_COLOURS["drain"]
    assert html.WAIT_COLOURS["upstream"] != html.WAIT_COLOURS["downstream"]
    assert set(html.WAIT_COLOURS) == set(pipeline.CAUSES)
    text = render(gpipe_report(), "html")
    for cause in ("fill", "downstream", "upstream", "comm"):
        assert f'<i style="background:{html.WAIT_COLOURS[cause]};height:6px"></i>wait: {cause}' in text


def test_a_waits_tooltip_says_its_cause_peer_and_passes():
    titles = [t for t in Page(render(gpipe_report(), "html")).titles if " wait, " in t]
    assert len(titles) == 4
    up = next(t for t in titles if t.startswith("s1: upstream"))
    assert up == ("s1: upstream wait, 2.20 ms at 6.00 ms — the next forward waited for its activation from the stage"
                  " before; waited for s0; passes: before F3, after B3")
    assert "waited for s1" in next(t for t in titles if t.startswith("s0: downstream"))
    spun = [t for t in Page(render(collectives_report(), "html")).titles if "collective wait" in t]
    assert spun == []  # waits without a stage are not drawn on a stage timeline; the table lists them
    assert "waited for rank 7" in html._wait(collectives_report().waits[0], T0)


def test_a_missed_slo_is_highlighted_and_a_met_one_is_not():
    missed = render(missed_slo(), "html")
    assert '<div class="card miss"><b>8.50 ms</b><span>time between tokens, p99 (SLO 5.00 ms): missed</span>' in missed
    assert '<li class="miss">TBT SLO missed: p99 8.50 ms over 5.00 ms</li>' in missed
    met = render(serving_report(), "html")
    assert "miss" not in met.replace(".card.miss", "").replace("li.miss", "")


def test_a_stacked_bar_per_stage_fills_its_window_with_comm_under_it():
    page = Page(render(gpipe_report(), "html"))
    widths = [float(re.search(r"width:([\d.]+)%", a["style"]).group(1)) for a in page.all("i")
              if a.get("title", "").startswith("s1 stage1: ")]
    assert len(widths) == 4 and sum(widths) == pytest.approx(100, abs=0.02)
    titles = [a["title"] for a in page.all("i") if a.get("title", "").startswith("s1 stage1: ")]
    assert titles == ["s1 stage1: busy 12.00 ms (50.8%)", "s1 stage1: fill 1.20 ms (5.1%)",
                      "s1 stage1: drain 4.40 ms (18.6%)", "s1 stage1: steady idle 6.00 ms (25.4%)"]
    comm = [a for a in page.all("s") if a.get("title", "").startswith("s1 stage1: comm in idle")]
    assert comm and comm[0]["title"] == "s1 stage1: comm in idle 1.60 ms (6.8%)"
    assert "█" not in render(gpipe_report(), "html")  # bars are drawn, not text blocks
    assert len(page.all("div", "sb")) == 4 and len(Page(render(gpu_time_report(), "html")).all("div", "gb")) == 2


def test_axis_ticks_read_as_the_text_timeline_writes_them():
    long = replace(gpipe_report(), timeline=gpipe_schedule(f=100 * MS, b=200 * MS, comm=20 * MS))
    ticks = re.findall(r'text-anchor="middle">([^<]+)</text>', render(long, "html"))
    assert ticks[:4] == ["0", "500", "1000", "1500"] and not any("," in t or "." in t for t in ticks)
    short = re.findall(r'text-anchor="middle">([^<]+)</text>', render(gpipe_report(), "html"))
    assert short[:4] == ["0", "5", "10", "15"], short


def test_the_page_is_offline():
    for build in PAGES.values():
        text = render(build(), "html")
        assert "<script" not in text and "<link" not in text and "@import" not in text
        assert "https://" not in text and "http://" not in text.replace("http://www.w3.org/2000/svg", "")


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium here (Debian: apt-get install chromium)")
@pytest.mark.parametrize("width", [800, 1400])
@pytest.mark.parametrize("name", PAGES)
def test_the_page_in_headless_chromium_has_no_sideways_scroll_and_its_numbers(tmp_path, name, width):
    page = tmp_path / f"{name}.html"
    text = render(PAGES[name](), "html")
    page.write_text(text)
    flags = [*FLAGS, f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={width},1200"]
    shot = tmp_path / "shot.png"
    proc = subprocess.run([CHROMIUM, *flags, f"--screenshot={shot}", page.as_uri()], capture_output=True,
                          timeout=120)
    assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
    assert _png_size(shot)[0] == width and shot.stat().st_size > 10_000
    probed = tmp_path / "probed.html"
    probed.write_text(text.replace("</body>", PROBE + "</body>"))
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", probed.as_uri()], capture_output=True, text=True,
                         timeout=120).stdout
    found = re.search(r'data-probe="(\d+) (\d+)"', dom)
    assert found, dom[-2000:]
    scroll, client = map(int, found.groups())
    assert client == width and scroll <= client, (name, width, scroll)
    for number in KEY_NUMBERS[name]:
        assert number in dom, (name, number)
