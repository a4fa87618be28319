/* The few-row product's entry points (gemv.c, its 512-bit loops gemv_avx512.c), for the files that call them: the
 * drivers (gemv_ffi.cc, decode_layer.c) and the two loop files themselves. C and C++. */
#ifndef DECODER_PARITY_GEMV_H
#define DECODER_PARITY_GEMV_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { GEMV_ISA_AVX2 = 0, GEMV_ISA_AVX512 = 1, GEMV_ISA_AVX512_BF16 = 2 }; /* gemv_isa's levels */

/* `fetch` (every entry point): whether each of a part's streams asks for its line a fixed distance ahead of reading
 * it (nonzero), or leaves the fetching to the processor's own prefetchers (0). Results are the same either way; which
 * reads faster depends on the processor, so the launchers choose it by measurement (kernels/cpu/gemv_fetch.py). */

/* A whole product on an OpenMP team (torch's, where torch loaded the library first: kernels/cpu/torch_gemv.py). */
void gemv_rows_f32(const float *x, const float *w, const float *b, float *y, long m, long in, long out, long fetch);
void gemv_rows_bf16(const float *x, const uint16_t *w, const float *b, float *y, long m, long in, long out, long fetch);
void gemv_cols_f32(const float *x, const float *w, const float *b, float *y, long m, long in, long out, long fetch);
void gemv_cols_bf16(const float *x, const uint16_t *w, const float *b, float *y, long m, long in, long out, long fetch);
long gemv_max_rows(void); /* the most token rows a launcher gives it (MAX_ROWS) */

/* Part `part` of `parts` of a product (gemv.c says how a product is cut), on gemv_isa()'s instruction set. */
void gemv_rows_f32_part(const float *x, const float *w, const float *b, float *y, long m, long in, long out, long part,
                        long parts, long fetch);
void gemv_rows_bf16_part(const float *x, const uint16_t *w, const float *b, float *y, long m, long in, long out,
                         long part, long parts, long fetch);
void gemv_cols_f32_part(const float *x, const float *w, float *partials, long m, long in, long out, long part,
                        long parts, long fetch);
void gemv_cols_bf16_part(const float *x, const uint16_t *w, float *partials, long m, long in, long out, long part,
                         long parts, long fetch);
void gemv_cols_reduce_part(const float *partials, const float *b, float *y, long m, long in, long out, long part,
                           long parts);
long gemv_cols_chunks(long in);
long gemv_isa(void);

/* The same parts on instruction set `isa` (a GEMV_ISA_* level; above gemv_isa(), gemv_isa()'s): the tests run every
 * level the processor has. */
void gemv_rows_f32_part_at(const float *x, const float *w, const float *b, float *y, long m, long in, long out,
                           long part, long parts, long fetch, long isa);
void gemv_rows_bf16_part_at(const float *x, const uint16_t *w, const float *b, float *y, long m, long in, long out,
                            long part, long parts, long fetch, long isa);
void gemv_cols_f32_part_at(const float *x, const float *w, float *partials, long m, long in, long out, long part,
                           long parts, long fetch, long isa);
void gemv_cols_bf16_part_at(const float *x, const uint16_t *w, float *partials, long m, long in, long out, long part,
                            long parts, long fetch, long isa);

/* gemv_avx512.c's loops, which gemv.c's parts call where gemv_isa() allows */
void gemv_rows_f32_avx512_part(const float *x, const float *w, const float *b, float *y, long m, long in, long out,
                               long part, long parts, long fetch);
void gemv_rows_bf16_avx512_part(const float *x, const uint16_t *w, const float *b, float *y, long m, long in,
                                long out, long part, long parts, long fetch, int dot);
void gemv_cols_f32_avx512_part(const float *x, const float *w, float *partials, long m, long in, long out, long part,
                               long parts, long fetch);
void gemv_cols_bf16_avx512_part(const float *x, const uint16_t *w, float *partials, long m, long in, long out,
                                long part, long parts, long fetch);

#ifdef __cplusplus
}
#endif
#endif
