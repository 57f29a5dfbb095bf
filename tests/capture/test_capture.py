"""capture: real child processes under the injected profiler, read back from the gzipped Kineto JSON."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="capture needs torch")

import typer  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from pipebubble.capture import CaptureOptions, capture  # noqa: E402
from pipebubble.capture.workloads import WorkloadSettings, workload_command  # noqa: E402
from pipebubble.cli import capture as capture_cli  # noqa: E402
from pipebubble.errors import CaptureError  # noqa: E402

TRAIN = """
    import sys, torch
    from torch.profiler import record_function
    model = torch.nn.Linear(32, 32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        with record_function("toy_step"):
            model(torch.randn(8, 32)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    sys.exit(3)
"""

DDP = """
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(4):
        model(torch.randn(4, 16)).sum().backward()
        optimizer.step()
    dist.destroy_process_group()
"""


def script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def events(trace: Path) -> dict:
    with gzip.open(trace, "rt") as f:
        return json.load(f)


def names(trace: Path) -> list[str]:
    return [e["name"] for e in events(trace)["traceEvents"] if e.get("ph") == "X"]


def memory(trace: Path) -> list[dict]:
    """The args of the trace's CPU allocator events (`[memory]` instants of device type 0)."""
    found = [e["args"] for e in events(trace)["traceEvents"] if e.get("name") == "[memory]"]
    return [args for args in found if args["Device Type"] == 0]


def test_plain_script_keeps_exit_code_and_writes_a_trace(tmp_path):
    result = capture([sys.executable, script(tmp_path, TRAIN)], CaptureOptions(out=tmp_path / "out"))
    assert result.exit_code == 3
    assert [t.name for t in result.traces] == ["rank0.pt.trace.json.gz"]
    found = names(result.traces[0])
    assert {"ProfilerStep#2", "ProfilerStep#3"} <= set(found) and "toy_step" in found
    meta = json.loads(result.metadata.read_text())
    assert meta["exit_code"] == 3 and meta["world_size"] == 1 and meta["torch"]
    assert "environ" not in json.dumps(meta).lower()
    # Allocator memory is recorded by default: every allocation and free, with the running total.
    assert meta["profile_memory"] is True
    allocated = memory(result.traces[0])
    assert allocated and {"Total Allocated", "Total Reserved", "Bytes", "Device Id"} <= set(allocated[0])
    assert max(args["Total Allocated"] for args in allocated) > 0


def test_no_memory_leaves_the_allocator_out(tmp_path):
    body = "import torch\ntorch.randn(64, 64).matmul(torch.randn(64, 64))\n"
    app = typer.Typer()
    capture_cli.register(app)
    app.command("noop")(lambda: None)
    out = tmp_path / "out"
    args = ["capture", "--mode", "run", "--no-memory", "--quiet", "-o", str(out), "--", sys.executable,
            script(tmp_path, body)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "aten::matmul" in names(out / "rank0.pt.trace.json.gz") and not memory(out / "rank0.pt.trace.json.gz")
    assert json.loads((out / "capture.json").read_text())["profile_memory"] is False


def test_script_without_optimizer_steps_says_what_to_change(tmp_path):
    body = "import torch\nprint(torch.ones(2).sum())\n"
    with pytest.raises(CaptureError, match="lower --wait/--warmup"):
        capture([sys.executable, script(tmp_path, body)], CaptureOptions(out=tmp_path / "out"))


def test_os_exit_still_flushes_the_run(tmp_path):
    body = "import os, torch\ntorch.randn(64, 64).matmul(torch.randn(64, 64))\nos._exit(5)\n"
    result = capture([sys.executable, script(tmp_path, body)], CaptureOptions(out=tmp_path / "out", mode="run"))
    assert result.exit_code == 5
    assert "aten::matmul" in names(result.traces[0])


def test_own_profiler_is_named(tmp_path):
    body = "import torch\nwith torch.profiler.profile():\n    torch.ones(3).sum()\n"
    with pytest.raises(CaptureError, match="runs its own torch.profiler"):
        capture([sys.executable, script(tmp_path, body)], CaptureOptions(out=tmp_path / "out"))


def test_sigterm_is_forwarded_and_the_trace_still_written(tmp_path):
    body = "import time, torch\ntorch.ones(8).sum()\nprint('ready', flush=True)\ntime.sleep(60)\n"
    cli = "from pipebubble.cli import main; main()"
    command = [sys.executable, "-c", cli, "capture", "--mode", "run", "--out", str(tmp_path / "out"), "--",
               sys.executable, script(tmp_path, body)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout.readline().strip() == "ready"
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert "aten::sum" in names(tmp_path / "out" / "rank0.pt.trace.json.gz")


def test_serve_workload_labels_steps_like_vllm(tmp_path):
    settings = WorkloadSettings(requests=3, arrival_rate=1000.0, chunked_prefill=64)
    command, about, options = workload_command("serve", settings, CaptureOptions(out=tmp_path / "out"))
    result = capture(command, options, about)
    steps = [n for n in names(result.traces[0]) if n.startswith("execute_")]
    assert steps and all(re.fullmatch(r"execute_context_\d+\(\d+\)_generation_(\d+)\(\1\)", n) for n in steps)
    assert any(not n.startswith("execute_context_0(") and not n.endswith("_0(0)") for n in steps)  # mixed steps


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not on PATH")
def test_torchrun_gives_one_trace_per_rank(tmp_path):
    command = ["torchrun", "--standalone", "--nproc-per-node", "2", script(tmp_path, DDP)]  # a free port
    result = capture(command, CaptureOptions(out=tmp_path / "out"))
    assert result.exit_code == 0 and not result.warnings
    ranks = [events(t)["distributedInfo"]["rank"] for t in result.traces]
    assert [t.name for t in result.traces] == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"]
    assert ranks == [0, 1]


@pytest.mark.slow
def test_pipeline_workload_labels_every_microbatch(tmp_path):
    settings = WorkloadSettings(schedule="1f1b", stages=4, microbatches=8, hidden=128, layers=4, batch=40)
    options = CaptureOptions(out=tmp_path / "out", active=1)
    command, about, options = workload_command("pipeline", settings, options)
    result = capture(command, options, about)
    assert result.exit_code == 0 and len(result.traces) == 4
    for rank, trace in enumerate(result.traces):
        labels = {n for n in names(trace) if re.fullmatch(r"PP:\d+[FB]\d+", n)}
        assert labels == {f"PP:{rank}{phase}{mb}" for phase in "FB" for mb in range(8)}
        assert events(trace)["distributedInfo"]["rank"] == rank
        # --batch 40 in 8 micro-batches: a block's output is 5 rows of 128 float32 values.
        assert 5 * 128 * 4 in {args["Bytes"] for args in memory(trace)}
    workload = json.loads(result.metadata.read_text())["workload"]
    assert (workload["schedule"], workload["batch"]) == ("1f1b", 40)
    # ... and reads back through the analysis as the pipeline it is.
    from pipebubble.options import Options, Scale
    from pipebubble.run import run

    pipe = run([options.out], Options(), Scale(use_cache=False)).pipeline
    assert (pipe.stages, pipe.microbatches, pipe.schedule, pipe.microbatches_inferred) == (4, 8, "1f1b", False)


def test_pipeline_batch_is_the_global_batch_in_rows(tmp_path):
    options = CaptureOptions(out=tmp_path / "out")
    default, about, _ = workload_command("pipeline", WorkloadSettings(microbatches=4), options)
    assert default[default.index("--batch") + 1] == "128" and about["batch"] == 128  # 32 rows per micro-batch
    given, about, _ = workload_command("pipeline", WorkloadSettings(microbatches=4, batch=2048), options)
    assert given[given.index("--batch") + 1] == "2048" and about["batch"] == 2048


def test_batch_is_refused_for_the_serve_workload(tmp_path):
    with pytest.raises(CaptureError, match="--batch applies to --workload pipeline only"):
        workload_command("serve", WorkloadSettings(batch=64), CaptureOptions(out=tmp_path / "out"))


@pytest.mark.parametrize("batch, hint", [(10, "e.g. 8 or 12"), (2, "e.g. 4 or 8"), (0, "e.g. 4 or 8")])
def test_a_batch_that_does_not_split_evenly_is_refused_up_front(tmp_path, batch, hint):
    settings = WorkloadSettings(microbatches=4, batch=batch)
    with pytest.raises(CaptureError, match=f"--batch {batch} does not split into 4 micro-batches.*{hint}"):
        workload_command("pipeline", settings, CaptureOptions(out=tmp_path / "out"))


def test_the_pipeline_module_refuses_such_a_batch_too(capsys):
    from pipebubble.capture.workloads import pipeline

    with pytest.raises(SystemExit) as exit_info:
        pipeline.parse(["--microbatches", "4", "--batch", "10"])
    assert exit_info.value.code == 2 and "--batch 10 does not split into 4" in capsys.readouterr().err
    assert pipeline.parse(["--microbatches", "4", "--batch", "12"]).microbatch_rows == 3


def test_cli_rejects_a_workload_and_a_command_together(tmp_path):
    app = typer.Typer()
    capture_cli.register(app)
    app.command("noop")(lambda: None)
    result = CliRunner().invoke(app, ["capture", "--workload", "serve", "--", "python", "x.py"])
    assert isinstance(result.exception, CaptureError)


GEMMS = """
    import torch
    a, b = torch.randn(128, 256), torch.randn(256, 64)
    for _ in range(20):
        c = a @ b
"""


def test_shapes_are_recorded_by_default_and_give_a_cpu_gemm_its_mfu(tmp_path):
    """A toy GEMM loop on CPU, captured as is: its aten::mm calls carry their shapes, and MFU against a given
    peak is the FLOPs over the thread's window × the peak, counted here from the raw events."""
    from pipebubble.options import Options, Scale
    from pipebubble.run import run

    result = capture([sys.executable, script(tmp_path, GEMMS)], CaptureOptions(out=tmp_path / "out", mode="run"))
    assert json.loads(result.metadata.read_text())["record_shapes"] is True
    raw = [e for e in events(result.traces[0])["traceEvents"] if e.get("cat") == "cpu_op"]
    mms = [e for e in raw if e["name"] == "aten::mm"]
    assert len(mms) == 20 and all(e["args"]["Input Dims"] == [[128, 256], [256, 64]] for e in mms)
    thread = [e for e in raw if e["tid"] == mms[0]["tid"]]
    window_ns = round(max(e["ts"] + e["dur"] for e in thread) * 1000) - round(min(e["ts"] for e in thread) * 1000)
    flops = 20 * 2 * 128 * 64 * 256
    report = run([result.traces[0]], Options.from_settings({"peak_flops": "50G"}), Scale(workers=1, use_cache=False))
    (lane,) = [g for g in report.flops.by_gpu if g.flops]
    assert lane.flops == flops and lane.window_ns == pytest.approx(window_ns, abs=2)
    assert 0 < lane.mfu < 1 and lane.mfu == pytest.approx(flops / (window_ns / 1e9 * 50e9), rel=1e-3)
