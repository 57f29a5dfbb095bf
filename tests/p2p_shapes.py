"""A GPipe pipeline whose activations and gradients travel as NCCL ``SendRecv`` kernels launched under
``nccl:send`` / ``nccl:recv`` ranges, one Kineto file per rank, with every receive's lead on its send given.

Stage s runs forward j from (s + j)·slot for ``forward[s]`` ns, then sends it to s + 1: the send kernel
starts when the forward ends and lasts ``transfer`` ns; the receive kernel on s + 1 starts ``lead_f[s+1]``
ns before the send began (negative: after) and ends with it. After every forward, backward j of stage s runs
from (p − 1 + m + p − 1 − s + j)·slot for ``backward[s]`` ns and sends its gradient to s − 1 the same way
(``lead_b[s−1]``). Pass labels (``PP:{s}F{j}``) hold only the kernels' launches, as on a GPU host thread.
``shift`` moves every time of a rank's file (its clock off by that much).
"""

from __future__ import annotations

from pathlib import Path

from shapes import SEND_RECV_KERNEL, Rank

MS = 1_000_000
SEND = (("user_annotation", "nccl:send"),)
RECV = (("user_annotation", "nccl:recv"),)


def gpipe_p2p(folder: Path, forward: list[int], backward: list[int], m: int, lead_f: dict[int, int],
              lead_b: dict[int, int], slot: int = 3 * MS, transfer: int = MS // 5,
              shift: dict[int, int] | None = None, base: int = 10 * MS) -> Path:
    p = len(forward)
    ranks = [Rank(s, p) for s in range(p)]

    def back(s: int, j: int) -> int:
        return base + (p - 1 + m + p - 1 - s + j) * slot

    for j in range(m):
        for s in range(p):
            _pass(ranks[s], f"PP:{s}F{j}", base + (s + j) * slot, forward[s])
            _pass(ranks[s], f"PP:{s}B{j}", back(s, j), backward[s])
    for j in range(m):
        for s in range(p - 1):  # activation s -> s + 1
            sent = base + (s + j) * slot + forward[s]
            _transfer(ranks[s], ranks[s + 1], sent, transfer, lead_f[s + 1])
        for s in range(1, p):  # gradient s -> s - 1
            sent = back(s, j) + backward[s]
            _transfer(ranks[s], ranks[s - 1], sent, transfer, lead_b[s - 1])
    for r in ranks:
        offset = (shift or {}).get(r.rank, 0)
        for e in r.events:
            e["ts"] += offset / 1000
        r.write(folder)
    return folder


def _pass(rank: Rank, label: str, start: int, dur: int) -> None:
    rank.x("user_annotation", label, start - 5_000, 4_000)
    rank.kernel(f"gemm_{label[-2]}", start, dur)


def _transfer(sender: Rank, receiver: Rank, sent: int, transfer: int, lead: int) -> None:
    sender.kernel(SEND_RECV_KERNEL, sent, transfer, 20, SEND)
    receiver.kernel(SEND_RECV_KERNEL, sent - lead, transfer + lead, 20, RECV)
