"""The reduce pauses Python's cycle collector and leaves it as it found it (``reducer._collector_paused``)."""

import gc

import pytest

from pipebubble.run.reducer import _collector_paused


@pytest.mark.parametrize("on", [True, False])
def test_collector_left_as_found(on):
    was = gc.isenabled()
    (gc.enable if on else gc.disable)()
    try:
        with _collector_paused():
            assert not gc.isenabled()
        assert gc.isenabled() is on
    finally:
        (gc.enable if was else gc.disable)()


def test_collector_back_on_after_an_error():
    assert gc.isenabled()
    with pytest.raises(ValueError), _collector_paused():
        raise ValueError("boom")
    assert gc.isenabled()
