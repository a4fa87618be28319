// XLA FFI handlers for the few-row products of gemv.c, so that a jitted JAX program calls them as custom calls
// (kernels/cpu/jax_gemv.py registers them). x [m, in] float32, W [out, in] ("rows") or [in, out] ("cols") in
// float32 or bfloat16, y [m, out] float32; jax_gemv.py checks every shape before the call and rounds y.
#include <cstdint>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

extern "C" {
void gemv_rows_f32(const float *x, const float *w, const float *b, float *y, long m, long in, long out);
void gemv_rows_bf16(const float *x, const uint16_t *w, const float *b, float *y, long m, long in, long out);
void gemv_cols_f32(const float *x, const float *w, const float *b, float *y, long m, long in, long out);
void gemv_cols_bf16(const float *x, const uint16_t *w, const float *b, float *y, long m, long in, long out);
}

template <ffi::DataType W, bool kRows>
static ffi::Error Gemv(ffi::Buffer<ffi::F32, 2> x, ffi::Buffer<W, 2> w, ffi::ResultBuffer<ffi::F32, 2> y) {
    const long m = x.dimensions()[0], in = x.dimensions()[1];
    const long out = kRows ? w.dimensions()[0] : w.dimensions()[1];
    const long w_in = kRows ? w.dimensions()[1] : w.dimensions()[0];
    if (w_in != in || y->dimensions()[0] != m || y->dimensions()[1] != out) {
        return ffi::Error::InvalidArgument("decoder_parity gemv: operand shapes do not agree");
    }
    const auto *wd = w.typed_data();
    float *yd = y->typed_data();
    if constexpr (W == ffi::F32) {
        (kRows ? gemv_rows_f32 : gemv_cols_f32)(x.typed_data(), wd, nullptr, yd, m, in, out);
    } else {
        (kRows ? gemv_rows_bf16 : gemv_cols_bf16)(x.typed_data(), wd, nullptr, yd, m, in, out);
    }
    return ffi::Error::Success();
}

#define BIND(W) ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F32, 2>>().Arg<ffi::Buffer<W, 2>>().Ret<ffi::Buffer<ffi::F32, 2>>()

XLA_FFI_DEFINE_HANDLER_SYMBOL(GemvRowsF32, (Gemv<ffi::F32, true>), BIND(ffi::F32));
XLA_FFI_DEFINE_HANDLER_SYMBOL(GemvRowsBF16, (Gemv<ffi::BF16, true>), BIND(ffi::BF16));
XLA_FFI_DEFINE_HANDLER_SYMBOL(GemvColsF32, (Gemv<ffi::F32, false>), BIND(ffi::F32));
XLA_FFI_DEFINE_HANDLER_SYMBOL(GemvColsBF16, (Gemv<ffi::BF16, false>), BIND(ffi::BF16));
