"""Generate Kineto-like traces for benchmarks: same layout and field mix as torch.profiler's writer."""

from __future__ import annotations

import random
import re
from pathlib import Path

HEADER = """{
  "schemaVersion": 1,
  "deviceProperties": [{"id": 0, "name": "Synthetic GPU", "totalGlobalMem": 85899345920}],
  "distributedInfo": {"backend": "nccl", "rank": %d, "world_size": %d},
  "displayTimeUnit": "ms",
  "baseTimeNanoseconds": 1700000000000000000,
  "traceEvents": [
"""
CPU_OP = """  {
    "ph": "X", "cat": "cpu_op", "name": "aten::%s", "pid": 4242, "tid": 4243,
    "ts": %.3f, "dur": %.3f,
    "args": {
      "External id": %d,"Record function id": 0, "Sequence number": %d, "Fwd thread id": 0, "Ev Idx": %d
    }
  },
"""
RUNTIME = """  {
    "ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 4242, "tid": 4243,
    "ts": %.3f, "dur": %.3f,
    "args": {
      "External id": %d, "cbid": 211, "correlation": %d
    }
  },
  {
    "ph": "s", "id": %d, "pid": 4242, "tid": 4243, "ts": %.3f,
    "cat": "ac2g", "name": "ac2g"
  },
"""
KERNEL = """  {
    "ph": "X", "cat": "kernel", "name": "%s", "pid": 0, "tid": %d,
    "ts": %.3f, "dur": %.3f,
    "args": {
      "External id": %d,      "queued": 0, "device": 0, "context": 1,      "stream": %d, "correlation": %d,      "registers per thread": 40,      "shared memory": 0,      "blocks per SM": 4.740741,      "warps per SM": 75.851852,      "grid": [512, 1, 1],      "block": [512, 1, 1],      "est. achieved occupancy %%": 75
    }
  },
  {
    "ph": "f", "id": %d, "pid": 0, "tid": %d, "ts": %.3f,
    "cat": "ac2g", "name": "ac2g", "bp": "e"
  },
"""
MEMORY = """  {
    "ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 4242, "tid": 4243,
    "ts": %.3f,
    "args": {
      "Total Reserved": %d, "Total Allocated": %d, "Bytes": %d, "Device Id": 0, "Device Type": 1, "Addr": %d, "Ev Idx": %d
    }
  },
"""
KERNELS = [
    "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_256x128_16x3_nn_align4>(Params)",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(int, Array<char*, 3>)",
    "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float>>>(Op)",
]
OPS = ["mm", "add", "relu", "linear", "addmm", "copy_", "view", "empty"]


def _compact(template: str) -> str:
    """``template`` on one line without the whitespace between tokens (what compact Chrome-trace writers
    emit); whitespace inside strings is kept."""
    return re.sub(r'("(?:[^"\\]|\\.)*")|\s+', lambda m: m.group(1) or "", template)


def generate(path: Path, events: int, rank: int = 0, world: int = 1, seed: int = 0, compact: bool = False,
             memory: bool = False) -> Path:
    """Write a trace of about ``events`` events (5 per launched kernel, as real traces have): torch's
    multi-line layout, or with ``compact`` all on one line with no whitespace between tokens. ``memory``: two
    allocator events more per kernel (its output allocated, an older one freed, as ``profile_memory=True``
    records them): 2 of every 7 events."""
    rnd = random.Random(seed)
    header, cpu_op, runtime, kernel, alloc = (
        (_compact(t) for t in (HEADER, CPU_OP, RUNTIME, KERNEL, MEMORY)) if compact
        else (HEADER, CPU_OP, RUNTIME, KERNEL, MEMORY)
    )
    per_kernel = 7 if memory else 5
    allocated = 1 << 30
    path.parent.mkdir(parents=True, exist_ok=True)
    cpu_t, gpu_t = 1000.0, 1010.0
    with open(path, "w") as out:
        out.write(header % (rank, world))
        for i in range(events // per_kernel):
            dur = rnd.uniform(2.0, 40.0)
            out.write(cpu_op % (rnd.choice(OPS), cpu_t, 12.5, i, i, i))
            if memory:
                size = 512 * rnd.randint(1, 4096)
                allocated += size
                out.write(alloc % (cpu_t + 1, 2 << 30, allocated, size, 139_000_000_000 + i, i))
                allocated -= size
                out.write(alloc % (cpu_t + 1.5, 2 << 30, allocated, -size, 139_000_000_000 + i, i))
            out.write(runtime % (cpu_t + 2, 6.25, i, i, i, cpu_t + 2))
            gpu_t = max(gpu_t + rnd.uniform(0.0, 5.0), cpu_t + 5)
            stream = 7 if i % 7 else 20
            out.write(kernel % (rnd.choice(KERNELS), stream, gpu_t, dur, i, stream, i, i, stream, gpu_t))
            gpu_t += dur
            cpu_t += 14.0
        end = '  {"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "", "ts": %.3f}\n'
        out.write((_compact(end) if compact else end) % cpu_t)
        out.write('],"traceName":"synthetic"}\n' if compact else '],\n  "traceName": "synthetic"\n}\n')
    return path


if __name__ == "__main__":
    import sys

    generate(Path(sys.argv[1]), int(sys.argv[2]), compact="--compact" in sys.argv[3:], memory="--memory" in sys.argv[3:])
