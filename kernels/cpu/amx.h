/* The AMX tile state the tile kernels set up (gemm_amx.c, gemm_amx_rows.c, attend_amx.c): Linux's grant of it to the
 * process, the one tile configuration they use, the GEMMs' C tiles' loads and stores, and the 16 x 16 transpose of
 * 32-bit elements that lays out their operands. AMX_TARGET: the target attribute of the including file's AMX
 * functions, where the file is not compiled for AMX as a whole (attend_amx.c); empty otherwise. */
#ifndef DECODER_PARITY_AMX_H
#define DECODER_PARITY_AMX_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef AMX_TARGET
#define AMX_TARGET
#endif

enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };

/* Linux hands a process the tile state only when asked (once per process): 0, or the error of the request. */
static inline int amx_request(void) { return (int)syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); }

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) TileConfig;

/* every tile 16 rows of 64 bytes: C 16 x 16 float32, A 16 rows x 32 bf16, B 16 pair-rows x 16 columns */
static inline AMX_TARGET void amx_configure(void) {
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) c.colsb[t] = 64, c.rows[t] = 16;
    _tile_loadconfig(&c);
}

/* A 16 x 16 transpose of 32-bit elements, r[i] row i on entry, column i on return: pairs, then quads, then 128-bit
 * lanes, then halves, exchanged. */
static inline AMX_TARGET void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 16; i += 8)
        for (int j = 0; j < 4; j++) {
            t[i + j] = _mm512_shuffle_i32x4(r[i + j], r[i + j + 4], 0x88);
            t[i + j + 4] = _mm512_shuffle_i32x4(r[i + j], r[i + j + 4], 0xdd);
        }
    for (int j = 0; j < 8; j++) {
        r[j] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0x88);
        r[j + 8] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0xdd);
    }
}

/* The four C tiles (0-3) of a 32 x 32 float32 block whose 16 x 16 quarters start at q[0..3], rows `stride` bytes
 * apart: zeroed for the block's first K block (`first`), else loaded; and stored back after a K block. */
static inline AMX_TARGET void amx_c_load(int first, float *const q[4], long stride) {
    if (first) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        return;
    }
    _tile_loadd(0, q[0], stride);
    _tile_loadd(1, q[1], stride);
    _tile_loadd(2, q[2], stride);
    _tile_loadd(3, q[3], stride);
}
static inline AMX_TARGET void amx_c_store(float *const q[4], long stride) {
    _tile_stored(0, q[0], stride);
    _tile_stored(1, q[1], stride);
    _tile_stored(2, q[2], stride);
    _tile_stored(3, q[3], stride);
}

#endif
