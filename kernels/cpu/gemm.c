/* Many-row products y[m, out] = x[m, in] . W[in, out] computed in float32 on AVX-512: a prompt's products (prefill,
 * a training step's forward) for jax_impl, where XLA:CPU's own GEMM runs these shapes below the processor's FMA rate
 * (docs/benchmarks.md). W is Flax's kernel layout [in, out]. Two entries share the loops: gemm_f32_item (float32
 * operands) and gemm_bf16_f32_item (bfloat16 storage, float32 compute: each bf16 value widened exactly to float32 as
 * it is packed, so the result is bit for bit the float32 entry's on the widened operands). The second is for
 * processors whose bf16 instructions, where they have any, run below their float32 FMAs (vdpbf16ps, gemm_dpbf16.c,
 * on an Intel Xeon without AMX exposed: docs/benchmarks.md). A third, gemm_bf16_f32_rows_item, is the second on
 * torch's layout W [out, in] (nn.Linear's), read in place: only the packing differs (`pack_bf16_rows`), so its results
 * are bit for bit the second's on the transposed weight. Built by kernels/cpu/build.py only where the processor has
 * avx512f, bound to XLA by gemm_ffi.cc, driven for torch by gemm_upcast_rows.c; reference: kernels/cpu/reference.py.
 *
 * Blocking. W is taken in panels of PANEL columns by KC rows, each copied ("packed") into a contiguous [KC, PANEL]
 * buffer (32 KB) that stays in L1 while every row tile of a block of up to MC rows of x runs over it: W's own rows
 * lie `out` floats apart, and rows 4-24 KB apart map to the same L1 sets and evict each other (unpacked, the same
 * loops ran at a fraction of the rate). The register tile is MR rows of y by PANEL columns: 2 * MR zmm
 * accumulators, two of W, x's entries broadcast from memory: from a copy of the block's rows of x ([rows, KC], made
 * once per K block, bf16 widened), whose rows lie 1 KB apart where x's own lie `in` values apart.
 *
 * Each output is one chain of fused multiply-adds in k order: a tile's accumulators start from y's partial sum of
 * the KC blocks before (or zero), so neither the blocking nor the thread count changes a result. Work is cut into
 * items (gemm_items): a block of MC rows by a span of panels, independent of each other.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

static __mmask16 lanes(long width) { return width >= 16 ? 0xFFFF : width <= 0 ? 0 : (__mmask16)((1u << width) - 1); }

/* bf16 bits to float32: they are its upper half, so the value is exact */
static inline __m512 widen(__m256i bits) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

/* 16 bf16 values from p, the lanes past `width` zero; a short run is copied first, so nothing past it is read (masked
 * 16-bit loads would need AVX512BW, which this file does not ask for) */
static inline __m512 widen_loadu(const uint16_t *p, long width) {
    if (width >= 16) return widen(_mm256_loadu_si256((const __m256i *)p));
    uint16_t part[16] = {0};
    if (width > 0) memcpy(part, p, sizeof(uint16_t) * width);
    return widen(_mm256_loadu_si256((const __m256i *)part));
}

/* the bf16 entry's pack: W[k0 : k0 + kc, c0 : c0 + width] widened into buf [kc, PANEL], the columns past `width`
 * zero */
static void pack_bf16(const uint16_t *w, long out, long k0, long kc, long c0, long width, float *buf) {
    for (long kk = 0; kk < kc; kk++) {
        const uint16_t *row = w + (k0 + kk) * out + c0;
        _mm512_store_ps(buf + kk * PANEL, widen_loadu(row, width));
        _mm512_store_ps(buf + kk * PANEL + 16, widen_loadu(row + 16, width - 16));
    }
}

/* torch's layout, W[out, in]: the panel's columns are W's rows c0 .. c0 + width, so buf[kk][j] = W[c0 + j][k0 + kk]
 * widened. Each row is read along k, in order (where the Flax layout's panel takes 64 bytes of each of kc rows), and
 * transposed by 32-bit gathers: one gathers W[c][k] and W[c][k + 1] for 16 rows c, the low half the first (shifted
 * up, it is the float32 value), the high half the second (masked). An odd last k is read one value a row: a 32-bit
 * load there would read past the row's end. Rows past `width` are zero. The gathers' offsets are int32, up to
 * 15 * in: `in` at most GEMM_ROWS_MAX_IN (the driver refuses more). */
static void pack_bf16_rows(const uint16_t *w, long in, long k0, long kc, long c0, long width, float *buf) {
    const __m512i offsets = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                               _mm512_set1_epi32((int)in));  // in bf16 values: scale 2 makes bytes
    const __m512i high = _mm512_set1_epi32((int)0xFFFF0000u);
    for (long half = 0; half < 2; half++) {
        const long first = c0 + 16 * half, n = width - 16 * half;
        if (n <= 0) {  // a last panel of 16 columns or fewer: its second half is zero (and W has no row `first`)
            for (long kk = 0; kk < kc; kk++) _mm512_store_ps(buf + kk * PANEL + 16, _mm512_setzero_ps());
            continue;
        }
        const __mmask16 live = lanes(n);
        const uint16_t *row0 = w + first * in + k0;  // W[first][k0]; gathered lanes are W's rows first + j
        long kk = 0;
        for (; kk + 1 < kc; kk += 2) {
            const __m512i pair = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, offsets, row0 + kk, 2);
            _mm512_store_ps(buf + kk * PANEL + 16 * half, _mm512_castsi512_ps(_mm512_slli_epi32(pair, 16)));
            _mm512_store_ps(buf + (kk + 1) * PANEL + 16 * half, _mm512_castsi512_ps(_mm512_and_si512(pair, high)));
        }
        if (kk < kc) {
            uint32_t bits[16] = {0};
            for (long j = 0; j < n && j < 16; j++) bits[j] = (uint32_t)row0[j * in + kk] << 16;
            _mm512_store_ps(buf + kk * PANEL + 16 * half, _mm512_castsi512_ps(_mm512_loadu_si512(bits)));
        }
    }
}

/* x[r0 : r0 + rows, k0 : k0 + kc] (float32, or bf16 widened) into xs [rows, KC]: the tiles' 12 rows of x then lie
 * 1 KB apart, not `in` values (rows 4 KB apart would share one L1 set) */
static void x_block(const float *x, const uint16_t *x16, long in, long r0, long rows, long k0, long kc, float *xs) {
    for (long r = 0; r < rows; r++) {
        const long at = (r0 + r) * in + k0;
        if (x16 == NULL) {
            memcpy(xs + r * KC, x + at, sizeof(float) * kc);
            continue;
        }
        for (long kk = 0; kk < kc; kk += 16) _mm512_storeu_ps(xs + r * KC + kk, widen_loadu(x16 + at + kk, kc - kk));
    }
}

/* Item `item` of `items`: items / gemm_row_blocks(m) spans of panels for each block of MC rows, x and W float32 or
 * (x16, w16 not NULL) bf16, widened into the x block and the panels, W bf16 [out, in] where `rows_layout`. Returns 0,
 * or -1 where a buffer could not be had (the caller reports it). */
static int item_of(const float *x, const float *w, const uint16_t *x16, const uint16_t *w16, float *y, long m, long in,
                   long out, long item, long items, int rows_layout) {
    const long blocks = gemm_row_blocks(m), spans = items / blocks, panels = gemm_panels(out);
    const long block = item / spans, span = item % spans;
    const long r0 = block * MC, rows = m - r0 < MC ? m - r0 : MC;
    const long p0 = panels * span / spans, p1 = panels * (span + 1) / spans;
    float *buf = aligned_alloc(64, sizeof(float) * KC * PANEL), *xs = aligned_alloc(64, sizeof(float) * MC * KC);
    if (buf == NULL || xs == NULL) {
        free(buf);
        free(xs);
        return -1;
    }
    for (long k0 = 0; k0 < in; k0 += KC) {
        const long kc = in - k0 < KC ? in - k0 : KC;
        x_block(x, x16, in, r0, rows, k0, kc, xs);
        for (long p = p0; p < p1; p++) {
            const long c0 = p * PANEL, width = out - c0 < PANEL ? out - c0 : PANEL;
            const __mmask16 lo = lanes(width), hi = lanes(width - 16);
            if (rows_layout) {
                pack_bf16_rows(w16, in, k0, kc, c0, width, buf);
            } else if (w16 != NULL) {
                pack_bf16(w16, out, k0, kc, c0, width, buf);
            } else {
                pack(w, out, k0, kc, c0, lo, hi, buf);
            }
            tiles(xs, KC, buf, 0, kc, y + r0 * out, out, c0, lo, hi, k0 == 0, rows);
        }
    }
    free(buf);
    free(xs);
    return 0;
}

int gemm_f32_item(const float *x, const float *w, float *y, long m, long in, long out, long item, long items) {
    return item_of(x, w, NULL, NULL, y, m, in, out, item, items, 0);
}

int gemm_bf16_f32_item(const uint16_t *x, const uint16_t *w, float *y, long m, long in, long out, long item,
                       long items) {
    return item_of(NULL, NULL, x, w, y, m, in, out, item, items, 0);
}

int gemm_bf16_f32_rows_item(const uint16_t *x, const uint16_t *w, float *y, long m, long in, long out, long item,
                            long items) {
    return item_of(NULL, NULL, x, w, y, m, in, out, item, items, 1);
}
