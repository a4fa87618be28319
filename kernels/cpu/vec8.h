/* The 8-lane float32 pieces decode_ops.c's row operators and attend.c's attention share: loads and stores of either
 * storage type (float32, bfloat16 through bf16.h, rounded as torch rounds), short loads and stores for a row's last
 * block, the sums across lanes, and exp. A T's operators are named NAME_f32 / NAME_bf16, so the files' macros paste
 * the suffix. */
#pragma once

#include <immintrin.h>
#include <stdint.h>

#include "bf16.h"

static inline float ld_f32(const float *p, long i) { return p[i]; }
static inline float ld_bf16(const uint16_t *p, long i) { return bf16_to_f32(p[i]); }
static inline void st_f32(float *p, long i, float v) { p[i] = v; }
static inline void st_bf16(uint16_t *p, long i, float v) { p[i] = f32_to_bf16(v); }

static inline __m256 ld8_f32(const float *p) { return _mm256_loadu_ps(p); }
static inline __m256 ld8_bf16(const uint16_t *p) { return bf16x8_to_f32(_mm_loadu_si128((const __m128i *)p)); }
static inline void st8_f32(float *p, __m256 v) { _mm256_storeu_ps(p, v); }
static inline void st8_bf16(uint16_t *p, __m256 v) { _mm_storeu_si128((__m128i *)p, f32x8_to_bf16(v)); }
static inline __m256 rnd8_f32(__m256 v) { return v; }
static inline __m256 rnd8_bf16(__m256 v) { return f32x8_round_bf16(v); }

/* k <= 8 values from p as 8 float32 lanes, the lanes past k zero; and the first k lanes of v stored to p: a row's
 * last, short block goes through the same vector code as the others (so an element's result does not depend on where
 * in the row it sits). */
#define DEFINE_PART8(S, T)                                                                                             \
    static inline __m256 part8_##S(const T *p, long k) {                                                               \
        if (k == 8) return ld8_##S(p);                                                                                 \
        float lanes[8] = {0};                                                                                          \
        for (long j = 0; j < k; j++) lanes[j] = ld_##S(p, j);                                                         \
        return _mm256_loadu_ps(lanes);                                                                                 \
    }                                                                                                                  \
    static inline void stpart8_##S(T *p, __m256 v, long k) {                                                           \
        if (k == 8) return st8_##S(p, v);                                                                              \
        float lanes[8];                                                                                                \
        _mm256_storeu_ps(lanes, v);                                                                                    \
        for (long j = 0; j < k; j++) st_##S(p, j, lanes[j]);                                                           \
    }
DEFINE_PART8(f32, float)
DEFINE_PART8(bf16, uint16_t)

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
