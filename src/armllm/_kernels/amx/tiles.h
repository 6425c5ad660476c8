/* amx/tiles.h: the AMX tile configuration (LDTILECFG's 64-byte operand,
 * palette 1: 8 tiles of at most 16 rows x 64 bytes), shared by the amx
 * variant's kernels.
 *
 * Tile configuration and tile data are per-thread state: a kernel loads its
 * configuration at the start of each pool chunk it runs (pool workers are
 * persistent threads, and another kernel may have configured them
 * differently) and releases the tiles (TILERELEASE) at the chunk's end, so
 * that a thread not running AMX code carries no tile state through context
 * switches. Using tiles needs the process's tile-data permission, which
 * cpu.c requests at detection (the amx variant is not runnable without it). */
#ifndef ARMLLM_AMX_TILES_H
#define ARMLLM_AMX_TILES_H

#include <stdint.h>
#include <string.h>

#define AMX_TILES 8          /* tile registers tmm0..tmm7 */
#define AMX_TILE_ROWS 16     /* the most rows of a tile */
#define AMX_TILE_COLSB 64    /* the most bytes of a tile row */
#define AMX_PALETTE 1        /* the palette of 8 x 1 KiB tiles */

typedef struct {
  uint8_t palette_id;
  uint8_t start_row; /* restart row of an interrupted tile load/store; 0 */
  uint8_t reserved[14];
  uint16_t colsb[16]; /* bytes per row of tile i (entries 8..15 reserved: 0) */
  uint8_t rows[16];   /* rows of tile i */
} __attribute__((packed, aligned(64))) amx_tilecfg;

_Static_assert(sizeof(amx_tilecfg) == 64, "LDTILECFG reads 64 bytes");

/* An empty configuration (every tile unused) of palette 1. */
static inline void amx_cfg_init(amx_tilecfg *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->palette_id = AMX_PALETTE;
}

/* Tile t: rows x colsb bytes. */
static inline void amx_cfg_tile(amx_tilecfg *cfg, int t, int rows, int colsb) {
  cfg->rows[t] = (uint8_t)rows;
  cfg->colsb[t] = (uint16_t)colsb;
}

#endif /* ARMLLM_AMX_TILES_H */
