/* A bfloat16 prompt's attention on Intel's AMX tiles: attend.c's attend_rows_bf16_item (the same item, the same
 * operands, the same softmax) where the processor has AMX-TILE and AMX-BF16 and Linux grants the tile state, and the
 * head width is a multiple of 32. attend.c's own loops sum in float32 fused multiply-adds, 8 lanes at a time; a
 * tile product (TDPBF16PS) does 16 x 16 x 32 multiply-adds at once, which is what a long prompt's attention is.
 *
 * Arithmetic (the reference's: torch_impl/attention.py's attend, held to the kernel tolerance table's attention row):
 *   scores  q . k: bf16 products are exact in float32, summed in float32 in the tile unit's order.
 *   softmax attend.c's (attend_softmax_row), on the float32 scores.
 *   output  p . v with p float32: p is split into hi = bf16(p) and lo = bf16(p - hi) (p - hi is exact; both rounded
 *           to nearest even by VCVTNEPS2BF16), each multiplied into float32 sums of its own, and the two sums added;
 *           what is left out, p - hi - lo, is below 2**-16 of p, far under the output's own rounding to bf16
 *           (2**-8). The result is rounded once to bf16.
 * The tile unit and VCVTNEPS2BF16 treat subnormals (below 2**-126) as zero, inputs and sums alike.
 *
 * Layout: an item's query rows (its steps' g heads, padded to 32 with the last row) are copied into a [rows, d] block,
 * the A tiles of the scores; the keys are the B tiles, 16 keys by 32 head dims, their pairs of dims interleaved
 * (the tile unit's "VNNI" layout): a 16 x 16 transpose of 32-bit pairs. The weights (hi and lo) are the A tiles of
 * the output, [rows, keys]; the values, [d, S] in the cache, are its B tiles: 16 dims by 32 keys, pairs of keys
 * interleaved, again a transpose of pairs. Keys past the item's last allowed key are not read: their weights are 0.
 * Compiled everywhere with target attributes; only run where attend_amx_usable says so.
 */
#include <cpuid.h>
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512bf16")))
#include "amx.h" /* the tile state: Linux's grant, the configuration (all 8 tiles 16 rows of 64 bytes) */
#include "decode_ops.h"
#include "vec8.h"

enum { TILE = 512 /* one B tile's bf16 elements: 16 rows of 32 */ };

/* AMX-TILE, AMX-BF16, AVX-512F, BW and BF16 (CPUID leaf 7), and Linux's grant of the tile state to this process
 * (asked once). */
int attend_amx_usable(void) {
    static int known = -1; /* atomic: the first items of a call may ask from several threads at once */
    int usable = __atomic_load_n(&known, __ATOMIC_ACQUIRE);
    if (usable < 0) {
        unsigned a, b, c, d, bf16 = 0;
        if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) bf16 = a >> 5 & 1; /* AVX512_BF16 */
        usable = bf16 && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b >> 16 & 1) && (b >> 30 & 1) /* AVX-512F, BW */
                 && (d >> 24 & 1) && (d >> 22 & 1) /* AMX-TILE, AMX-BF16 */
                 && amx_request() == 0;
        __atomic_store_n(&known, usable, __ATOMIC_RELEASE);
    }
    return usable;
}

/* dst[c][r] = (src_r[2c], src_r[2c + 1]) for 16 rows src_r = src + r * stride and 16 pairs c: a B tile whose rows
 * interleave pairs of src's columns; an element at or past `limit` (columns) or a row at or past `rows` is zero and
 * not read. */
static inline AMX_TARGET void pair_transpose(const uint16_t *src, long stride, long rows, long limit, uint16_t *dst) {
    const __mmask32 cols = limit >= 32 ? 0xFFFFFFFFu : limit <= 0 ? 0 : (__mmask32)((1u << limit) - 1);
    __m512i r[16];
    for (long i = 0; i < 16; i++)
        r[i] = i < rows ? _mm512_maskz_loadu_epi16(cols, src + i * stride) : _mm512_setzero_si512();
    transpose16(r);
    for (long c = 0; c < 16; c++) _mm512_storeu_si512(dst + c * 32, r[c]);
}

AMX_TARGET void attend_rows_bf16_amx_item(const uint16_t *q, const uint16_t *k, const uint16_t *v, const uint8_t *mask,
                                   uint16_t *out, long item, long steps, long n_kv, long g, long d, long keys,
                                   long mask_row, long k_head, long v_head, long v_row, float scale, float cap) {
    const long blocks = (steps + kAttendBlockSteps - 1) / kAttendBlockSteps, kv = item / blocks;
    const long t0 = item % blocks * kAttendBlockSteps;
    const long t1 = t0 + kAttendBlockSteps < steps ? t0 + kAttendBlockSteps : steps;
    const long m = (t1 - t0) * g, mp = (m + 31) / 32 * 32; /* query rows, padded to pairs of whole tiles */
    const uint16_t *kh = k + kv * k_head, *vh = v + kv * v_head;
    long *end = malloc(sizeof(long) * m), top = 0; /* each query row's allowed end, the latest */
    if (!end) abort();
    for (long r = 0; r < m; r++) {
        end[r] = r % g ? end[r - 1] : attend_allowed_end(mask + (t0 + r / g) * mask_row, keys);
        top = end[r] > top ? end[r] : top;
    }
    const long ps = (top + 31) / 32 * 32, dt = d / 16; /* a row of scores (whole key tiles); dim tiles */
    float *p = malloc(sizeof(float) * (mp * ps + 2 * mp * d)), *o = p + mp * ps; /* scores; hi's and lo's sums */
    uint16_t *qb = malloc(sizeof(uint16_t) * (mp * d + 2 * mp * ps + 32 * d + dt * ps * 16));
    if (!p || !qb) abort();
    uint16_t *hi = qb + mp * d, *lo = hi + mp * ps, *kb = lo + mp * ps, *vb = kb + 32 * d;
    for (long r = 0; r < mp; r++) { /* row r = (t - t0) * g + j; the padding repeats the last */
        const long row = r < m ? r : m - 1;
        memcpy(qb + r * d, q + ((t0 + row / g) * n_kv + kv) * g * d + row % g * d, sizeof(uint16_t) * d);
    }
    amx_configure();
    /* Four independent sums at a time (a tile product waits on the previous one into the same tile): scores of two
     * row tiles by two key tiles; weighted sums of two dim tiles, hi and lo apart (added at the end). */
    for (long s0 = 0; s0 < ps; s0 += 32) { /* scores of 32 keys: B tiles of d / 32 dims' pairs, 16 keys each */
        for (long c = 0; c < d / 32; c++) {
            pair_transpose(kh + s0 * d + 32 * c, d, top - s0, 32, kb + (2 * c) * TILE);
            pair_transpose(kh + (s0 + 16) * d + 32 * c, d, top - s0 - 16, 32, kb + (2 * c + 1) * TILE);
        }
        for (long r = 0; r < mp; r += 32) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (long c = 0; c < d / 32; c++) {
                _tile_loadd(4, qb + r * d + 32 * c, d * sizeof(uint16_t));
                _tile_loadd(5, qb + (r + 16) * d + 32 * c, d * sizeof(uint16_t));
                _tile_loadd(6, kb + (2 * c) * TILE, 64);
                _tile_loadd(7, kb + (2 * c + 1) * TILE, 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
            _tile_stored(0, p + r * ps + s0, ps * sizeof(float));
            _tile_stored(1, p + r * ps + s0 + 16, ps * sizeof(float));
            _tile_stored(2, p + (r + 16) * ps + s0, ps * sizeof(float));
            _tile_stored(3, p + (r + 16) * ps + s0 + 16, ps * sizeof(float));
        }
    }
    for (long r = 0; r < mp; r++) { /* weights, split into hi + lo; past a row's end, and padding rows, zero */
        float *pr = p + r * ps;
        const long e = r < m ? end[r] : 0;
        if (r < m) attend_softmax_row(pr, mask + (t0 + r / g) * mask_row, e, scale, cap);
        for (long s = 0; s < ps; s += 16) {
            const long n = e - s < 0 ? 0 : (e - s < 16 ? e - s : 16);
            const __m512 x = _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), pr + s);
            const __m256i h = (__m256i)_mm512_cvtneps_pbh(x);
            const __m512 back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
            _mm256_storeu_si256((__m256i *)(hi + r * ps + s), h);
            _mm256_storeu_si256((__m256i *)(lo + r * ps + s), (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(x, back)));
        }
    }
    for (long t = 0; t < dt; t++) /* values: B tiles of 16 dims by 32 keys' pairs, [dim tile][key tile] */
        for (long s0 = 0; s0 < ps; s0 += 32)
            pair_transpose(vh + 16 * t * v_row + s0, v_row, 16, top - s0, vb + (t * ps / 32 + s0 / 32) * TILE);
    float *o_lo = o + mp * d;
    for (long r = 0; r < mp; r += 16)
        for (long t = 0; t < dt; t += 2) { /* two dim tiles at a time: d is a multiple of 32 */
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (long s0 = 0; s0 < ps; s0 += 32) {
                _tile_loadd(4, hi + r * ps + s0, ps * sizeof(uint16_t));
                _tile_loadd(5, lo + r * ps + s0, ps * sizeof(uint16_t));
                _tile_loadd(6, vb + (t * ps / 32 + s0 / 32) * TILE, 64);
                _tile_loadd(7, vb + ((t + 1) * ps / 32 + s0 / 32) * TILE, 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 5, 6);
                _tile_dpbf16ps(2, 4, 7);
                _tile_dpbf16ps(3, 5, 7);
            }
            _tile_stored(0, o + r * d + 16 * t, d * sizeof(float));
            _tile_stored(1, o_lo + r * d + 16 * t, d * sizeof(float));
            _tile_stored(2, o + r * d + 16 * (t + 1), d * sizeof(float));
            _tile_stored(3, o_lo + r * d + 16 * (t + 1), d * sizeof(float));
        }
    _tile_release();
    for (long r = 0; r < m; r++) {
        uint16_t *dst = out + ((t0 + r / g) * n_kv + kv) * g * d + r % g * d;
        for (long i = 0; i < d; i++) dst[i] = f32_to_bf16(o[r * d + i] + o_lo[r * d + i]);
    }
    free(qb);
    free(p);
    free(end);
}
