"""Memory ground truth: the bundled pipeline captured on CPU, read back from its `[memory]` events by hand.

    python bench/memory_capture.py [--batch 2048] [--hidden 128] [--layers 8] [--stages 4] [--keep DIR]

Captures `pipebubble capture --workload pipeline` at one global batch with 4 and with 8 micro-batches, for
gpipe and for 1f1b, into a temporary folder (or --keep DIR), one profiled optimizer step each. For every
capture and rank it prints the peak of `Total Allocated` over the rank's CPU `[memory]` events, the weights
and gradients the rank's stage holds (counted from the model's shape), and the allocated total when each
forward/backward pass starts and ends (`PP:{stage}{F|B}{mb}`, which capture records for every schedule;
else GPipe's own `Forward {mb}`/`Backward {mb}`); then a table of the peaks, each capture's wall time (the
ranks' start-up included) and its longest profiled step. Plain json and gzip: no pipebubble analysis, so this
is what the memory analysis is checked against.

`Total Allocated` counts only blocks allocated while the profiler records memory (from the warm-up step on):
the weights, made before, are not in it; the gradients (set to None at every step) and activations are.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MIB = 1 << 20
CPU = 0  # `Device Type` of the CPU in a [memory] event (c10::DeviceType::CPU)
_PASS = re.compile(r"PP:\d+([FB])(\d+)|(Forward|Backward) (\d+)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2048, help="global batch in rows")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--keep", type=Path, help="capture into this folder (outside the repo), not a temporary one")
    args = parser.parse_args()
    summary = []
    with tempfile.TemporaryDirectory(prefix="pipebubble-memory-") as scratch:
        root = args.keep or Path(scratch)
        for schedule in ("gpipe", "1f1b"):
            for microbatches in (4, 8):
                out = root / f"{schedule}_m{microbatches}"
                seconds = run_capture(args, schedule, microbatches, out)
                docs = [load(trace) for trace in sorted(out.glob("rank*.pt.trace.json.gz"), key=_rank_number)]
                print(f"{schedule}, {microbatches} micro-batches of {args.batch // microbatches} rows "
                      f"(global batch {args.batch}): captured in {seconds:.1f} s")
                for doc in docs:
                    print(describe_rank(doc, stage_bytes(args)))
                peaks = [max(memory_curve(doc["traceEvents"])[1], default=0) for doc in docs]
                summary.append((f"{schedule} m={microbatches}", peaks, seconds, max(map(step_ms, docs))))
    print("\npeak Total Allocated per rank (MiB), capture wall time, longest profiled step:")
    for name, peaks, seconds, ms in summary:
        ranks = " ".join(f"{peak / MIB:6.2f}" for peak in peaks)
        print(f"  {name:<10} {ranks}   {seconds:5.1f} s  {ms:6.1f} ms")


def _rank_number(trace: Path) -> int:
    return int(re.match(r"rank(\d+)\.", trace.name).group(1))


def step_ms(doc: dict) -> float:
    """The longest profiled step (`ProfilerStep#N`) of a rank, in ms."""
    steps = [e["dur"] for e in doc["traceEvents"] if e.get("ph") == "X" and e["name"].startswith("ProfilerStep")]
    return max(steps, default=0) / 1000


def capture_command(args, schedule: str, microbatches: int, out: Path) -> list[str]:
    """The command line of one capture (one profiled step, the default wait and warm-up)."""
    return [sys.executable, "-m", "pipebubble", "capture", "--workload", "pipeline", "--schedule", schedule,
            "--stages", str(args.stages), "--microbatches", str(microbatches), "--batch", str(args.batch),
            "--hidden", str(args.hidden), "--layers", str(args.layers), "--active", "1", "--quiet", "--force", "-o",
            str(out)]  # --force: a --keep folder's earlier capture is replaced


def run_capture(args, schedule: str, microbatches: int, out: Path) -> float:
    """Run one capture; its wall seconds (the ranks' start-up included)."""
    command = capture_command(args, schedule, microbatches, out)
    print("$ " + " ".join(["python", *command[1:]]), flush=True)
    start = time.perf_counter()
    subprocess.run(command, check=True)
    return time.perf_counter() - start


def stage_bytes(args) -> int:
    """Weights plus gradients of one stage (float32): blocks of Linear(h, h) up and down, with biases."""
    blocks = max(1, args.layers // args.stages)
    h = args.hidden
    return 2 * 4 * blocks * (2 * h * h + 2 * h)


def load(trace: Path) -> dict:
    with gzip.open(trace, "rt") as f:
        return json.load(f)


def memory_curve(events: list[dict]) -> tuple[list[float], list[int]]:
    """The CPU `[memory]` events in time order: their timestamps (µs) and `Total Allocated` (bytes)."""
    points = sorted((float(e["ts"]), int(e["args"]["Total Allocated"])) for e in events
                    if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == CPU)
    return [t for t, _ in points], [a for _, a in points]


def passes(events: list[dict]) -> list[tuple[str, float, float]]:
    """Each forward/backward pass as (label such as F3 or B3, start µs, end µs), in start order: the `PP:`
    labels where the trace has them (GPipe's `Forward {mb}` also holds its blocking receive)."""
    marked = [(match, float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
              if e.get("ph") == "X" and (match := _PASS.fullmatch(str(e.get("name")))) is not None]
    pp = [m for m in marked if m[0].group(1)]
    return sorted(((_label(match), start, end) for match, start, end in pp or marked), key=lambda p: p[1])


def _label(match: re.Match) -> str:
    return f"{match.group(1)}{match.group(2)}" if match.group(1) else f"{match.group(3)[0]}{match.group(4)}"


def allocated_at(times: list[float], totals: list[int], ts: float) -> int:
    """`Total Allocated` after the last memory event at or before ``ts`` (0 before the first)."""
    i = bisect.bisect_right(times, ts)
    return totals[i - 1] if i else 0


def describe_rank(doc: dict, weights_grads: int) -> str:
    """Two lines for one rank: its peak (and what its stage's weights and gradients weigh), then its passes."""
    events = doc["traceEvents"]
    times, totals = memory_curve(events)
    rank = doc.get("distributedInfo", {}).get("rank", "?")
    peak = max(totals, default=0)
    head = (f"  rank {rank}: peak Total Allocated {peak / MIB:6.2f} MiB ({len(totals)} CPU [memory] events); "
            f"weights+grads {weights_grads / MIB:.2f} MiB, peak/that {peak / weights_grads:.1f}x")
    found = passes(events)
    mib = [(label, allocated_at(times, totals, start) / MIB, allocated_at(times, totals, end) / MIB)
           for label, start, end in found]
    steps = " ".join(f"{label}:{before:.1f}>{after:.1f}" for label, before, after in mib)
    return head + ("\n    passes (MiB at start>end): " + steps if found else "\n    no pass labels")


if __name__ == "__main__":
    main()
