/* The loop structure gemv.c's 256-bit and gemv_avx512.c's 512-bit parts share (C only): the cut of a part, the rows
 * layout's runs of ROW_TILE streams and the cols layout's chunks, each with its scalar tail; the files fill in the
 * vector loops. gemv.c says why the loops are shaped this way. */
#ifndef DECODER_PARITY_GEMV_LOOPS_H
#define DECODER_PARITY_GEMV_LOOPS_H

#include <immintrin.h>
#include <stdint.h>

#include "bf16.h"
#include "gemv.h"

enum { ROW_TILE = 4, MAX_ROWS = 8, RUN_BYTES = 256 << 10 };

/* How far ahead of each stream its line is fetched (bytes), in both files' loops, where the part's `fetch` asks for it
 * (a variable of the loop's function). Whether to fetch at all is a property of the processor's memory system, so the
 * caller chooses it by measurement (kernels/cpu/gemv_fetch.py): on one processor the hardware prefetchers alone left
 * the four streams short of the machine's bandwidth and a line asked for 2 KB ahead closed most of the gap, on another
 * the same fetch held them below what the hardware's own fetch reads (docs/benchmarks.md). A hint: past the end it
 * fetches nothing and faults nothing, and it changes no result. */
#define AHEAD 2048
#define FETCH(p) _mm_prefetch((const char *)(p) + AHEAD, _MM_HINT_T0)
#define FETCH4(i)                                                                                                    \
    if (fetch) (FETCH(w0 + (i)), FETCH(w1 + (i)), FETCH(w2 + (i)), FETCH(w3 + (i)))

/* part `part` of `parts` of n items: [lo, hi) */
static inline void span(long n, long part, long parts, long *lo, long *hi) {
    *lo = n * part / parts;
    *hi = n * (part + 1) / parts;
}

/* 8 weights as float32: a plain load, or 8 bfloat16 widened (bf16 is the top half of a float32). */
static inline __m256 load8_f32(const float *w) { return _mm256_loadu_ps(w); }
static inline __m256 load8_bf16(const uint16_t *w) { return bf16x8_to_f32(_mm_loadu_si128((const __m128i *)w)); }
static inline float load1_f32(const float *w) { return *w; }
static inline float load1_bf16(const uint16_t *w) { return bf16_to_f32(*w); }

/* The rows layout (a function body over x, w, b, y, m, in, out, part, parts): the part's output rows in blocks of
 * ROW_TILE runs, output row o[t] of each run (-1 past the block's end: its stream repeats run 0's row and its sum is
 * dropped), weight rows w0..w3; per x row r, accumulators a0..a3 of type VEC start at ZERO, the variadic body runs
 * the vector loop over k < vec (a local the caller sets), REDUCE sums each, and the scalar tail adds k >= vec. */
#define GEMV_ROW_RUNS(WT, LOAD1, VEC, ZERO, REDUCE, ...)                                                     \
    long run = RUN_BYTES / ((long)sizeof(WT) * in), lo, hi;                                                  \
    span(out, part, parts, &lo, &hi);                                                                        \
    if (run < 1) run = 1;                                                                                    \
    for (long b0 = lo; b0 < hi; b0 += ROW_TILE * run) {                                                      \
        long n = hi - b0 < ROW_TILE * run ? hi - b0 : ROW_TILE * run, q = (n + ROW_TILE - 1) / ROW_TILE;     \
        for (long j = 0; j < q; j++) {                                                                       \
            long o[ROW_TILE];                                                                                \
            const WT *rows[ROW_TILE];                                                                        \
            for (long t = 0; t < ROW_TILE; t++) {                                                            \
                o[t] = t * q + j < n ? b0 + t * q + j : -1;                                                  \
                rows[t] = w + (o[t] < 0 ? b0 + j : o[t]) * in;                                               \
            }                                                                                                \
            const WT *w0 = rows[0], *w1 = rows[1], *w2 = rows[2], *w3 = rows[3];                             \
            for (long r = 0; r < m; r++) { /* the rows stay in L1 across x's rows */                         \
                const float *xr = x + r * in;                                                                \
                VEC a0 = ZERO, a1 = a0, a2 = a0, a3 = a0;                                                    \
                __VA_ARGS__                                                                                  \
                float s[ROW_TILE] = {REDUCE(a0), REDUCE(a1), REDUCE(a2), REDUCE(a3)};                        \
                for (long t = 0; t < ROW_TILE; t++) {                                                        \
                    if (o[t] < 0) continue;                                                                  \
                    for (long k = vec; k < in; k++) s[t] += LOAD1(rows[t] + k) * xr[k];                      \
                    y[r * out + o[t]] = b ? s[t] + b[o[t]] : s[t];                                           \
                }                                                                                            \
            }                                                                                                \
        }                                                                                                    \
    }

/* The cols layout (a function body over x, w, partials, m, in, out, part, parts): the part's chunks of W's rows, each
 * summed into its partial [m, out]; rows i, i + q, i + 2q, i + 3q (w0..w3, x's entries xr[i], xr[k1], xr[k2],
 * xr[k3]) added per pass, the variadic body's vector loops advancing the column j from 0, the scalar tail the rest;
 * the chunk's last rows past 4q one at a time. */
#define GEMV_COLS_CHUNKS(WT, LOAD1, ...)                                                                     \
    long chunks = gemv_cols_chunks(in), per = (in + chunks - 1) / chunks, lo, hi;                            \
    span(chunks, part, parts, &lo, &hi);                                                                     \
    for (long c = lo; c < hi; c++) {                                                                         \
        long i0 = c * per < in ? c * per : in, i1 = i0 + per < in ? i0 + per : in;                           \
        long q = (i1 - i0) / ROW_TILE; /* rows per run */                                                    \
        for (long r = 0; r < m; r++) {                                                                       \
            float *acc = partials + (c * m + r) * out;                                                       \
            const float *xr = x + r * in;                                                                    \
            for (long j = 0; j < out; j++) acc[j] = 0.0f;                                                    \
            for (long i = i0; i < i0 + q; i++) { /* rows i, i + q, i + 2q, i + 3q */                         \
                long k1 = i + q, k2 = i + 2 * q, k3 = i + 3 * q, j = 0;                                      \
                const WT *w0 = w + i * out, *w1 = w + k1 * out, *w2 = w + k2 * out, *w3 = w + k3 * out;      \
                __VA_ARGS__                                                                                  \
                for (; j < out; j++)                                                                         \
                    acc[j] = (((acc[j] + LOAD1(w0 + j) * xr[i]) + LOAD1(w1 + j) * xr[k1]) +                  \
                              LOAD1(w2 + j) * xr[k2]) + LOAD1(w3 + j) * xr[k3];                              \
            }                                                                                                \
            for (long i = i0 + ROW_TILE * q; i < i1; i++)                                                    \
                for (long j = 0; j < out; j++) acc[j] += LOAD1(w + i * out + j) * xr[i];                     \
        }                                                                                                    \
    }

#endif
