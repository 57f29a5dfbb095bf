"""A timeline window (``--window``) that ends where or before it starts, or that shows none of the timeline, is
refused with where the timeline lies, in every renderer that draws one; one that overlaps it is drawn."""

from __future__ import annotations

import pytest
from test_render import MS, gpipe_report

from pipebubble.render import render
from pipebubble.render.sections import timeline


@pytest.mark.parametrize("window", [(5 * MS, 2 * MS), (3 * MS, 3 * MS)])
def test_a_window_that_ends_before_it_starts_is_refused(window):
    with pytest.raises(ValueError, match="ends before it starts"):
        timeline.select_window(gpipe_report(), None, window)


@pytest.mark.parametrize("fmt", ["text", "markdown", "html"])
@pytest.mark.parametrize("window", [(10_000 * MS, 10_001 * MS), (-50 * MS, -10 * MS)])
def test_a_window_outside_the_timeline_says_where_the_timeline_lies(fmt, window):
    with pytest.raises(ValueError, match=r"lies outside the timeline, which runs from -?[\d.,]+ to [\d.,]+ ms"):
        render(gpipe_report(), fmt, width=100, window=window)


def test_a_window_that_overlaps_the_timeline_is_drawn():
    report = gpipe_report()
    start, end = timeline.select_window(report, None, (-1 * MS, 2 * MS))
    assert end - start == 3 * MS and "Timeline (-1.00 to 2.00 ms)" in render(report, "text", width=100,
                                                                              window=(-1 * MS, 2 * MS))
