"""What a schedule would need: a stage's predicted peak at another schedule, micro-batch count or chunk count.

A stage measured with static part S (allocated before its first forward), peak P, and per micro-batch ``a``
bytes held from its forward until its backward frees them and ``k`` kept to the step's end: along the
schedule's own action order (``schedules``), a forward of one of v chunks adds (a + k)/v, its backward frees
a/v (zero-bubble's split backward frees at B; what W keeps is not counted). ``held_max`` is the most that
order holds at once. The measured peak's remainder T = P − S − held_max(measured) is what a backward
allocates on top (gradients, temporaries). At the same global batch a micro-batch of the row is m/m' of the
measured one, so its a, k and T scale by m/m'; the predicted peak is S + held_max(row) + T·m/m', or the
device's peak outside the passes (an optimizer step) if larger. GPipe holds all m (in flight at most m),
1F1B min(p − s, m) on stage s (``inflight_max``).
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache

from pipebubble.analysis.schedule.schedules import make_schedule


@lru_cache(maxsize=256)
def _orders(schedule: str, stages: int, microbatches: int, chunks: int) -> tuple[str, ...]:
    """Each stage's order as a string of phases (F, B, W)."""
    return tuple("".join(a.phase for a in order) for order in make_schedule(schedule, stages, microbatches,
                                                                            chunks).orders)


@lru_cache(maxsize=256)
def inflight_max(schedule: str, stages: int, microbatches: int, chunks: int = 1) -> tuple[Fraction, ...]:
    """Per stage: the most micro-batches in flight at once (whole micro-batches: a chunk's forward is 1/v of
    one)."""
    return tuple(held_max(order, chunks, Fraction(1), Fraction(0))
                 for order in _orders(schedule, stages, microbatches, chunks))


def held_max(order: str, chunks: int, freed: Fraction, kept: Fraction) -> Fraction:
    """The most a stage's ``order`` holds at once: a forward adds (freed + kept)/chunks, a backward frees
    freed/chunks."""
    held = most = Fraction(0)
    up, down = (freed + kept) / chunks, freed / chunks
    for phase in order:
        held += up if phase == "F" else -down if phase == "B" else 0
        most = max(most, held)
    return most


def predicted_peak(static: int, peak: int, freed: int | None, kept: int, outside: int | None,
                   stage: int, stages: int, measured: tuple[str, int, int], row: tuple[str, int, int],
                   scale: Fraction | None = None) -> int | None:
    """Stage ``stage``'s predicted peak in bytes (module docstring); ``measured`` and ``row`` are (schedule,
    m, v); ``freed`` and ``kept`` per micro-batch as measured, each chunk's pass counted (a stage of v chunks
    holds v of them per micro-batch); ``scale``: a row micro-batch's size over a measured one's (default
    m/m', the same global batch). None without a measured per-micro-batch size."""
    if freed is None:
        return None
    (schedule, m, v), (row_schedule, m_row, v_row) = measured, row
    a, k = Fraction(freed * v), Fraction(kept * v)
    now = held_max(_orders(schedule, stages, m, v)[stage], v, a, k)
    scale = Fraction(m, m_row) if scale is None else scale
    then = held_max(_orders(row_schedule, stages, m_row, v_row)[stage], v_row, a * scale, k * scale)
    return max(static + round(then + (peak - static - now) * scale), static, outside or 0)
