"""Reduce: each late arrival at a collective split into "entered late" and "late inside", and the part inside
given to what the late rank did more of than its peers (``per_call``).

At a matched collective (``collectives.match``), the last arrival r is late by ``lateness`` = its arrival −
the median of its peers' arrivals. Each member's window opens at its last sync point: the end of its previous
matched call of the same group in the step (which released every member together), else the step's start
(``part.windows``' origin). ``entered`` = for a step's first call, r's step start − the peers' median step
start, clipped to [0, lateness]: how late r entered the step (the delay lies before it, or before the
profiled window); ``inside`` = lateness − entered, given to the class r spent most more time in than its
peers' median over their windows (``CAUSES``): on a GPU rank, its GPU's compute, exposed communication or
idle (the idle then split by the idle account's cause: a sync stall, a blocking copy, host operators, Python
or untraced time ...; where a file has no account, by what its host did);
on a CPU rank, its host classes directly. ``comm`` (a window opened later than the peers', or more time
spun in communication inside it): r itself was held by communication (``chain`` follows it).

The step time saved had r come on time (``worth``): the call releases at the second-last arrival instead, so
``worth`` = r's arrival − the latest peer arrival = the least of its peers' waits there (their spin up to r's
arrival). It is split between entered and inside in proportion.
"""

from __future__ import annotations

import polars as pl

from pipebubble.analysis.intervals import ENGINE
from pipebubble.analysis.rootcause.part import CLASSES, HOST_CLASSES, IDLE_CLASSES

#: What an inside lateness is given to, by the class whose excess over the peers' median is largest; a GPU's
#: idle by the idle account's cause.
CAUSES = {"compute": "gpu_compute", "comm": "comm", "loader": "data_loader", "sync": "sync",
          "host_ops": "host_ops", "host_idle": "host_idle",
          "idle_sync_stall": "sync", "idle_blocking_copy": "blocking_copy", "idle_allocator": "allocator",
          "idle_startup": "startup", "idle_cpu_ops": "host_ops", "idle_launch": "host_ops",
          "idle_python": "host_idle", "idle_peer": "comm", "idle_data_loader": "data_loader",
          "idle_dependency": "dependency", "idle_unknown": "unknown"}
PER_CALL = ["group", "kind", "call"]


def per_call(windows: pl.DataFrame, matched: pl.DataFrame) -> pl.DataFrame:
    """One row per matched call whose last arrival was late (lateness and worth > 0): group, kind, call,
    who (the last arrival), step, arrival, opened (its window's start), lateness, entered, inside, worth,
    cause, and each class's excess over the peers' median (``x_<class>``)."""
    if matched.is_empty() or windows.is_empty():
        return pl.DataFrame(schema=_SCHEMA)
    rows = opened(windows, matched)
    last = rows.filter(pl.col("who") == pl.col("last_who"))
    peers = rows.filter(pl.col("who") != pl.col("last_who")).group_by(PER_CALL).agg(
        p_arrival=pl.col("start").median(), p_opened=pl.col("opened").median(), worth=pl.col("wait").min(),
        **{f"p_{c}": pl.col(c).median() for c in CLASSES},
    )
    both = last.join(peers, on=PER_CALL).with_columns(lateness=(pl.col("start") - pl.col("p_arrival")).round())
    both = both.filter((pl.col("lateness") > 0) & (pl.col("worth") > 0))
    later = pl.col("opened") - pl.col("p_opened")
    entered = pl.when(pl.col("first") & pl.col("step").is_not_null()).then(later.clip(0, pl.col("lateness")))
    both = both.with_columns(entered=entered.otherwise(0).round()).with_columns(
        inside=pl.col("lateness") - pl.col("entered"))
    both = both.with_columns(**{f"x_{c}": pl.col(c) - pl.col(f"p_{c}") for c in CLASSES})
    # A window opened later than the peers' at a previous call: held there longer (``comm``).
    both = both.with_columns(x_comm=pl.col("x_comm") + pl.when(pl.col("first")).then(0).otherwise(later))
    return both.with_columns(cause=cause_of()).select(
        *PER_CALL, "who", "step", arrival="start", opened="opened", lateness="lateness", entered="entered",
        inside="inside", worth="worth", cause="cause", **{f"x_{c}": f"x_{c}" for c in CLASSES},
    ).cast(_SCHEMA).sort("who", "arrival")  # type: ignore[arg-type]


def opened(windows: pl.DataFrame, matched: pl.DataFrame) -> pl.DataFrame:
    """The matched rows with their window: step, gpu, ``opened`` (the previous matched call of the group in
    the step's end, else the origin), ``first`` (no previous call) and each class's ns in it."""
    own = windows.filter(~pl.col("kind").is_in(["send", "recv"])).unique(["who", "arrival"], keep="first")
    rows = matched.join(own.drop("kind", "seq", "end"), left_on=["who", "start"], right_on=["who", "arrival"])
    per = ["who", "group", "step"]
    rows = rows.sort("who", "group", "start").with_columns(
        first=pl.col("end").shift(1).over(per).is_null(),
        opened=pl.col("end").shift(1).over(per).fill_null(pl.col("origin")))
    return rows.with_columns(
        **{c: pl.col(f"a_{c}") - pl.col(f"e_{c}").shift(1).over(per).fill_null(0) for c in CLASSES})


def cause_of() -> pl.Expr:
    """The cause of a call's inside lateness: on a GPU rank the largest excess of its GPU's compute,
    communication and idle, an idle excess then given to the largest of the host's; on a CPU rank the
    largest of communication and the host's; ``unknown`` where no class exceeds the peers'."""
    def argmax(classes: tuple[str, ...]) -> tuple[pl.Expr, pl.Expr]:
        best, name = pl.max_horizontal(f"x_{c}" for c in classes), pl.lit(None, pl.String)
        for c in reversed(classes):  # the first class listed wins a tie
            name = pl.when(pl.col(f"x_{c}") == best).then(pl.lit(CAUSES.get(c, c))).otherwise(name)
        return best, name

    gpu_best, gpu_name = argmax(("compute", "comm", "idle"))
    idle_best, idle_name = argmax(IDLE_CLASSES)
    host_best, host_name = argmax(HOST_CLASSES)
    cpu_best, cpu_name = argmax(("comm", *HOST_CLASSES))
    # The GPU's idle excess: the account's cause with the most of it, else (no account) the host's class.
    idle = pl.when(idle_best > 0).then(idle_name).when(host_best > 0).then(host_name).otherwise(pl.lit("host_idle"))
    on_gpu = pl.when(gpu_best <= 0).then(pl.lit("unknown")).when(gpu_name == "idle").then(idle).otherwise(gpu_name)
    on_cpu = pl.when(cpu_best <= 0).then(pl.lit("unknown")).otherwise(cpu_name)
    return pl.when(pl.col("gpu")).then(on_gpu).otherwise(on_cpu)


_SCHEMA = {"group": pl.Int64, "kind": pl.String, "call": pl.Int64, "who": pl.Int64, "step": pl.Int64,
           "arrival": pl.Int64, "opened": pl.Int64, "lateness": pl.Int64, "entered": pl.Int64, "inside": pl.Int64,
           "worth": pl.Int64, "cause": pl.String, **{f"x_{c}": pl.Int64 for c in CLASSES}}


def by_cause(calls: pl.DataFrame) -> pl.DataFrame:
    """who, step, cause, late, worth: per late rank and step, the lateness and the worth given to each cause
    (``entered_late`` for the part entered late), worth split in proportion to lateness."""
    share = pl.col("worth") / pl.col("lateness")
    entered = calls.select("who", "step", cause=pl.lit("entered_late"), late="entered", worth=pl.col("entered") * share)
    inside = calls.select("who", "step", "cause", late="inside", worth=pl.col("inside") * share)
    parts = pl.concat([entered, inside]).filter(pl.col("late") > 0)
    out = parts.lazy().group_by("who", "step", "cause").agg(pl.col("late").sum(), pl.col("worth").sum().round())
    return out.cast({"worth": pl.Int64}).sort("who", "step", "cause").collect(engine=ENGINE)
