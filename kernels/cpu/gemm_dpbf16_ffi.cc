// XLA FFI handler for the many-row bfloat16 product of gemm_dpbf16.c (AVX512_BF16), so that a jitted JAX program
// calls it as a custom call (kernels/cpu/jax_gemm.py registers it): x [m, in] bfloat16, W [in, out] bfloat16 (Flax's
// kernel layout), y [m, out] float32. The handler's body is gemm_ffi.h's, shared with gemm_ffi.cc.
#include "gemm_ffi.h"

extern "C" {
int gemm_dpbf16_item(const uint16_t *x, const uint16_t *w, float *y, long m, long in, long out, long item,
                     long items);
long gemm_dpbf16_row_blocks(long m);
long gemm_dpbf16_panels(long out);
}

using Bf16Matrix = ffi::Buffer<ffi::BF16, 2>;  // names without commas, for the macro below
using F32Matrix = ffi::Buffer<ffi::F32, 2>;

static ffi::Error Gemm(ffi::ThreadPool pool, Bf16Matrix x, Bf16Matrix w, ffi::ResultBuffer<ffi::F32, 2> y) {
    static const RowsKernel<uint16_t> kernel{"gemm_dpbf16", gemm_dpbf16_item, gemm_dpbf16_row_blocks,
                                             gemm_dpbf16_panels};
    return GemmRows(kernel, pool, x, w, y);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(GemmDpBF16, Gemm,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Bf16Matrix>()
                                  .Arg<Bf16Matrix>()
                                  .Ret<F32Matrix>());
