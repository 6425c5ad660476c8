/* attn_common.h: what every attention variant shares: the metadata check,
 * the key range of a query row, cache addressing, and the merge of
 * per-partition softmax partials (see armllm_kernels.h). */
#ifndef ARMLLM_ATTN_COMMON_H
#define ARMLLM_ATTN_COMMON_H

#include "armllm_kernels.h"
#include "vexp.h"

/* -1, or the first sequence whose metadata is inconsistent. */
static inline int64_t armllm_attn_check(const armllm_attn_args *a) {
  if (a->query_start[0] != 0) return 0;
  for (int64_t b = 0; b < a->n_seqs; b++) {
    const int64_t q_len = a->query_start[b + 1] - a->query_start[b];
    const int64_t seq_len = a->seq_lens[b];
    if (q_len < 0 || q_len > seq_len) return b;
    const int64_t blocks = (seq_len + a->block_size - 1) / a->block_size;
    if (blocks > a->max_blocks) return b;
    for (int64_t i = 0; i < blocks; i++) {
      const int32_t id = a->block_table[b * a->max_blocks + i];
      if (id < 0 || id >= a->num_blocks) return b;
    }
  }
  return -1;
}

/* The sequence owning query row `row` (binary search over query_start). */
static inline int64_t armllm_attn_seq_of_row(const armllm_attn_args *a, int64_t row) {
  int64_t lo = 0, hi = a->n_seqs - 1;
  while (lo < hi) {
    int64_t mid = (lo + hi + 1) / 2;
    if (a->query_start[mid] <= row) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/* Position of query row `row` of sequence b, and the first key it sees. */
static inline int64_t armllm_attn_pos(const armllm_attn_args *a, int64_t b, int64_t row) {
  const int64_t q_len = a->query_start[b + 1] - a->query_start[b];
  return a->seq_lens[b] - q_len + (row - a->query_start[b]);
}

static inline int64_t armllm_attn_lo(const armllm_attn_args *a, int64_t pos) {
  if (a->sliding_window <= 0 || pos - a->sliding_window + 1 < 0) return 0;
  return pos - a->sliding_window + 1;
}

/* Element offset of token `tok` of KV head `kvh` of sequence b in a cache. */
static inline int64_t armllm_attn_kv_offset(const armllm_attn_args *a, int64_t b, int64_t kvh,
                                            int64_t tok) {
  const int64_t block = a->block_table[b * a->max_blocks + tok / a->block_size];
  return ((block * a->n_kv_heads + kvh) * a->block_size + tok % a->block_size) * a->head_dim;
}

/* Running softmax state of one (row, head): (m, l, acc[head_dim]). */
typedef struct {
  float m, l;
  int have;
} armllm_softmax_state;

/* Merges a partition's partial (mp, lp, accp) into the running (st, acc),
 * in partition order: the only place partials meet, so split and unsplit
 * runs agree to the bit. */
static inline void armllm_attn_merge(armllm_softmax_state *st, float *acc, float mp, float lp,
                                     const float *accp, int64_t head_dim) {
  if (!st->have) {
    st->m = mp;
    st->l = lp;
    st->have = 1;
    memcpy(acc, accp, (size_t)head_dim * sizeof *acc);
    return;
  }
  const float mn = st->m > mp ? st->m : mp;
  const float ca = armllm_exp_scalar(st->m - mn), cb = armllm_exp_scalar(mp - mn);
  st->l = st->l * ca + lp * cb;
  st->m = mn;
  for (int64_t d = 0; d < head_dim; d++) acc[d] = acc[d] * ca + accp[d] * cb;
}

#endif /* ARMLLM_ATTN_COMMON_H */
