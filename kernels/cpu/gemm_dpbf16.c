/* Many-row bfloat16 products y[m, out] = x[m, in] . W[in, out] on AVX512_BF16 (vdpbf16ps), for processors that
 * have those instructions but no AMX tiles (AMD Zen 4 and later, Intel Cooper Lake): a prompt's products for
 * jax_impl, where XLA:CPU's own bf16 dot runs them well below the instruction's rate (docs/benchmarks.md). W is Flax's
 * kernel layout [in, out]; y is float32, rounded by the caller. Built by kernels/cpu/build.py only where the processor
 * has avx512_bf16, bound to XLA by gemm_dpbf16_ffi.cc; reference: kernels/cpu/reference.py.
 *
 * vdpbf16ps multiplies pairs: each 32-bit lane of its operands holds two bf16 values adjacent in k, and the lane's
 * float32 accumulator gains both products. x's rows already hold k-pairs side by side (one 32-bit broadcast per row);
 * W's do not (rows k and k + 1 lie `out` apart), so W is taken in panels of PANEL columns by KC rows and packed as
 * [KC / 2 pairs][PANEL columns][2], rows k and k + 1 interleaved, a zero row after an odd last k. The packed panel
 * (64 KB) stays in L2 while every row tile of a block of up to MC rows of x runs over it. The register tile is MR rows
 * of y by PANEL columns (MR * NV zmm accumulators, NV of W, x's pair broadcast): 6 x 64 ran at least as fast as
 * 12 x 32 (gemm.c's), 4 x 64 and 5 x 64, and K blocks of 512 as 128-4096 (docs/benchmarks.md).
 *
 * Each output is one chain of pair steps in k order: a tile's accumulators start from y's partial sum of the K blocks
 * before (or zero), so neither the blocking nor the thread count changes a result. vdpbf16ps treats subnormal inputs
 * as zero and flushes subnormal results (its definition, whatever MXCSR says). Work is cut into items
 * (gemm_dpbf16_item): a block of MC rows by a span of panels, independent of each other.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { MR = 6, NV = 4, PANEL = 16 * NV, KC = 512, MC = 192 };

long gemm_dpbf16_row_blocks(long m) { return (m + MC - 1) / MC; }
long gemm_dpbf16_panels(long out) { return (out + PANEL - 1) / PANEL; }

static __mmask32 columns(long width) { return width >= 32 ? 0xFFFFFFFFu : width <= 0 ? 0 : (1u << width) - 1; }

/* W[k0 : k0 + kc, c0 : c0 + width] into buf [ceil(kc / 2)][PANEL][2]; columns past `width` and the row after an odd
 * last k are zero */
static void pack(const uint16_t *w, long out, long k0, long kc, long c0, long width, uint16_t *buf) {
    // lane 2j: row k's column j, lane 2j + 1: row k + 1's (permutex2var's indices 32+ name its second operand)
    const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                        37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    for (long kk = 0; kk < kc; kk += 2) {
        const uint16_t *row = w + (k0 + kk) * out + c0;
        for (int h = 0; h < NV / 2; h++) {  // 32 columns at a time
            const __mmask32 m = columns(width - 32 * h);
            const __m512i a = _mm512_maskz_loadu_epi16(m, row + 32 * h);
            const __m512i b = kk + 1 < kc ? _mm512_maskz_loadu_epi16(m, row + out + 32 * h) : _mm512_setzero_si512();
            _mm512_store_si512(buf + kk * PANEL + 64 * h, _mm512_permutex2var_epi16(a, lo, b));
            _mm512_store_si512(buf + kk * PANEL + 64 * h + 32, _mm512_permutex2var_epi16(a, hi, b));
        }
    }
}

/* x[r, k], x[r, k + 1] as one 32-bit lane; `last` (an odd K block's final k): x[r, k] and a zero, x[r, k + 1] being
 * past the row (the next row's first value, or past the buffer) */
static inline __m512bh pair(const uint16_t *p, int last) {
    uint32_t v = *p;
    if (!last) memcpy(&v, p, sizeof v);  // x's rows may start at any 2-byte boundary
    return (__m512bh)_mm512_set1_epi32((int)v);
}

/* y[r0 : r0 + mr, c0 : c0 + width] (+)= x[r0 : r0 + mr, k0 : k0 + kc] . buf; mr a constant once inlined, so the
 * accumulators are registers */
static inline __attribute__((always_inline)) void tile(const uint16_t *x, long in, const uint16_t *buf, long k0,
                                                       long kc, float *y, long out, long c0, const __mmask16 *mask,
                                                       int first, const int mr) {
    __m512 acc[MR][NV];
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++) {
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++) {
            acc[r][j] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask[j], y + r * out + c0 + 16 * j);
        }
    }
    const uint16_t *xk = x + k0;
    for (long kk = 0; kk < kc; kk += 2) {
        const int last = kk + 1 == kc;
        __m512bh b[NV];
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++) b[j] = (__m512bh)_mm512_load_si512(buf + kk * PANEL + 32 * j);
#pragma GCC unroll 8
        for (int r = 0; r < mr; r++) {
            const __m512bh a = pair(xk + r * in + kk, last);
#pragma GCC unroll 4
            for (int j = 0; j < NV; j++) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], a, b[j]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++) {
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++) _mm512_mask_storeu_ps(y + r * out + c0 + 16 * j, mask[j], acc[r][j]);
    }
}

#define TILE(n) \
    case n: tile(x, in, buf, k0, kc, y, out, c0, mask, first, n); break;

static void tiles(const uint16_t *x, long in, const uint16_t *buf, long k0, long kc, float *y, long out, long c0,
                  const __mmask16 *mask, int first, long rows) {
    for (long r0 = 0; r0 < rows; r0 += MR, x += MR * in, y += MR * out) {
        switch (rows - r0 < MR ? rows - r0 : MR) {
            TILE(1) TILE(2) TILE(3) TILE(4) TILE(5) TILE(6)
        }
    }
}

/* Item `item` of `items`: items / gemm_dpbf16_row_blocks(m) spans of panels for each block of MC rows. Returns 0,
 * or -1 where the packing buffer could not be had (the caller reports it). */
int gemm_dpbf16_item(const uint16_t *x, const uint16_t *w, float *y, long m, long in, long out, long item,
                     long items) {
    const long blocks = gemm_dpbf16_row_blocks(m), spans = items / blocks, panels = gemm_dpbf16_panels(out);
    const long block = item / spans, span = item % spans;
    const long r0 = block * MC, rows = m - r0 < MC ? m - r0 : MC;
    const long p0 = panels * span / spans, p1 = panels * (span + 1) / spans;
    uint16_t *buf = aligned_alloc(64, sizeof(uint16_t) * KC * PANEL);
    if (buf == NULL) return -1;
    for (long k0 = 0; k0 < in; k0 += KC) {
        const long kc = in - k0 < KC ? in - k0 : KC;
        for (long p = p0; p < p1; p++) {
            const long c0 = p * PANEL, width = out - c0 < PANEL ? out - c0 : PANEL;
            __mmask16 mask[NV];
            for (int j = 0; j < NV; j++) mask[j] = (__mmask16)columns(width - 16 * j);
            pack(w, out, k0, kc, c0, width, buf);
            tiles(x + r0 * in, in, buf, k0, kc, y + r0 * out, out, c0, mask, k0 == 0, rows);
        }
    }
    free(buf);
    return 0;
}
