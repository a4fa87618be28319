/* One pre-norm decoder layer of a CPU decode step in one call: the layer the backends' DecoderLayer computes for a
 * dense layer (Llama, Qwen2, Qwen3, Mistral) with every one of its products on the few-row kernel, built from the
 * very functions those per-operator calls run (gemv.c's products, decode_ops.c's add+RMSNorm, q/k norms and RoPE,
 * attention and SwiGLU), in the same order, with the same roundings between them. It exists for what a decode step's
 * operators cost around their arithmetic: in torch ~30 calls a layer from Python, each a few microseconds of
 * interpreter and dispatcher; in XLA a dozen small fused loops and a thread-pool hand-off for every product; here the
 * layer is one call whose products are cut over the threads and whose small operators run on one of them.
 * decode_layers_NAME runs a stack of such layers, each on the previous one's outputs: torch's decode step then crosses
 * from Python into C once, not once a layer.
 *
 *   residual, h = add_rms_norm(x, residual, input_norm)      (layer 0: residual = x, h = rms_norm(x))
 *   q, k, v     = h Wq + bq, h Wk + bk, h Wv + bv             (float32 sums, rounded to T)
 *   q, k        = rotary(q_norm(q)), rotary(k_norm(k))         (per head; without q/k norms, rotary alone)
 *   cache[pos]  = k, v;  a = attend(q, cache[0 .. pos], mask)
 *   residual, h = add_rms_norm(a Wo + bo, residual, post_norm)
 *   out         = silu_and_mul(h Wgu + bgu) Wd + bd
 *
 * The layer is a fixed sequence of phases (decode_layer.h), each of independent items: a product's parts (gemv.c's
 * cut, which no result depends on), its finish (the cols layout's chunk sums added, then every sum rounded once to
 * T), the attention's (row, kv head) items (each also its heads' q/k norms and RoPE and its slot's cache write, which
 * are per head: a phase and a barrier fewer, and the cache's scattered writes on every thread), and the other small
 * operators as one item each. Two drivers run them: the OpenMP team below (torch: its launcher
 * kernels/cpu/torch_decode_layer.py; the tests hold it bit for bit to the per-operator layer) and XLA's thread pool
 * (decode_layer_ffi.cc, kernels/cpu/jax_decode_layer.py).
 *
 * Storage T float32 or bfloat16 (NAME_f32 / NAME_bf16): the products widen their input to float32 and round their
 * float32 sums once to T, as the backends' launchers do around gemv.c. Built with gemv.c and decode_ops.c into one
 * library (kernels/cpu/build.py, "decode_layer" and, with the FFI handler, "decode_layer_xla").
 */
#include "decode_layer.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "decode_ops.h"
#include "gemv.h"
#include "vec8.h" /* ld_NAME / st_NAME: decode_ops.c's widening and rounding */

/* One product of a phase: y = x32 W + b in float32 (cols: through partials), then rounded to dst. */
typedef struct {
    const void *w;
    const float *b;
    float *y, *partials;
    void *dst;
    long in, out;
} Product;

long decode_layer_items(const DecodeLayer *L, long phase, long parts) {
    switch (phase) {
    case QKV:
    case QKV_FIN: return 3 * parts; /* q's parts, then k's, then v's */
    case ATTEND: return L->rows * L->kv_heads;
    case O:
    case O_FIN:
    case GU:
    case GU_FIN:
    case DOWN:
    case DOWN_FIN: return parts;
    default: return 1;
    }
}

static long chunks(const DecodeLayer *L, long in) { return L->cols ? gemv_cols_chunks(in) : 0; }

/* The products of a product phase or its finish: q, k and v (3), or the one of o, gate_up, down. y and the partials
 * are shared by phases that never overlap; q, k and v each have their own. */
static void products(const DecodeLayer *L, const Scratch *s, long phase, Product *p) {
    const long m = L->rows, H = L->hidden, d = L->head_dim, nq = L->heads * d, nk = L->kv_heads * d;
    const long I = L->inter, ch = chunks(L, H);
    switch (phase) {
    case QKV:
    case QKV_FIN:
        p[0] = (Product){L->wq, L->bq, s->y, s->partials, s->q, H, nq};
        p[1] = (Product){L->wk, L->bk, s->y + m * nq, s->partials + ch * m * nq, s->k, H, nk};
        p[2] = (Product){L->wv, L->bv, s->y + m * (nq + nk), s->partials + ch * m * (nq + nk), s->v, H, nk};
        return;
    case O:
    case O_FIN: p[0] = (Product){L->wo, L->bo, s->y, s->partials, s->o, nq, H}; return;
    case GU:
    case GU_FIN: p[0] = (Product){L->wgu, L->bgu, s->y, s->partials, s->gu, H, 2 * I}; return;
    default: p[0] = (Product){L->wd, L->bd, s->y, s->partials, L->out, I, H}; return;
    }
}

static int is_finish(long phase) {
    return phase == QKV_FIN || phase == O_FIN || phase == GU_FIN || phase == DOWN_FIN;
}

/* Layer i of a stack reads layer i - 1's outputs and the step's operands, which the caller sets on layer 0 only. */
static void decode_layers_chain(DecodeLayer *L, const DecodeLayer *previous, const DecodeLayer *first) {
    L->x = previous->out;
    L->residual = previous->residual_out;
    L->pos = first->pos;
    L->mask_row = first->mask_row;
    L->cos = first->cos;
    L->sin = first->sin;
    L->mask = first->mask;
}

void decode_layer_end(Scratch *s) {
    free(s->h);
    free(s->x32);
    s->h = NULL;
    s->x32 = NULL;
}

#define DEFINE_LAYER(S, T)                                                                                             \
    /* T buffers: h [m, H], q and qr [m, nq], k, kr and v [m, nk], o [m, H], gu [m, 2I], act [m, I] (the attention's   \
     * output reuses q); float32: x32 [m, widest input], y [m, widest output: q, k and v together], the partials of    \
     * q, k and v together or of the widest other product */                                                           \
    int decode_layer_##S##_begin(const DecodeLayer *L, Scratch *s) {                                                   \
        const long m = L->rows, H = L->hidden, d = L->head_dim, nq = L->heads * d, nk = L->kv_heads * d;               \
        const long I = L->inter, qkv = nq + 2 * nk;                                                                    \
        const long in = H > nq ? (H > I ? H : I) : (nq > I ? nq : I), wide = qkv > 2 * I ? qkv : 2 * I;                \
        const long outs = wide > H ? wide : H;                                                                         \
        long part = chunks(L, H) * qkv, other = chunks(L, nq) * H;                                                     \
        if (chunks(L, H) * 2 * I > other) other = chunks(L, H) * 2 * I;                                                \
        if (chunks(L, I) * H > other) other = chunks(L, I) * H;                                                        \
        if (other > part) part = other;                                                                                \
        T *h = malloc(sizeof(T) * m * (2 * H + 2 * nq + 3 * nk + 3 * I));                                              \
        float *x32 = malloc(sizeof(float) * m * (in + outs + part));                                                   \
        if (!h || !x32) {                                                                                              \
            free(h);                                                                                                   \
            free(x32);                                                                                                 \
            return 0;                                                                                                  \
        }                                                                                                              \
        T *q = h + m * H, *qr = q + m * nq, *k = qr + m * nq, *kr = k + m * nk, *v = kr + m * nk, *o = v + m * nk;     \
        T *gu = o + m * H;                                                                                             \
        *s = (Scratch){h, q, qr, k, kr, v, o, gu, gu + m * 2 * I, x32, x32 + m * in, x32 + m * (in + outs)};           \
        return 1;                                                                                                      \
    }                                                                                                                  \
    static void widen_rows_##S(const T *src, float *dst, long n) {                                                     \
        for (long i = 0; i < n; i++) dst[i] = ld_##S(src, i);                                                          \
    }                                                                                                                  \
    /* a product's part, or its finish: the part's span of columns summed (cols) and rounded to T, every row */        \
    static void product_##S(const DecodeLayer *L, const Scratch *s, long phase, long item, long parts) {               \
        Product all[3];                                                                                                \
        products(L, s, phase, all);                                                                                    \
        const Product *p = &all[item / parts];                                                                         \
        const long m = L->rows, part = item % parts;                                                                   \
        if (!is_finish(phase)) {                                                                                       \
            if (L->cols) gemv_cols_##S##_part(s->x32, p->w, p->partials, m, p->in, p->out, part, parts, L->fetch);     \
            else gemv_rows_##S##_part(s->x32, p->w, p->b, p->y, m, p->in, p->out, part, parts, L->fetch);              \
            return;                                                                                                    \
        }                                                                                                              \
        if (L->cols) gemv_cols_reduce_part(p->partials, p->b, p->y, m, p->in, p->out, part, parts);                    \
        const long lo = p->out * part / parts, hi = p->out * (part + 1) / parts; /* gemv.c's span */                   \
        for (long r = 0; r < m; r++)                                                                                   \
            for (long j = lo; j < hi; j++) st_##S((T *)p->dst, r * p->out + j, p->y[r * p->out + j]);                  \
    }                                                                                                                  \
    void decode_layer_##S##_item(const DecodeLayer *L, const Scratch *s, long phase, long item, long parts) {          \
        const long m = L->rows, H = L->hidden, d = L->head_dim, nq = L->heads * d, nk = L->kv_heads * d;               \
        const long I = L->inter, keys = L->pos + 1;                                                                    \
        T *h = s->h, *q = s->q, *qr = s->qr, *k = s->k, *kr = s->kr, *v = s->v, *a = s->q, *res = L->residual_out;     \
        switch (phase) {                                                                                               \
        case NORM_IN:                                                                                                  \
            if (L->residual)                                                                                           \
                add_rms_norm_##S(L->x, L->residual, L->input_norm, h, res, m, H, L->eps, L->offset,                    \
                                 L->float32_weight);                                                                   \
            else {                                                                                                     \
                memcpy(res, L->x, sizeof(T) * m * H);                                                                  \
                add_rms_norm_##S(L->x, NULL, L->input_norm, h, NULL, m, H, L->eps, L->offset, L->float32_weight);      \
            }                                                                                                          \
            widen_rows_##S(h, s->x32, m * H);                                                                          \
            return;                                                                                                    \
        case ATTEND: { /* one (row, kv head): its g query heads' and its key's norms and RoPE, its key and value   \
                          written at slot pos, then the g heads' attention, and their output widened for o_proj */    \
            const long b = item / L->kv_heads, kv = item % L->kv_heads, g = L->heads / L->kv_heads;                    \
            const long qo = b * nq + kv * g * d, ko = b * nk + kv * d; /* the group's first q, and k, element */       \
            const float *c = L->cos + b * L->rotated, *sn = L->sin + b * L->rotated;                                   \
            if (L->q_norm)                                                                                             \
                norm_rotary_##S(q + qo, k + ko, L->q_norm, L->k_norm, c, sn, qr + qo, kr + ko, 1, g, 1, d, L->rotated, \
                                L->eps, L->offset, L->float32_weight);                                                 \
            else {                                                                                                     \
                rotary_##S(q + qo, c, sn, qr + qo, 1, g, d, L->rotated);                                               \
                rotary_##S(k + ko, c, sn, kr + ko, 1, 1, d, L->rotated);                                               \
            }                                                                                                          \
            T *kc = (T *)L->k_cache + b * L->k_batch + kv * L->k_head + L->pos * d;                                    \
            T *vc = (T *)L->v_cache + b * L->v_batch + kv * L->v_head + L->pos;                                        \
            memcpy(kc, kr + ko, sizeof(T) * d);                                                                        \
            for (long i = 0; i < d; i++) vc[i * L->v_row] = v[ko + i];                                                 \
            attend_##S##_item(qr + b * nq, (const T *)L->k_cache + b * L->k_batch,                                     \
                              (const T *)L->v_cache + b * L->v_batch, L->mask + b * L->mask_row, a + b * nq, kv,       \
                              L->kv_heads, g, d, keys, L->mask_row, L->k_head, L->v_head, L->v_row, L->scale, L->cap); \
            widen_rows_##S(a + qo, s->x32 + qo, g * d);                                                                \
            return;                                                                                                    \
        }                                                                                                              \
        case NORM_POST:                                                                                                \
            add_rms_norm_##S(s->o, res, L->post_norm, h, res, m, H, L->eps, L->offset, L->float32_weight);             \
            widen_rows_##S(h, s->x32, m * H);                                                                          \
            return;                                                                                                    \
        case ACT:                                                                                                      \
            silu_and_mul_##S(s->gu, s->act, m, I);                                                                     \
            widen_rows_##S(s->act, s->x32, m * I);                                                                     \
            return;                                                                                                    \
        default: product_##S(L, s, phase, item, parts);                                                                \
        }                                                                                                              \
    }                                                                                                                  \
    void decode_layer_##S(const DecodeLayer *L) {                                                                      \
        Scratch s;                                                                                                     \
        if (!decode_layer_##S##_begin(L, &s)) abort();                                                                 \
        _Pragma("omp parallel") {                                                                                      \
            const long parts = omp_get_num_threads();                                                                  \
            for (long phase = 0; phase < PHASES; phase++) {                                                            \
                const long items = decode_layer_items(L, phase, parts);                                                \
                /* round robin: thread t takes part t of each of q, k and v */                                         \
                _Pragma("omp for schedule(static, 1)") for (long i = 0; i < items; i++)                                \
                    decode_layer_##S##_item(L, &s, phase, i, parts);                                                   \
            }                                                                                                          \
        }                                                                                                              \
        decode_layer_end(&s);                                                                                          \
    }                                                                                                                  \
    void decode_layers_##S(DecodeLayer *layers, long n) {                                                              \
        for (long i = 0; i < n; i++) {                                                                                 \
            if (i > 0) decode_layers_chain(&layers[i], &layers[i - 1], &layers[0]);                                    \
            decode_layer_##S(&layers[i]);                                                                              \
        }                                                                                                              \
    }
DEFINE_LAYER(f32, float)
DEFINE_LAYER(bf16, uint16_t)
