/* Few-row products y[m, out] = x[m, in] . W (+ b) that stream their weight once: a decode step's products on a
 * CPU, where the libraries' matrix-vector code reads a chain of 4-25 MB weights well below the machine's
 * bandwidth (docs/benchmarks.md). Built and loaded by kernels/cpu/build.py; reference: kernels/cpu/reference.py.
 *
 * Two weight layouts, because the two backends store their weights differently:
 *   rows  W [out, in]  (torch's nn.Linear, a tied head's table): y[r, o] = dot(x[r, :], W[o, :])
 *   cols  W [in, out]  (Flax's nnx.Linear kernel):                y[r, :] = sum_i x[r, i] * W[i, :]
 * and two weight dtypes: float32, and bfloat16 widened to float32 as it is loaded (bf16 storage, float32
 * compute: the bits shifted left by 16, exact). x, b and y are float32; every product accumulates in float32
 * and the caller rounds y once to the model's dtype.
 *
 * Each product is cut into `parts` (NAME_part computes part `part`): rows, a span of output rows; cols, a
 * span of the contraction's CHUNKS, whose partial sums gemv_cols_reduce_part then adds in chunk order over a span
 * of output columns. The cut is the caller's thread count, but no output's summation order depends on it. Two
 * drivers: NAME runs the parts on an OpenMP team (torch's own when torch loaded it first: kernels/cpu/
 * torch_gemv.py); gemv_ffi.cc runs them on XLA's intra-op thread pool, so the kernel never competes with it.
 *
 * AVX2 + FMA; build.py compiles this only where the processor has both. Any shape: tails are scalar. Where the
 * caller asks (`fetch`, gemv.h), each of the four streams fetches its line AHEAD bytes before it reads it
 * (gemv_loops.h); whether that is faster depends on the processor, so it is measured (kernels/cpu/gemv_fetch.py).
 * Where the processor has AVX-512F (and AVX512_BF16), each part runs gemv_avx512.c's 512-bit loops instead
 * (gemv_isa, a rule of the instruction set, not a measurement: the same loops with half the instructions per cache
 * line of W; docs/benchmarks.md); that file says what they keep bit for bit and what they reorder.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "gemv_loops.h"

/* The instruction set the parts run on here: GEMV_ISA_AVX2, or GEMV_ISA_AVX512 where the processor (and its operating
 * system: the compiler's check includes the saved register state) has AVX-512F, or GEMV_ISA_AVX512_BF16 with
 * AVX512_BF16 too. Asked once; the answer is the same on every thread. */
long gemv_isa(void) {
    static long level = -1; /* atomic: the first parts of a product may ask from several threads at once */
    long known = __atomic_load_n(&level, __ATOMIC_RELAXED);
    if (known < 0) {
        __builtin_cpu_init();
        known = !__builtin_cpu_supports("avx512f")      ? GEMV_ISA_AVX2
                : !__builtin_cpu_supports("avx512bf16") ? GEMV_ISA_AVX512
                                                        : GEMV_ISA_AVX512_BF16;
        __atomic_store_n(&level, known, __ATOMIC_RELAXED);
    }
    return known;
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}


#define LINE(WT) (64 / (long)sizeof(WT)) /* weights per cache line: one fetch per line and stream */

/* rows layout: a part's output rows are cut into blocks of up to ROW_TILE runs of q consecutive rows (~RUN_BYTES of
 * weights per run), and the kernel dots one row of each run at a time, so it reads ROW_TILE long contiguous streams.
 * ROW_TILE adjacent rows instead (at in = 1024 each row is one 4 KB page) read a chain of decode-sized products
 * measurably slower: the hardware prefetcher restarts at every short stream (docs/benchmarks.md has the figures). Each
 * output is still one dot product in one order, so the cut changes no result. The accumulators are named
 * registers (an array indexed by a run-time count would live in memory). */
#define DEFINE_ROWS(NAME, WT, LOAD8, LOAD1)                                                                  \
    static void NAME##_avx2_part(const float *x, const WT *w, const float *b, float *y, long m, long in,     \
                                 long out, long part, long parts, long fetch) {                              \
        const long vec = in / 8 * 8;                                                                         \
        GEMV_ROW_RUNS(WT, LOAD1, __m256, _mm256_setzero_ps(), hsum, for (long i = 0; i < vec; i += 8) {      \
            __m256 xv = _mm256_loadu_ps(xr + i);                                                             \
            if (i % LINE(WT) == 0) FETCH4(i);                                                                \
            a0 = _mm256_fmadd_ps(LOAD8(w0 + i), xv, a0);                                                     \
            a1 = _mm256_fmadd_ps(LOAD8(w1 + i), xv, a1);                                                     \
            a2 = _mm256_fmadd_ps(LOAD8(w2 + i), xv, a2);                                                     \
            a3 = _mm256_fmadd_ps(LOAD8(w3 + i), xv, a3);                                                     \
        })                                                                                                   \
    }                                                                                                        \
    void NAME(const float *x, const WT *w, const float *b, float *y, long m, long in, long out, long fetch) {\
        _Pragma("omp parallel")                                                                              \
            NAME##_part(x, w, b, y, m, in, out, omp_get_thread_num(), omp_get_num_threads(), fetch);         \
    }

/* cols layout: the contraction split into gemv_cols_chunks(in) contiguous blocks of W's rows (a number fixed
 * by the shape), each summed into a partial y of its own (partials [chunks, m, out]); the partials are then added
 * in chunk order. A chunk's rows are cut into ROW_TILE runs of q consecutive rows, and each pass over the partial
 * adds one row of each run, so the kernel reads ROW_TILE long contiguous streams (as the rows layout does, and for
 * the same reason) and reads and writes the partial a quarter as often; the chunk's last rows past 4q are added
 * one at a time. The order of the additions is fixed by the shape. A chunk is at least CHUNK_ROWS rows (all of W
 * where it has fewer), and there are at most MAX_CHUNKS: each chunk also zeroes its partial and adds it in the
 * reduction, work that does not shrink with the chunk, and chunks of 128 rows made a decode layer measurably slower
 * than chunks of 256 (docs/benchmarks.md). So up to in / CHUNK_ROWS threads share a cols product (4 at the 0.6B
 * shape's hidden size of 1024, 16 from 4096 on); the rows layout is cut by outputs, among any number. */
enum { CHUNK_ROWS = 256, MAX_CHUNKS = 16 };
long gemv_cols_chunks(long in) {
    long c = in / CHUNK_ROWS;
    return c < 1 ? 1 : (c > MAX_CHUNKS ? MAX_CHUNKS : c);
}

#define DEFINE_COLS(NAME, WT, LOAD8, LOAD1)                                                                  \
    static void NAME##_avx2_part(const float *x, const WT *w, float *partials, long m, long in, long out,    \
                                 long part, long parts, long fetch) {                                        \
        const long vec = out / 8 * 8;                                                                        \
        GEMV_COLS_CHUNKS(WT, LOAD1, {                                                                        \
            __m256 x0 = _mm256_set1_ps(xr[i]), x1 = _mm256_set1_ps(xr[k1]);                                  \
            __m256 x2 = _mm256_set1_ps(xr[k2]), x3 = _mm256_set1_ps(xr[k3]);                                 \
            for (; j < vec; j += 8) {                                                                        \
                if (j % LINE(WT) == 0) FETCH4(j);                                                            \
                __m256 a = _mm256_fmadd_ps(LOAD8(w0 + j), x0, _mm256_loadu_ps(acc + j));                     \
                a = _mm256_fmadd_ps(LOAD8(w1 + j), x1, a);                                                   \
                a = _mm256_fmadd_ps(LOAD8(w2 + j), x2, a);                                                   \
                _mm256_storeu_ps(acc + j, _mm256_fmadd_ps(LOAD8(w3 + j), x3, a));                            \
            }                                                                                                \
        })                                                                                                   \
    }                                                                                                        \
    void NAME(const float *x, const WT *w, const float *b, float *y, long m, long in, long out, long fetch) {\
        float *partials = malloc(sizeof(float) * gemv_cols_chunks(in) * m * out);                            \
        if (!partials) abort();                                                                              \
        _Pragma("omp parallel") {                                                                            \
            NAME##_part(x, w, partials, m, in, out, omp_get_thread_num(), omp_get_num_threads(), fetch);     \
            _Pragma("omp barrier")                                                                           \
            gemv_cols_reduce_part(partials, b, y, m, in, out, omp_get_thread_num(), omp_get_num_threads());  \
        }                                                                                                    \
        free(partials);                                                                                      \
    }

/* y[r, j] = b[j] + sum over chunks c, in order, of partials[c, r, j], for the columns of part `part` */
void gemv_cols_reduce_part(const float *partials, const float *b, float *y, long m, long in, long out, long part,
                           long parts) {
    long chunks = gemv_cols_chunks(in), lo, hi;
    span(out, part, parts, &lo, &hi);
    for (long r = 0; r < m; r++)
        for (long j = lo; j < hi; j++) {
            float s = b ? b[j] : 0.0f;
            for (long c = 0; c < chunks; c++) s += partials[(c * m + r) * out + j];
            y[r * out + j] = s;
        }
}

DEFINE_ROWS(gemv_rows_f32, float, load8_f32, load1_f32)
DEFINE_ROWS(gemv_rows_bf16, uint16_t, load8_bf16, load1_bf16)
DEFINE_COLS(gemv_cols_f32, float, load8_f32, load1_f32)
DEFINE_COLS(gemv_cols_bf16, uint16_t, load8_bf16, load1_bf16)

/* The parts on instruction set `isa`, at most gemv_isa()'s (the tests ask for each level the processor has), and as
 * the drivers call them, on gemv_isa()'s. */
static long usable(long isa) { return isa < gemv_isa() ? isa : gemv_isa(); }

void gemv_rows_f32_part_at(const float *x, const float *w, const float *b, float *y, long m, long in, long out,
                           long part, long parts, long fetch, long isa) {
    if (usable(isa) >= GEMV_ISA_AVX512) gemv_rows_f32_avx512_part(x, w, b, y, m, in, out, part, parts, fetch);
    else gemv_rows_f32_avx2_part(x, w, b, y, m, in, out, part, parts, fetch);
}
void gemv_rows_bf16_part_at(const float *x, const uint16_t *w, const float *b, float *y, long m, long in, long out,
                            long part, long parts, long fetch, long isa) {
    isa = usable(isa);
    if (isa >= GEMV_ISA_AVX512)
        gemv_rows_bf16_avx512_part(x, w, b, y, m, in, out, part, parts, fetch, isa == GEMV_ISA_AVX512_BF16);
    else gemv_rows_bf16_avx2_part(x, w, b, y, m, in, out, part, parts, fetch);
}
void gemv_cols_f32_part_at(const float *x, const float *w, float *partials, long m, long in, long out, long part,
                           long parts, long fetch, long isa) {
    if (usable(isa) >= GEMV_ISA_AVX512) gemv_cols_f32_avx512_part(x, w, partials, m, in, out, part, parts, fetch);
    else gemv_cols_f32_avx2_part(x, w, partials, m, in, out, part, parts, fetch);
}
void gemv_cols_bf16_part_at(const float *x, const uint16_t *w, float *partials, long m, long in, long out, long part,
                            long parts, long fetch, long isa) {
    if (usable(isa) >= GEMV_ISA_AVX512) gemv_cols_bf16_avx512_part(x, w, partials, m, in, out, part, parts, fetch);
    else gemv_cols_bf16_avx2_part(x, w, partials, m, in, out, part, parts, fetch);
}

void gemv_rows_f32_part(const float *x, const float *w, const float *b, float *y, long m, long in, long out, long part,
                        long parts, long fetch) {
    gemv_rows_f32_part_at(x, w, b, y, m, in, out, part, parts, fetch, gemv_isa());
}
void gemv_rows_bf16_part(const float *x, const uint16_t *w, const float *b, float *y, long m, long in, long out,
                         long part, long parts, long fetch) {
    gemv_rows_bf16_part_at(x, w, b, y, m, in, out, part, parts, fetch, gemv_isa());
}
void gemv_cols_f32_part(const float *x, const float *w, float *partials, long m, long in, long out, long part,
                        long parts, long fetch) {
    gemv_cols_f32_part_at(x, w, partials, m, in, out, part, parts, fetch, gemv_isa());
}
void gemv_cols_bf16_part(const float *x, const uint16_t *w, float *partials, long m, long in, long out, long part,
                         long parts, long fetch) {
    gemv_cols_bf16_part_at(x, w, partials, m, in, out, part, parts, fetch, gemv_isa());
}

long gemv_max_rows(void) { return MAX_ROWS; }
