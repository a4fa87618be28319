// The XLA FFI handler body of the many-row products whose kernels read Flax's [in, out] W in panels and cut their
// work into items of row blocks by spans of panels: gemm.c (float32, bound by gemm_ffi.cc) and gemm_dpbf16.c
// (bfloat16, bound by gemm_dpbf16_ffi.cc). x [m, in], W [in, out] of one dtype, y [m, out] float32; jax_gemm.py
// checks every shape before the call. The items run on XLA's own intra-op thread pool (Share, xla_pool.h says why).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "xla_pool.h"

// E: the element as the kernel's C signature spells it (float, uint16_t for bf16's bits)
template <typename E>
struct RowsKernel {
    const char *name;  // in errors
    int (*item)(const E *x, const E *w, float *y, long m, long in, long out, long item, long items);
    long (*row_blocks)(long m);
    long (*panels)(long out);
};

template <typename E, ffi::DataType T>
static ffi::Error GemmRows(const RowsKernel<E> &kernel, ffi::ThreadPool pool, ffi::Buffer<T, 2> x,
                           ffi::Buffer<T, 2> w, ffi::ResultBuffer<ffi::F32, 2> y) {
    const long m = x.dimensions()[0], in = x.dimensions()[1], out = w.dimensions()[1];
    if (w.dimensions()[0] != in || y->dimensions()[0] != m || y->dimensions()[1] != out || in < 1) {
        return ffi::Error::InvalidArgument(std::string("decoder_parity ") + kernel.name +
                                           ": operand shapes do not agree");
    }
    const long helpers = std::max<int64_t>(0, pool.num_threads() - 1);
    // a few spans per thread: a late helper still finds work
    const long spans = std::min(kernel.panels(out), 2 * (helpers + 1));
    const long items = kernel.row_blocks(m) * spans;
    const auto *xd = reinterpret_cast<const E *>(x.typed_data());
    const auto *wd = reinterpret_cast<const E *>(w.typed_data());
    float *yd = y->typed_data();
    const auto item = kernel.item;
    const bool done = ShareChecked(pool, helpers, items, [=](long i) {
        return item(xd, wd, yd, m, in, out, i, items);
    });
    if (!done) {
        return ffi::Error::Internal(std::string("decoder_parity ") + kernel.name + ": no memory for a packing buffer");
    }
    return ffi::Error::Success();
}
