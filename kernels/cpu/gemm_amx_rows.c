/* Many-row bfloat16 products y[m, out] = x[m, in] . W[out, in]^T (+ b) on Intel's AMX tiles: a prompt's bf16
 * products for torch_impl, whose weights keep nn.Linear's layout [out, in]. Built by kernels/cpu/build.py only where
 * the processor has amx_tile and amx_bf16, called through ctypes by kernels/cpu/torch_gemm.py; reference:
 * kernels/cpu/reference.py ("rows"). The twin for Flax's layout [in, out] is gemm_amx.c.
 *
 * Why a kernel of its own for this layout: a tile product C += A . B takes A as 16 rows of 32 bf16 read in place
 * with any row stride, and B in the tile unit's pair-interleaved ("VNNI") layout. W [out, in] is already A's layout,
 * so here the product is computed transposed, y^T = W . x^T: W is read in place, never repacked, and only x (a
 * prompt's few hundred rows) is packed into B tiles, once per call. The libraries' plain-weight GEMM repacks W on
 * every call (docs/benchmarks.md has the comparison). Each C tile holds 16 outputs of 16 tokens; it is transposed in
 * registers on its way out and written in y's [m, out] layout.
 *
 * Arithmetic: each tile product (TDPBF16PS) multiplies bf16 pairs exactly and accumulates in float32, every output
 * summed over k in step order whatever its row's place or thread; the bias is added to the float32 sum, which is then
 * written as float32 or rounded once to bf16 as torch rounds (bf16.h). The tile unit treats bf16 subnormals as zero.
 *
 * Layout of the work. Rows are taken in chunks of at most CHUNK_BYTES of packed x (kept in the core's cache while
 * every block of W passes over it); within a chunk, x's 16-token blocks are packed step by step (32 k per step) into
 * B tiles, and W's 32-row blocks are shared among the threads, each multiplied by every token block of the chunk:
 * per step two A tiles (W's rows), two B tiles (32 tokens), four tile products into four C tiles. The steps are taken
 * KB at a time, every pair of token blocks in turn over the same A tiles while they are still in the core's caches,
 * the C tiles set aside between K blocks (faster than each pair's whole sum at once: docs/benchmarks.md). A block of
 * W with rows past `out` or a width not a multiple of 32 is first copied, zero-padded, into a buffer of the thread's:
 * a tile then never reads past W's end nor multiplies a neighbour's weights.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amx.h" /* the tile state, the C tiles' loads and stores, transpose16 */
#include "bf16.h"

// STEP: k per tile product; TILE: one tile's bf16 elements; BLOCK: W's rows (and tokens) per pair of tiles; KB: steps
// per K block; MAX_CHUNK: rows of x per chunk at most (the C tiles a thread keeps between K blocks: 4 KB per 32 rows)
enum { STEP = 32, TILE = 512, BLOCK = 32, KB = 8, MAX_CHUNK = 1024 };
#define CHUNK_BYTES (1L << 20)

/* Linux hands a process the tile state only when asked (once per process): 0, or the error of the request. */
int gemm_amx_rows_permit(void) { return amx_request(); }

/* B tile (token block tb, step s) of rows [r0, r1): pair-row kp holds (x[t][k + 2kp], x[t][k + 2kp + 1]) for the
 * block's 16 tokens t, zero past `in` and past r1. Shared by the team: called inside its parallel region. */
static void pack_x(const uint16_t *x, long r0, long r1, long in, long steps, uint16_t *xp) {
    const long blocks = (r1 - r0 + BLOCK - 1) / BLOCK * 2;
#pragma omp for schedule(static) collapse(2)
    for (long tb = 0; tb < blocks; tb++)
        for (long s = 0; s < steps; s++) {
            const long k = s * STEP, width = in - k < STEP ? in - k : STEP;
            const __mmask32 cols = width >= STEP ? 0xFFFFFFFFu : (__mmask32)((1u << width) - 1);
            __m512i r[16];  // token i's 32 bf16 of this step: 16 pairs
            for (int i = 0; i < 16; i++) {
                const long t = r0 + tb * 16 + i;
                r[i] = t < r1 ? _mm512_maskz_loadu_epi16(cols, x + t * in + k) : _mm512_setzero_si512();
            }
            transpose16(r);  // r[kp]: pair kp of the 16 tokens
            uint16_t *tile = xp + (tb * steps + s) * TILE;
            for (int kp = 0; kp < 16; kp++) _mm512_store_si512(tile + kp * 32, r[kp]);
        }
}

/* Rows [o0, o0 + 32) of W as A tiles' source: in place where whole (every row there, `in` a multiple of 32),
 * else copied into `pad` [32, steps * 32] with zeros past `in` and past `out`. Sets its row stride in bytes. */
static const uint16_t *w_block(const uint16_t *w, long o0, long in, long out, long steps, uint16_t *pad, long *ld) {
    if (o0 + BLOCK <= out && in % STEP == 0) {
        *ld = in * 2;
        return w + o0 * in;
    }
    const long width = steps * STEP;
    memset(pad, 0, BLOCK * width * sizeof(uint16_t));
    for (long i = 0; i < BLOCK && o0 + i < out; i++) memcpy(pad + i * width, w + (o0 + i) * in, in * sizeof(uint16_t));
    *ld = width * 2;
    return pad;
}

/* C tile c (16 outputs o0.. x 16 tokens t0..) into y's rows t0.. (those before r1) at columns o0.. (those before
 * out): transposed, plus the bias, float32 or rounded to bf16. */
static void store(const float *c, long o0, long t0, long r1, long out, const uint16_t *bias, void *y, int y_f32) {
    __m512i r[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_load_si512(c + 16 * i);
    transpose16(r);  // r[j]: token t0 + j's 16 outputs
    const long width = out - o0 < 16 ? out - o0 : 16;
    const __mmask16 cols = (__mmask16)((1u << width) - 1);
    const __m512 b = bias ? _mm512_castsi512_ps(_mm512_slli_epi32(
                                _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(cols, bias + o0)), 16))
                          : _mm512_setzero_ps();
    for (long j = 0; j < 16 && t0 + j < r1; j++) {
        const __m512 v = _mm512_add_ps(_mm512_castsi512_ps(r[j]), b);
        if (y_f32) {
            _mm512_mask_storeu_ps((float *)y + (t0 + j) * out + o0, cols, v);
            continue;
        }
        const __m128i lo = f32x8_to_bf16(_mm512_castps512_ps256(v));
        const __m128i hi = f32x8_to_bf16(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
        _mm256_mask_storeu_epi16((uint16_t *)y + (t0 + j) * out + o0, cols, _mm256_set_m128i(hi, lo));
    }
}

/* *buf holding at least `need` elements of `size` bytes, grown where it held fewer (*have: its elements); NULL where
 * memory could not be had. */
static void *grow(void **buf, long *have, long need, long size) {
    if (*have < need) {
        free(*buf);
        *have = 0;
        if ((*buf = aligned_alloc(64, need * size)) == NULL) return NULL;
        *have = need;
    }
    return *buf;
}

/* y [m, out] (float32 where y_f32, else bf16) = x [m, in] . W[out, in]^T + bias (NULL: none), all bf16 and
 * contiguous, m, in, out >= 1. Runs on the calling thread's OpenMP team. Returns 0, or -1 where a buffer could not
 * be had (nothing written). */
int gemm_amx_rows_bf16(const uint16_t *x, const uint16_t *w, const uint16_t *bias, void *y, long m, long in, long out,
                       int y_f32) {
    const long steps = (in + STEP - 1) / STEP, width = steps * STEP, blocks = (out + BLOCK - 1) / BLOCK;
    long chunk = CHUNK_BYTES / (width * 2) / BLOCK * BLOCK;  // rows of x packed at a time
    chunk = chunk < BLOCK ? BLOCK : chunk > MAX_CHUNK ? MAX_CHUNK : chunk;
    const long rows = m < chunk ? (m + BLOCK - 1) / BLOCK * BLOCK : chunk, pairs_max = rows / BLOCK;
    // Kept from call to call, by the calling thread (the packed x, which the team shares) and by each thread of the
    // team: buffers of these sizes mapped anew on every call would have their pages faulted in while the product
    // waits.
    static __thread void *xp = NULL, *pad = NULL, *acc = NULL;
    static __thread long xp_have = 0, pad_have = 0, acc_have = 0;
    uint16_t *const packed = grow(&xp, &xp_have, rows * width, sizeof(uint16_t));  // inside the team, xp is another
    if (packed == NULL) return -1;
    const int partial = out % BLOCK != 0 || in % STEP != 0;
    int failed = 0;
#pragma omp parallel
    {
        // This thread's copy of a partial block of W, and its C tiles between K blocks (four per pair of token blocks)
        uint16_t *const w_pad = partial ? grow(&pad, &pad_have, BLOCK * width, sizeof(uint16_t)) : NULL;
        float *const tiles = grow(&acc, &acc_have, pairs_max * 4 * 256, sizeof(float));
        if ((partial && w_pad == NULL) || tiles == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
        if (!failed) {
            amx_configure();
            for (long r0 = 0; r0 < m; r0 += chunk) {
                const long r1 = r0 + chunk < m ? r0 + chunk : m, pairs = (r1 - r0 + BLOCK - 1) / BLOCK;
                pack_x(x, r0, r1, in, steps, packed);  // its omp for ends on a barrier: x is packed before use
#pragma omp for schedule(static)
                for (long ob = 0; ob < blocks; ob++) {
                    long ld;
                    const uint16_t *a0 = w_block(w, ob * BLOCK, in, out, steps, w_pad, &ld), *a1 = a0 + 16 * (ld / 2);
                    // K blocks of KB steps: the pairs of token blocks take their turn on the same few A tiles
                    for (long s0 = 0; s0 < steps; s0 += KB) {
                        const long s1 = s0 + KB < steps ? s0 + KB : steps;
                        for (long p = 0; p < pairs; p++) {
                            const uint16_t *b0 = packed + 2 * p * steps * TILE, *b1 = b0 + steps * TILE;
                            float *c = tiles + p * 4 * 256;  // C tiles 0-3, 256 floats each
                            float *const q[4] = {c, c + 256, c + 512, c + 768};
                            amx_c_load(s0 == 0, q, 64);
                            for (long s = s0; s < s1; s++) {
                                _tile_loadd(4, a0 + s * STEP, ld);
                                _tile_loadd(5, a1 + s * STEP, ld);
                                _tile_loadd(6, b0 + s * TILE, 64);
                                _tile_loadd(7, b1 + s * TILE, 64);
                                _tile_dpbf16ps(0, 4, 6);  // W rows 0-15 x tokens 0-15
                                _tile_dpbf16ps(1, 4, 7);  // W rows 0-15 x tokens 16-31
                                _tile_dpbf16ps(2, 5, 6);
                                _tile_dpbf16ps(3, 5, 7);
                            }
                            amx_c_store(q, 64);
                            if (s1 < steps) continue;
                            for (int t = 0; t < 4; t++) {
                                const long o0 = ob * BLOCK + (t >> 1) * 16, t0 = r0 + p * BLOCK + (t & 1) * 16;
                                if (o0 < out) store(q[t], o0, t0, r1, out, bias, y, y_f32);
                            }
                        }
                    }
                }
            }
            _tile_release();
        }
    }
    return failed ? -1 : 0;
}
