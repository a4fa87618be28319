// XLA FFI handlers for the many-row products of gemm.c, so that a jitted JAX program calls them as custom calls
// (kernels/cpu/jax_gemm.py registers them): x [m, in], W [in, out] (Flax's kernel layout), both float32 (GemmF32) or
// both bfloat16 (GemmBF16F32, computed in float32), y [m, out] float32. The handlers' body is gemm_ffi.h's, shared
// with gemm_dpbf16_ffi.cc.
#include "gemm_ffi.h"

extern "C" {
int gemm_f32_item(const float *x, const float *w, float *y, long m, long in, long out, long item, long items);
int gemm_bf16_f32_item(const uint16_t *x, const uint16_t *w, float *y, long m, long in, long out, long item,
                       long items);
long gemm_row_blocks(long m);
long gemm_panels(long out);
}

using Matrix = ffi::Buffer<ffi::F32, 2>;  // names without commas, for the macros below
using Bf16Matrix = ffi::Buffer<ffi::BF16, 2>;

static ffi::Error Gemm(ffi::ThreadPool pool, Matrix x, Matrix w, ffi::ResultBuffer<ffi::F32, 2> y) {
    static const RowsKernel<float> kernel{"gemm", gemm_f32_item, gemm_row_blocks, gemm_panels};
    return GemmRows(kernel, pool, x, w, y);
}

static ffi::Error GemmUpcast(ffi::ThreadPool pool, Bf16Matrix x, Bf16Matrix w, ffi::ResultBuffer<ffi::F32, 2> y) {
    static const RowsKernel<uint16_t> kernel{"gemm upcast", gemm_bf16_f32_item, gemm_row_blocks, gemm_panels};
    return GemmRows(kernel, pool, x, w, y);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(GemmF32, Gemm,
                              ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<Matrix>().Arg<Matrix>().Ret<Matrix>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(GemmBF16F32, GemmUpcast,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Bf16Matrix>()
                                  .Arg<Bf16Matrix>()
                                  .Ret<Matrix>());
