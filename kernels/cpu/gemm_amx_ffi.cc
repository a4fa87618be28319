// XLA FFI handler for the many-row bfloat16 product of gemm_amx.c, so that a jitted JAX program calls it as a custom
// call (kernels/cpu/jax_gemm.py registers it): x [m, in] bfloat16, W [in, out] bfloat16 (Flax's kernel layout),
// y [m, out] float32. jax_gemm.py checks every shape before the call and asks Linux for the tile state first
// (gemm_amx_permit).
//
// The kernel reads and writes whole 32 x 32 blocks: where m or in is not a multiple of 32, x is first copied into a
// zero-padded buffer, and where m or out is not, y is computed into a padded one and copied out. The items run on
// XLA's own intra-op thread pool (Share, xla_pool.h says why).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "xla_pool.h"

extern "C" {
int gemm_amx_item(const uint16_t *x, long ldx, const uint16_t *w, float *y, long ldy, long m, long in, long out,
                  long item, long items);
long gemm_amx_row_blocks(long m);
long gemm_amx_panels(long out);
}

using Bf16Matrix = ffi::Buffer<ffi::BF16, 2>;  // names without commas, for the macro below
using F32Matrix = ffi::Buffer<ffi::F32, 2>;

static ffi::Error GemmAmx(ffi::ThreadPool pool, Bf16Matrix x, Bf16Matrix w, ffi::ResultBuffer<ffi::F32, 2> y) {
    const long m = x.dimensions()[0], in = x.dimensions()[1], out = w.dimensions()[1];
    if (w.dimensions()[0] != in || y->dimensions()[0] != m || y->dimensions()[1] != out || in < 1) {
        return ffi::Error::InvalidArgument("decoder_parity gemm_amx: operand shapes do not agree");
    }
    const auto *xd = reinterpret_cast<const uint16_t *>(x.typed_data());
    const auto *wd = reinterpret_cast<const uint16_t *>(w.typed_data());
    const long rows = (m + 31) / 32 * 32, ldx = (in + 31) / 32 * 32, ldy = gemm_amx_panels(out) * 32;
    std::vector<uint16_t> x_padded;
    if (rows != m || ldx != in) {
        x_padded.assign(static_cast<size_t>(rows * ldx), 0);
        for (long r = 0; r < m; r++) std::memcpy(&x_padded[r * ldx], xd + r * in, in * sizeof(uint16_t));
        xd = x_padded.data();
    }
    float *yd = y->typed_data();
    std::vector<float> y_padded;
    if (rows != m || ldy != out) {
        y_padded.resize(static_cast<size_t>(rows * ldy));
        yd = y_padded.data();
    }
    const long helpers = std::max<int64_t>(0, pool.num_threads() - 1);
    // a few spans per thread: a late helper still finds work
    const long spans = std::min(gemm_amx_panels(out), 2 * (helpers + 1));
    const long items = gemm_amx_row_blocks(rows) * spans;
    const bool done = ShareChecked(pool, helpers, items, [=](long i) {
        return gemm_amx_item(xd, ldx, wd, yd, ldy, rows, in, out, i, items);
    });
    if (!done) return ffi::Error::Internal("decoder_parity gemm_amx: no memory for a packing buffer");
    if (yd != y->typed_data()) {
        for (long r = 0; r < m; r++) std::memcpy(y->typed_data() + r * out, yd + r * ldy, out * sizeof(float));
    }
    return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(GemmAmxBF16, GemmAmx,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Bf16Matrix>()
                                  .Arg<Bf16Matrix>()
                                  .Ret<F32Matrix>());
