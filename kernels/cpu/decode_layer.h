/* One pre-norm decoder layer of a CPU decode step (decode_layer.c), as the phases both of its drivers run: the
 * OpenMP driver decode_layer_NAME (torch, through kernels/cpu/torch_decode_layer.py) and the XLA FFI handler in
 * decode_layer_ffi.cc (JAX, on XLA's own thread pool, through kernels/cpu/jax_decode_layer.py). */
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The operands of one layer, row b of every [rows, ...] operand at b times its width (the launchers make them
 * contiguous). Keys of batch row b, kv head h, slot s at k_cache + b * k_batch + h * k_head + s * head_dim; values'
 * element i of that slot at v_cache + b * v_batch + h * v_head + i * v_row + s. The product weights are [out, in]
 * (cols 0: torch's nn.Linear) or [in, out] (cols 1: Flax's kernel). Biases are float32 or NULL. `fetch`: the products'
 * software fetch (gemv.h). */
typedef struct {
    long rows, hidden, heads, kv_heads, head_dim, rotated, inter, pos, mask_row;
    long k_batch, k_head, v_batch, v_head, v_row;
    float eps, offset, scale, cap;
    int float32_weight, cols, fetch;
    const void *x, *residual; /* [rows, hidden]; residual NULL at layer 0 */
    const void *input_norm, *post_norm, *q_norm, *k_norm; /* q_norm, k_norm [head_dim] or NULL */
    const void *wq, *wk, *wv, *wo, *wgu, *wd;
    const float *bq, *bk, *bv, *bo, *bgu, *bd;
    const float *cos, *sin; /* [rows, rotated] */
    void *k_cache, *v_cache;
    const uint8_t *mask; /* [rows, mask_row], the first pos + 1 read: nonzero = may attend */
    void *out, *residual_out; /* [rows, hidden] */
} DecodeLayer;

/* A layer's working memory, one allocation (decode_layer_NAME_begin, decode_layer_end). */
typedef struct {
    void *h, *q, *qr, *k, *kr, *v, *o, *gu, *act; /* in the storage dtype */
    float *x32, *y, *partials; /* a product's float32 input, its sums, and (cols) its chunks' partial sums */
} Scratch;

/* The phases, in order; each runs decode_layer_items(L, phase, parts) independent items, and every item of a phase
 * ends before any of the next begins. */
enum { NORM_IN, QKV, QKV_FIN, ATTEND, O, O_FIN, NORM_POST, GU, GU_FIN, ACT, DOWN, DOWN_FIN, PHASES };

long decode_layer_items(const DecodeLayer *L, long phase, long parts);
int decode_layer_f32_begin(const DecodeLayer *L, Scratch *s); /* 0: out of memory */
int decode_layer_bf16_begin(const DecodeLayer *L, Scratch *s);
void decode_layer_f32_item(const DecodeLayer *L, const Scratch *s, long phase, long item, long parts);
void decode_layer_bf16_item(const DecodeLayer *L, const Scratch *s, long phase, long item, long parts);
void decode_layer_end(Scratch *s);
void decode_layer_f32(const DecodeLayer *L); /* the OpenMP driver: every phase on the calling team */
void decode_layer_bf16(const DecodeLayer *L);
/* layers[0 .. n) in order, layer i > 0 on layer i - 1's out and residual_out as its x and residual, and on layer 0's
 * pos, mask_row, cos, sin and mask (written into it); each layer's own out and residual_out */
void decode_layers_f32(DecodeLayer *layers, long n);
void decode_layers_bf16(DecodeLayer *layers, long n);

#ifdef __cplusplus
}
#endif
