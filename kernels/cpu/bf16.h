/* bfloat16 <-> float32 for the CPU kernels that round as torch rounds (decode_ops.c, decode_layer.c): one definition,
 * so that a layer computed in one call (decode_layer.c) rounds exactly as the per-operator calls it stands for. */
#pragma once

#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t h) { /* exact: bf16 is the top half of a float32 */
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* a quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                                          /* to nearest, ties to even */
    return (uint16_t)(u >> 16);
}
