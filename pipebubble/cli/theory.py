"""`pipebubble theory`: the closed-form bubble of each schedule and a simulated step, no trace needed."""

from __future__ import annotations

from enum import Enum
from fractions import Fraction
from typing import Annotated

import typer

from pipebubble.analysis.schedule.schedules import closed_form_bubble, make_schedule
from pipebubble.analysis.schedule.whatif import StageTimes, ideal_step_time_ns, simulate
from pipebubble.cli.output import write_text
from pipebubble.errors import StageSpecError
from pipebubble.render import formats
from pipebubble.render.theory import NS_PER_MS, Theory

ZB_FORMULA = "(p-1)(F+B-W)/(m(F+B+W)+(p-1)(F+B-W))"


class ScheduleName(str, Enum):
    gpipe = "gpipe"
    one_f_one_b = "1f1b"
    interleaved_1f1b = "interleaved_1f1b"
    zero_bubble = "zero_bubble"


Format = formats.choices("theory")  # --format's choices come from the render registry
DEFAULT_FORMAT = Format(formats.default("theory"))


def theory(
    stages: Annotated[int, typer.Option("--stages", "-p", min=1, help="Pipeline stages p.")],
    microbatches: Annotated[int, typer.Option("--microbatches", "-m", min=1, help="Micro-batches per step.")],
    schedule: Annotated[
        ScheduleName, typer.Option("--schedule", "-s", help="Schedule to simulate.")
    ] = ScheduleName.one_f_one_b,
    chunks: Annotated[
        int | None, typer.Option("--chunks", "-v", min=1, help="Model chunks per stage (interleaved: 2).")
    ] = None,
    stage_times: Annotated[
        str | None, typer.Option("--stage-times", help="Forward ms of one micro-batch per stage: 1,1,1.5,1.")
    ] = None,
    fwd_bwd_ratio: Annotated[
        float, typer.Option("--fwd-bwd-ratio", min=0.0, help="Backward time as a multiple of forward.")
    ] = 2.0,
    format: Annotated[Format, typer.Option("--format", "-f", help="Output format.")] = DEFAULT_FORMAT,
) -> None:
    """Closed-form bubble fractions and one simulated step of a pipeline schedule.

    Backward takes --fwd-bwd-ratio times forward; zero_bubble splits it into equal halves, B and W.

    Examples:

      pipebubble theory --stages 4 --microbatches 8

      pipebubble theory -p 4 -m 8 --schedule interleaved_1f1b --chunks 2

      pipebubble theory -p 4 -m 16 -s zero_bubble --stage-times 1,1,1.5,1 -f json
    """
    v = chunks or (2 if schedule is ScheduleName.interleaved_1f1b else 1)
    forward = _parse_stage_times(stage_times, stages)
    times = StageTimes.uniform(forward, microbatches, Fraction(fwd_bwd_ratio))
    sim = simulate(make_schedule(schedule.value, stages, microbatches, v), times)
    forms = _closed_forms(stages, microbatches, v, Fraction(fwd_bwd_ratio))
    result = Theory(forms, sim, ideal_step_time_ns(times))
    write_text(formats.pick("theory", format).render(result, formats.Options()), None)


def _parse_stage_times(text: str | None, stages: int) -> tuple[int, ...]:
    if text is None:
        return (NS_PER_MS,) * stages
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        values = []
    if len(values) != stages or min(values) <= 0:
        raise StageSpecError(f"--stage-times: expected {stages} positive numbers (one a stage), got {text!r}")
    return tuple(round(x * NS_PER_MS) for x in values)


def _closed_forms(p: int, m: int, v: int, ratio: Fraction) -> list[tuple[str, str, Fraction]]:
    """(name, formula, value); ZB-H1 takes T_B = T_W = ratio/2 · T_F, as the simulation does."""
    zb, v = (Fraction(1), ratio / 2, ratio / 2), max(v, 2)
    return [
        ("gpipe / 1f1b", "(p-1)/(m+p-1)", closed_form_bubble("1f1b", p, m)),
        (f"interleaved_1f1b v={v}", "(p-1)/(v*m+p-1)", closed_form_bubble("interleaved_1f1b", p, m, v)),
        ("zero_bubble (ZB-H1)", ZB_FORMULA, closed_form_bubble("zero_bubble", p, m, 1, zb)),
    ]


def register(app: typer.Typer) -> None:
    app.command(no_args_is_help=True)(theory)
