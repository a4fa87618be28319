/* Grouped attention over a KV cache for a decode step's few query rows (or a prompt's): torch_impl/attention.py's
 * attend (jax_impl/attention.py's), which the tests hold it to. torch_impl calls `attend_NAME` through
 * kernels/cpu/torch_decode_ops.py, jax_impl `attend_NAME_item` on XLA's threads (decode_ops_ffi.cc) and decode_layer.c
 * it within a layer. Built with -ffp-contract=off (kernels/cpu/build.py): the products sum with fused multiply-adds,
 * as the BLAS behind the reference's einsum computes them, in 8 lanes and then across them; the rest rounds as the
 * reference does. exp is vec8.h's exp8. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "decode_ops.h"
#include "vec8.h"

/* out[u] = sum_i a[i] * row_u[i] (i < len) for the n <= 8 rows row_u = first + u * stride: summed in 8 lanes, then
 * across them (sums8), then the tail. Eight rows at a time, so that eight independent sums fill the pipeline
 * instead of one waiting on itself; a block short of eight repeats its last row (those sums are dropped), so the
 * loop over the rows has a fixed count and the accumulators stay in registers. `fetch`: fetch the rows four blocks
 * on (only the first of several calls over the same rows asks: the others would fetch what is on its way). A
 * prefetch never faults, so the rows fetched ahead may run past the operand's end. */
#define DEFINE_DOTS8(NAME, T, LD, LD8)                                                                                 \
    static inline void NAME(const float *a, const T *first, long stride, long n, long len, float *out,                 \
                            int fetch) {                                                                               \
        const T *row[8];                                                                                               \
        for (long u = 0; u < 8; u++) row[u] = first + (u < n ? u : n - 1) * stride;                                    \
        for (long u = 0; fetch && u < 8; u++) /* rows four blocks on, fetched while this block is summed: */           \
            for (long b = 0; b < len * (long)sizeof(T); b += 64) /* the cache's own prefetch misses them */            \
                _mm_prefetch((const char *)(first + (32 + u) * stride) + b, _MM_HINT_T0);                              \
        __m256 acc[8];                                                                                                 \
        for (long u = 0; u < 8; u++) acc[u] = _mm256_setzero_ps();                                                     \
        long vec = len / 8 * 8;                                                                                        \
        for (long i = 0; i < vec; i += 8) {                                                                            \
            __m256 av = _mm256_loadu_ps(a + i);                                                                        \
            for (long u = 0; u < 8; u++) acc[u] = _mm256_fmadd_ps(av, LD8(row[u] + i), acc[u]);                        \
        }                                                                                                              \
        float sums[8];                                                                                                 \
        _mm256_storeu_ps(sums, sums8(acc));                                                                            \
        for (long u = 0; u < n; u++) {                                                                                 \
            for (long i = vec; i < len; i++) sums[u] += a[i] * LD(row[u], i);                                          \
            out[u] = sums[u];                                                                                          \
        }                                                                                                              \
    }
DEFINE_DOTS8(dots8_f32, float, ld_f32, ld8_f32)
DEFINE_DOTS8(dots8_bf16, uint16_t, ld_bf16, ld8_bf16)

/* softmax's last two steps on scores p[0..n) with maximum `top`: p = exp(p - top) (exp8), then p / sum(p), the sum
 * taken in index order. */
static void softmax_tail(float *p, long n, float top) {
    __m256 t = _mm256_set1_ps(top);
    float e[8];
    for (long s = 0; s < n; s += 8) {
        long k = n - s < 8 ? n - s : 8;
        _mm256_storeu_ps(e, exp8(_mm256_sub_ps(part8_f32(p + s, k), t)));
        memcpy(p + s, e, sizeof(float) * k);
    }
    float sum = 0.0f;
    for (long s = 0; s < n; s++) sum += p[s];
    for (long s = 0; s < n; s++) p[s] = p[s] / sum;
}

/* attend (torch_impl/attention.py) for one batch row: q [T, n_kv, g, d] contiguous, keys k[kv, s, :] at
 * k + kv * k_head + s * d, values v[kv, :, s] at v + kv * v_head + i * v_row + s, mask [T, keys] at mask + t *
 * mask_row (nonzero: may attend) -> out [T, n_kv, g, d]. scores = (q . k) * scale, softcap (cap > 0): cap *
 * tanh(scores / cap), masked scores the float32 minimum; softmax as torch's (exp(x - max) / sum); out = rnd(sum_s
 * p[s] * v[:, s]). Both products are DOTS8's: eight keys, then eight value rows, at a time, with fused
 * multiply-adds; each block of keys, and of value rows, serves every query of the group while it is in the L1
 * cache (the cache is read once per kv head, not once per query head). NAME_item computes one (step, kv head),
 * item = t * n_kv + kv, alone: NAME runs every item of a batch row on the OpenMP team (torch's own, as for
 * gemv.c), decode_ops_ffi.cc on XLA's thread pool; a long cache is read on every core the libraries would use,
 * and no sum's order depends on which thread took an item. */
#define DEFINE_ATTEND(NAME, T, LD, DOTS8, ST)                                                                          \
    void NAME##_item(const T *q, const T *k, const T *v, const uint8_t *mask, T *out, long item, long n_kv,            \
                     long g, long d, long keys, long mask_row, long k_head, long v_head, long v_row, float scale,      \
                     float cap) {                                                                                      \
        const long t = item / n_kv, kv = item % n_kv;                                                                  \
        const T *kh = k + kv * k_head, *vh = v + kv * v_head;                                                          \
        const uint8_t *mt = mask + t * mask_row;                                                                       \
        long hi = keys; /* keys past the row's last allowed one weigh exactly 0: not computed (a prompt's causal */    \
        while (hi > 0 && !mt[hi - 1]) hi--; /* mask halves the work); a fully masked row attends over every key */     \
        if (hi == 0) hi = keys;             /* with equal weights, as the reference does */                            \
        float *p = malloc(sizeof(float) * g * (keys + d)), *qf = p + g * keys; /* scores, queries in f32 */            \
        if (!p) abort();                                                                                               \
        for (long j = 0; j < g * d; j++) qf[j] = LD(q + (t * n_kv + kv) * g * d, j);                                   \
        for (long s0 = 0; s0 < hi; s0 += 8) /* q . k for keys s0 .. s0 + 7, every query of the group */                \
            for (long j = 0; j < g; j++)    /* while those keys are in L1 */                                           \
                DOTS8(qf + j * d, kh + s0 * d, d, hi - s0 < 8 ? hi - s0 : 8, d, p + j * keys + s0, !j);                \
        for (long j = 0; j < g; j++) {                                                                                 \
            float *pj = p + j * keys, top = -INFINITY;                                                                 \
            for (long s = 0; s < hi; s++) {                                                                            \
                float x = pj[s] * scale;                                                                               \
                if (cap > 0.0f) x = tanhf(x / cap) * cap;                                                              \
                if (!mt[s]) x = -3.40282347e38f;                                                                       \
                pj[s] = x;                                                                                             \
                top = x > top ? x : top;                                                                               \
            }                                                                                                          \
            softmax_tail(pj, hi, top);                                                                                 \
        }                                                                                                              \
        for (long i0 = 0; i0 < d; i0 += 8) { /* p . v for value rows i0 .. i0 + 7, every query of the group */         \
            long n = d - i0 < 8 ? d - i0 : 8;                                                                          \
            for (long j = 0; j < g; j++) {                                                                             \
                float sums[8];                                                                                         \
                T *o = out + ((t * n_kv + kv) * g + j) * d;                                                            \
                DOTS8(p + j * keys, vh + i0 * v_row, v_row, n, hi, sums, !j);                                          \
                for (long u = 0; u < n; u++) ST(o, i0 + u, sums[u]);                                                   \
            }                                                                                                          \
        }                                                                                                              \
        free(p);                                                                                                       \
    }                                                                                                                  \
    void NAME(const T *q, const T *k, const T *v, const uint8_t *mask, T *out, long steps, long n_kv, long g,          \
              long d, long keys, long k_head, long v_head, long v_row, float scale, float cap) {                       \
        _Pragma("omp parallel for schedule(static, 1)") /* interleaved: a causal mask's later steps cost more */       \
        for (long item = 0; item < steps * n_kv; item++)                                                               \
            NAME##_item(q, k, v, mask, out, item, n_kv, g, d, keys, keys, k_head, v_head, v_row, scale, cap);          \
    }
DEFINE_ATTEND(attend_f32, float, ld_f32, dots8_f32, st_f32)
DEFINE_ATTEND(attend_bf16, uint16_t, ld_bf16, dots8_bf16, st_bf16)
