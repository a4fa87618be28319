// XLA FFI handler for attend.c's attention over a KV cache, so that a jitted JAX decode step or prompt calls it as a
// custom call (kernels/cpu/jax_decode_ops.py registers it and checks every shape before the call).
//
// q [B, T, n_kv, g, d], k [B, n_kv, S, d], v [B, n_kv, d, S] (jax_impl/kv_cache.py's buffers, read in place),
// mask [B, T, S] bool, keys: an int32 scalar, the slots written so far (the cache's length after this step's
// write) -> out [B, T, n_kv, g, d] in q's dtype. Only slots [0, min(keys, S)) are read: the cache is a
// preallocated buffer of S slots of which a decode step has filled `keys`, and a step that attended over all S
// (the unwritten ones masked) read the whole buffer every step. Every (batch row, step, kv head) is one item of
// attend_NAME_item, or for a prompt's many steps every (batch row, kv head, block of steps) one of
// attend_rows_NAME_item, run on XLA's intra-op thread pool (Share, xla_pool.h).
//
// And the cache write those reads follow (CacheWriteF32, CacheWriteBF16): a layer's T new keys [B, n_kv, T, d] and
// values [B, n_kv, d, T] copied into its buffers at slots [start, start + T), the buffers aliased to the results
// (input_output_aliases), so only the new slots are touched. XLA:CPU computes a bfloat16 dynamic_update_slice in
// float32 and writes the whole buffer back, every layer of every prompt: a cost that grew with the cache's capacity.
// `start` is clamped as dynamic_update_slice clamps it (to [0, S - T]), so the results are the same in every case.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "decode_ops.h"
#include "xla_pool.h"

template <ffi::DataType T>
static ffi::Error Attend(ffi::ThreadPool pool, ffi::Buffer<T, 5> q, ffi::Buffer<T, 4> k, ffi::Buffer<T, 4> v,
                         ffi::Buffer<ffi::PRED, 3> mask, ffi::Buffer<ffi::S32, 0> keys, ffi::ResultBuffer<T, 5> out,
                         float scale, float cap) {
    const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions(), md = mask.dimensions();
    const long b = qd[0], t = qd[1], n_kv = qd[2], g = qd[3], d = qd[4], s = kd[2];
    if (kd[0] != b || kd[1] != n_kv || kd[3] != d || vd[0] != b || vd[1] != n_kv || vd[2] != d || vd[3] != s ||
        md[0] != b || md[1] != t || md[2] != s ||
        !std::equal(qd.begin(), qd.end(), out->dimensions().begin())) {
        return ffi::Error::InvalidArgument("decoder_parity attend: operand shapes do not agree");
    }
    const long read = std::clamp<long>(*keys.typed_data(), 0, s);  // slots past the written ones are never read
    const bool prompt = t >= kAttendRowsMinSteps;  // many steps: attend.c's blocked items (a kv head, a block of steps)
    const long items = prompt ? n_kv * ((t + kAttendBlockSteps - 1) / kAttendBlockSteps) : t * n_kv;  // per batch row
    const long q_row = t * n_kv * g * d;
    const auto *qp = q.typed_data(), *kp = k.typed_data(), *vp = v.typed_data();
    const auto *mp = reinterpret_cast<const uint8_t *>(mask.typed_data());
    auto *op = out->typed_data();
    const long helpers = std::max<int64_t>(0, pool.num_threads() - 1);
    Share(pool, helpers, b * items, [=](long i) {
        const long r = i / items;  // the batch row
        const auto *qr = qp + r * q_row, *kr = kp + r * n_kv * s * d, *vr = vp + r * n_kv * d * s;
        const uint8_t *mr = mp + r * t * s;
        auto *orow = op + r * q_row;
        if constexpr (T == ffi::F32) {
            if (prompt)
                attend_rows_f32_item(qr, kr, vr, mr, orow, i % items, t, n_kv, g, d, read, s, s * d, d * s, s, scale,
                                     cap);
            else
                attend_f32_item(qr, kr, vr, mr, orow, i % items, n_kv, g, d, read, s, s * d, d * s, s, scale, cap);
        } else {
            if (prompt)
                attend_rows_bf16_item(qr, kr, vr, mr, orow, i % items, t, n_kv, g, d, read, s, s * d, d * s, s, scale,
                                      cap);
            else
                attend_bf16_item(qr, kr, vr, mr, orow, i % items, n_kv, g, d, read, s, s * d, d * s, s, scale, cap);
        }
    });
    return ffi::Error::Success();
}

#define BIND(T)                                                                                                 \
    ffi::Ffi::Bind()                                                                                            \
        .Ctx<ffi::ThreadPool>()                                                                                 \
        .Arg<ffi::Buffer<T, 5>>()                                                                               \
        .Arg<ffi::Buffer<T, 4>>()                                                                               \
        .Arg<ffi::Buffer<T, 4>>()                                                                               \
        .Arg<ffi::Buffer<ffi::PRED, 3>>()                                                                       \
        .Arg<ffi::Buffer<ffi::S32, 0>>()                                                                        \
        .Ret<ffi::Buffer<T, 5>>()                                                                               \
        .Attr<float>("scale")                                                                                   \
        .Attr<float>("cap")

XLA_FFI_DEFINE_HANDLER_SYMBOL(AttendF32, Attend<ffi::F32>, BIND(ffi::F32));
XLA_FFI_DEFINE_HANDLER_SYMBOL(AttendBF16, Attend<ffi::BF16>, BIND(ffi::BF16));

template <ffi::DataType T>
static ffi::Error CacheWrite(ffi::Buffer<T, 4> cache_k, ffi::Buffer<T, 4> cache_v, ffi::Buffer<T, 4> k,
                             ffi::Buffer<T, 4> v, ffi::Buffer<ffi::S32, 0> start, ffi::ResultBuffer<T, 4> out_k,
                             ffi::ResultBuffer<T, 4> out_v) {
    const auto ck = cache_k.dimensions(), cv = cache_v.dimensions(), kd = k.dimensions(), vd = v.dimensions();
    const long b = ck[0], n_kv = ck[1], s = ck[2], d = ck[3], t = kd[2];
    if (cv[0] != b || cv[1] != n_kv || cv[2] != d || cv[3] != s || kd[0] != b || kd[1] != n_kv || kd[3] != d ||
        vd[0] != b || vd[1] != n_kv || vd[2] != d || vd[3] != t || t > s ||
        !std::equal(ck.begin(), ck.end(), out_k->dimensions().begin()) ||
        !std::equal(cv.begin(), cv.end(), out_v->dimensions().begin())) {
        return ffi::Error::InvalidArgument("decoder_parity cache write: operand shapes do not agree");
    }
    using E = ffi::NativeType<T>;
    E *ok = out_k->typed_data(), *ov = out_v->typed_data();
    if (ok != cache_k.typed_data()) std::memcpy(ok, cache_k.typed_data(), sizeof(E) * b * n_kv * s * d);
    if (ov != cache_v.typed_data()) std::memcpy(ov, cache_v.typed_data(), sizeof(E) * b * n_kv * d * s);
    const long at = std::clamp<long>(*start.typed_data(), 0, s - t);
    const E *kp = k.typed_data(), *vp = v.typed_data();
    for (long h = 0; h < b * n_kv; h++) {  // a (batch row, kv head): its keys one run, its values d runs
        std::memcpy(ok + (h * s + at) * d, kp + h * t * d, sizeof(E) * t * d);
        for (long i = 0; i < d; i++) std::memcpy(ov + (h * d + i) * s + at, vp + (h * d + i) * t, sizeof(E) * t);
    }
    return ffi::Error::Success();
}

#define BIND_WRITE(T)                    \
    ffi::Ffi::Bind()                     \
        .Arg<ffi::Buffer<T, 4>>()        \
        .Arg<ffi::Buffer<T, 4>>()        \
        .Arg<ffi::Buffer<T, 4>>()        \
        .Arg<ffi::Buffer<T, 4>>()        \
        .Arg<ffi::Buffer<ffi::S32, 0>>() \
        .Ret<ffi::Buffer<T, 4>>()        \
        .Ret<ffi::Buffer<T, 4>>()

XLA_FFI_DEFINE_HANDLER_SYMBOL(CacheWriteF32, CacheWrite<ffi::F32>, BIND_WRITE(ffi::F32));
XLA_FFI_DEFINE_HANDLER_SYMBOL(CacheWriteBF16, CacheWrite<ffi::BF16>, BIND_WRITE(ffi::BF16));
