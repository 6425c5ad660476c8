/* attn_x86_tile.h: the fields every x86 attention tile (tile_ctx of
 * avx2/attn.c, avx512/attn.c, amx/attn.c) starts with: the ones the shared
 * driver attn_x86.h reads and writes. The including file defines TILE_Q,
 * PART and MAXD first and adds its own fields after these. */
#ifndef ARMLLM_ATTN_X86_TILE_H
#define ARMLLM_ATTN_X86_TILE_H

#define ARMLLM_X86_TILE_FIELDS                                                               \
  const armllm_attn_args *a;                                                                 \
  int64_t b, kvh, r0, r1, h0, nh, nq, hd, hdp; /* the sub-tile (tile_init) */                 \
  int64_t pos[TILE_Q], lo[TILE_Q];             /* per query */                               \
  int64_t lo_u, pos_u;                         /* the union of their key ranges */           \
  float q[TILE_Q][MAXD];                       /* zero-padded to hdp */                      \
  float accp[TILE_Q][MAXD] __attribute__((aligned(64))); /* the partition's weighted V */    \
  float mp[TILE_Q], lp[TILE_Q];                                                              \
  int valid[TILE_Q];             /* query has keys in the partition */                       \
  const void *rows[2 * PART];    /* K rows of the partition's keys, then V rows */           \
  float ksc[PART], vsc[PART];    /* int8 caches: their rows' scales, as rows */              \
  int64_t nrows;                 /* keys: V rows start at rows + nrows */

#endif /* ARMLLM_ATTN_X86_TILE_H */
