"""Megatron's step-timer timelines, written as Megatron writes one for a whole job: ``pid`` = the DP rank, a
thread per PP rank and class (``PP rank {p}, TP rank 0, compute`` / ``pp-comm`` / ``dp-comm`` / ``misc``), X
events in float µs: ``forward-compute`` / ``backward-compute`` with args {step, model_chunk, mb_id, seq_id},
``forward-send`` / ``backward-send`` on the pp-comm thread, ``grads-reduce-scatter`` on the dp-comm thread
(the replicas' gradient sync) and ``optimizer`` on the misc thread after the step's passes; only the ``steps``
sampled (with gaps), each 1 s apart; replica d's clock 7.5 µs after replica 0's."""

from __future__ import annotations

import json

SYNC_US = 10.0  # the gradient reduce-scatter's own time once the last replica's stage arrives


def write_step_timers(path, pp=4, dp=2, m=4, forward_us=100.0, heavy=None, slow=None, steps=(3, 4, 9)):
    """GPipe: stage s's forward takes ``forward_us`` × ``heavy[s]`` (in every replica) × ``slow[(s, d)]`` (one
    worker), its backward twice that; F(s, k) starts when F(s−1, k) and F(s, k−1) have ended, B(s, k) when
    B(s+1, k), B(s, k−1) and F(s, m−1) have. Each stage's gradient sync ends ``SYNC_US`` after the last
    replica's stage finished its backward. Returns the path and, per (replica, step), each stage's passes
    [(phase, mb, start, end)] in µs."""
    heavy, slow = heavy or {}, slow or {}
    events, passes = [], {}
    for d in range(dp):
        for s in range(pp):
            for c, kind in enumerate(("compute", "pp-comm", "dp-comm", "misc")):
                events.append({"name": "thread_name", "ph": "M", "pid": d, "tid": 10 * s + c,
                               "args": {"name": f"PP rank {s}, TP rank 0, {kind}"}})
    for step in steps:
        for d in range(dp):
            t0 = 1_000_000.0 * step + 7.5 * d
            f_end, b_end, rows = {}, {}, {s: [] for s in range(pp)}
            scale = {s: heavy.get(s, 1.0) * slow.get((s, d), 1.0) for s in range(pp)}
            for k in range(m):
                for s in range(pp):
                    start = max(f_end.get((s - 1, k), t0), f_end.get((s, k - 1), t0))
                    f_end[(s, k)] = start + forward_us * scale[s]
                    rows[s].append(("forward", k, start, f_end[(s, k)]))
            for k in range(m):
                for s in reversed(range(pp)):
                    start = max(b_end.get((s + 1, k), t0), b_end.get((s, k - 1), t0), f_end[(s, m - 1)])
                    b_end[(s, k)] = start + 2 * forward_us * scale[s]
                    rows[s].append(("backward", k, start, b_end[(s, k)]))
            passes[(d, step)] = rows
        synced = {s: max(passes[(d, step)][s][-1][3] for d in range(dp)) + SYNC_US for s in range(pp)}
        for d in range(dp):
            rows = passes[(d, step)]
            for s, row in rows.items():
                for phase, k, start, end in row:
                    args = {"step": step, "model_chunk": 0, "mb_id": k, "seq_id": 0}
                    events.append({"name": f"{phase}-compute", "ph": "X", "pid": d, "tid": 10 * s,
                                   "ts": start, "dur": end - start, "args": args})
                    if (phase == "forward" and s < pp - 1) or (phase == "backward" and s > 0):
                        timer = "forward-send" if phase == "forward" else "backward-send"
                        events.append({"name": timer, "ph": "X", "pid": d, "tid": 10 * s + 1, "ts": end,
                                       "dur": 1.0, "args": {"step": step}})
                    if phase == "backward" and s < pp - 1 and k < m - 1:
                        # a combined send-and-receive is written twice, with the same ts and dur
                        both = {"name": "backward-send-forward-recv", "ph": "X", "pid": d, "tid": 10 * s + 1,
                                "ts": end + 0.5, "dur": 2.0, "args": {"step": step}}
                        events += [both, dict(both)]
                last = row[-1][3]
                events.append({"name": "params-all-gather", "ph": "X", "pid": d, "tid": 10 * s + 2,
                               "ts": row[0][2] - 3.0, "dur": 2.0, "args": {"step": step}})
                events.append({"name": "grads-reduce-scatter", "ph": "X", "pid": d, "tid": 10 * s + 2, "ts": last,
                               "dur": synced[s] - last, "args": {"step": step}})
                events.append({"name": "optimizer", "ph": "X", "pid": d, "tid": 10 * s + 3, "ts": synced[s] + 5,
                               "dur": 20.0, "args": {"step": step}})
    path.write_text(json.dumps({"traceEvents": events}))
    return path, passes


def write_rank_files(folder, passes, pp, dp, groups=True, skew_us=0.0, shapes=None):
    """The same job as one Chrome trace per rank (``rank{r}.json``), Megatron's rank order with TP = 1
    (rank = d + dp · s: the stage's ranks are neighbours): each file the worker's ``forward-compute`` /
    ``backward-compute`` passes (args mb_id), with ``groups`` its pipeline process group in
    ``distributedInfo.pg_config``; rank r's clock ``skew_us`` × r (mod 3) ahead. ``shapes``: stage -> (M, N, K),
    each pass then one ``aten::mm`` of (M, K) by (K, N) floats over its whole time, its backward two (the
    input's and the weight's gradients), as torch.profiler records them with ``record_shapes``. Returns each
    worker's rank, by (stage, replica)."""
    folder.mkdir(parents=True, exist_ok=True)
    rank_of = {(s, d): d + dp * s for s in range(pp) for d in range(dp)}
    for (s, d), r in rank_of.items():
        info = {"rank": r, "world_size": pp * dp}
        if groups:
            info["pg_config"] = [{"pg_name": "7", "pg_desc": "PIPELINE_MODEL_PARALLEL_GROUP",
                                  "ranks": [rank_of[(t, d)] for t in range(pp)]},
                                 {"pg_name": "8", "pg_desc": "DATA_PARALLEL_GROUP",
                                  "ranks": [rank_of[(s, e)] for e in range(dp)]}]
        events = [{"name": "thread_name", "ph": "M", "pid": r, "tid": 1, "args": {"name": "compute"}}]
        for (replica, step), rows in passes.items():
            if replica != d:
                continue
            for phase, k, start, end in rows[s]:
                events.append({"name": f"{phase}-compute", "ph": "X", "pid": r, "tid": 1,
                               "ts": start + skew_us * (r % 3),
                               "dur": end - start, "args": {"step": step, "mb_id": k}})
                if shapes is not None:
                    mm, n, kk = shapes[s]
                    calls = 1 if phase == "forward" else 2
                    for c in range(calls):
                        a = start + skew_us * (r % 3) + (end - start) * c / calls
                        events.append({"name": "aten::mm", "cat": "cpu_op", "ph": "X", "pid": r, "tid": 1, "ts": a,
                                       "dur": (end - start) / calls,
                                       "args": {"Input Dims": [[mm, kk], [kk, n]], "Input type": ["float", "float"]}})
            # the stage's gradient all-reduce with its peers: from its last backward to the slowest's, then SYNC_US
            last = rows[s][-1][3]
            synced = max(passes[(e, step)][s][-1][3] for e in range(dp)) + SYNC_US
            events.append({"name": "c10d::allreduce_", "cat": "cpu_op", "ph": "X", "pid": r, "tid": 1,
                           "ts": last + skew_us * (r % 3), "dur": synced - last})
        (folder / f"rank{r}.json").write_text(json.dumps({"distributedInfo": info, "traceEvents": events}))
    return rank_of
