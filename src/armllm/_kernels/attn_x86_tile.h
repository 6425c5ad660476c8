/* attn_x86_tile.h: the fields every x86 attention tile (tile_ctx of
 * avx2/attn.c, avx512/attn.c, amx/attn.c) starts with: the ones the shared
 * driver attn_x86.h reads and writes. The including file defines TILE_Q,
 * PART and MAXD first and adds its own fields after these. */
#ifndef ARMLLM_ATTN_X86_TILE_H
#define ARMLLM_ATTN_X86_TILE_H

#include <immintrin.h>
#include <stdint.h>

/* The most rows of the next partition a tile's prefetch runs on into (the
 * int8 prefetch distance, I8_PF; the bf16 one, KC, is 32). */
#define ARMLLM_ATTN_PF_NEXT 64

/* Prefetches every line of a cache row of `bytes` at p into L2: each 64
 * bytes from its first, and its last byte's line. Rows need not start on a
 * line (numpy puts a large array 16 bytes into its first page): a 64-byte
 * int8 row then spans two lines, and the last row of a block's run (the next
 * line another block's) would leave its second line to a demand miss. L2,
 * not L1 (T0): on Zen 4 (2 threads, Llama-3.2-1B's heads, 16 layers'
 * caches) decode read the rows at 18.4 and 20.8 GB/s with T1 against T0's
 * 13.6 and 17.8 (bf16; 32K tokens, 4K x 8), 10.9 and 12.2 against 9.8 and
 * 12.2 (int8), with a sequence's blocks scattered; T2 as T1. In one run of
 * blocks (armllm_kv_row) T0 still lost (16K tokens: 22.8-23.2 GB/s against
 * 25.0-25.8), and no prefetch at all was about as fast as T1 there (17.9-
 * 20.9 against 20.8-21.0) but 1.6-2.7x slower over scattered or descending
 * blocks. */
static inline __attribute__((always_inline)) void attn_prefetch_row(const void *p,
                                                                    int64_t bytes) {
  const char *c = p;
  for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(c + o, _MM_HINT_T1);
  _mm_prefetch(c + bytes - 1, _MM_HINT_T1);
}

#define ARMLLM_X86_TILE_FIELDS                                                               \
  const armllm_attn_args *a;                                                                 \
  int64_t b, kvh, r0, r1, h0, nh, nq, hd, hdp; /* the sub-tile (tile_init) */                 \
  int64_t pos[TILE_Q], lo[TILE_Q];             /* per query */                               \
  int64_t lo_u, pos_u;                         /* the union of their key ranges */           \
  float q[TILE_Q][MAXD];                       /* zero-padded to hdp */                      \
  float accp[TILE_Q][MAXD] __attribute__((aligned(64))); /* the partition's weighted V */    \
  float mp[TILE_Q], lp[TILE_Q];                                                              \
  int valid[TILE_Q];             /* query has keys in the partition */                       \
  const void *rows[2 * PART + ARMLLM_ATTN_PF_NEXT]; /* K rows of the partition's keys, then  \
                                                    V rows, then the next one's first K rows */ \
  float ksc[PART], vsc[PART];    /* int8 caches: their rows' scales, as rows */              \
  int64_t nrows, nnext;          /* keys: V rows start at rows + nrows; next K rows after */

#endif /* ARMLLM_ATTN_X86_TILE_H */
