"""The kernel table's short names on every real trace: each at most 80 characters with neither ``(`` nor
``<``, distinct where the full names differ, the same where they are the same (one name in two classes), and
the full name kept beside it (``name_full``, in the JSON report and the CSV table)."""

from __future__ import annotations

import csv
import io
from functools import cache
from pathlib import Path

import pytest
from conftest import shared, shared_files

from pipebubble.options import Options, Scale
from pipebubble.render import render
from pipebubble.report import Report
from pipebubble.report.names import WIDTH
from pipebubble.run import run

TRACES = [p for p in shared_files(".", "**/*") if p.is_file() and p.suffix != ".md"]


@cache
def _report(*paths: str) -> Report:
    return run([Path(p) for p in paths], Options(), Scale(use_cache=False, workers=1))


def _check(report: Report) -> None:
    rows = report.kernels
    for k in rows:
        assert k.name_full is not None or k.name is None
        if k.name is not None:
            assert len(k.name) <= WIDTH and "(" not in k.name and "<" not in k.name, k.name
    pairs = {(k.name_full, k.name) for k in rows}
    assert len({full for full, _ in pairs}) == len(pairs)  # one full name, one short name
    assert len({short for _, short in pairs}) == len(pairs), "two full names share a short name"
    data = report.to_dict()["kernels"]
    assert [(k["name"], k["name_full"]) for k in data] == [(k.name, k.name_full) for k in rows]
    table = list(csv.DictReader(io.StringIO(render(report, "csv", table="kernels"))))
    assert [(r["name"], r["name_full"]) for r in table] == [(k.name or "", k.name_full or "") for k in rows]


@pytest.mark.parametrize("path", TRACES or [None], ids=lambda p: str(p.relative_to(p.parents[1])) if p else "absent")
def test_every_real_trace_names_its_kernels_short_and_apart(path):
    path = path or shared("kineto")
    _check(_report(str(path)))


def test_a_job_of_two_ranks_names_its_kernels_short_and_apart():
    """The summary over files (value counts merged) names its rows as one file's does."""
    ranks = [shared("kineto", f"recsys_128rank_sampled_rank-{r}.json.gz") for r in (0, 1)]
    report = _report(*map(str, ranks))
    assert len(report.kernels) > 100
    _check(report)


def test_the_names_a_person_reads_on_a_real_trace():
    """The resnet DDP trace: cutlass wrappers by their template argument, NCCL without its parameters,
    PyTorch's elementwise kernels told apart by the functor they run."""
    names = {k.name_full: k.name for k in _report(str(shared("kineto", "resnet_ddp_a100_nccl_rank0.json.gz"))).kernels}
    assert names["ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"] == \
        "ncclKernel_AllReduce_RING_LL_Sum_float"
    gemm = "cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4"
    assert names[f"void cutlass::Kernel<{gemm}>({gemm}::Params)"] == gemm
    elementwise = [n for n in names.values() if n.startswith("vectorized_elementwise_kernel")]
    assert len(elementwise) > 3 and all(n.startswith("vectorized_elementwise_kernel[") for n in elementwise)
