/* bfloat16 <-> float32 for the CPU kernels that round as torch rounds (decode_ops.c, attend.c, decode_layer.c): one
 * definition, so that a layer computed in one call (decode_layer.c) rounds exactly as the per-operator calls it stands
 * for. The 8-lane forms compute the scalar ones' bits lane by lane (the tests hold the operators that use them to
 * their scalar twins). */
#pragma once

#include <immintrin.h>
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

/* 8 bf16 -> 8 float32 lanes */
static inline __m256 bf16x8_to_f32(__m128i h) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
/* 8 float32 lanes -> their bf16 bits in the low 16 of each 32-bit lane: f32_to_bf16, lane by lane */
static inline __m256i f32x8_to_bf16_lanes(__m256 f) {
    const __m256i u = _mm256_castps_si256(f), top = _mm256_srli_epi32(u, 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000)); /* |u| <= 2^31 - 1: signed compare holds */
    const __m256i odd = _mm256_and_si256(top, _mm256_set1_epi32(1));
    const __m256i bias = _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff)); /* to nearest, ties to even */
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
    return _mm256_blendv_epi8(rounded, _mm256_or_si256(top, _mm256_set1_epi32(0x40)), nan);
}
/* 8 float32 lanes -> 8 bf16 */
static inline __m128i f32x8_to_bf16(__m256 f) {
    const __m256i lanes = f32x8_to_bf16_lanes(f); /* each <= 0xffff: the unsigned saturating pack keeps it */
    return _mm_packus_epi32(_mm256_castsi256_si128(lanes), _mm256_extracti128_si256(lanes, 1));
}
/* bf16_to_f32(f32_to_bf16(f)) of 8 lanes: a float32 rounded to bf16 and kept as float32 */
static inline __m256 f32x8_round_bf16(__m256 f) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(f32x8_to_bf16_lanes(f), 16));
}
