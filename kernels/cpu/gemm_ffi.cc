// XLA FFI handler for the many-row float32 product of gemm.c, so that a jitted JAX program calls it as a custom call
// (kernels/cpu/jax_gemm.py registers it): x [m, in] float32, W [in, out] float32 (Flax's kernel layout), y [m, out]
// float32. The handler's body is gemm_ffi.h's, shared with gemm_dpbf16_ffi.cc.
#include "gemm_ffi.h"

extern "C" {
int gemm_f32_item(const float *x, const float *w, float *y, long m, long in, long out, long item, long items);
long gemm_row_blocks(long m);
long gemm_panels(long out);
}

using Matrix = ffi::Buffer<ffi::F32, 2>;  // a name without commas, for the macro below

static ffi::Error Gemm(ffi::ThreadPool pool, Matrix x, Matrix w, ffi::ResultBuffer<ffi::F32, 2> y) {
    static const RowsKernel<float> kernel{"gemm", gemm_f32_item, gemm_row_blocks, gemm_panels};
    return GemmRows(kernel, pool, x, w, y);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(GemmF32, Gemm,
                              ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<Matrix>().Arg<Matrix>().Ret<Matrix>());
