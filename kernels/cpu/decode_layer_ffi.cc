// XLA FFI handler of decode_layer.c: a whole pre-norm decoder layer of a CPU decode step as one custom call inside
// a jitted JAX decode step (kernels/cpu/jax_decode_layer.py registers it and checks every operand's shape and dtype
// before the call; this checks the sizes it reads and writes, so a bad call fails instead of reading past a buffer).
//
// Operands, in order: x, residual, input_norm, post_norm, q_norm, k_norm, wq, wk, wv, wo, wgu, wd (Flax's [in, out]
// kernels), bq, bk, bv, bo, bgu, bd (float32), cos, sin (float32), k_cache [B, n_kv, S, d], v_cache [B, n_kv, d, S],
// mask [B, 1, S] bool, pos (an int32 scalar: the slot this step writes, the cache's length). An absent operand
// (residual at layer 0, q/k norms, biases) is an empty array. Results: out and residual_out [B, 1, H], and the two
// caches, aliased to their operands (input_output_aliases), written at slot pos in place. A pos at or past S is
// clamped to the last slot, as dynamic_update_slice clamps the per-operator step's write; jax_impl/kv_cache.py
// records the slot asked for, and its check() refuses the step's results. Attributes: the heads, the norms' and the
// attention's options, and `fetch`, the products' software fetch (gemv.h; kernels/cpu/gemv_fetch.py chooses it).
//
// The phases run on XLA's own intra-op thread pool (SharePhases, xla_pool.h): the pool is woken once for the layer.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "decode_layer.h"
#include "xla_pool.h"

enum Operand { X, RESIDUAL, INPUT_NORM, POST_NORM, Q_NORM, K_NORM, WQ, WK, WV, WO, WGU, WD, BQ, BK, BV, BO, BGU, BD,
               COS, SIN, K_CACHE, V_CACHE, MASK, POS, OPERANDS };
enum Result { OUT, RESIDUAL_OUT, K_OUT, V_OUT, RESULTS };

static ffi::Error Refuse(const char *what) {
    return ffi::Error::InvalidArgument(std::string("decoder_parity decode_layer: ") + what);
}

static ffi::Error Layer(ffi::ThreadPool pool, ffi::RemainingArgs args, ffi::RemainingRets rets, int64_t heads,
                        float eps, float offset, float scale, float cap, int32_t float32_weight, int32_t fetch) {
    if (args.size() != OPERANDS || rets.size() != RESULTS) return Refuse("24 operands and 4 results expected");
    std::vector<ffi::AnyBuffer> a;
    std::vector<ffi::Result<ffi::AnyBuffer>> r;
    for (long i = 0; i < OPERANDS; i++) {
        auto buffer = args.get<ffi::AnyBuffer>(i);
        if (buffer.has_error()) return buffer.error();
        a.push_back(*buffer);
    }
    for (long i = 0; i < RESULTS; i++) {
        auto buffer = rets.get<ffi::AnyBuffer>(i);
        if (buffer.has_error()) return buffer.error();
        r.push_back(*buffer);
    }
    const auto xd = a[X].dimensions(), kd = a[K_CACHE].dimensions(), wd = a[WD].dimensions(), cd = a[COS].dimensions();
    if (xd.size() != 3 || kd.size() != 4 || wd.size() != 2 || cd.size() != 3) return Refuse("operand ranks");
    const long b = xd[0], hidden = xd[2], kv = kd[1], slots = kd[2], d = kd[3], inter = wd[0], rot = cd[2];
    if (heads <= 0 || kv <= 0 || heads % kv || rot % 2 || rot > d || slots <= 0) return Refuse("heads or rotary");
    const long nq = heads * d, nk = kv * d;
    const ffi::DataType t = a[X].element_type(), f32 = ffi::DataType::F32;
    if (t != f32 && t != ffi::DataType::BF16) return Refuse("x is float32 or bfloat16");
    struct Want { Operand i; long count; ffi::DataType type; bool optional; };
    const Want want[] = {
        {X, b * hidden, t, false}, {RESIDUAL, b * hidden, t, true}, {INPUT_NORM, hidden, t, false},
        {POST_NORM, hidden, t, false}, {Q_NORM, d, t, true}, {K_NORM, d, t, true}, {WQ, hidden * nq, t, false},
        {WK, hidden * nk, t, false}, {WV, hidden * nk, t, false}, {WO, nq * hidden, t, false},
        {WGU, hidden * 2 * inter, t, false}, {WD, inter * hidden, t, false}, {BQ, nq, f32, true}, {BK, nk, f32, true},
        {BV, nk, f32, true}, {BO, hidden, f32, true}, {BGU, 2 * inter, f32, true}, {BD, hidden, f32, true},
        {COS, b * rot, f32, false}, {SIN, b * rot, f32, false}, {K_CACHE, b * nk * slots, t, false},
        {V_CACHE, b * nk * slots, t, false}, {MASK, b * slots, ffi::DataType::PRED, false},
        {POS, 1, ffi::DataType::S32, false}};
    for (const Want &w : want) {
        const long n = static_cast<long>(a[w.i].element_count());
        if (a[w.i].element_type() != w.type || !(n == w.count || (w.optional && n == 0))) {
            return Refuse("an operand's size or dtype does not agree with x, k_cache, wd and cos");
        }
    }
    for (long i = 0; i < RESULTS; i++) {
        const long n = static_cast<long>(r[i]->element_count());
        if (r[i]->element_type() != t || n != (i < K_OUT ? b * hidden : b * nk * slots)) return Refuse("a result");
    }
    auto data = [&](Operand i) -> const void * { return a[i].element_count() ? a[i].untyped_data() : nullptr; };
    auto bias = [&](Operand i) { return static_cast<const float *>(data(i)); };
    const long pos = std::clamp<long>(*static_cast<const int32_t *>(a[POS].untyped_data()), 0, slots - 1);
    DecodeLayer L = {};
    L.rows = b, L.hidden = hidden, L.heads = heads, L.kv_heads = kv, L.head_dim = d, L.rotated = rot;
    L.inter = inter, L.pos = pos, L.mask_row = slots;
    L.k_batch = nk * slots, L.k_head = slots * d, L.v_batch = nk * slots, L.v_head = d * slots, L.v_row = slots;
    L.eps = eps, L.offset = offset, L.scale = scale, L.cap = cap, L.float32_weight = float32_weight, L.cols = 1;
    L.fetch = fetch;
    L.x = data(X), L.residual = data(RESIDUAL), L.input_norm = data(INPUT_NORM), L.post_norm = data(POST_NORM);
    L.q_norm = data(Q_NORM), L.k_norm = data(K_NORM);
    L.wq = data(WQ), L.wk = data(WK), L.wv = data(WV), L.wo = data(WO), L.wgu = data(WGU), L.wd = data(WD);
    L.bq = bias(BQ), L.bk = bias(BK), L.bv = bias(BV), L.bo = bias(BO), L.bgu = bias(BGU), L.bd = bias(BD);
    L.cos = bias(COS), L.sin = bias(SIN);
    L.k_cache = r[K_OUT]->untyped_data(), L.v_cache = r[V_OUT]->untyped_data();  // the operands' own memory
    L.mask = static_cast<const uint8_t *>(data(MASK));
    L.out = r[OUT]->untyped_data(), L.residual_out = r[RESIDUAL_OUT]->untyped_data();
    const bool bf16 = t == ffi::DataType::BF16;
    Scratch s;
    if (!(bf16 ? decode_layer_bf16_begin(&L, &s) : decode_layer_f32_begin(&L, &s))) {
        return ffi::Error(ffi::ErrorCode::kResourceExhausted, "decoder_parity decode_layer: out of memory");
    }
    const long helpers = std::max<int64_t>(0, pool.num_threads() - 1);
    const long parts = 2 * (helpers + 1);  // a few per thread: a late helper still finds work
    long items[PHASES];
    for (long p = 0; p < PHASES; p++) items[p] = decode_layer_items(&L, p, parts);
    const DecodeLayer *lp = &L;
    const Scratch *sp = &s;
    SharePhases(pool, helpers, items, PHASES, [=](long phase, long item) {
        if (bf16) decode_layer_bf16_item(lp, sp, phase, item, parts);
        else decode_layer_f32_item(lp, sp, phase, item, parts);
    });
    decode_layer_end(&s);
    return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(DecodeLayerStep, Layer,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<int64_t>("heads")
                                  .Attr<float>("eps")
                                  .Attr<float>("offset")
                                  .Attr<float>("scale")
                                  .Attr<float>("cap")
                                  .Attr<int32_t>("float32_weight")
                                  .Attr<int32_t>("fetch"));
