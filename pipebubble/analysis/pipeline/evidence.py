"""Whether a multi-rank job is a pipeline, from what its traces show, and the job's one-line notes.

A job is a pipeline only on evidence: micro-batch pass labels, a pipeline process group in
``distributedInfo.pg_config``, point-to-point sends and receives between ranks (outside any collective:
NCCL runs all_to_all as grouped send/recv, which is not a pipeline), or the user's ``--pp-size``,
``--stage-by`` or ``--stage``. Data-parallel, FSDP and expert-parallel jobs have none of these: they get
lanes and collectives, and a note saying why there is no pipeline section.
"""

from __future__ import annotations

from pipebubble.analysis.pipeline.part import StagePart
from pipebubble.options import StageOptions


def pipeline_evidence(parts: list[StagePart], p2p: dict[str, int], options: StageOptions) -> list[str]:
    """Why these stages form a pipeline, one phrase per kind of evidence (empty: no evidence)."""
    found = []
    if options.rules:
        found.append("--stage rules")
    if options.pp_size:
        found.append(f"--pp-size {options.pp_size}")
    if options.stage_by:
        found.append(f"--stage-by {options.stage_by}")
    patterns = sorted({p.facts["pattern"] for p in parts if p.facts.get("pattern")})
    if patterns:
        found.append(f"micro-batch labels ({', '.join(patterns)})")
    if any(p.pipeline is not None for p in parts):
        found.append("pipeline process group (pg_config)")
    sends, recvs = p2p.get("send", 0), p2p.get("recv", 0)
    if sends and recvs:
        found.append(f"send/recv between ranks ({sends:,} sends, {recvs:,} receives outside collectives)")
    return found


def not_a_pipeline(names: list[str] | set[str]) -> str:
    """The note for a job of several ranks (or GPUs: stages named by ``names``) without pipeline evidence."""
    unit = "ranks" if all(n.startswith("rank") for n in names) else "GPUs"
    return (
        f"not a pipeline: {len(names)} {unit} with no micro-batch labels, no send/recv between them outside "
        "collectives and no pipeline process group (--pp-size, --stage-by or --microbatch-regex analyse one)"
    )


#: What to try instead when ``--stage-by`` finds fewer than two stages: the rules that split the same work otherwise.
OTHER_RULES = {"rank": "process or thread", "process": "thread", "device": "rank or thread", "stream": "rank or thread",
               "thread": "rank or process"}


def too_few_stages(options: StageOptions, names: list[str]) -> str | None:
    """The note for stages the user's rule (``--stage-by``, ``--stage``) asked for that found fewer than two
    (``names``), so there is no pipeline to analyse; None when the stages were not the user's or are enough.
    GPU rules (device, stream) number only GPU work: none found means the traces hold none."""
    if len(names) >= 2 or not (options.stage_by or options.rules):
        return None
    rule = "--stage rules" if options.rules else f"--stage-by {options.stage_by}"
    found = f"one stage ({names[0]})" if names else "no stages"
    if options.rules:
        return f"{rule} found {found}: a pipeline needs two; each REGEX is matched against the lane ids of the " \
               "lanes table"
    why = "these traces have no GPU work" if not names and options.stage_by in ("device", "stream") else \
        "a pipeline needs two"
    return f"{rule} found {found}: {why}; try --stage-by {OTHER_RULES[options.stage_by]}"


def one_rank(meta: dict, stage: str | None) -> str | None:
    """The note for a file that is one rank of a bigger job (``world_size`` > 1), or None."""
    world, rank = meta.get("world_size"), meta.get("rank")
    if not isinstance(world, int) or world < 2 or len(meta.get("ranks") or ()) > 1:  # a file of several ranks
        return None
    who = f"rank {rank}" if rank is not None else "one rank"
    if stage is None:
        return (
            f"one rank ({who}) of a {world:,}-rank job: this file's own lanes and collectives are analysed; "
            "no stages are inferred from one rank (give every rank's trace for the pipeline)"
        )
    return (
        f"one rank ({who}, stage {stage}) of a {world:,}-rank job: its own passes and waits are analysed; "
        "the pipeline's bubble needs every stage's trace"
    )


def some_ranks(metas: list[dict]) -> str | None:
    """The note for several files that are only some of a bigger job's ranks, or None."""
    ranks = {m.get("rank") for m in metas if isinstance(m.get("rank"), int)}
    worlds = [m.get("world_size") for m in metas if isinstance(m.get("world_size"), int)]
    world = max(worlds, default=0)
    if len(metas) < 2 or not ranks or world <= len(ranks):
        return None
    return (
        f"{len(ranks):,} of a {world:,}-rank job's ranks: collectives are matched among these ranks only "
        "(the others' arrivals are not in these traces)"
    )
