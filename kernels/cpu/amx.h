/* The AMX tile state both tile kernels set up (gemm_amx.c, attend_amx.c): Linux's grant of it to the process, and the
 * one tile configuration both use. AMX_TARGET: the target attribute of the including file's AMX functions, where the
 * file is not compiled for AMX as a whole (attend_amx.c); empty otherwise. */
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

#endif
