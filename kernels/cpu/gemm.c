/* Many-row float32 products y[m, out] = x[m, in] . W[in, out] on AVX-512: a prompt's products (prefill, a training
 * step's forward) for jax_impl, where XLA:CPU's own GEMM runs these shapes below the processor's FMA rate
 * (docs/benchmarks.md). W is Flax's kernel layout [in, out]. Built by kernels/cpu/build.py only where the processor
 * has avx512f, bound to XLA by gemm_ffi.cc; reference: kernels/cpu/reference.py.
 *
 * Blocking. W is taken in panels of PANEL columns by KC rows, each copied ("packed") into a contiguous [KC, PANEL]
 * buffer (32 KB) that stays in L1 while every row tile of a block of up to MC rows of x runs over it: W's own rows
 * lie `out` floats apart, and rows 4-24 KB apart map to the same L1 sets and evict each other (unpacked, the same
 * loops ran at a fraction of the rate). The register tile is MR rows of y by PANEL columns: 2 * MR zmm
 * accumulators, two of W, x's entries broadcast from memory.
 *
 * Each output is one chain of fused multiply-adds in k order: a tile's accumulators start from y's partial sum of
 * the KC blocks before (or zero), so neither the blocking nor the thread count changes a result. Work is cut into
 * items (gemm_items): a block of MC rows by a span of panels, independent of each other.
 */
#include <immintrin.h>
#include <stdlib.h>

enum { MR = 12, PANEL = 32, KC = 256, MC = 192 };

long gemm_row_blocks(long m) { return (m + MC - 1) / MC; }
long gemm_panels(long out) { return (out + PANEL - 1) / PANEL; }

/* W[k0 : k0 + kc, c0 : c0 + width] into buf [kc, PANEL], the columns past `width` zero */
static void pack(const float *w, long out, long k0, long kc, long c0, __mmask16 lo, __mmask16 hi, float *buf) {
    for (long kk = 0; kk < kc; kk++) {
        const float *row = w + (k0 + kk) * out + c0;
        _mm512_store_ps(buf + kk * PANEL, _mm512_maskz_loadu_ps(lo, row));
        _mm512_store_ps(buf + kk * PANEL + 16, _mm512_maskz_loadu_ps(hi, row + 16));
    }
}

/* y[r0 : r0 + mr, c0 : c0 + width] (+)= x[r0 : r0 + mr, k0 : k0 + kc] . buf; mr a constant once inlined, so the
 * accumulators are registers (an array indexed by a run-time count would live in memory). */
static inline __attribute__((always_inline)) void tile(const float *x, long in, const float *buf, long k0, long kc,
                                                       float *y, long out, long c0, __mmask16 lo, __mmask16 hi,
                                                       int first, const int mr) {
    __m512 acc[MR][2];
#pragma GCC unroll 16
    for (int r = 0; r < mr; r++) {
        acc[r][0] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(lo, y + r * out + c0);
        acc[r][1] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(hi, y + r * out + c0 + 16);
    }
    const float *xk = x + k0;
    for (long kk = 0; kk < kc; kk++) {
        const __m512 b0 = _mm512_load_ps(buf + kk * PANEL), b1 = _mm512_load_ps(buf + kk * PANEL + 16);
#pragma GCC unroll 16
        for (int r = 0; r < mr; r++) {
            const __m512 a = _mm512_set1_ps(xk[r * in + kk]);
            acc[r][0] = _mm512_fmadd_ps(a, b0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(a, b1, acc[r][1]);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < mr; r++) {
        _mm512_mask_storeu_ps(y + r * out + c0, lo, acc[r][0]);
        _mm512_mask_storeu_ps(y + r * out + c0 + 16, hi, acc[r][1]);
    }
}

#define TILE(n) \
    case n: tile(x, in, buf, k0, kc, y, out, c0, lo, hi, first, n); break;

static void tiles(const float *x, long in, const float *buf, long k0, long kc, float *y, long out, long c0,
                  __mmask16 lo, __mmask16 hi, int first, long rows) {
    for (long r0 = 0; r0 < rows; r0 += MR, x += MR * in, y += MR * out) {
        switch (rows - r0 < MR ? rows - r0 : MR) {
            TILE(1) TILE(2) TILE(3) TILE(4) TILE(5) TILE(6) TILE(7) TILE(8) TILE(9) TILE(10) TILE(11) TILE(12)
        }
    }
}

/* Item `item` of `items`: items / gemm_row_blocks(m) spans of panels for each block of MC rows. Returns 0, or -1
 * where the packing buffer could not be had (the caller reports it). */
int gemm_f32_item(const float *x, const float *w, float *y, long m, long in, long out, long item, long items) {
    const long blocks = gemm_row_blocks(m), spans = items / blocks, panels = gemm_panels(out);
    const long block = item / spans, span = item % spans;
    const long r0 = block * MC, rows = m - r0 < MC ? m - r0 : MC;
    const long p0 = panels * span / spans, p1 = panels * (span + 1) / spans;
    float *buf = aligned_alloc(64, sizeof(float) * KC * PANEL);
    if (buf == NULL) return -1;
    for (long k0 = 0; k0 < in; k0 += KC) {
        const long kc = in - k0 < KC ? in - k0 : KC;
        for (long p = p0; p < p1; p++) {
            const long c0 = p * PANEL, width = out - c0 < PANEL ? out - c0 : PANEL;
            const __mmask16 lo = width >= 16 ? 0xFFFF : (__mmask16)((1u << width) - 1);
            const __mmask16 hi = width >= 32 ? 0xFFFF : width <= 16 ? 0 : (__mmask16)((1u << (width - 16)) - 1);
            pack(w, out, k0, kc, c0, lo, hi, buf);
            tiles(x + r0 * in, in, buf, k0, kc, y + r0 * out, out, c0, lo, hi, k0 == 0, rows);
        }
    }
    free(buf);
    return 0;
}
