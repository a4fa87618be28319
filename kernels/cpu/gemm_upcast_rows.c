/* torch's driver of gemm.c's bfloat16-storage, float32-compute entry on nn.Linear's layout: y[m, out] =
 * x[m, in] . W[out, in]^T (+ b), bf16 operands widened exactly, float32 sums, the bias added to each sum, which is
 * then kept as float32 or rounded once to bf16 as torch rounds (bf16.h). The path "upcast" of torch_impl/linear.py,
 * called through ctypes by kernels/cpu/torch_gemm.py on torch's OpenMP team; the twin of gemm_ffi.cc's GemmBF16F32,
 * which runs the same loops on XLA's pool for Flax's layout. Built with gemm.c only where the processor has avx512f;
 * reference: kernels/cpu/reference.py.
 *
 * The work is gemm.c's items (a block of rows of x by a span of W's panels), claimed one at a time by the team's
 * threads, a few per thread so that a late thread still finds some (the spans gemm_ffi.h's GemmRows cuts for XLA's
 * pool); then the team adds the bias and rounds, row by row. The float32 sums are written to `y32` (the caller's:
 * the result itself where it asks for float32).
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#include "bf16.h"

#define GEMM_ROWS_MAX_IN (0x7fffffffL / 15)  // gemm.c gathers W's rows at int32 offsets up to 15 * in
long gemm_row_blocks(long m);
long gemm_panels(long out);
int gemm_bf16_f32_rows_item(const uint16_t *x, const uint16_t *w, float *y, long m, long in, long out, long item,
                            long items);

/* y32[r] + bias, rounded into y16[r] where y16, else kept in y32[r]: one row of `out` */
static void finish_row(float *y32, const uint16_t *bias, uint16_t *y16, long out) {
    long c = 0;
    for (; c + 16 <= out; c += 16) {
        __m512 v = _mm512_loadu_ps(y32 + c);
        if (bias != NULL) {
            v = _mm512_add_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(
                                     _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(bias + c))), 16)));
        }
        if (y16 == NULL) {
            _mm512_storeu_ps(y32 + c, v);
            continue;
        }
        const __m128i lo = f32x8_to_bf16(_mm512_castps512_ps256(v));
        const __m128i hi = f32x8_to_bf16(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
        _mm256_storeu_si256((__m256i *)(y16 + c), _mm256_set_m128i(hi, lo));
    }
    for (; c < out; c++) {  // the last out % 16 (16-bit masked stores would need AVX512BW)
        const float v = bias != NULL ? y32[c] + bf16_to_f32(bias[c]) : y32[c];
        if (y16 != NULL) {
            y16[c] = f32_to_bf16(v);
        } else {
            y32[c] = v;
        }
    }
}

/* bias (NULL: none) [out], y32 [m, out] float32 sums, y16 (NULL: the result is y32) [m, out]. Returns 0; -1 where a
 * thread could not have its packing buffers, -2 where `in` is past what gemm.c's gathers address (GEMM_ROWS_MAX_IN:
 * the caller reports either). */
int gemm_upcast_rows_bf16(const uint16_t *x, const uint16_t *w, const uint16_t *bias, float *y32, uint16_t *y16,
                          long m, long in, long out) {
    if (in > GEMM_ROWS_MAX_IN) return -2;
    const long threads = omp_get_max_threads(), panels = gemm_panels(out);
    const long spans = panels < 2 * threads ? panels : 2 * threads, items = gemm_row_blocks(m) * spans;
    int failed = 0;
#pragma omp parallel
    {
#pragma omp for schedule(dynamic, 1)
        for (long i = 0; i < items; i++) {
            if (gemm_bf16_f32_rows_item(x, w, y32, m, in, out, i, items) != 0) {
#pragma omp atomic write
                failed = 1;
            }
        }  // its barrier: every sum is whole before the rows are finished
        if (bias != NULL || y16 != NULL) {
#pragma omp for schedule(static)
            for (long r = 0; r < m; r++) finish_row(y32 + r * out, bias, y16 == NULL ? NULL : y16 + r * out, out);
        }
    }
    return failed ? -1 : 0;
}
