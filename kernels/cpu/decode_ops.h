/* The entry points of decode_ops.c (the row operators) and attend.c (attention), for the files that call them:
 * decode_layer.c, decode_ops_ffi.cc, and the two files themselves. Storage float32 (_f32) or bfloat16 (_bf16, as
 * uint16_t). C and C++. */
#ifndef DECODER_PARITY_DECODE_OPS_H
#define DECODER_PARITY_DECODE_OPS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* the query steps of one attend_rows item (attend.c), and from how many a call's steps take attend_rows (the FFI;
 * kernels/cpu/torch_decode_ops.py's ROWS_MIN_STEPS is the same number) */
enum { kAttendBlockSteps = 16, kAttendRowsMinSteps = 2 };

/* attend.c's pieces attend_amx.c shares: a mask row's allowed end, a row's softmax; and the AMX item itself */
long attend_allowed_end(const uint8_t *mt, long keys);
void attend_softmax_row(float *p, const uint8_t *mt, long hi, float scale, float cap);
int attend_amx_usable(void);
void attend_rows_bf16_amx_item(const uint16_t *q, const uint16_t *k, const uint16_t *v, const uint8_t *mask,
                               uint16_t *out, long item, long steps, long n_kv, long g, long d, long keys,
                               long mask_row, long k_head, long v_head, long v_row, float scale, float cap);

#define DECODE_OPS_DECLARE(T, S)                                                                                       \
    void add_rms_norm_##S(const T *x, const T *residual, const T *w, T *out, T *s_out, long rows, long dim, float eps, \
                          float offset, int float32_weight);                                                           \
    void rotary_##S(const T *x, const float *cos, const float *sin, T *out, long rows, long heads, long d, long r);    \
    void norm_rotary_##S(const T *q, const T *k, const T *wq, const T *wk, const float *cos, const float *sin,         \
                         T *q_out, T *k_out, long rows, long nq, long nk, long d, long r, float eps, float offset,     \
                         int float32_weight);                                                                          \
    void silu_and_mul_##S(const T *x, T *out, long rows, long inter);                                                  \
    void attend_##S##_item(const T *q, const T *k, const T *v, const uint8_t *mask, T *out, long item, long n_kv,      \
                           long g, long d, long keys, long mask_row, long k_head, long v_head, long v_row,             \
                           float scale, float cap);                                                                    \
    void attend_##S(const T *q, const T *k, const T *v, const uint8_t *mask, T *out, long steps, long n_kv, long g,    \
                    long d, long keys, long k_head, long v_head, long v_row, float scale, float cap);                  \
    void attend_rows_##S##_item(const T *q, const T *k, const T *v, const uint8_t *mask, T *out, long item,            \
                                long steps, long n_kv, long g, long d, long keys, long mask_row, long k_head,          \
                                long v_head, long v_row, float scale, float cap);                                      \
    void attend_rows_##S##_loops_item(const T *q, const T *k, const T *v, const uint8_t *mask, T *out, long item,      \
                                      long steps, long n_kv, long g, long d, long keys, long mask_row, long k_head,    \
                                      long v_head, long v_row, float scale, float cap);                                \
    void attend_rows_##S(const T *q, const T *k, const T *v, const uint8_t *mask, T *out, long steps, long n_kv,       \
                           long g, long d, long keys, long k_head, long v_head, long v_row, float scale, float cap);
DECODE_OPS_DECLARE(float, f32)
DECODE_OPS_DECLARE(uint16_t, bf16)
#undef DECODE_OPS_DECLARE

#ifdef __cplusplus
}
#endif

#endif
