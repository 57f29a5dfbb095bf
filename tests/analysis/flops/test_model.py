"""FLOPs and bytes of one operator call, by hand."""

from __future__ import annotations

import pytest

from pipebubble.analysis.flops.model import model

F, H = "float", "c10::BFloat16"


@pytest.mark.parametrize(("name", "dims", "types", "flops", "nbytes"), [
    ("aten::mm", [[8, 256], [256, 512]], [F, F], 2 * 8 * 512 * 256, 4 * (8 * 256 + 256 * 512 + 8 * 512)),
    # addmm(bias, a, b, beta, alpha): the bias is read, not multiplied
    ("aten::addmm", [[512], [8, 256], [256, 512], [], []], [F, F, F, "Scalar", "Scalar"], 2 * 8 * 512 * 256,
     4 * (512 + 8 * 256 + 256 * 512 + 8 * 512)),
    ("aten::bmm", [[4, 8, 16], [4, 16, 32]], [H, H], 2 * 4 * 8 * 32 * 16, 2 * (4 * 8 * 16 + 4 * 16 * 32 + 4 * 8 * 32)),
    ("aten::baddbmm", [[4, 8, 32], [4, 8, 16], [4, 16, 32], [], []], [H, H, H, "Scalar", "Scalar"],
     2 * 4 * 8 * 32 * 16, 2 * (4 * 8 * 32 + 4 * 8 * 16 + 4 * 16 * 32 + 4 * 8 * 32)),
    # matmul broadcasts a 2-d weight over the batch
    ("aten::matmul", [[3, 8, 16], [16, 32]], [F, F], 2 * 3 * 8 * 32 * 16, 4 * (3 * 8 * 16 + 16 * 32 + 3 * 8 * 32)),
    # linear(x, W[N, K], bias): x's leading dims are rows
    ("aten::linear", [[2, 5, 64], [128, 64], [128]], [H, H, H], 2 * 10 * 128 * 64,
     2 * (2 * 5 * 64 + 128 * 64 + 128 + 10 * 128)),
    ("aten::_scaled_mm", [[64, 128], [128, 256], [], []], ["c10::Float8_e4m3fn", "c10::Float8_e4m3fn", F, F],
     2 * 64 * 256 * 128, 64 * 128 + 128 * 256 + 2 * 4 + 64 * 256),  # the two scales: 0-d float tensors
    ("aten::_grouped_mm", [[96, 64], [3, 64, 32], [3]], [H, H, "int"], 2 * 96 * 32 * 64, None),
    # copies read their source and write their destination once; fills write only
    ("aten::copy_", [[1024, 8], [1024, 8], []], [H, H, "Scalar"], 8192, 2 * 2 * 8192),
    ("aten::fill_", [[1024], []], [F, "Scalar"], 1024, 4 * 1024),
    ("aten::add", [[64, 32], [32], []], [F, F, "Scalar"], 64 * 32, 4 * (64 * 32 + 32 + 64 * 32)),
])
def test_products_and_bytes_by_hand(name, dims, types, flops, nbytes):
    cost = model(name, dims, types)
    assert cost is not None and cost.flops == flops
    if nbytes is not None:
        assert cost.bytes == nbytes


def test_attention_is_its_two_products_in_either_layout():
    b, h, lq, lk, d = 2, 8, 128, 256, 64
    expected = 2 * b * h * lq * lk * d * 2
    bhld = model("aten::_scaled_dot_product_flash_attention", [[b, h, lq, d], [b, h, lk, d], [b, h, lk, d]],
                 [H, H, H])
    blhd = model("aten::_flash_attention_forward", [[b, lq, h, d], [b, lk, h, d], [b, lk, h, d]], [H, H, H])
    assert bhld.flops == blhd.flops == expected and bhld.cls == "attention" and bhld.dtype == "bf16"
    grad = [b, h, lq, d]
    backward = model("aten::_scaled_dot_product_efficient_attention_backward",
                     [grad, [b, h, lq, d], [b, h, lk, d], [b, h, lk, d]], [H, H, H, H])
    assert backward.flops == expected * 5 // 2


def test_convolution_backward_from_the_output_gradient():
    # forward: 2 · N · O · C · kh · kw · Hout · Wout, backward twice that
    cost = model("aten::convolution_backward", [[4, 16, 30, 30], [4, 3, 32, 32], [16, 3, 3, 3]], [F, F, F])
    assert cost.flops == 2 * (2 * 4 * 16 * 3 * 3 * 3 * 30 * 30) and cost.cls == "conv"


@pytest.mark.parametrize(("name", "dims", "types"), [
    ("aten::mm", [[8, 256], [128, 512]], [F, F]),  # inner dimensions differ
    ("aten::convolution", [[4, 3, 32, 32], [16, 3, 3, 3]], [F, F]),  # the output's size is not recorded
    ("aten::view", [[8, 256], []], [F, "Scalar"]),  # no work
    ("aten::mm", [], []),
    ("aten::mm", [[8, 256], [256, 512]], ["", ""]),  # no dtype: no bytes to count
])
def test_no_model_where_the_shapes_do_not_say(name, dims, types):
    assert model(name, dims, types) is None
