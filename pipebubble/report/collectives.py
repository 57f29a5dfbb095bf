"""Collectives matched across the ranks of a multi-rank job: each rank's wait and lateness, the worst calls,
the straggler and how much evidence the claims rest on."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class CollectiveRank:
    """One rank's collectives: ``wait_ns`` its collective kernels spun before the last peer arrived (waiting,
    not work); ``late_ns`` the time its peers spun waiting for it, at the calls where it arrived last
    (``last`` of its ``calls``)."""

    rank: int | None
    calls: int
    wait_ns: int
    late_ns: int
    last: int = 0
    lane: str | None = None
    pid: int | None = None  # a process where the trace names no ranks (``rank`` is then null)


@dataclass(frozen=True)
class CollectiveCall:
    """One collective matched across ranks (its members' kernels end together): the ``seq``-th call of
    ``name`` in the job; ``skew_ns`` from the first arrival to the last (``last_rank``), ``waited_ns`` the
    peers' spin summed."""

    name: str
    seq: int
    start_ns: int
    skew_ns: int
    last_rank: int | None
    waited_ns: int
    ranks: int = 0
    last_pid: int | None = None  # the process that arrived last, where the trace names no ranks


#: Fewer matched calls than this make a claim across ranks thin (``Support.thin``).
THIN_CALLS = 3


@dataclass(frozen=True)
class Support:
    """How much evidence the claims across ranks rest on: ``calls`` matched over ``ranks`` participants;
    ``world`` the job's ranks when only some were traced (None: all of them); ``straggler_calls`` the calls
    the straggler arrived last at. ``thin``: fewer than 3 calls, or only some of the job's ranks."""

    calls: int
    ranks: int
    world: int | None = None
    straggler_calls: int | None = None
    thin: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "thin", self.calls < THIN_CALLS or self.world is not None)


@dataclass(frozen=True)
class Collectives:
    """Collective calls matched across the ranks of a multi-rank job (pipeline or not). ``matched`` calls
    plus the ``left_out`` ones (by reason) account for every collective call of every participant
    (``participant_calls``)."""

    calls: int
    ranks: list[CollectiveRank] = field(default_factory=list)
    worst: list[CollectiveCall] = field(default_factory=list)
    straggler: int | None = None  # the rank the others waited for most, when one stands out
    waited_ns: int = 0  # every rank's collective spin, summed
    matched_by: str = "end"  # how calls were paired across ranks: their kernels' ends
    unmatched: int = 0  # participants' calls in no matched collective (sum of ``left_out``)
    straggler_pid: int | None = None  # the straggler, where it is a process of a trace without ranks
    left_out: dict[str, int] = field(default_factory=dict)  # reason (collectives.LEFT_OUT) -> participants' calls
    participant_calls: int = 0  # every participant's collective calls: in matched calls or left out
    support: Support | None = None
