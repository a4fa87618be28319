/* Many-row bfloat16 products y[m, out] = x[m, in] . W[in, out] on Intel's AMX tiles, float32 out: a prompt's bf16
 * products (prefill, a training step's forward) for jax_impl, where XLA:CPU's bf16 GEMM ran below what the
 * processor's tile unit does (docs/benchmarks.md). W is Flax's kernel layout [in, out]. Built by kernels/cpu/build.py
 * only where the processor has amx_tile and amx_bf16, bound to XLA by gemm_amx_ffi.cc; reference:
 * kernels/cpu/reference.py. The float32 twin is gemm.c.
 *
 * Arithmetic: each tile product (TDPBF16PS) multiplies bf16 pairs exactly and accumulates in float32, so the product
 * is the bf16 contract's (bf16 operands, float32 accumulation, the caller rounds once); the order of the float32
 * sums is the tile unit's, and it treats bf16 subnormals as zero (tests/kernels/test_cpu_gemm.py holds it to the
 * float32 table's bound).
 *
 * Layout. x is read in place as the A tiles (16 rows x 32 bf16, its row stride `ldx`): the launcher hands over x
 * padded with zeros to a multiple of 32 rows and 32 columns where it is not one (gemm_amx_ffi.cc), so every tile is
 * whole. W is taken in panels of 32 columns, repacked K block by K block (KB steps of 32 k) for GROUP panels at a
 * time into the tile unit's pair-interleaved ("VNNI") layout: per step, two B tiles of 16 rows, row kp holding
 * (W[2kp][c], W[2kp + 1][c]) for each of 16 columns c, zero past `in` and past the last column. A 32 x 32 block of
 * y is four C tiles, carried from K block to K block through y: per step, two A tiles, two B tiles, four tile
 * products.
 *
 * Work is cut into items (gemm_amx_item): a block of MC rows by a span of panels, independent of each other; each
 * output is summed over k in step order whatever the cut.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amx.h" /* the tile state: Linux's grant, the configuration (all 8 tiles 16 rows of 64 bytes) */

// TILE: one B tile's bf16 elements (16 rows of 64 bytes); PAIR: a step's two; KB: steps per K block; GROUP: panels
// Tiles 0-3: C, 16 x 16 float32; 4-5: A, 16 rows x 32 bf16; 6-7: B, 16 pair-rows x 16 columns.
enum { PANEL = 32, MC = 128, STEP = 32, TILE = 512, PAIR = 2 * TILE, KB = 8, GROUP = 16 };

long gemm_amx_row_blocks(long m) { return (m + MC - 1) / MC; }
long gemm_amx_panels(long out) { return (out + PANEL - 1) / PANEL; }

/* Linux hands a process the tile state only when asked (once per process): 0, or the error of the request. */
int gemm_amx_permit(void) { return amx_request(); }

/* Rows [k0, k0 + 32 * steps) of W's panels c0 / 32 .. + panels into buf, panel j's `steps` pairs of B tiles at
 * buf + j * steps * PAIR (the layout above). Two rows of W are read at a time across every panel of the group,
 * so W is read row by row: taken panel by panel, each row of a panel is a cache line on a page of its own, and the
 * reads waited on address translation and memory for most of a prompt's product (docs/benchmarks.md). */
static void pack(const uint16_t *w, long in, long out, long k0, long steps, long c0, long panels, uint16_t *buf) {
    int16_t lo[32], hi[32];  // a's element i, then b's: a0 b0 a1 b1 ... (columns 0-15; 16-31)
    for (int i = 0; i < 16; i++) lo[2 * i] = i, lo[2 * i + 1] = 32 + i, hi[2 * i] = 16 + i, hi[2 * i + 1] = 48 + i;
    const __m512i lo_idx = _mm512_loadu_si512(lo), hi_idx = _mm512_loadu_si512(hi);
    for (long s = 0; s < steps; s++)
        for (long kp = 0; kp < 16; kp++) {
            const long k = k0 + STEP * s + 2 * kp;
            const uint16_t *ra = w + k * out, *rb = ra + out;
            for (long j = 0; j < panels; j++) {
                const long c = c0 + j * PANEL, width = out - c < PANEL ? out - c : PANEL;
                const __mmask32 cols = width >= PANEL ? 0xFFFFFFFFu : (__mmask32)((1u << width) - 1);
                const __m512i a = k < in ? _mm512_maskz_loadu_epi16(cols, ra + c) : _mm512_setzero_si512();
                const __m512i b = k + 1 < in ? _mm512_maskz_loadu_epi16(cols, rb + c) : _mm512_setzero_si512();
                uint16_t *t0 = buf + (j * steps + s) * PAIR + kp * 32;
                _mm512_store_si512(t0, _mm512_permutex2var_epi16(a, lo_idx, b));
                _mm512_store_si512(t0 + TILE, _mm512_permutex2var_epi16(a, hi_idx, b));
            }
        }
}

/* Item `item` of `items`: items / gemm_amx_row_blocks(m) spans of panels for each block of MC rows. Every tile is
 * whole: m a multiple of 32; x [m, ldx] with ldx >= in rounded up to 32, zero past `in`; y [m, ldy] with ldy >= out
 * rounded up to 32 (its columns past `out` get zeros). Returns 0, or -1 where the packing buffer could not be had
 * (the caller reports it). */
int gemm_amx_item(const uint16_t *x, long ldx, const uint16_t *w, float *y, long ldy, long m, long in, long out,
                  long item, long items) {
    const long blocks = gemm_amx_row_blocks(m), spans = items / blocks, panels = gemm_amx_panels(out);
    const long block = item / spans, span = item % spans;
    const long r0 = block * MC, r1 = r0 + MC < m ? r0 + MC : m;
    const long p0 = panels * span / spans, p1 = panels * (span + 1) / spans;
    const long steps = (in + STEP - 1) / STEP;
    // This thread's packing buffer, kept from call to call: one of this size mapped anew by malloc on every call
    // has its pages faulted in while the product waits.
    static __thread uint16_t *buf = NULL;
    if (buf == NULL && (buf = aligned_alloc(64, GROUP * KB * PAIR * sizeof(uint16_t))) == NULL) return -1;
    amx_configure();
    for (long g = p0; g < p1; g += GROUP) {
        const long group = p1 - g < GROUP ? p1 - g : GROUP;
        for (long s0 = 0; s0 < steps; s0 += KB) {
            const long kb = steps - s0 < KB ? steps - s0 : KB;
            pack(w, in, out, s0 * STEP, kb, g * PANEL, group, buf);
            for (long j = 0; j < group; j++) {
                const uint16_t *b = buf + j * kb * PAIR;
                for (long r = r0; r < r1; r += 32) {
                    float *c = y + r * ldy + (g + j) * PANEL;
                    float *const q[4] = {c, c + 16, c + 16 * ldy, c + 16 * ldy + 16};
                    const long stride = ldy * sizeof(float);
                    amx_c_load(s0 == 0, q, stride);
                    const uint16_t *xa = x + r * ldx + s0 * STEP, *xb = xa + 16 * ldx;  // rows r.., r + 16..
                    for (long s = 0; s < kb; s++) {
                        _tile_loadd(4, xa + STEP * s, ldx * 2);
                        _tile_loadd(5, xb + STEP * s, ldx * 2);
                        _tile_loadd(6, b + s * PAIR, 64);
                        _tile_loadd(7, b + s * PAIR + TILE, 64);
                        _tile_dpbf16ps(0, 4, 6);
                        _tile_dpbf16ps(1, 4, 7);
                        _tile_dpbf16ps(2, 5, 6);
                        _tile_dpbf16ps(3, 5, 7);
                    }
                    amx_c_store(q, stride);
                }
            }
        }
    }
    _tile_release();
    return 0;
}
