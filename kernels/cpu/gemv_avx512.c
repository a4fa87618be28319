/* gemv.c's few-row products in 512-bit vectors, for the processors that have AVX-512F (and AVX512_BF16): the same
 * parts, the same cut and the same contract (x, b and y float32, W float32 or bfloat16 widened exactly, float32
 * sums), called by gemv.c's dispatch (gemv_isa) where the processor has the instructions. A decode step streams its
 * weights once, from memory: with half as many instructions per cache line of W (each stream's line fetched AHEAD
 * bytes before it is read where the caller asks, as in the 256-bit loops), these read a chain of decode-sized
 * weights faster than the 256-bit loops, most of all in bfloat16 (docs/benchmarks.md has the figures). Compiled in
 * every build of gemv.c (the target attributes let an AVX2 compile hold them); only called where gemv_isa() says
 * the processor runs them.
 *
 * What changes against the 256-bit loops, and what does not:
 *   cols  the same additions in the same order for every output (acc + w0 x0 + w1 x1 + w2 x2 + w3 x3 per column,
 *         16 columns at a time, then 8, then the scalar tail, as gemv.c): results are bit for bit gemv.c's.
 *   rows  each dot product in 16 lanes instead of 8, so its sum is reordered (within the float32 bound). bfloat16:
 *         a line of 32 weights is split into its odd and its even elements (the high half of each 32-bit word is
 *         the odd bf16, a mask away from a float32; the even one is a shift away), and each lane adds the odd
 *         product first, then the even one -- VDPBF16PS's order, so where x holds bfloat16 values (a bf16 model's
 *         activations, widened) and the processor has AVX512_BF16, that one instruction does the two multiply-adds
 *         with the same result (a bf16 product is exact in float32; the instruction rounds after each addition, as
 *         a fused multiply-add does). It also treats subnormal inputs and sums (below 2**-126) as zero: the only
 *         place the two loops can differ.
 */
#include <immintrin.h>
#include <stdint.h>

#include "gemv_loops.h"

#define AVX512 __attribute__((target("avx512f")))
#define AVX512_BF16 __attribute__((target("avx512f,avx512bf16")))

/* 16 weights as float32 */
static inline AVX512 __m512 load16_f32(const float *w) { return _mm512_loadu_ps(w); }
static inline AVX512 __m512 load16_bf16(const uint16_t *w) {
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)w));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

#define REDUCE16 _mm512_reduce_add_ps

AVX512 void gemv_rows_f32_avx512_part(const float *x, const float *w, const float *b, float *y, long m, long in,
                                      long out, long part, long parts, long fetch) {
    const long vec = in / 16 * 16;
    GEMV_ROW_RUNS(float, load1_f32, __m512, _mm512_setzero_ps(), REDUCE16, for (long i = 0; i < vec; i += 16) {
        const __m512 xv = _mm512_loadu_ps(xr + i);
        FETCH4(i);
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w0 + i), xv, a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w1 + i), xv, a1);
        a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w2 + i), xv, a2);
        a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w3 + i), xv, a3);
    })
}

/* the odd and the even bf16 of 32 as float32, lane l holding elements 2l + 1 and 2l */
#define ODD(v) _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xFFFF0000u)))
#define EVEN(v) _mm512_castsi512_ps(_mm512_slli_epi32(v, 16))
#define ODD_EVEN(a, wr, xo, xe)                                            \
    {                                                                      \
        const __m512i v = _mm512_loadu_si512(wr + i);                      \
        a = _mm512_fmadd_ps(EVEN(v), xe, _mm512_fmadd_ps(ODD(v), xo, a)); \
    }

/* x [m, in] deinterleaved into its odd and even elements 32 at a time: lane l of a block's odd vector is
 * x[i + 2l + 1]. Widened bf16 or any float32 alike. */
static inline AVX512 void odd_even(const float *x, __m512 *odd, __m512 *even) {
    const __m512 lo = _mm512_loadu_ps(x), hi = _mm512_loadu_ps(x + 16);
    const __m512i odd_idx = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    const __m512i even_idx = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    *odd = _mm512_permutex2var_ps(lo, odd_idx, hi);
    *even = _mm512_permutex2var_ps(lo, even_idx, hi);
}

static AVX512 void rows_bf16_fma(const float *x, const uint16_t *w, const float *b, float *y, long m, long in,
                                 long out, long part, long parts, long fetch) {
    const long vec = in / 32 * 32;
    GEMV_ROW_RUNS(uint16_t, load1_bf16, __m512, _mm512_setzero_ps(), REDUCE16, for (long i = 0; i < vec; i += 32) {
        __m512 xo, xe;
        odd_even(xr + i, &xo, &xe);
        FETCH4(i);
        ODD_EVEN(a0, w0, xo, xe) ODD_EVEN(a1, w1, xo, xe) ODD_EVEN(a2, w2, xo, xe) ODD_EVEN(a3, w3, xo, xe)
    })
}

/* 32 x (float32 holding bf16 values) as the pairs VDPBF16PS takes: exact */
#define X_PAIRS(p) _mm512_cvtne2ps_pbh(_mm512_loadu_ps((p) + 16), _mm512_loadu_ps(p))
/* the four streams' pair steps at k = i, x's pairs XV */
#define DOT_STEP(XV)                                                         \
    {                                                                        \
        const __m512bh xv = (XV);                                            \
        FETCH4(i);                                                           \
        a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(w0 + i), xv); \
        a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_loadu_si512(w1 + i), xv); \
        a2 = _mm512_dpbf16_ps(a2, (__m512bh)_mm512_loadu_si512(w2 + i), xv); \
        a3 = _mm512_dpbf16_ps(a3, (__m512bh)_mm512_loadu_si512(w3 + i), xv); \
    }

enum { X_PAIRS_BYTES = 32 << 10 }; /* x's pairs on the stack: a decode row of up to 16384, or 8 rows of 2048 */

/* x converted to pairs once per call where they fit the stack, not once per four rows of W: a line of bf16 weights
 * then takes 64 bytes of x, as a float32 line does, not 128 (a wide row of x lives in L2, not L1), and the loop
 * converts nothing; measured faster at every width tried (docs/benchmarks.md). The same pairs either way: the same
 * bits. */
static AVX512_BF16 void rows_bf16_dot(const float *x, const uint16_t *w, const float *b, float *y, long m, long in,
                                      long out, long part, long parts, long fetch) {
    const long vec = in / 32 * 32, blocks = vec / 32;
    if (m * blocks > X_PAIRS_BYTES / 64) { /* converted as they are read */
        GEMV_ROW_RUNS(uint16_t, load1_bf16, __m512, _mm512_setzero_ps(), REDUCE16,
                      for (long i = 0; i < vec; i += 32) DOT_STEP(X_PAIRS(xr + i)))
        return;
    }
    __m512bh pairs[X_PAIRS_BYTES / 64];
    for (long r = 0; r < m; r++)
        for (long i = 0; i < vec; i += 32) pairs[r * blocks + i / 32] = X_PAIRS(x + r * in + i);
    GEMV_ROW_RUNS(uint16_t, load1_bf16, __m512, _mm512_setzero_ps(), REDUCE16,
                  for (long i = 0; i < vec; i += 32) DOT_STEP(pairs[r * blocks + i / 32]))
}

/* Whether every x is a bfloat16 value that VDPBF16PS takes as it is: the low 16 bits zero, and not subnormal. */
static AVX512 int bf16_values(const float *x, long n) {
    const uint32_t *u = (const uint32_t *)x;
    for (long i = 0; i < n; i++) {
        const uint32_t exponent = u[i] & 0x7F800000u;
        if ((u[i] & 0xFFFFu) || (exponent == 0 && (u[i] & 0x7FFFFFFFu))) return 0;
    }
    return 1;
}

/* dot: whether the processor has AVX512_BF16 (gemv_isa() == 2) */
AVX512 void gemv_rows_bf16_avx512_part(const float *x, const uint16_t *w, const float *b, float *y, long m, long in,
                                       long out, long part, long parts, long fetch, int dot) {
    if (dot && in >= 32 && bf16_values(x, m * in))
        rows_bf16_dot(x, w, b, y, m, in, out, part, parts, fetch);
    else
        rows_bf16_fma(x, w, b, y, m, in, out, part, parts, fetch);
}

/* The cols layout: 16 columns at a time, then gemv.c's 8-wide loop, then the shared scalar tail. */
#define DEFINE_COLS512(NAME, WT, LOAD16, LOAD8, LOAD1)                                                       \
    AVX512 void NAME(const float *x, const WT *w, float *partials, long m, long in, long out, long part,     \
                     long parts, long fetch) {                                                               \
        const long vec16 = out / 16 * 16, vec8 = out / 8 * 8;                                               \
        GEMV_COLS_CHUNKS(WT, LOAD1, {                                                                        \
            __m512 x0 = _mm512_set1_ps(xr[i]), x1 = _mm512_set1_ps(xr[k1]);                                  \
            __m512 x2 = _mm512_set1_ps(xr[k2]), x3 = _mm512_set1_ps(xr[k3]);                                 \
            for (; j < vec16; j += 16) {                                                                     \
                FETCH4(j);                                                                                   \
                __m512 a = _mm512_fmadd_ps(LOAD16(w0 + j), x0, _mm512_loadu_ps(acc + j));                    \
                a = _mm512_fmadd_ps(LOAD16(w1 + j), x1, a);                                                  \
                a = _mm512_fmadd_ps(LOAD16(w2 + j), x2, a);                                                  \
                _mm512_storeu_ps(acc + j, _mm512_fmadd_ps(LOAD16(w3 + j), x3, a));                           \
            }                                                                                                \
            const __m256 y0 = _mm512_castps512_ps256(x0), y1 = _mm512_castps512_ps256(x1);                   \
            const __m256 y2 = _mm512_castps512_ps256(x2), y3 = _mm512_castps512_ps256(x3);                   \
            for (; j < vec8; j += 8) { /* gemv.c's 256-bit loop */                                           \
                __m256 a = _mm256_fmadd_ps(LOAD8(w0 + j), y0, _mm256_loadu_ps(acc + j));                     \
                a = _mm256_fmadd_ps(LOAD8(w1 + j), y1, a);                                                   \
                a = _mm256_fmadd_ps(LOAD8(w2 + j), y2, a);                                                   \
                _mm256_storeu_ps(acc + j, _mm256_fmadd_ps(LOAD8(w3 + j), y3, a));                            \
            }                                                                                                \
        })                                                                                                   \
    }

DEFINE_COLS512(gemv_cols_f32_avx512_part, float, load16_f32, load8_f32, load1_f32)
DEFINE_COLS512(gemv_cols_bf16_avx512_part, uint16_t, load16_bf16, load8_bf16, load1_bf16)
