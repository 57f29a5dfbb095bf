"""A real torch.distributed.pipelining training step on P ranks (gloo on CPU, NCCL with one GPU per rank).

Run without RANK set, it starts the P ranks itself (see launch.py). Each stage is a stack of MLP blocks of
width --hidden; --imbalance X makes the last stage's blocks X times as wide inside, so it does X times the
work of the others and the rest of the pipeline waits on it. --batch ROWS is the global batch, split evenly
into the --microbatches (default: 32 rows each).

Memory: a block's weights and gradients grow with hidden², the activations a micro-batch in flight keeps
for its backward with rows x hidden. To make activations dominate, make the rows many and the model narrow:
on CPU, `--hidden 128 --layers 8 --stages 4 --batch 2048` gives each stage 0.5 MiB of weights and
gradients, while its allocator peak over a step (`[memory]` Total Allocated) is about 6.3 MiB for GPipe,
which holds every micro-batch at once whatever their number, and for 1F1B on rank 0 6.3 MiB at 4
micro-batches but 3.6 MiB at 8 (it holds at most P in flight). bench/memory_capture.py prints these.
"""

from __future__ import annotations

import argparse
import os
import sys

from pipebubble.capture.workloads import MICROBATCH_ROWS, SCHEDULES, microbatch_rows
from pipebubble.capture.workloads.launch import run_ranks
from pipebubble.errors import CaptureError


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pipebubble.capture.workloads.pipeline")
    parser.add_argument("--schedule", choices=SCHEDULES, default="1f1b")
    parser.add_argument("--stages", type=int, default=4, help="pipeline ranks")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--batch", type=int, default=None,
                        help=f"global batch in rows, split evenly into the micro-batches (default: "
                        f"{MICROBATCH_ROWS} rows each)")
    parser.add_argument("--imbalance", type=float, default=1.0)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8, help="MLP blocks in the whole model")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--steps", type=int, default=3, help="training steps (optimizer steps)")
    args = parser.parse_args(argv)
    try:
        args.microbatch_rows = microbatch_rows(args.batch, args.microbatches)
    except CaptureError as exc:
        parser.error(str(exc))
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    if "RANK" not in os.environ:
        return run_ranks(__spec__.name, argv, args.stages)
    return train(args)


def chunks_per_rank(schedule: str) -> int:
    # Interleaved and zero-bubble schedules hold two model chunks per rank (looped placement).
    return 2 if schedule in ("interleaved_1f1b", "zero_bubble") else 1


def build_block(hidden: int, inner: int):
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down, self.act = nn.Linear(hidden, inner), nn.Linear(inner, hidden), nn.GELU()

        def forward(self, x):
            return x + self.down(self.act(self.up(x)))

    return Block()


def build_stage(args, index: int, n_stages: int):
    import torch.nn as nn

    inner = round(args.hidden * (args.imbalance if index == n_stages - 1 else 1.0))
    blocks = max(1, args.layers // n_stages)
    return nn.Sequential(*[build_block(args.hidden, inner) for _ in range(blocks)])


def make_schedule(args, stages, loss_fn):
    from torch.distributed.pipelining import schedules as sched

    n = args.microbatches
    if args.schedule == "gpipe":
        return sched.ScheduleGPipe(stages[0], n, loss_fn=loss_fn)
    if args.schedule == "1f1b":
        return sched.Schedule1F1B(stages[0], n, loss_fn=loss_fn)
    if args.schedule == "interleaved_1f1b":
        return sched.ScheduleInterleaved1F1B(stages, n, loss_fn=loss_fn)
    return sched.ScheduleInterleavedZeroBubble(stages, n, loss_fn=loss_fn)


def setup(args):
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.device == "cuda":
        if torch.cuda.device_count() < world:
            sys.exit(f"pipeline workload: --device cuda needs one GPU per rank ({world}), "
                     f"found {torch.cuda.device_count()}")
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        # The ranks share the machine's cores; more threads each would only oversubscribe them further.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
        dist.init_process_group("gloo")
    return rank, world, device


def train(args) -> int:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage

    rank, world, device = setup(args)
    n_stages = world * chunks_per_rank(args.schedule)
    indices = list(range(rank, n_stages, world))
    stages = []
    for index in indices:
        torch.manual_seed(index)
        module = build_stage(args, index, n_stages).to(device)
        stages.append(PipelineStage(module, index, n_stages, device))
    schedule = make_schedule(args, stages, torch.nn.functional.mse_loss)
    params = [p for stage in stages for p in stage.submod.parameters()]
    optimizer = torch.optim.SGD(params, lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    rows = args.microbatches * args.microbatch_rows
    x = torch.randn(rows, args.hidden, generator=generator).to(device)
    target = torch.randn(rows, args.hidden, generator=generator).to(device)
    for _ in range(args.steps):
        inputs = (x,) if 0 in indices else ()
        extra = {"target": target, "losses": []} if n_stages - 1 in indices else {}
        schedule.step(*inputs, **extra)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
