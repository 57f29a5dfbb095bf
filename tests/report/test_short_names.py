"""Kernels' short names (``report.names``): a demangled or mangled C++ signature as the function's own name,
a plain name as it is, at most 80 characters with neither ``(`` nor ``<``; names of one table that shorten
alike told apart by the least that differs, else numbered."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipebubble.report import Report
from pipebubble.report.names import WIDTH, short_name, short_names

ADD = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char*,"
       " 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)")
MUL = ("void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float,"
       " at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, 3> >(int, at::native::BinaryFunctor"
       "<float, float, float, at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, 3>)")


def lambda_kernel(op: str, dtype: str = "float") -> str:
    """A vectorized kernel of a lambda of ``op``, as PyTorch's CUDA kernels are named."""
    inner = (f"at::native::{op}(at::TensorIteratorBase&)::{{lambda()#2}}::operator()() const::{{lambda()#7}}::"
             f"operator()() const::{{lambda({dtype})#1}}")
    return f"void at::native::vectorized_elementwise_kernel<4, {inner}, at::detail::Array<char*, 2> >(int, {inner}," \
           " at::detail::Array<char*, 2>)"


@pytest.mark.parametrize(("full", "short"), [
    # templated at::native kernels, GCC's and EDG's spelling (casts, placeholders, [lambda ... (instance N)])
    (ADD, "vectorized_elementwise_kernel"),
    ("void at::native::elementwise_kernel<(int)128, (int)4, void at::native::gpu_kernel_impl_nocast<at::native::"
     "CUDAFunctor_add<float>>(at::TensorIteratorBase &, const T1 &)::[lambda(int) (instance 1)]>(int, T3)",
     "elementwise_kernel"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, "
     "float>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, "
     "unsigned int, float, 4>)", "reduce_kernel"),
    # cutlass: the wrapper's template argument names the kernel; xmma, cuDNN and cuBLAS names are plain
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x64_32x6_nt_align1>(cutlass_80_tensorop_s1688gemm_128x64_"
     "32x6_nt_align1::Params)", "cutlass_80_tensorop_s1688gemm_128x64_32x6_nt_align1"),
    ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int, int, int>, void> >"
     "(cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int, int, int>, void>::Params)", "GemmUniversal"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_cluster1x2x1_execute",
     "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_cluster1x2x1_execute"),
    ("volta_sgemm_128x32_nt", "volta_sgemm_128x32_nt"),
    ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1, true>(cudnnTensorStruct, float const*)",
     "bn_fw_tr_1C11_kernel_NCHW"),
    ("std::enable_if<!(false), void>::type internal::gemvx::kernel<int, int, float, false, 7>(cublasGemvParams<float>)",
     "gemvx::kernel"),  # a wrapper named by no type argument keeps its scope
    # NCCL
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "ncclDevKernel_AllGather_RING_LL"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
     "ncclKernel_AllReduce_RING_LL_Sum_float"),
    ("ncclKernel_AllReduce", "ncclKernel_AllReduce"),
    # Triton and other plain names
    ("triton_poi_fused_add_cos_sin_0", "triton_poi_fused_add_cos_sin_0"),
    ("create_flashinfer_kv_indices_triton", "create_flashinfer_kv_indices_triton"),
    ("Memcpy HtoD (Pageable -> Device)", "Memcpy HtoD [Pageable -> Device]"),
    ("Memset (Device)", "Memset [Device]"),
    ("", ""),
    # anonymous namespaces, GCC's and EDG's
    ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, true, false>(float*, float const*, "
     "int, int, int, bool const*, int, bool)", "softmax_warp_forward"),
    ("void at::native::<unnamed>::vectorized_layer_norm_kernel<float, float, (bool)0>(int, T2, const T1 *, T2 *)",
     "vectorized_layer_norm_kernel"),
    ("void fbgemm_gpu::(anonymous namespace)::_get_FP8_qparam_cuda_kernel<float>(float const*, int, int, "
     "unsigned char*, float*, bool)", "_get_FP8_qparam_cuda_kernel"),
    # operator() and lambdas: the function they are in
    ("void at::native::sigmoid_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() const",
     "sigmoid_kernel_cuda"),
    (lambda_kernel("tanh_kernel_cuda"), "vectorized_elementwise_kernel"),
    # mangled names (ROCm and some exports keep them)
    ("_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi256ELi16ELb0ELb0ELb1ELi1EEEvPT0_PT_PfS4_S4_S4_diiiiiiib",
     "add_rmsnorm_quant_kernel"),
    ("_ZN7ck_tile6kentryILi2ENS_38FmhaBatchPrefillWithPagedKVCacheKernelINS_5FooEEEEvT0_",
     "FmhaBatchPrefillWithPagedKVCacheKernel"),
    ("_Z9my_kernelPfi", "my_kernel"),
])
def test_a_name_alone_is_its_own_name(full, short):
    assert short_name(full) == short


@pytest.mark.parametrize("full", [
    "sm80_xmma_wgrad_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x16_stage4_warpsize2x2x1_"
    "g1_tensor16x8x8_execute_kernel_cudnn_train",
    "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT128x256x32_MI16x16x1_SN_LDSB1_AFC1_AFEM1_AFEM1_ASEM1_CLR1_CADS0",
    "void " + "very_long_kernel_name_" * 6 + "<int>(int)",
])
def test_a_long_name_keeps_its_start_within_the_width(full):
    short = short_name(full)
    assert len(short) == WIDTH and short.endswith("…") and full.removeprefix("void ").startswith(short[:-1])


def test_namesakes_get_the_word_they_differ_in():
    got = short_names([ADD, MUL, lambda_kernel("sigmoid_kernel_cuda"), lambda_kernel("tanh_kernel_cuda")])
    assert list(got.values()) == ["vectorized_elementwise_kernel[CUDAFunctor_add]",
                                  "vectorized_elementwise_kernel[BinaryFunctor]",
                                  "vectorized_elementwise_kernel[sigmoid_kernel_cuda]",
                                  "vectorized_elementwise_kernel[tanh_kernel_cuda]"]


def test_namesakes_that_part_deeper_say_each_word_they_part_at():
    """A lambda's parameter type tells two lambdas of one function apart; a functor's argument two functors."""
    div = MUL.replace("MulFunctor", "DivFunctor")
    got = short_names([lambda_kernel("neg_kernel_cuda"), lambda_kernel("neg_kernel_cuda", "long"), MUL, div])
    assert list(got.values()) == ["vectorized_elementwise_kernel[neg_kernel_cuda, float]",
                                  "vectorized_elementwise_kernel[neg_kernel_cuda, long]",
                                  "vectorized_elementwise_kernel[BinaryFunctor, MulFunctor]",
                                  "vectorized_elementwise_kernel[BinaryFunctor, DivFunctor]"]


def test_what_most_namesakes_share_goes_unsaid():
    """Three kernels of vector width 4 and one of 2: only the odd one says its width."""
    fill = [ADD.replace("CUDAFunctor_add", f) for f in ("FillFunctor", "AbsFunctor")]
    narrow = ADD.replace("kernel<4,", "kernel<2,")
    got = short_names([ADD, *fill, narrow])
    assert list(got.values()) == ["vectorized_elementwise_kernel[CUDAFunctor_add]",
                                  "vectorized_elementwise_kernel[FillFunctor]",
                                  "vectorized_elementwise_kernel[AbsFunctor]",
                                  "vectorized_elementwise_kernel[2]"]


def test_namesakes_of_two_namespaces_get_the_namespace():
    lt = "void cublasLt::splitKreduce_kernel<32, 16, int, float, true>(cublasLt::cublasSplitKParams<float>, float*)"
    plain = "void splitKreduce_kernel<32, 16, int, float, true>(cublasSplitKParams<float>, float*)"
    assert short_names([lt, plain]) == {lt: "cublasLt::splitKreduce_kernel", plain: "splitKreduce_kernel"}


def test_mangled_namesakes_get_their_template_values():
    """Most are 256 wide (unsaid); those two differ in a flag."""
    names = [f"_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi{a}ELi16ELb{b}ELb0EEEvPT0_PT_Pf"
             for a, b in ((256, 0), (256, 1), (64, 0))]
    assert list(short_names(names).values()) == ["add_rmsnorm_quant_kernel[0]", "add_rmsnorm_quant_kernel[1]",
                                                 "add_rmsnorm_quant_kernel[64]"]


def test_long_plain_namesakes_are_told_apart_by_the_part_they_differ_in():
    base = "triton_red_fused__to_copy_add_embedding_mean_mul_pow_rsqrt_" + "native_layer_norm_backward_" * 2
    got = short_names([base + "0", base + "1"])
    assert len(set(got.values())) == 2 and all(len(s) <= WIDTH for s in got.values())
    assert got[base + "1"].endswith("[1]") and got[base + "1"].startswith("triton_red_fused__to_copy_add")


def test_namesakes_that_differ_in_nothing_said_are_numbered_in_table_order():
    """An anonymous namespace is left out: two names that differ only there are numbered, the first keeps its
    name; a name taken by another already gets the next number."""
    anon, plain = "void (anonymous namespace)::foo<int>(int)", "void foo<int>(int)"
    assert short_names([anon, plain]) == {anon: "foo", plain: "foo#2"}
    assert short_names([anon, "foo#2", plain]) == {anon: "foo", "foo#2": "foo#2", plain: "foo#3"}


def test_no_name_and_the_same_name_twice():
    assert short_names([None, ADD, ADD]) == {ADD: "vectorized_elementwise_kernel"}


NAMESPACES = st.sampled_from(["", "at::native::", "(anonymous namespace)::", "cub::", "at::native::<unnamed>::"])
IDENTIFIERS = st.sampled_from(["elementwise_kernel", "reduce_kernel", "Kernel", "foo", "kernel", "CatArrayCopy"])
ARGUMENTS = st.sampled_from(["int", "float", "4", "(int)8", "true", "c10::Half", "at::native::MulFunctor<float>",
                             "at::native::f(at::Tensor&)::{lambda(float)#1}", "cutlass_80_gemm_64x64", "T1 const*"])


@st.composite
def signatures(draw) -> str:
    """A C++ signature of a random namespace, name, template arguments and parameters."""
    targs = draw(st.lists(ARGUMENTS, max_size=4))
    params = draw(st.lists(ARGUMENTS, max_size=3))
    template = f"<{', '.join(targs)}>" if targs else ""
    return f"void {draw(NAMESPACES)}{draw(IDENTIFIERS)}{template}({', '.join(params)})"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(signatures(), st.from_regex(r"[A-Za-z_][\w ]{0,120}", fullmatch=True)), max_size=40))
def test_any_table_of_names_gets_distinct_short_names(names):
    got = short_names(names)
    assert set(got) == set(names)
    assert len(set(got.values())) == len(got)
    assert all(len(s) <= WIDTH and "(" not in s and "<" not in s for s in got.values())


def test_a_report_saved_before_short_names_reads_back_with_them():
    """An older saved report names each kernel with its full name: read back, that is ``name_full``."""
    old = {"schema_version": 1, "kernels": [{"name": n, "class": "compute", "count": 1, "total_ns": 1, "mean_ns": 1.0,
                                             "median_ns": 1.0, "min_ns": 1, "max_ns": 1, "std_ns": 0.0, "share": 0.5}
                                            for n in (ADD, MUL)]}
    kernels = Report.from_dict(old).kernels
    assert [(k.name, k.name_full) for k in kernels] == [("vectorized_elementwise_kernel[CUDAFunctor_add]", ADD),
                                                        ("vectorized_elementwise_kernel[BinaryFunctor]", MUL)]
    again = Report.from_dict(Report(kernels=kernels).to_dict()).kernels
    assert again == kernels and list(kernels[0].to_dict())[:3] == ["name", "name_full", "class"]
