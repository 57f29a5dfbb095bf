"""FLOPs and bytes of one operator call from its name and the shapes and dtypes torch.profiler recorded
(``record_shapes=True``: ``Input Dims``, ``Input type``).

Conventions, each the one the literature uses for model FLOPs:
- a matrix product of (M, K) by (K, N) is 2·M·N·K FLOPs (a multiply and an add per term); a bias or a
  ``beta``·C term is not counted; a batch multiplies it;
- attention (``scaled_dot_product_attention`` and its flash, memory-efficient and cuDNN kernels) is its two
  products, Q·Kᵀ and P·V: 2·B·H·Lq·Lk·D + 2·B·H·Lq·Lk·Dv, without the causal mask's saving (the recorded
  shapes do not say whether it was causal); a backward is 2.5× its forward (five products to two);
- a convolution's backward, whose first input is the output's gradient, is 2× its forward (input and weight
  gradients); a forward convolution is modelled only from the output shape, which its inputs do not give,
  so it is left unmodelled;
- elementwise operators and reductions count one FLOP per element; their worth is their bytes;
- bytes are every tensor input read once and the output written once, at the dtype's size.

``model(name, dims, dtypes)`` gives ``Cost(flops, bytes, cls, dtype)`` or None where the operator has no model
or its shapes do not fit one.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

__all__ = ["DTYPES", "Cost", "dtype_of", "model"]

#: torch.profiler's ``Input type`` spellings -> (dtype name, bytes per element).
DTYPES: dict[str, tuple[str, int]] = {
    "float": ("fp32", 4), "c10::Float": ("fp32", 4),
    "double": ("fp64", 8),
    "c10::Half": ("fp16", 2), "c10::BFloat16": ("bf16", 2),
    "c10::Float8_e4m3fn": ("fp8", 1), "c10::Float8_e5m2": ("fp8", 1), "c10::Float8_e4m3fnuz": ("fp8", 1),
    "c10::Float8_e5m2fnuz": ("fp8", 1), "c10::Float8_e8m0fnu": ("fp8", 1),
    "signed char": ("int8", 1), "unsigned char": ("uint8", 1), "bool": ("bool", 1),
    "short int": ("int16", 2), "int": ("int32", 4), "long int": ("int64", 8), "long": ("int64", 8),
}


class Cost(NamedTuple):
    flops: int
    bytes: int
    cls: str  # matmul, attention, conv, elementwise, reduction
    dtype: str | None  # the compute dtype: the first tensor input's


def _bare(name: str) -> str:
    """``aten::addmm`` -> ``addmm``; ``aten::add_`` -> ``add``."""
    return name.rsplit("::", 1)[-1].rstrip("_")


def _numel(shape) -> int:
    return math.prod(shape) if shape else 1


def dtype_of(dtypes: list) -> str | None:
    """The compute dtype: that of the first input with a known tensor dtype."""
    for t in dtypes:
        if isinstance(t, str) and t in DTYPES:
            return DTYPES[t][0]
    return None


def _size(dtypes: list, i: int) -> int:
    t = dtypes[i] if i < len(dtypes) else None
    return DTYPES[t][1] if isinstance(t, str) and t in DTYPES else 0


def _tensors(dims: list, dtypes: list) -> list[tuple[list[int], int]]:
    """(shape, element size) of every tensor input: a list of ints with a known dtype (a 0-d tensor is [])."""
    out = []
    for i, shape in enumerate(dims):
        size = _size(dtypes, i)
        if size and isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape):
            out.append((shape, size))
    return out


def _io(tensors: list[tuple[list[int], int]], out_numel: int) -> int:
    """Bytes: every tensor input read once, the output written once at the first input's size."""
    return sum(_numel(s) * b for s, b in tensors) + out_numel * (tensors[0][1] if tensors else 0)


def _gemm(a: list[int], b: list[int]) -> tuple[int, int, int, int] | None:
    """(batch, M, N, K) of ``a @ b`` with matmul's broadcasting; None where the shapes do not multiply."""
    if not a or not b:
        return None
    a2 = [1, *a] if len(a) == 1 else a
    b2 = [*b, 1] if len(b) == 1 else b
    m, k = a2[-2], a2[-1]
    k2, n = b2[-2], b2[-1]
    if k != k2:
        return None
    batch_a, batch_b = a2[:-2], b2[:-2]
    width = max(len(batch_a), len(batch_b))
    batch_a = [1] * (width - len(batch_a)) + batch_a
    batch_b = [1] * (width - len(batch_b)) + batch_b
    batch = 1
    for x, y in zip(batch_a, batch_b, strict=True):
        if x != y and 1 not in (x, y):
            return None
        batch *= max(x, y)
    return batch, m, n, k


def _matmul(a, b, tensors, cls: str = "matmul", flops_scale: int = 1) -> tuple[int, int, str] | None:
    g = _gemm(a, b)
    if g is None:
        return None
    batch, m, n, k = g
    return 2 * batch * m * n * k * flops_scale, _io(tensors, batch * m * n), cls


#: Attention operators and the layout of their q, k, v: (index of q, "bhld" or "blhd", backward?).
_ATTENTION = {
    "scaled_dot_product_attention": (0, "bhld", False),
    "_scaled_dot_product_flash_attention": (0, "bhld", False),
    "_scaled_dot_product_flash_attention_for_cpu": (0, "bhld", False),
    "_scaled_dot_product_efficient_attention": (0, "bhld", False),
    "_scaled_dot_product_cudnn_attention": (0, "bhld", False),
    "_scaled_dot_product_fused_attention_overrideable": (0, "bhld", False),
    "_flash_attention_forward": (0, "blhd", False),
    "_efficient_attention_forward": (0, "blhd", False),
    "_scaled_dot_product_flash_attention_backward": (1, "bhld", True),
    "_scaled_dot_product_flash_attention_for_cpu_backward": (1, "bhld", True),
    "_scaled_dot_product_efficient_attention_backward": (1, "bhld", True),
    "_scaled_dot_product_cudnn_attention_backward": (1, "bhld", True),
    "_flash_attention_backward": (1, "blhd", True),
    "_efficient_attention_backward": (1, "blhd", True),
}

_ELEMENTWISE = frozenset("""
add sub mul div neg abs exp exp2 log log1p sqrt rsqrt pow reciprocal sin cos tanh sigmoid relu relu6 gelu silu
mish hardswish hardsigmoid leaky_relu elu clamp clamp_min clamp_max threshold threshold_backward gelu_backward
silu_backward sigmoid_backward tanh_backward where masked_fill copy to _to_copy fill zero lerp addcmul addcdiv
maximum minimum eq ne lt le gt ge bitwise_and bitwise_or logical_and logical_not floor ceil round sign erf
dropout native_dropout fused_dropout
""".split())
_REDUCTIONS = frozenset("""
sum mean amax amin max min argmax argmin prod norm linalg_vector_norm var std var_mean std_mean softmax _softmax
log_softmax _log_softmax _softmax_backward_data _log_softmax_backward_data layer_norm native_layer_norm
native_layer_norm_backward group_norm native_group_norm rms_norm _fused_rms_norm batch_norm native_batch_norm
cumsum logsumexp
""".split())
_NORM_SPLIT = re.compile(r"^(.*?)(?:_backward|Backward\d*)$")


def model(name: str, dims: list, dtypes: list) -> Cost | None:
    """The ``Cost`` of one call of operator ``name`` with inputs of shapes ``dims`` and types ``dtypes`` (as
    torch.profiler records them); None where it has no model."""
    op = _bare(name)
    if not isinstance(dims, list) or not isinstance(dtypes, list):
        return None
    tensors = _tensors(dims, dtypes)
    if not tensors:
        return None
    dtype = dtype_of(dtypes)
    got = _model(op, name, dims, dtypes, tensors)
    if got is None:
        return None
    flops, nbytes, cls = got
    return Cost(int(flops), int(nbytes), cls, dtype)


def _shape(dims: list, i: int) -> list[int] | None:
    s = dims[i] if i < len(dims) else None
    return s if isinstance(s, list) and all(type(d) is int for d in s) else None


def _model(op: str, name: str, dims: list, dtypes: list, tensors) -> tuple[int, int, str] | None:
    if op in ("mm", "matmul", "bmm", "_scaled_mm", "_scaled_mm_v2", "_int_mm", "dot", "mv", "vdot"):
        a, b = _shape(dims, 0), _shape(dims, 1)
        return None if a is None or b is None else _matmul(a, b, tensors)
    if op in ("addmm", "baddbmm", "addbmm", "_addmm_activation", "addmv"):
        a, b = _shape(dims, 1), _shape(dims, 2)
        return None if a is None or b is None else _matmul(a, b, tensors)
    if op == "linear":
        x, w = _shape(dims, 0), _shape(dims, 1)
        if not x or not w or len(w) != 2 or x[-1] != w[1]:
            return None
        rows = _numel(x[:-1])
        return 2 * rows * w[0] * w[1], _io(tensors, rows * w[0]), "matmul"
    if op == "_grouped_mm" or op == "_scaled_grouped_mm":
        return _grouped(dims, tensors)
    if op in _ATTENTION:
        return _attention(op, dims, tensors)
    if op in ("convolution_backward", "cudnn_convolution_backward", "miopen_convolution_backward"):
        return _conv_backward(dims, tensors)
    if op in ("copy", "fill", "zero"):  # the destination is written, not read: a copy reads its source once
        first, size = _numel(tensors[0][0]), tensors[0][1]
        moved = sum(_numel(s) * b for s, b in tensors) if op == "copy" else first * size
        return first, moved, "elementwise"
    if op in _ELEMENTWISE:
        out = max(_numel(s) for s, _ in tensors)
        return out, _io(tensors, out), "elementwise"
    base = _NORM_SPLIT.match(op)
    if op in _REDUCTIONS or (base is not None and base.group(1) in _REDUCTIONS):
        first = _numel(tensors[0][0])
        out = first if "softmax" in op or "norm" in op else 0
        return first, _io(tensors, out), "reduction"
    return None


def _grouped(dims: list, tensors) -> tuple[int, int, str] | None:
    """``_grouped_mm(A, B, offs)``: A (total_m, K) against B (G, K, N), the groups' rows summing to total_m:
    2·total_m·N·K; a 3-d A (G, M, K) is a batched product."""
    a, b = _shape(dims, 0), _shape(dims, 1)
    if not a or not b:
        return None
    if len(a) == 2 and len(b) == 3 and a[1] == b[1]:
        return 2 * a[0] * b[2] * a[1], _io(tensors, a[0] * b[2]), "matmul"
    return _matmul(a, b, tensors)


def _attention(op: str, dims: list, tensors) -> tuple[int, int, str] | None:
    first, layout, backward = _ATTENTION[op]
    q, k, v = (_shape(dims, first + i) for i in range(3))
    if not q or not k or not v or len(q) != 4 or len(k) != 4 or len(v) != 4:
        return None
    if layout == "bhld":
        b, h, lq, d = q
        lk, dv = k[2], v[3]
    else:
        b, lq, h, d = q
        lk, dv = k[1], v[3]
    forward = 2 * b * h * lq * lk * d + 2 * b * h * lq * lk * dv
    out = b * h * lq * dv
    if backward:
        return forward * 5 // 2, _io(tensors, 3 * out), "attention"
    return forward, _io(tensors, out), "attention"


def _conv_backward(dims: list, tensors) -> tuple[int, int, str] | None:
    """``convolution_backward(grad_output, input, weight, ...)``: the forward's FLOPs are 2·N·O·(C/g)·∏k·∏out
    (the output's gradient gives the output's shape), the backward twice that."""
    go, x, w = _shape(dims, 0), _shape(dims, 1), _shape(dims, 2)
    if not go or not x or not w or len(go) < 3 or len(go) != len(x) or len(w) != len(x):
        return None
    n, o = go[0], go[1]
    if w[0] != o:
        return None
    forward = 2 * n * o * w[1] * _numel(w[2:]) * _numel(go[2:])
    return 2 * forward, _io(tensors, _numel(x) + _numel(w)), "conv"
