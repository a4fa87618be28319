/* The few-row product's entry points (gemv.c, its 512-bit loops gemv_avx512.c), for the files that call them: the
 * drivers (gemv_ffi.cc, decode_layer.c) and the two loop files themselves. C and C++. */
#ifndef DECODER_PARITY_GEMV_H
#define DECODER_PARITY_GEMV_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { GEMV_ISA_AVX2 = 0, GEMV_ISA_AVX512 = 1, GEMV_ISA_AVX512_BF16 = 2 }; /* gemv_isa's levels */

/* Part `part` of `parts` of a product (gemv.c says how a product is cut), on gemv_isa()'s instruction set. */
void gemv_rows_f32_part(const float *x, const float *w, const float *b, float *y, long m, long in, long out, long part,
                        long parts);
void gemv_rows_bf16_part(const float *x, const uint16_t *w, const float *b, float *y, long m, long in, long out,
                         long part, long parts);
void gemv_cols_f32_part(const float *x, const float *w, float *partials, long m, long in, long out, long part,
                        long parts);
void gemv_cols_bf16_part(const float *x, const uint16_t *w, float *partials, long m, long in, long out, long part,
                         long parts);
void gemv_cols_reduce_part(const float *partials, const float *b, float *y, long m, long in, long out, long part,
                           long parts);
long gemv_cols_chunks(long in);
long gemv_isa(void);

/* gemv_avx512.c's loops, which gemv.c's parts call where gemv_isa() allows */
void gemv_rows_f32_avx512_part(const float *x, const float *w, const float *b, float *y, long m, long in, long out,
                               long part, long parts);
void gemv_rows_bf16_avx512_part(const float *x, const uint16_t *w, const float *b, float *y, long m, long in,
                                long out, long part, long parts, int dot);
void gemv_cols_f32_avx512_part(const float *x, const float *w, float *partials, long m, long in, long out, long part,
                               long parts);
void gemv_cols_bf16_avx512_part(const float *x, const uint16_t *w, float *partials, long m, long in, long out,
                                long part, long parts);

#ifdef __cplusplus
}
#endif
#endif
