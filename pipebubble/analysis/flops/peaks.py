"""Dense peak FLOP/s by dtype and memory bandwidth of the accelerators users run, found from the device name a
trace records (Kineto's ``deviceProperties[].name``, Nsight's ``TARGET_INFO_GPU.name``).

Figures are the vendors' dense (no 2:4 sparsity) tensor-core peaks at boost clock, per device as the framework
sees it (an MI250X is two devices, one per GCD, each half the card), from their datasheets:
- NVIDIA V100: "NVIDIA Tesla V100 GPU Accelerator" datasheet (SXM2 and PCIe columns);
- NVIDIA A100: "NVIDIA A100 Tensor Core GPU" datasheet (80GB SXM / PCIe; 40GB at 1,555 GB/s);
- NVIDIA H100, H200: "NVIDIA H100 Tensor Core GPU" and "NVIDIA H200" datasheets (SXM, PCIe, NVL; the
  sparse figures they print halved);
- NVIDIA B200, GB200: "NVIDIA Blackwell" / DGX B200 and GB200 NVL72 datasheets, per GPU, dense;
- NVIDIA L4, L40S, A10: their datasheets (dense columns);
- NVIDIA GeForce RTX 4090: "NVIDIA Ada GPU Architecture" whitepaper, appendix table (FP16/BF16 tensor with
  FP32 accumulate, as PyTorch accumulates);
- AMD Instinct MI250X, MI250, MI300X, MI325X: AMD's product specification pages (matrix peaks);
- Intel Gaudi 2 and Gaudi 3: Intel's Gaudi 2 and Gaudi 3 AI accelerator white papers (MME BF16).
FP32 is the CUDA-core (non-tensor) peak where the vendor gives one: PyTorch runs float32 matrix products
without TF32 unless asked (``torch.backends.cuda.matmul.allow_tf32``).
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["PEAKS", "Peak", "peak_of"]

T = 1e12


class Peak(NamedTuple):
    device: str  # the table's name for it
    flops: dict[str, float]  # dtype -> dense FLOP/s
    bytes_per_s: float  # memory bandwidth, bytes/s


def _p(device: str, bandwidth_gbs: float, **tflops: float) -> Peak:
    flops = {k: v * T for k, v in tflops.items()}
    flops.setdefault("fp16", flops.get("bf16", 0.0))
    flops.setdefault("bf16", flops["fp16"])
    return Peak(device, flops, bandwidth_gbs * 1e9)


#: (pattern over the recorded device name, case-insensitive) -> its peaks; the first that matches is taken, so
#: the more specific come first.
PEAKS: list[tuple[str, Peak]] = [
    (r"GB200", _p("GB200", 8000, fp64=45, fp32=80, tf32=1250, bf16=2500, fp8=5000, int8=5000)),
    (r"B200", _p("B200", 8000, fp64=40, fp32=75, tf32=1100, bf16=2250, fp8=4500, int8=4500)),
    (r"H200", _p("H200 SXM", 4800, fp64=67, fp32=67, tf32=494.7, bf16=989.4, fp8=1978.9, int8=1978.9)),
    (r"H100.*NVL", _p("H100 NVL", 3900, fp64=60, fp32=60, tf32=417.5, bf16=835, fp8=1670, int8=1670)),
    (r"H100.*PCIe", _p("H100 PCIe", 2000, fp64=51, fp32=51, tf32=378, bf16=756, fp8=1513, int8=1513)),
    (r"H100|H800", _p("H100 SXM", 3350, fp64=67, fp32=67, tf32=494.7, bf16=989.4, fp8=1978.9, int8=1978.9)),
    (r"A100.*PCIe.*40|A100-PCIE-40", _p("A100 PCIe 40GB", 1555, fp64=19.5, fp32=19.5, tf32=156, bf16=312,
                                         int8=624)),
    (r"A100.*PCIe", _p("A100 PCIe 80GB", 1935, fp64=19.5, fp32=19.5, tf32=156, bf16=312, int8=624)),
    (r"A100.*40GB", _p("A100 SXM 40GB", 1555, fp64=19.5, fp32=19.5, tf32=156, bf16=312, int8=624)),
    (r"A100|A800", _p("A100 SXM 80GB", 2039, fp64=19.5, fp32=19.5, tf32=156, bf16=312, int8=624)),
    (r"V100.*PCIe", _p("V100 PCIe", 900, fp64=7, fp32=14, fp16=112)),
    (r"V100", _p("V100 SXM2", 900, fp64=7.8, fp32=15.7, fp16=125)),
    (r"L40S", _p("L40S", 864, fp32=91.6, tf32=183, bf16=362.05, fp8=733, int8=733)),
    (r"\bL4\b", _p("L4", 300, fp32=30.3, tf32=60, bf16=121, fp8=242.5, int8=242.5)),
    (r"\bA10\b", _p("A10", 600, fp32=31.2, tf32=62.5, bf16=125, int8=250)),
    (r"RTX 4090", _p("RTX 4090", 1008, fp32=82.6, tf32=82.6, bf16=165.2, fp8=330.3, int8=660.6)),
    (r"MI325X", _p("MI325X", 6000, fp64=163.4, fp32=163.4, tf32=653.7, bf16=1307.4, fp8=2614.9, int8=2614.9)),
    (r"MI300X", _p("MI300X", 5300, fp64=163.4, fp32=163.4, tf32=653.7, bf16=1307.4, fp8=2614.9, int8=2614.9)),
    (r"MI250X", _p("MI250X (one GCD)", 1638.4, fp64=47.85, fp32=47.85, bf16=191.5, int8=191.5)),
    (r"MI250", _p("MI250 (one GCD)", 1638.4, fp64=45.25, fp32=45.25, bf16=181, int8=181)),
    (r"Gaudi ?3|HL-3", _p("Gaudi 3", 3700, fp32=229, bf16=1835, fp8=1835)),
    (r"Gaudi ?2|HL-2", _p("Gaudi 2", 2460, fp32=432, bf16=432, fp8=865)),
]


def peak_of(device_name: str | None) -> Peak | None:
    """The peaks of the device a trace names; None where the table has no entry for it."""
    if not device_name:
        return None
    for pattern, peak in PEAKS:
        if re.search(pattern, device_name, re.IGNORECASE):
            return peak
    return None
