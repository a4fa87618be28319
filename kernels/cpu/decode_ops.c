/* The small per-token operators of a decode step, one call each: add+RMSNorm, rotate-half RoPE (and the per-head q/k
 * norms with it), grouped attention over a KV cache and SwiGLU's activation. At a decode step's few rows each of these
 * is a handful of elements per operator, and its cost in eager PyTorch is the 5-10 dispatches it takes (and the caches
 * the weight stream has just flushed), not the arithmetic; one call does the same arithmetic once. torch_impl takes
 * them only in its generation's CPU decode steps (kernels/cpu/torch_decode_ops.py), jax_impl the attention there
 * (kernels/cpu/jax_decode_ops.py through decode_ops_ffi.cc: XLA fuses the others itself, but attends over every slot of
 * its preallocated cache); their math is kernels/triton/reference.py's add_rms_norm_reference and
 * silu_and_mul_reference, torch_impl/rotary_embedding.py's apply_rotary and torch_impl/attention.py's attend
 * (jax_impl/attention.py's), which the tests hold them to. exp is exp8's, eight lanes at a time: a scalar expf lost to
 * torch's vectorized one at these sizes. Built and loaded by kernels/cpu/build.py.
 *
 * Storage float32 or bfloat16 (NAME_f32 / NAME_bf16), compute float32, each result rounded once where the
 * reference rounds it (bfloat16: round to nearest even, as torch rounds). Built with -ffp-contract=off, so that
 * a product and a sum are two roundings as in the reference, not one fused multiply-add; only the sums of
 * squares and the attention products are summed in another order than torch's (8 lanes, then across them), the
 * attention products with fused multiply-adds, as the BLAS behind the reference's einsum computes them.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

static inline float ld_f32(const float *p, long i) { return p[i]; }
static inline float ld_bf16(const uint16_t *p, long i) { return bf16_to_f32(p[i]); }
static inline void st_f32(float *p, long i, float v) { p[i] = v; }
static inline void st_bf16(uint16_t *p, long i, float v) { p[i] = f32_to_bf16(v); }
static inline float rnd_f32(float v) { return v; }
static inline float rnd_bf16(float v) { return bf16_to_f32(f32_to_bf16(v)); }

static inline __m256 ld8_f32(const float *p) { return _mm256_loadu_ps(p); }
static inline __m256 ld8_bf16(const uint16_t *p) {
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
/* [sum of a[0]'s lanes, ..., sum of a[7]'s lanes]: eight dot products finished at once */
static inline __m256 sums8(const __m256 *a) {
    __m256 s01 = _mm256_hadd_ps(a[0], a[1]), s23 = _mm256_hadd_ps(a[2], a[3]);
    __m256 s45 = _mm256_hadd_ps(a[4], a[5]), s67 = _mm256_hadd_ps(a[6], a[7]);
    __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);
    return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
}
static inline float sum1(__m256 a) {
    __m256 all[8] = {a, a, a, a, a, a, a, a};
    return _mm256_cvtss_f32(sums8(all));
}

/* exp of 8 floats: x = n ln2 + r, |r| <= ln2 / 2, e^r by Cephes' degree-7 polynomial, times 2^n: within 2 float32
 * ulps of the correctly rounded value (torch's vectorized exp is within 1; the tests hold the ops to their
 * references' tolerance rows). Below -87.3 (where 2^n leaves the normal range) the result is 0, not a subnormal. */
static inline __m256 exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33654f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(88.72283f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x); /* ln2 in two parts: r exact */
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* 2^n as float bits; n in [-126, 128]: 2^128 would overflow the exponent, so scale by 2^(n-1) twice */
    __m256i e = _mm256_cvtps_epi32(n);
    __m256i half = _mm256_srai_epi32(e, 1);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
    __m256i rest = _mm256_add_epi32(_mm256_sub_epi32(e, half), _mm256_set1_epi32(127));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(rest, 23));
    return _mm256_andnot_ps(under, _mm256_mul_ps(_mm256_mul_ps(y, s1), s2));
}

/* sum of v[i]^2 in float32: 8 lanes of a vector register, then the lanes (a reordering of torch's sum) */
static float sum_squares(const float *v, long n) {
    __m256 acc = _mm256_setzero_ps();
    long i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(v + i);
        acc = _mm256_add_ps(acc, _mm256_mul_ps(x, x));
    }
    float s = sum1(acc);
    for (; i < n; i++) s += v[i] * v[i];
    return s;
}

/* add_rms_norm_reference: s = rnd(x + residual) (the new residual, written to s_out) or s = x; then
 *   float32_weight: out = rnd(normed * (offset + w))        else: out = rnd(rnd(offset + w) * rnd(normed))
 * with normed = s * (1 / sqrt(mean(s^2) + eps)), all in float32. */
#define DEFINE_NORM(NAME, T, LD, ST, RND)                                                                     \
    void NAME(const T *x, const T *residual, const T *w, T *out, T *s_out, long rows, long dim, float eps,   \
              float offset, int float32_weight) {                                                           \
        float *s = malloc(sizeof(float) * dim); /* the row in float32 */                                     \
        if (!s) abort();                                                                                     \
        for (long r = 0; r < rows; r++) {                                                                    \
            const T *xr = x + r * dim;                                                                       \
            for (long i = 0; i < dim; i++) s[i] = residual ? RND(LD(xr, i) + LD(residual + r * dim, i)) : LD(xr, i); \
            if (residual)                                                                                    \
                for (long i = 0; i < dim; i++) ST(s_out + r * dim, i, s[i]);                                \
            float inv = 1.0f / sqrtf(sum_squares(s, dim) / (float)dim + eps);                               \
            for (long i = 0; i < dim; i++) {                                                                 \
                float normed = s[i] * inv;                                                                   \
                float v = float32_weight ? normed * (offset + LD(w, i))                                      \
                                         : RND(offset != 0.0f ? offset + LD(w, i) : LD(w, i)) * RND(normed); \
                ST(out + r * dim, i, v);                                                                     \
            }                                                                                                \
        }                                                                                                    \
        free(s);                                                                                             \
    }
DEFINE_NORM(add_rms_norm_f32, float, ld_f32, st_f32, rnd_f32)
DEFINE_NORM(add_rms_norm_bf16, uint16_t, ld_bf16, st_bf16, rnd_bf16)

/* apply_rotary: x [rows, heads, d], cos/sin [rows, r] float32 (r even, r <= d): the first r dims of each head
 * rotated, out = x * cos + rotate_half(x) * sin with rotate_half([a, b]) = [-b, a]; dims from r on copied. */
#define DEFINE_ROTARY(NAME, T, LD, ST)                                                                        \
    void NAME(const T *x, const float *cos, const float *sin, T *out, long rows, long heads, long d, long r) { \
        long half = r / 2;                                                                                   \
        for (long t = 0; t < rows; t++) {                                                                    \
            const float *c = cos + t * r, *s = sin + t * r;                                                  \
            for (long h = 0; h < heads; h++) {                                                               \
                const T *xh = x + (t * heads + h) * d;                                                       \
                T *oh = out + (t * heads + h) * d;                                                           \
                for (long i = 0; i < half; i++) ST(oh, i, LD(xh, i) * c[i] + (-LD(xh, i + half)) * s[i]);   \
                for (long i = half; i < r; i++) ST(oh, i, LD(xh, i) * c[i] + LD(xh, i - half) * s[i]);      \
                for (long i = r; i < d; i++) oh[i] = xh[i];                                                  \
            }                                                                                                \
        }                                                                                                    \
    }
DEFINE_ROTARY(rotary_f32, float, ld_f32, st_f32)
DEFINE_ROTARY(rotary_bf16, uint16_t, ld_bf16, st_bf16)

/* Qwen3's q/k step before attention: each head of q [rows, nq, d] and of k [rows, nk, d] normed over d (NAME's norm,
 * no residual, its own weight) and then rotated by apply_rotary: exactly the two calls in turn, the normed heads
 * rounded to T between them as the reference rounds them, in one call instead of four. */
#define DEFINE_NORM_ROTARY(NAME, T, NORM, ROTARY)                                                             \
    void NAME(const T *q, const T *k, const T *wq, const T *wk, const float *cos, const float *sin, T *q_out,  \
              T *k_out, long rows, long nq, long nk, long d, long r, float eps, float offset, int float32_weight) { \
        T *normed = malloc(sizeof(T) * rows * (nq > nk ? nq : nk) * d);                                      \
        if (!normed) abort();                                                                                \
        NORM(q, NULL, wq, normed, NULL, rows * nq, d, eps, offset, float32_weight);                          \
        ROTARY(normed, cos, sin, q_out, rows, nq, d, r);                                                     \
        NORM(k, NULL, wk, normed, NULL, rows * nk, d, eps, offset, float32_weight);                          \
        ROTARY(normed, cos, sin, k_out, rows, nk, d, r);                                                     \
        free(normed);                                                                                        \
    }
DEFINE_NORM_ROTARY(norm_rotary_f32, float, add_rms_norm_f32, rotary_f32)
DEFINE_NORM_ROTARY(norm_rotary_bf16, uint16_t, add_rms_norm_bf16, rotary_bf16)

/* out[u] = sum_i a[i] * row_u[i] (i < len) for the n <= 8 rows row_u = first + u * stride: summed in 8 lanes, then
 * across them (sums8), then the tail. Eight rows at a time, so that eight independent sums fill the pipeline
 * instead of one waiting on itself; a block short of eight repeats its last row (those sums are dropped), so the
 * loop over the rows has a fixed count and the accumulators stay in registers. `fetch`: fetch the rows four blocks
 * on (only the first of several calls over the same rows asks: the others would fetch what is on its way). A
 * prefetch never faults, so the rows fetched ahead may run past the operand's end. */
#define DEFINE_DOTS8(NAME, T, LD, LD8)                                                                        \
    static inline void NAME(const float *a, const T *first, long stride, long n, long len, float *out,       \
                            int fetch) {                                                                     \
        const T *row[8];                                                                                     \
        for (long u = 0; u < 8; u++) row[u] = first + (u < n ? u : n - 1) * stride;                          \
        for (long u = 0; fetch && u < 8; u++) /* rows four blocks on, fetched while this block is summed: */ \
            for (long b = 0; b < len * (long)sizeof(T); b += 64) /* the cache's own prefetch misses them */  \
                _mm_prefetch((const char *)(first + (32 + u) * stride) + b, _MM_HINT_T0);                    \
        __m256 acc[8];                                                                                       \
        for (long u = 0; u < 8; u++) acc[u] = _mm256_setzero_ps();                                           \
        long vec = len / 8 * 8;                                                                              \
        for (long i = 0; i < vec; i += 8) {                                                                  \
            __m256 av = _mm256_loadu_ps(a + i);                                                              \
            for (long u = 0; u < 8; u++) acc[u] = _mm256_fmadd_ps(av, LD8(row[u] + i), acc[u]);             \
        }                                                                                                    \
        float sums[8];                                                                                       \
        _mm256_storeu_ps(sums, sums8(acc));                                                                  \
        for (long u = 0; u < n; u++) {                                                                       \
            for (long i = vec; i < len; i++) sums[u] += a[i] * LD(row[u], i);                                \
            out[u] = sums[u];                                                                                \
        }                                                                                                    \
    }
DEFINE_DOTS8(dots8_f32, float, ld_f32, ld8_f32)
DEFINE_DOTS8(dots8_bf16, uint16_t, ld_bf16, ld8_bf16)

/* k <= 8 values from p as 8 float32 lanes, the lanes past k zero: a row's last, short block goes through the same
 * vector code as the others (so an element's result does not depend on where in the row it sits). */
#define DEFINE_PART8(NAME, T, LD, LD8)                                                                        \
    static inline __m256 NAME(const T *p, long k) {                                                          \
        if (k == 8) return LD8(p);                                                                           \
        float lanes[8] = {0};                                                                                \
        for (long j = 0; j < k; j++) lanes[j] = LD(p, j);                                                    \
        return _mm256_loadu_ps(lanes);                                                                       \
    }
DEFINE_PART8(part8_f32, float, ld_f32, ld8_f32)
DEFINE_PART8(part8_bf16, uint16_t, ld_bf16, ld8_bf16)

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
#define DEFINE_ATTEND(NAME, T, LD, DOTS8, ST)                                                                 \
    void NAME##_item(const T *q, const T *k, const T *v, const uint8_t *mask, T *out, long item, long n_kv,      \
                     long g, long d, long keys, long mask_row, long k_head, long v_head, long v_row, float scale, \
                     float cap) {                                                                            \
        const long t = item / n_kv, kv = item % n_kv;                                                        \
        const T *kh = k + kv * k_head, *vh = v + kv * v_head;                                                \
        float *p = malloc(sizeof(float) * g * (keys + d)), *qf = p + g * keys; /* scores, queries in f32 */  \
        if (!p) abort();                                                                                     \
        for (long j = 0; j < g * d; j++) qf[j] = LD(q + (t * n_kv + kv) * g * d, j);                        \
        for (long s0 = 0; s0 < keys; s0 += 8) /* q . k for keys s0 .. s0 + 7, every query of the group */   \
            for (long j = 0; j < g; j++)      /* while those keys are in L1 */                              \
                DOTS8(qf + j * d, kh + s0 * d, d, keys - s0 < 8 ? keys - s0 : 8, d, p + j * keys + s0, !j); \
        for (long j = 0; j < g; j++) {                                                                       \
            float *pj = p + j * keys, top = -INFINITY;                                                       \
            for (long s = 0; s < keys; s++) {                                                                \
                float x = pj[s] * scale;                                                                     \
                if (cap > 0.0f) x = tanhf(x / cap) * cap;                                                    \
                if (!mask[t * mask_row + s]) x = -3.40282347e38f;                                            \
                pj[s] = x;                                                                                   \
                top = x > top ? x : top;                                                                     \
            }                                                                                                \
            softmax_tail(pj, keys, top);                                                                     \
        }                                                                                                    \
        for (long i0 = 0; i0 < d; i0 += 8) { /* p . v for value rows i0 .. i0 + 7, every query of the group */ \
            long n = d - i0 < 8 ? d - i0 : 8;                                                                \
            for (long j = 0; j < g; j++) {                                                                   \
                float sums[8];                                                                               \
                T *o = out + ((t * n_kv + kv) * g + j) * d;                                                  \
                DOTS8(p + j * keys, vh + i0 * v_row, v_row, n, keys, sums, !j);                             \
                for (long u = 0; u < n; u++) ST(o, i0 + u, sums[u]);                                         \
            }                                                                                                \
        }                                                                                                    \
        free(p);                                                                                             \
    }                                                                                                        \
    void NAME(const T *q, const T *k, const T *v, const uint8_t *mask, T *out, long steps, long n_kv, long g, \
              long d, long keys, long k_head, long v_head, long v_row, float scale, float cap) {             \
        _Pragma("omp parallel for schedule(static)")                                                         \
        for (long item = 0; item < steps * n_kv; item++)                                                     \
            NAME##_item(q, k, v, mask, out, item, n_kv, g, d, keys, keys, k_head, v_head, v_row, scale, cap); \
    }
DEFINE_ATTEND(attend_f32, float, ld_f32, dots8_f32, st_f32)
DEFINE_ATTEND(attend_bf16, uint16_t, ld_bf16, dots8_bf16, st_bf16)

/* silu_and_mul_reference (kernels/triton/reference.py): x [rows, 2I], gate first -> out [rows, I] =
 * rnd(silu(g) * u) in float32, silu(g) = g / (1 + exp(-g)) as torch's CPU kernel computes it (exp8 for exp). */
#define DEFINE_SILU(NAME, T, PART8, ST)                                                                       \
    void NAME(const T *x, T *out, long rows, long inter) {                                                   \
        const __m256 one = _mm256_set1_ps(1.0f);                                                             \
        float v[8];                                                                                          \
        for (long r = 0; r < rows; r++) {                                                                    \
            const T *g = x + r * 2 * inter, *u = g + inter;                                                  \
            T *o = out + r * inter;                                                                          \
            for (long i = 0; i < inter; i += 8) {                                                            \
                long k = inter - i < 8 ? inter - i : 8;                                                      \
                __m256 gv = PART8(g + i, k), e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv));              \
                _mm256_storeu_ps(v, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), PART8(u + i, k))); \
                for (long j = 0; j < k; j++) ST(o, i + j, v[j]);                                             \
            }                                                                                                \
        }                                                                                                    \
    }
DEFINE_SILU(silu_and_mul_f32, float, part8_f32, st_f32)
DEFINE_SILU(silu_and_mul_bf16, uint16_t, part8_bf16, st_bf16)
