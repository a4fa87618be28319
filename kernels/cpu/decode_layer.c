/* One pre-norm decoder layer of a CPU decode step in one call: the layer torch_impl/decoder_layer.py's DecoderLayer
 * computes for a dense layer (Llama, Qwen2, Qwen3, Mistral) with every one of its products on the few-row kernel,
 * built from the very functions those per-operator calls run (gemv.c's rows products, decode_ops.c's add+RMSNorm,
 * q/k norms and RoPE, attention and SwiGLU), in the same order, with the same roundings between them. It exists for
 * what a decode step's operators cost around their arithmetic: ~30 calls a layer from Python, each a few
 * microseconds of interpreter and dispatcher, and an OpenMP team woken for every product; here the layer is one
 * parallel region, its products cut over the team and its small operators run by one thread between barriers.
 * kernels/cpu/torch_decode_layer.py is its launcher; the tests hold it bit for bit to the per-operator layer.
 *
 *   residual, h = add_rms_norm(x, residual, input_norm)      (layer 0: residual = x, h = rms_norm(x))
 *   q, k, v     = h Wq^T + bq, h Wk^T + bk, h Wv^T + bv       (float32 sums, rounded to T)
 *   q, k        = rotary(q_norm(q)), rotary(k_norm(k))         (per head; without q/k norms, rotary alone)
 *   cache[pos]  = k, v;  a = attend(q, cache[0 .. pos], mask)
 *   residual, h = add_rms_norm(a Wo^T + bo, residual, post_norm)
 *   out         = silu_and_mul(h Wgu^T + bgu) Wd^T + bd
 *
 * Storage T float32 or bfloat16 (NAME_f32 / NAME_bf16): the products widen their input to float32 and round their
 * float32 sums once to T, as torch_gemv.py's launcher does around gemv.c. Built with gemv.c and decode_ops.c into
 * one library (kernels/cpu/build.py, "decode_layer").
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

/* The operands of one layer, row b of every [rows, ...] operand at b times its width (the launcher makes them
 * contiguous). Keys of batch row b, kv head h, slot s at k_cache + b * k_batch + h * k_head + s * head_dim; values'
 * element i of that slot at v_cache + b * v_batch + h * v_head + i * v_row + s. Biases are float32 or NULL. */
typedef struct {
    long rows, hidden, heads, kv_heads, head_dim, rotated, inter, pos;
    long k_batch, k_head, v_batch, v_head, v_row;
    float eps, offset, scale, cap;
    int float32_weight;
    const void *x, *residual; /* [rows, hidden]; residual NULL at layer 0 */
    const void *input_norm, *post_norm, *q_norm, *k_norm; /* q_norm, k_norm [head_dim] or NULL */
    const void *wq, *wk, *wv, *wo, *wgu, *wd;
    const float *bq, *bk, *bv, *bo, *bgu, *bd;
    const float *cos, *sin; /* [rows, rotated] */
    void *k_cache, *v_cache;
    const uint8_t *mask; /* [rows, pos + 1]: nonzero = may attend */
    void *out, *residual_out; /* [rows, hidden] */
} DecodeLayer;

#define DECLARE(T, S)                                                                                                  \
    void gemv_rows_##S##_part(const float *x, const T *w, const float *b, float *y, long m, long in, long out,         \
                              long part, long parts);                                                                  \
    void add_rms_norm_##S(const T *x, const T *residual, const T *w, T *out, T *s_out, long rows, long dim, float eps, \
                          float offset, int float32_weight);                                                           \
    void rotary_##S(const T *x, const float *cos, const float *sin, T *out, long rows, long heads, long d, long r);    \
    void norm_rotary_##S(const T *q, const T *k, const T *wq, const T *wk, const float *cos, const float *sin,         \
                         T *q_out, T *k_out, long rows, long nq, long nk, long d, long r, float eps, float offset,     \
                         int float32_weight);                                                                          \
    void attend_##S##_item(const T *q, const T *k, const T *v, const uint8_t *mask, T *out, long item, long n_kv,      \
                           long g, long d, long keys, long mask_row, long k_head, long v_head, long v_row,             \
                           float scale, float cap);                                                                    \
    void silu_and_mul_##S(const T *x, T *out, long rows, long inter);
DECLARE(float, f32)
DECLARE(uint16_t, bf16)

static inline float widen_f32(float v) { return v; }
static inline float widen_bf16(uint16_t h) { return bf16_to_f32(h); }
static inline float narrow_f32(float f) { return f; }
static inline uint16_t narrow_bf16(float f) { return f32_to_bf16(f); } /* decode_ops.c's rounding, from bf16.h */

/* A product of the team: every thread computes its part of y = x W^T + b (float32), then all wait for the whole;
 * one thread rounds y to T (dst). x32 is the float32 input every thread reads. */
#define DEFINE_LAYER(S, T)                                                                                             \
    static void product_##S(const float *x32, const T *w, const float *b, float *y, T *dst, long m, long in,           \
                            long out, int t, int nt) {                                                                 \
        gemv_rows_##S##_part(x32, w, b, y, m, in, out, t, nt);                                                         \
        _Pragma("omp barrier") _Pragma("omp single") for (long i = 0; i < m * out; i++) dst[i] = narrow_##S(y[i]);     \
    }                                                                                                                  \
    static void widen_rows_##S(const T *src, float *dst, long n) {                                                     \
        for (long i = 0; i < n; i++) dst[i] = widen_##S(src[i]);                                                       \
    }                                                                                                                  \
    void decode_layer_##S(const DecodeLayer *L) {                                                                      \
        const long m = L->rows, H = L->hidden, d = L->head_dim, nq = L->heads * d, nk = L->kv_heads * d;               \
        const long I = L->inter, keys = L->pos + 1, up = H > 2 * I ? H : 2 * I, wide = nq > up ? nq : up;              \
        /* T buffers: h [m, H], q [m, nq], k, v [m, nk], a [m, nq], o [m, H], gu [m, 2I], act [m, I];                  \
         * float32: x32 (a product's input) and y (its sums), each as wide as the widest (up: o, or gu) */             \
        T *h = malloc(sizeof(T) * m * (H + 2 * nq + 3 * nk + up + I));                                                 \
        float *x32 = malloc(sizeof(float) * m * 2 * wide);                                                             \
        if (!h || !x32) abort();                                                                                       \
        T *q = h + m * H, *qr = q + m * nq, *k = qr + m * nq, *kr = k + m * nk, *v = kr + m * nk;                      \
        T *a = q, *o = v + m * nk, *gu = o, *act = gu + m * 2 * I; /* a reuses q; gu, act reuse o and past it */       \
        float *y = x32 + m * wide;                                                                                     \
        T *res = L->residual_out;                                                                                      \
        _Pragma("omp parallel") {                                                                                      \
            const int t = omp_get_thread_num(), nt = omp_get_num_threads();                                            \
            _Pragma("omp single") {                                                                                    \
                if (L->residual)                                                                                       \
                    add_rms_norm_##S(L->x, L->residual, L->input_norm, h, res, m, H, L->eps, L->offset,                \
                                     L->float32_weight);                                                               \
                else {                                                                                                 \
                    memcpy(res, L->x, sizeof(T) * m * H);                                                              \
                    add_rms_norm_##S(L->x, NULL, L->input_norm, h, NULL, m, H, L->eps, L->offset,                      \
                                     L->float32_weight);                                                               \
                }                                                                                                      \
                widen_rows_##S(h, x32, m * H);                                                                         \
            }                                                                                                          \
            product_##S(x32, L->wq, L->bq, y, q, m, H, nq, t, nt);                                                     \
            product_##S(x32, L->wk, L->bk, y, k, m, H, nk, t, nt);                                                     \
            product_##S(x32, L->wv, L->bv, y, v, m, H, nk, t, nt);                                                     \
            _Pragma("omp single") {                                                                                    \
                if (L->q_norm)                                                                                         \
                    norm_rotary_##S(q, k, L->q_norm, L->k_norm, L->cos, L->sin, qr, kr, m, L->heads, L->kv_heads,      \
                                    d, L->rotated, L->eps, L->offset, L->float32_weight);                              \
                else {                                                                                                 \
                    rotary_##S(q, L->cos, L->sin, qr, m, L->heads, d, L->rotated);                                     \
                    rotary_##S(k, L->cos, L->sin, kr, m, L->kv_heads, d, L->rotated);                                  \
                }                                                                                                      \
                for (long b = 0; b < m; b++) /* this step's keys and values into slot pos */                           \
                    for (long kv = 0; kv < L->kv_heads; kv++) {                                                        \
                        T *kc = (T *)L->k_cache + b * L->k_batch + kv * L->k_head + L->pos * d;                        \
                        T *vc = (T *)L->v_cache + b * L->v_batch + kv * L->v_head + L->pos;                            \
                        memcpy(kc, kr + b * nk + kv * d, sizeof(T) * d);                                               \
                        for (long i = 0; i < d; i++) vc[i * L->v_row] = v[b * nk + kv * d + i];                        \
                    }                                                                                                  \
            }                                                                                                          \
            _Pragma("omp for schedule(static)") for (long item = 0; item < m * L->kv_heads; item++) {                  \
                long b = item / L->kv_heads;                                                                           \
                attend_##S##_item(qr + b * nq, (const T *)L->k_cache + b * L->k_batch,                                 \
                                  (const T *)L->v_cache + b * L->v_batch, L->mask + b * keys, a + b * nq,              \
                                  item % L->kv_heads, L->kv_heads, L->heads / L->kv_heads, d, keys, keys,              \
                                  L->k_head, L->v_head, L->v_row, L->scale, L->cap);                                   \
            }                                                                                                          \
            _Pragma("omp single") widen_rows_##S(a, x32, m * nq);                                                      \
            product_##S(x32, L->wo, L->bo, y, o, m, nq, H, t, nt);                                                     \
            _Pragma("omp single") {                                                                                    \
                add_rms_norm_##S(o, res, L->post_norm, h, res, m, H, L->eps, L->offset, L->float32_weight);            \
                widen_rows_##S(h, x32, m * H);                                                                         \
            }                                                                                                          \
            product_##S(x32, L->wgu, L->bgu, y, gu, m, H, 2 * I, t, nt);                                               \
            _Pragma("omp single") {                                                                                    \
                silu_and_mul_##S(gu, act, m, I);                                                                       \
                widen_rows_##S(act, x32, m * I);                                                                       \
            }                                                                                                          \
            product_##S(x32, L->wd, L->bd, y, L->out, m, I, H, t, nt);                                                 \
        }                                                                                                              \
        free(h);                                                                                                       \
        free(x32);                                                                                                     \
    }
DEFINE_LAYER(f32, float)
DEFINE_LAYER(bf16, uint16_t)
