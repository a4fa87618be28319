/* Grouped attention over a KV cache for a decode step's few query rows (or a prompt's): torch_impl/attention.py's
 * attend (jax_impl/attention.py's), which the tests hold it to. torch_impl calls `attend_NAME` through
 * kernels/cpu/torch_decode_ops.py, jax_impl `attend_NAME_item` on XLA's threads (decode_ops_ffi.cc) and decode_layer.c
 * it within a layer. Built with -ffp-contract=off (kernels/cpu/build.py): the products sum with fused multiply-adds,
 * as the BLAS behind the reference's einsum computes them, in 8 lanes and then across them; the rest rounds as the
 * reference does. exp is vec8.h's exp8. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "decode_ops.h"
#include "vec8.h"

/* out[u] = sum_i a[i] * row_u[i] (i < len) for the n <= 8 rows row_u = first + u * stride: summed in 8 lanes, then
 * across them (sums8), then the tail. Eight rows at a time, so that eight independent sums fill the pipeline
 * instead of one waiting on itself; a block short of eight repeats its last row (those sums are dropped), so the
 * loop over the rows has a fixed count and the accumulators stay in registers. Rows of at most SHORT_ROW elements (a
 * head's key, a short cache's values) are summed one after another instead, each read in address order, which the
 * cache's own prefetchers follow: a decode step's cache comes from memory (every layer's weights passed through the
 * caches since its last read), and stepping across eight such rows at once, fetching ahead, read it at half the rate
 * (docs/benchmarks.md: measured on an AMD Zen 4 only). Each sum's order is the same either way. `fetch`, in the
 * eight-row order: fetch the rows four blocks on (only the first of several calls over the same rows asks: the others
 * would fetch what is on its way). A prefetch never faults, so the rows fetched ahead may run past the operand's
 * end. */
#define SHORT_ROW 256
#define DEFINE_DOTS8(NAME, T, LD, LD8)                                                                                 \
    static inline void NAME(const float *a, const T *first, long stride, long n, long len, float *out,                 \
                            int fetch) {                                                                               \
        const T *row[8];                                                                                               \
        for (long u = 0; u < 8; u++) row[u] = first + (u < n ? u : n - 1) * stride;                                    \
        const int by_row = len <= SHORT_ROW;                                                                           \
        for (long u = 0; fetch && !by_row && u < 8; u++) /* rows four blocks on, fetched while this block sums: */    \
            for (long b = 0; b < len * (long)sizeof(T); b += 64) /* the cache's own prefetch misses them */            \
                _mm_prefetch((const char *)(first + (32 + u) * stride) + b, _MM_HINT_T0);                              \
        __m256 acc[8];                                                                                                 \
        for (long u = 0; u < 8; u++) acc[u] = _mm256_setzero_ps();                                                     \
        long vec = len / 8 * 8;                                                                                        \
        if (by_row)                                                                                                    \
            for (long u = 0; u < n; u++) /* row by row: the repeated rows' sums are dropped, so not computed */        \
                for (long i = 0; i < vec; i += 8)                                                                      \
                    acc[u] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), LD8(row[u] + i), acc[u]);                         \
        else                                                                                                           \
            for (long i = 0; i < vec; i += 8) {                                                                        \
                __m256 av = _mm256_loadu_ps(a + i);                                                                    \
                for (long u = 0; u < 8; u++) acc[u] = _mm256_fmadd_ps(av, LD8(row[u] + i), acc[u]);                    \
            }                                                                                                          \
        float sums[8];                                                                                                 \
        _mm256_storeu_ps(sums, sums8(acc));                                                                            \
        for (long u = 0; u < n; u++) {                                                                                 \
            for (long i = vec; i < len; i++) sums[u] += a[i] * LD(row[u], i);                                          \
            out[u] = sums[u];                                                                                          \
        }                                                                                                              \
    }
DEFINE_DOTS8(dots8_f32, float, ld_f32, ld8_f32)
DEFINE_DOTS8(dots8_bf16, uint16_t, ld_bf16, ld8_bf16)

/* softmax's last two steps on scores p[0..n) with maximum `top`: p = exp(p - top) (exp8), then p / sum(p), the sum
 * in 8 lanes, then across them, then the tail (torch's CPU softmax sums in vector lanes too; one running scalar sum
 * waited on itself, a long prompt's attention most of all). */
static void softmax_tail(float *p, long n, float top) {
    const __m256 t = _mm256_set1_ps(top);
    __m256 acc = _mm256_setzero_ps();
    long s = 0;
    for (; s + 8 <= n; s += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + s), t));
        _mm256_storeu_ps(p + s, e);
        acc = _mm256_add_ps(acc, e);
    }
    float sum = sum1(acc), e[8];
    if (s < n) {
        _mm256_storeu_ps(e, exp8(_mm256_sub_ps(part8_f32(p + s, n - s), t)));
        for (long i = 0; s + i < n; i++) sum += p[s + i] = e[i];
    }
    const __m256 sum8 = _mm256_set1_ps(sum);
    for (s = 0; s + 8 <= n; s += 8) _mm256_storeu_ps(p + s, _mm256_div_ps(_mm256_loadu_ps(p + s), sum8));
    for (; s < n; s++) p[s] = p[s] / sum;
}

/* The end of the keys a query row weighs: one past its last allowed key (mt: the row's mask). Keys past it weigh
 * exactly 0 (exp of the float32 minimum less the row's maximum), so they are not computed: a prompt's causal mask
 * halves the work. A fully masked row attends over every key with equal weights, as the reference does. */
long attend_allowed_end(const uint8_t *mt, long keys) {
    long hi = keys;
    for (; hi >= 32; hi -= 32) { /* 32 mask bytes at a time from the end: a prompt's early rows mask most keys */
        const __m256i bytes = _mm256_loadu_si256((const __m256i *)(mt + hi - 32));
        const __m256i zero = _mm256_cmpeq_epi8(bytes, _mm256_setzero_si256());
        const unsigned allowed = ~(unsigned)_mm256_movemask_epi8(zero); /* bit j: byte hi - 32 + j allowed */
        if (allowed) return hi - 32 + (32 - __builtin_clz(allowed));
    }
    while (hi > 0 && !mt[hi - 1]) hi--;
    return hi ? hi : keys;
}

/* A row's scores p[0..hi) -> its weights: scaled, soft-capped (cap > 0: cap * tanh(x / cap)), masked to the float32
 * minimum, then softmax as torch's (exp(x - max) / sum, the sum in vector lanes). Eight lanes at a time where that
 * computes the same values (a product, a select, a maximum). */
void attend_softmax_row(float *p, const uint8_t *mt, long hi, float scale, float cap) {
    const __m256 sc = _mm256_set1_ps(scale), lowest = _mm256_set1_ps(-3.40282347e38f);
    __m256 top8 = _mm256_set1_ps(-INFINITY);
    long s = 0;
    if (cap <= 0.0f)
        for (; s + 8 <= hi; s += 8) {
            const __m128i m8 = _mm_loadl_epi64((const __m128i *)(mt + s)); /* 8 mask bytes -> 8 lanes, 0: masked */
            const __m256i zero = _mm256_cmpeq_epi32(_mm256_cvtepu8_epi32(m8), _mm256_setzero_si256());
            const __m256 masked = _mm256_castsi256_ps(zero);
            const __m256 x = _mm256_blendv_ps(_mm256_mul_ps(_mm256_loadu_ps(p + s), sc), lowest, masked);
            _mm256_storeu_ps(p + s, x);
            top8 = _mm256_max_ps(top8, x);
        }
    float lanes[8], top = -INFINITY;
    _mm256_storeu_ps(lanes, top8);
    for (int u = 0; u < 8; u++) top = lanes[u] > top ? lanes[u] : top;
    for (; s < hi; s++) {
        float x = p[s] * scale;
        if (cap > 0.0f) x = tanhf(x / cap) * cap;
        if (!mt[s]) x = -3.40282347e38f;
        p[s] = x;
        top = x > top ? x : top;
    }
    softmax_tail(p, hi, top);
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
#define DEFINE_ATTEND(NAME, T, LD, DOTS8, ST)                                                                          \
    void NAME##_item(const T *q, const T *k, const T *v, const uint8_t *mask, T *out, long item, long n_kv,            \
                     long g, long d, long keys, long mask_row, long k_head, long v_head, long v_row, float scale,      \
                     float cap) {                                                                                      \
        const long t = item / n_kv, kv = item % n_kv;                                                                  \
        const T *kh = k + kv * k_head, *vh = v + kv * v_head;                                                          \
        const uint8_t *mt = mask + t * mask_row;                                                                       \
        const long hi = attend_allowed_end(mt, keys);                                                                  \
        float *p = malloc(sizeof(float) * g * (keys + d)), *qf = p + g * keys; /* scores, queries in f32 */            \
        if (!p) abort();                                                                                               \
        for (long j = 0; j < g * d; j++) qf[j] = LD(q + (t * n_kv + kv) * g * d, j);                                   \
        for (long s0 = 0; s0 < hi; s0 += 8) /* q . k for keys s0 .. s0 + 7, every query of the group */                \
            for (long j = 0; j < g; j++)    /* while those keys are in L1 */                                           \
                DOTS8(qf + j * d, kh + s0 * d, d, hi - s0 < 8 ? hi - s0 : 8, d, p + j * keys + s0, !j);                \
        for (long j = 0; j < g; j++) attend_softmax_row(p + j * keys, mt, hi, scale, cap);                             \
        for (long i0 = 0; i0 < d; i0 += 8) { /* p . v for value rows i0 .. i0 + 7, every query of the group */         \
            long n = d - i0 < 8 ? d - i0 : 8;                                                                          \
            for (long j = 0; j < g; j++) {                                                                             \
                float sums[8];                                                                                         \
                T *o = out + ((t * n_kv + kv) * g + j) * d;                                                            \
                DOTS8(p + j * keys, vh + i0 * v_row, v_row, n, hi, sums, !j);                                          \
                for (long u = 0; u < n; u++) ST(o, i0 + u, sums[u]);                                                   \
            }                                                                                                          \
        }                                                                                                              \
        free(p);                                                                                                       \
    }                                                                                                                  \
    void NAME(const T *q, const T *k, const T *v, const uint8_t *mask, T *out, long steps, long n_kv, long g,          \
              long d, long keys, long k_head, long v_head, long v_row, float scale, float cap) {                       \
        _Pragma("omp parallel for schedule(static, 1)") /* interleaved: a causal mask's later steps cost more */       \
        for (long item = 0; item < steps * n_kv; item++)                                                               \
            NAME##_item(q, k, v, mask, out, item, n_kv, g, d, keys, keys, k_head, v_head, v_row, scale, cap);          \
    }
DEFINE_ATTEND(attend_f32, float, ld_f32, dots8_f32, st_f32)
DEFINE_ATTEND(attend_bf16, uint16_t, ld_bf16, dots8_bf16, st_bf16)

/* r[0..8) as an 8 x 8 matrix of float32, transposed in place (r[c] lane u <- r[u] lane c). */
static inline void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44), u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44), u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

enum { BLOCK_STEPS = kAttendBlockSteps, KEY_BLOCK = 16, ROW_GROUP = 4 };

/* o_u[0..16) = sum_i a_u[i] * b[i][0..16) (i < n) for the four rows a_u: b a [n, 16] float32 matrix, each of the 64
 * sums in index order with fused multiply-adds; the accumulators named one by one so that they stay in registers. */
static inline void rows4x16(const float *a0, const float *a1, const float *a2, const float *a3, const float *b,
                            long stride, long n, float *o0, float *o1, float *o2, float *o3) {
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00;
    for (long i = 0; i < n; i++) {
        const __m256 b0 = _mm256_loadu_ps(b + i * stride), b1 = _mm256_loadu_ps(b + i * stride + 8);
        __m256 x = _mm256_broadcast_ss(a0 + i);
        c00 = _mm256_fmadd_ps(x, b0, c00), c01 = _mm256_fmadd_ps(x, b1, c01);
        x = _mm256_broadcast_ss(a1 + i);
        c10 = _mm256_fmadd_ps(x, b0, c10), c11 = _mm256_fmadd_ps(x, b1, c11);
        x = _mm256_broadcast_ss(a2 + i);
        c20 = _mm256_fmadd_ps(x, b0, c20), c21 = _mm256_fmadd_ps(x, b1, c21);
        x = _mm256_broadcast_ss(a3 + i);
        c30 = _mm256_fmadd_ps(x, b0, c30), c31 = _mm256_fmadd_ps(x, b1, c31);
    }
    _mm256_storeu_ps(o0, c00), _mm256_storeu_ps(o0 + 8, c01), _mm256_storeu_ps(o1, c10), _mm256_storeu_ps(o1 + 8, c11);
    _mm256_storeu_ps(o2, c20), _mm256_storeu_ps(o2 + 8, c21), _mm256_storeu_ps(o3, c30), _mm256_storeu_ps(o3 + 8, c31);
}


/* attend's math for a prompt's many query steps (attend_rows_NAME): the same arithmetic as attend_NAME_item's
 * (scores, softmax, weighted sum in float32, keys past a row's allowed end skipped), arranged as small matrix
 * products: an item is one kv head and a block of BLOCK_STEPS steps, item = kv * blocks + block. Its g * BLOCK_STEPS
 * query rows take the keys KEY_BLOCK at a time, transposed to [d, KEY_BLOCK] in float32, ROW_GROUP rows at a time
 * (each score a sum over d in index order, one fused multiply-add per term); then the weights, ROW_GROUP rows at a
 * time, against the values transposed to [keys, d] (each output a sum over the keys in index order). A group's
 * products run to the latest of its rows' ends, the others' weights zero past their own. attend_rows_NAME runs a
 * batch row's items on the OpenMP team, decode_ops_ffi.cc on XLA's pool; no sum's order depends on the thread or
 * the block. */
#define DEFINE_ATTEND_ROWS(S, T)                                                                                       \
    void attend_rows_##S##_loops_item(const T *q, const T *k, const T *v, const uint8_t *mask, T *out, long item,      \
                                      long steps, long n_kv, long g, long d, long keys, long mask_row, long k_head,    \
                                      long v_head, long v_row, float scale, float cap) {                               \
        const long blocks = (steps + BLOCK_STEPS - 1) / BLOCK_STEPS, kv = item / blocks;                               \
        const long t0 = item % blocks * BLOCK_STEPS, t1 = t0 + BLOCK_STEPS < steps ? t0 + BLOCK_STEPS : steps;         \
        const long m = (t1 - t0) * g, ps = (keys + 15) / 16 * 16, dp = (d + 15) / 16 * 16; /* rows, strides */         \
        const T *kh = k + kv * k_head, *vh = v + kv * v_head;                                                          \
        long *end = malloc(sizeof(long) * m), top = 0; /* each query row's allowed end, the latest */                  \
        float *qf = malloc(sizeof(float) * (m * d + m * ps + d * KEY_BLOCK + ps * dp));                                \
        if (!qf || !end) abort();                                                                                      \
        float *p = qf + m * d, *kt = p + m * ps, *vt = kt + d * KEY_BLOCK; /* scores, keys^T, values^T */              \
        for (long r = 0; r < m; r++) { /* query row r = (t - t0) * g + j */                                            \
            const long t = t0 + r / g;                                                                                 \
            for (long i = 0; i < d; i++) qf[r * d + i] = ld_##S(q + ((t * n_kv + kv) * g + r % g) * d, i);             \
            end[r] = r % g ? end[r - 1] : attend_allowed_end(mask + t * mask_row, keys); /* a step's g rows */         \
            top = end[r] > top ? end[r] : top;                                                                         \
        }                                                                                                              \
        __m256 x[8];                                                                                                   \
        float spare[ROW_GROUP * 16]; /* a group's sums past the last row, and its weighted sums */                     \
        for (long s0 = 0; s0 < top; s0 += KEY_BLOCK) {                                                                 \
            for (long h = 0; h < KEY_BLOCK; h += 8) /* keys s0 + h .. + 7 -> kt[i][h .. h + 7] */                      \
                for (long i0 = 0; i0 < d; i0 += 8) {                                                                   \
                    const long n = d - i0 < 8 ? d - i0 : 8;                                                            \
                    for (long u = 0; u < 8; u++)                                                                       \
                        x[u] = s0 + h + u < top ? part8_##S(kh + (s0 + h + u) * d + i0, n) : _mm256_setzero_ps();      \
                    transpose8(x);                                                                                     \
                    for (long c = 0; c < n; c++) _mm256_storeu_ps(kt + (i0 + c) * KEY_BLOCK + h, x[c]);                \
                }                                                                                                      \
            for (long r = 0; r < m; r += ROW_GROUP) { /* scores of rows r .. r + 3 for the block: kt is [d, 16] */     \
                const float *a[ROW_GROUP];                                                                             \
                float *o[ROW_GROUP];                                                                                   \
                for (long u = 0; u < ROW_GROUP; u++) { /* past the last row: its query again, the sums dropped */      \
                    a[u] = qf + (r + u < m ? r + u : m - 1) * d;                                                       \
                    o[u] = r + u < m ? p + (r + u) * ps + s0 : spare + u * KEY_BLOCK;                                  \
                }                                                                                                      \
                rows4x16(a[0], a[1], a[2], a[3], kt, KEY_BLOCK, d, o[0], o[1], o[2], o[3]);                            \
            }                                                                                                          \
        }                                                                                                              \
        for (long r = 0; r < m; r++) {                                                                                 \
            float *pr = p + r * ps;                                                                                    \
            attend_softmax_row(pr, mask + (t0 + r / g) * mask_row, end[r], scale, cap);                                \
            memset(pr + end[r], 0, sizeof(float) * (top - end[r])); /* weighs nothing up to its group's end */         \
        }                                                                                                              \
        for (long s0 = 0; s0 < top; s0 += 8) /* values^T: vt[s][i] = v[i][s], zero past d */                           \
            for (long i0 = 0; i0 < dp; i0 += 8) {                                                                      \
                const long n = top - s0 < 8 ? top - s0 : 8;                                                            \
                for (long c = 0; c < 8; c++)                                                                           \
                    x[c] = i0 + c < d ? part8_##S(vh + (i0 + c) * v_row + s0, n) : _mm256_setzero_ps();                \
                transpose8(x);                                                                                         \
                for (long u = 0; u < n; u++) _mm256_storeu_ps(vt + (s0 + u) * dp + i0, x[u]);                          \
            }                                                                                                          \
        for (long r = 0; r < m; r += ROW_GROUP) { /* weighted sums of rows r .. r + 3, 16 value dims at a time */      \
            const float *a[ROW_GROUP];                                                                                 \
            long hi = 0;                                                                                               \
            for (long u = 0; u < ROW_GROUP; u++) {                                                                     \
                const long row = r + u < m ? r + u : m - 1;                                                            \
                a[u] = p + row * ps;                                                                                   \
                hi = end[row] > hi ? end[row] : hi;                                                                    \
            }                                                                                                          \
            for (long i0 = 0; i0 < d; i0 += 16) {                                                                      \
                rows4x16(a[0], a[1], a[2], a[3], vt + i0, dp, hi, spare, spare + 16, spare + 32, spare + 48);          \
                const long n = d - i0 < 16 ? d - i0 : 16;                                                              \
                for (long u = 0; u < ROW_GROUP && r + u < m; u++) {                                                    \
                    T *o = out + ((t0 + (r + u) / g) * n_kv + kv) * g * d + (r + u) % g * d + i0;                      \
                    for (long c = 0; c < n; c += 8)                                                                    \
                        stpart8_##S(o + c, _mm256_loadu_ps(spare + u * 16 + c), n - c < 8 ? n - c : 8);                \
                }                                                                                                      \
            }                                                                                                          \
        }                                                                                                              \
        free(qf);                                                                                                      \
        free(end);                                                                                                     \
    }                                                                                                                  \
    /* an item on attend_amx.c's tiles where they run (bf16, d a multiple of 32), else on the loops above */          \
    void attend_rows_##S##_item(const T *q, const T *k, const T *v, const uint8_t *mask, T *out, long item,            \
                                long steps, long n_kv, long g, long d, long keys, long mask_row, long k_head,          \
                                long v_head, long v_row, float scale, float cap) {                                     \
        if (sizeof(T) == 2 && d % 32 == 0 && attend_amx_usable())                                                      \
            attend_rows_bf16_amx_item((const uint16_t *)q, (const uint16_t *)k, (const uint16_t *)v, mask,             \
                                      (uint16_t *)out, item, steps, n_kv, g, d, keys, mask_row, k_head, v_head, v_row, \
                                      scale, cap);                                                                     \
        else                                                                                                           \
            attend_rows_##S##_loops_item(q, k, v, mask, out, item, steps, n_kv, g, d, keys, mask_row, k_head, v_head,  \
                                         v_row, scale, cap);                                                           \
    }                                                                                                                  \
    void attend_rows_##S(const T *q, const T *k, const T *v, const uint8_t *mask, T *out, long steps, long n_kv,       \
                         long g, long d, long keys, long k_head, long v_head, long v_row, float scale, float cap) {    \
        const long items = n_kv * ((steps + BLOCK_STEPS - 1) / BLOCK_STEPS);                                           \
        _Pragma("omp parallel for schedule(dynamic)") /* a causal mask's later blocks cost more */                     \
        for (long item = 0; item < items; item++)                                                                      \
            attend_rows_##S##_item(q, k, v, mask, out, item, steps, n_kv, g, d, keys, keys, k_head, v_head, v_row,     \
                                   scale, cap);                                                                        \
    }
DEFINE_ATTEND_ROWS(f32, float)
DEFINE_ATTEND_ROWS(bf16, uint16_t)
