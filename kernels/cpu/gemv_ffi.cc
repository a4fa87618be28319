// XLA FFI handlers for the few-row products of gemv.c, so that a jitted JAX program calls them as custom calls
// (kernels/cpu/jax_gemv.py registers them). x [m, in] float32, W [out, in] ("rows") or [in, out] ("cols") in
// float32 or bfloat16, y [m, out] float32; jax_gemv.py checks every shape before the call and rounds y. The attribute
// `fetch` is the parts' software fetch (gemv.h), chosen by measurement (kernels/cpu/gemv_fetch.py).
//
// The parts of a product run on XLA's own intra-op thread pool (Share, xla_pool.h says why).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "gemv.h"
#include "xla_pool.h"

template <ffi::DataType W, bool kRows>
static ffi::Error Gemv(ffi::ThreadPool pool, ffi::Buffer<ffi::F32, 2> x, ffi::Buffer<W, 2> w,
                       ffi::ResultBuffer<ffi::F32, 2> y, int32_t fetch) {
    const long m = x.dimensions()[0], in = x.dimensions()[1];
    const long out = kRows ? w.dimensions()[0] : w.dimensions()[1];
    const long w_in = kRows ? w.dimensions()[1] : w.dimensions()[0];
    if (w_in != in || y->dimensions()[0] != m || y->dimensions()[1] != out) {
        return ffi::Error::InvalidArgument("decoder_parity gemv: operand shapes do not agree");
    }
    const long helpers = std::max<int64_t>(0, pool.num_threads() - 1);
    const long items = 2 * (helpers + 1);  // a few per thread: a late helper still finds work
    const float *xd = x.typed_data();
    const auto *wd = w.typed_data();
    float *yd = y->typed_data();
    if constexpr (kRows) {
        Share(pool, helpers, items, [=](long i) {
            if constexpr (W == ffi::F32) gemv_rows_f32_part(xd, wd, nullptr, yd, m, in, out, i, items, fetch);
            else gemv_rows_bf16_part(xd, wd, nullptr, yd, m, in, out, i, items, fetch);
        });
    } else {
        const long chunks = gemv_cols_chunks(in);
        std::vector<float> partials(static_cast<size_t>(chunks * m * out));  // [chunks, m, out]
        float *pd = partials.data();
        Share(pool, helpers, chunks, [=](long c) {
            if constexpr (W == ffi::F32) gemv_cols_f32_part(xd, wd, pd, m, in, out, c, chunks, fetch);
            else gemv_cols_bf16_part(xd, wd, pd, m, in, out, c, chunks, fetch);
        });
        Share(pool, helpers, items, [=](long i) { gemv_cols_reduce_part(pd, nullptr, yd, m, in, out, i, items); });
    }
    return ffi::Error::Success();
}

#define BIND(W)                                                                                  \
    ffi::Ffi::Bind()                                                                             \
        .Ctx<ffi::ThreadPool>()                                                                  \
        .Arg<ffi::Buffer<ffi::F32, 2>>()                                                         \
        .Arg<ffi::Buffer<W, 2>>()                                                                \
        .Ret<ffi::Buffer<ffi::F32, 2>>()                                                         \
        .Attr<int32_t>("fetch")

XLA_FFI_DEFINE_HANDLER_SYMBOL(GemvRowsF32, (Gemv<ffi::F32, true>), BIND(ffi::F32));
XLA_FFI_DEFINE_HANDLER_SYMBOL(GemvRowsBF16, (Gemv<ffi::BF16, true>), BIND(ffi::BF16));
XLA_FFI_DEFINE_HANDLER_SYMBOL(GemvColsF32, (Gemv<ffi::F32, false>), BIND(ffi::F32));
XLA_FFI_DEFINE_HANDLER_SYMBOL(GemvColsBF16, (Gemv<ffi::BF16, false>), BIND(ffi::BF16));
