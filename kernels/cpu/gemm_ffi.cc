// XLA FFI handler for the many-row float32 product of gemm.c, so that a jitted JAX program calls it as a custom call
// (kernels/cpu/jax_gemm.py registers it): x [m, in] float32, W [in, out] float32 (Flax's kernel layout), y [m, out]
// float32. jax_gemm.py checks every shape before the call.
//
// The items run on XLA's own intra-op thread pool (Share, xla_pool.h says why).
#include <algorithm>
#include <cstdint>

#include "xla_pool.h"

extern "C" {
int gemm_f32_item(const float *x, const float *w, float *y, long m, long in, long out, long item, long items);
long gemm_row_blocks(long m);
long gemm_panels(long out);
}

using Matrix = ffi::Buffer<ffi::F32, 2>;  // a name without commas, for the macro below

static ffi::Error Gemm(ffi::ThreadPool pool, Matrix x, Matrix w, ffi::ResultBuffer<ffi::F32, 2> y) {
    const long m = x.dimensions()[0], in = x.dimensions()[1], out = w.dimensions()[1];
    if (w.dimensions()[0] != in || y->dimensions()[0] != m || y->dimensions()[1] != out || in < 1) {
        return ffi::Error::InvalidArgument("decoder_parity gemm: operand shapes do not agree");
    }
    const long helpers = std::max<int64_t>(0, pool.num_threads() - 1);
    // a few spans per thread: a late helper still finds work
    const long spans = std::min(gemm_panels(out), 2 * (helpers + 1));
    const long items = gemm_row_blocks(m) * spans;
    const float *xd = x.typed_data(), *wd = w.typed_data();
    float *yd = y->typed_data();
    const bool done = ShareChecked(pool, helpers, items, [=](long i) {
        return gemm_f32_item(xd, wd, yd, m, in, out, i, items);
    });
    if (!done) return ffi::Error::Internal("decoder_parity gemm: no memory for a packing buffer");
    return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(GemmF32, Gemm,
                              ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<Matrix>().Arg<Matrix>().Ret<Matrix>());
