/* The row operators of torch_impl's CPU generation, one call each: add+RMSNorm, rotate-half RoPE (and the per-head q/k
 * norms with it) and SwiGLU's activation (attention: attend.c). In eager PyTorch each is 5-10 dispatches, each a pass
 * over the rows through float32 temporaries: at a decode step's few rows the dispatches are the cost, at a prompt's
 * hundreds of rows the passes are (a bfloat16 add+RMSNorm of 128 x 1024 is seven of them); one call reads the rows
 * once and does the same arithmetic. torch_impl takes them in its generation's CPU prompt and decode steps
 * (kernels/cpu/torch_decode_ops.py), decode_layer.c within its one-call layer; their math is
 * kernels/triton/reference.py's add_rms_norm_reference and silu_and_mul_reference and
 * torch_impl/rotary_embedding.py's apply_rotary, which the tests hold them to. Built and loaded by
 * kernels/cpu/build.py.
 *
 * Storage float32 or bfloat16 (NAME_f32 / NAME_bf16), compute float32 in 8 lanes (vec8.h), each result rounded once
 * where the reference rounds it (bfloat16: round to nearest even, as torch rounds). Built with -ffp-contract=off, so
 * that a product and a sum are two roundings as in the reference, not one fused multiply-add; only the sums of
 * squares are summed in another order than torch's (8 lanes, then across them), and exp is exp8's (a scalar expf
 * lost to torch's vectorized one). A call over PARALLEL_MIN elements or more cuts its rows over the OpenMP team
 * (torch's own, as for gemv.c), each row on one thread, so no result depends on the cut; a decode step's rows stay on
 * the calling thread (a team's start costs more than they do).
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "decode_ops.h"
#include "vec8.h"

enum { PARALLEL_MIN = 1 << 15 }; /* elements: at::internal::GRAIN_SIZE, where torch's own loops start a team */

/* The calling thread's rows [lo, hi) of n, inside `#pragma omp parallel if (work >= PARALLEL_MIN)`: all of them in a
 * team of one (below PARALLEL_MIN elements), else its static share. */
static inline void my_rows(long n, long *lo, long *hi) {
    const long parts = omp_get_num_threads(), part = omp_get_thread_num();
    *lo = n * part / parts;
    *hi = n * (part + 1) / parts;
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
 * with normed = s * (1 / sqrt(mean(s^2) + eps)), all in float32. s_out may be residual (decode_layer.c's in-place
 * residual): each block is read before it is written. */
#define DEFINE_NORM(S, T)                                                                                              \
    static void norm_row_##S(const T *x, const T *residual, const T *w, T *out, T *s_out, long dim, float eps,         \
                             float offset, int float32_weight, float *s) {                                             \
        for (long i = 0; i < dim; i += 8) {                                                                            \
            const long k = dim - i < 8 ? dim - i : 8;                                                                  \
            __m256 v = part8_##S(x + i, k);                                                                            \
            if (residual) {                                                                                            \
                v = rnd8_##S(_mm256_add_ps(v, part8_##S(residual + i, k)));                                            \
                stpart8_##S(s_out + i, v, k);                                                                          \
            }                                                                                                          \
            _mm256_storeu_ps(s + i, v);                                                                                \
        }                                                                                                              \
        const __m256 inv = _mm256_set1_ps(1.0f / sqrtf(sum_squares(s, dim) / (float)dim + eps));                       \
        const __m256 off = _mm256_set1_ps(offset);                                                                     \
        for (long i = 0; i < dim; i += 8) {                                                                            \
            const long k = dim - i < 8 ? dim - i : 8;                                                                  \
            const __m256 normed = _mm256_mul_ps(_mm256_loadu_ps(s + i), inv), w8 = part8_##S(w + i, k);                \
            const __m256 v = float32_weight ? _mm256_mul_ps(normed, _mm256_add_ps(off, w8))                            \
                                            : _mm256_mul_ps(offset != 0.0f ? rnd8_##S(_mm256_add_ps(off, w8)) : w8,    \
                                                            rnd8_##S(normed)); /* w8 holds T's values already */       \
            stpart8_##S(out + i, v, k);                                                                                \
        }                                                                                                              \
    }                                                                                                                  \
    void add_rms_norm_##S(const T *x, const T *residual, const T *w, T *out, T *s_out, long rows, long dim, float eps, \
                          float offset, int float32_weight) {                                                          \
        _Pragma("omp parallel if (rows * dim >= PARALLEL_MIN)") {                                                      \
            float *s = malloc(sizeof(float) * (dim + 8)); /* the row in float32, a whole last block */                 \
            if (!s) abort();                                                                                           \
            long lo, hi;                                                                                               \
            my_rows(rows, &lo, &hi);                                                                                   \
            for (long r = lo; r < hi; r++)                                                                             \
                norm_row_##S(x + r * dim, residual ? residual + r * dim : NULL, w, out + r * dim,                      \
                             s_out ? s_out + r * dim : NULL, dim, eps, offset, float32_weight, s);                     \
            free(s);                                                                                                   \
        }                                                                                                              \
    }
DEFINE_NORM(f32, float)
DEFINE_NORM(bf16, uint16_t)

/* apply_rotary: x [rows, heads, d], cos/sin [rows, r] float32 (r even, r <= d): the first r dims of each head
 * rotated, out = x * cos + rotate_half(x) * sin with rotate_half([a, b]) = [-b, a]; dims from r on copied. */
#define DEFINE_ROTARY(S, T)                                                                                            \
    static void rotary_head_##S(const T *xh, const float *c, const float *s, T *oh, long d, long r) {                  \
        const long half = r / 2;                                                                                       \
        const __m256 sign = _mm256_set1_ps(-0.0f);                                                                     \
        for (long i = 0; i < half; i += 8) {                                                                           \
            const long k = half - i < 8 ? half - i : 8;                                                                \
            const __m256 a = part8_##S(xh + i, k), b = part8_##S(xh + half + i, k);                                    \
            const __m256 lo = _mm256_add_ps(_mm256_mul_ps(a, part8_f32(c + i, k)),                                     \
                                            _mm256_mul_ps(_mm256_xor_ps(b, sign), part8_f32(s + i, k)));               \
            const __m256 hi = _mm256_add_ps(_mm256_mul_ps(b, part8_f32(c + half + i, k)),                              \
                                            _mm256_mul_ps(a, part8_f32(s + half + i, k)));                             \
            stpart8_##S(oh + i, lo, k);                                                                                \
            stpart8_##S(oh + half + i, hi, k);                                                                         \
        }                                                                                                              \
        memcpy(oh + r, xh + r, sizeof(T) * (d - r));                                                                   \
    }                                                                                                                  \
    void rotary_##S(const T *x, const float *cos, const float *sin, T *out, long rows, long heads, long d, long r) {   \
        _Pragma("omp parallel if (rows * heads * d >= PARALLEL_MIN)") {                                                \
            long lo, hi;                                                                                               \
            my_rows(rows * heads, &lo, &hi);                                                                           \
            for (long item = lo; item < hi; item++) /* item = t * heads + h */                                         \
                rotary_head_##S(x + item * d, cos + item / heads * r, sin + item / heads * r, out + item * d, d, r);   \
        }                                                                                                              \
    }
DEFINE_ROTARY(f32, float)
DEFINE_ROTARY(bf16, uint16_t)

/* Qwen3's q/k step before attention: each head of q [rows, nq, d] and of k [rows, nk, d] normed over d (NAME's norm,
 * no residual, its own weight) and then rotated by apply_rotary: exactly the two calls in turn, the normed heads
 * rounded to T between them as the reference rounds them, in one call instead of four. */
#define DEFINE_NORM_ROTARY(S, T)                                                                                       \
    void norm_rotary_##S(const T *q, const T *k, const T *wq, const T *wk, const float *cos, const float *sin,         \
                         T *q_out, T *k_out, long rows, long nq, long nk, long d, long r, float eps, float offset,     \
                         int float32_weight) {                                                                         \
        T *normed = malloc(sizeof(T) * rows * (nq > nk ? nq : nk) * d);                                                \
        if (!normed) abort();                                                                                          \
        add_rms_norm_##S(q, NULL, wq, normed, NULL, rows * nq, d, eps, offset, float32_weight);                        \
        rotary_##S(normed, cos, sin, q_out, rows, nq, d, r);                                                           \
        add_rms_norm_##S(k, NULL, wk, normed, NULL, rows * nk, d, eps, offset, float32_weight);                        \
        rotary_##S(normed, cos, sin, k_out, rows, nk, d, r);                                                           \
        free(normed);                                                                                                  \
    }
DEFINE_NORM_ROTARY(f32, float)
DEFINE_NORM_ROTARY(bf16, uint16_t)

/* silu_and_mul_reference (kernels/triton/reference.py): x [rows, 2I], gate first -> out [rows, I] =
 * rnd(silu(g) * u) in float32, silu(g) = g / (1 + exp(-g)) as torch's CPU kernel computes it (exp8 for exp). */
#define DEFINE_SILU(S, T)                                                                                              \
    void silu_and_mul_##S(const T *x, T *out, long rows, long inter) {                                                 \
        const __m256 one = _mm256_set1_ps(1.0f);                                                                       \
        _Pragma("omp parallel if (rows * inter >= PARALLEL_MIN)") {                                                    \
            long lo, hi;                                                                                               \
            my_rows(rows, &lo, &hi);                                                                                   \
            for (long r = lo; r < hi; r++) {                                                                           \
                const T *g = x + r * 2 * inter, *u = g + inter;                                                        \
                for (long i = 0; i < inter; i += 8) {                                                                  \
                    const long k = inter - i < 8 ? inter - i : 8;                                                      \
                    const __m256 gv = part8_##S(g + i, k), e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv));           \
                    stpart8_##S(out + r * inter + i, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)),           \
                                                                   part8_##S(u + i, k)), k);                           \
                }                                                                                                      \
            }                                                                                                          \
        }                                                                                                              \
    }
DEFINE_SILU(f32, float)
DEFINE_SILU(bf16, uint16_t)
