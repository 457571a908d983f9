import pytest

from fullgraph.bench.kernel_classes import classify, is_layout_conversion, is_pointwise, short_name

KERNELS = {
    "nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN": "gemm",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas": "gemm",  # noqa: E501
    "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_128x128_32x3_nn_align8>(Params)": "gemm",
    "ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x3_tn": "gemm",
    "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, true>(...)": "gemm",
    "void cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16_s16816fprop_optimized_bf16_128x128_32x5_nhwc_align8>(P)": "gemm",  # noqa: E501
    "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_execute_kernel__5x_cudnn": "gemm",  # noqa: E501
    "triton_tem_fused_addmm_0": "gemm",
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0": "attention",  # noqa: E501
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false>>(Params)": "attention",
    "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t>::Params)": "attention",  # noqa: E501
    "flash_attention_fwd_kernel": "attention",
    "triton_tem_fused_flex_attention_0": "attention",
    "triton_poi_fused_gelu_view_2": "elementwise",
    "triton_red_fused_add_cat_convolution_expand_native_layer_norm_transpose_view_1": "elementwise",
    "triton_per_fused_add_native_layer_norm_view_6": "elementwise",
    "triton_poi_fused__to_copy_add_1": "elementwise",
    "void at::native::vectorized_elementwise_kernel<8, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}, std::array<char*, 2ul> >(int)": "elementwise",  # noqa: E501
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, false>(int, float)": "elementwise",  # noqa: E501
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float>>>(R)": "elementwise",  # noqa: E501
    "void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul> >(int)": "elementwise",  # noqa: E501
    "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}>>(int)": "copy",  # noqa: E501
    "void cudnn::engines_precompiled::nchwToNhwcKernel<__nv_bfloat16, __nv_bfloat16, float, false, true, (cudnnKernelDataType_t)0>(P)": "copy",  # noqa: E501
    "void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespace)::OpaqueType<2u>>(P)": "copy",  # noqa: E501
    "Memcpy DtoD (Device -> Device)": "copy",
    "Memset (Device)": "copy",
    "triton_poi_fused_clone_3": "copy",
    "triton_poi_fused__to_copy_0": "copy",
    "void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, true>(P)": "other",  # noqa: E501
    # on the CPU: ops, and Inductor's C++ kernels when profiled one by one
    "aten::addmm": "gemm",
    "aten::mkldnn_convolution": "gemm",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "attention",
    "aten::gelu": "elementwise",
    "aten::native_layer_norm": "elementwise",
    "fullgraph::rms_norm": "elementwise",
    "aten::copy_": "copy",
    "aten::view": "other",
    "aten::index_select": "other",
    "graph_0_cpp_fused_gelu_mul_0": "elementwise",
    # ours, by the Triton functions' names (a profile shows them as they are)
    "fullgraph_row_norm": "elementwise",
    "fullgraph_rope": "elementwise",
    "fullgraph_modulation": "elementwise",
    "fullgraph_skinny_gemv": "gemm",
}


@pytest.mark.parametrize("name", KERNELS)
def test_classify_realistic_kernel_names(name):
    assert classify(name) == KERNELS[name]


def test_unnamed_kernels_take_the_class_of_the_op_that_launched_them():
    # a Triton kernel whose function is called "kernel" (ours were, before they got names); the op says what it does
    assert classify("kernel", ["fullgraph::rms_norm", "aten::add"]) == "elementwise"
    assert classify("kernel", ["fullgraph::flash_attention"]) == "attention"
    assert classify("kernel", ["aten::mm"]) == "gemm"
    assert classify("kernel") == "other"


def test_our_triton_kernels_carry_the_names_their_class_is_read_from():
    # a profile of a compiled graph has no op record around a user Triton kernel: its name is all the breakdown has
    pytest.importorskip("triton")
    from fullgraph.kernels import modulate, rms_norm, rope, skinny_linear

    kernels = [rms_norm._row_norm_fwd_kernel(), rope._rope_fwd_kernel(), modulate._modulation_fwd_kernel()]
    assert [classify(k.__name__) for k in kernels] == ["elementwise"] * 3
    assert classify(skinny_linear._kernel().__name__) == "gemm"
    assert all(k.__name__.startswith("fullgraph_") for k in [*kernels, skinny_linear._kernel()])


def test_pointwise_and_layout_kernels():
    assert is_pointwise("triton_poi_fused_addmm_gelu_3", "elementwise")
    assert not is_pointwise("triton_per_fused_add_native_layer_norm_6", "elementwise")
    assert not is_pointwise("void at::native::vectorized_layer_norm_kernel<float>", "elementwise")
    gelu = "void at::native::vectorized_elementwise_kernel<8, at::native::GeluCUDAKernelImpl(...)::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul> >(int)"  # noqa: E501
    assert is_pointwise(gelu, "elementwise")  # "std::array" is no reduction
    assert is_pointwise("graph_0_cpp_fused_gelu_mul_0", "elementwise") and is_pointwise("aten::gelu", "elementwise")
    assert not is_pointwise("graph_0_cpp_fused_native_layer_norm_0", "elementwise")
    assert not is_pointwise("fullgraph_row_norm", "elementwise")  # ours: RMSNorm is a reduction
    assert is_layout_conversion("void cudnn::engines_precompiled::nchwToNhwcKernel<float>", "copy")
    assert is_layout_conversion("triton_poi_fused_clone_3", "copy")
    assert not is_layout_conversion("triton_poi_fused__to_copy_0", "copy")  # a cast, not a layout change
    assert not is_layout_conversion("Memcpy DtoD (Device -> Device)", "copy")


@pytest.mark.parametrize(
    ("name", "short"),
    [
        ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespace)::Op<2u>, "
         "unsigned int, 3, 64, 64>(at::native::(anonymous namespace)::Op<2u>*, unsigned int)", "CatArrayBatchedCopy"),
        ("void cudnn::engines_precompiled::nchwToNhwcKernel<__nv_bfloat16, float>(params, float const*)",
         "nchwToNhwcKernel"),
        ("triton_poi_fused_gelu_view_2", "triton_poi_fused_gelu_view_2"),
        ("Memset (Device)", "Memset"),
    ],
)  # fmt: skip
def test_short_names_drop_templates_namespaces_and_parameters(name, short):
    assert short_name(name) == short
