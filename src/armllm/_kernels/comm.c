/* comm.c: the shared-memory all-reduce described in comm.h. */
#define _GNU_SOURCE
#include "comm.h"

#include <limits.h>
#include <string.h>

#include "sync.h"

#define CACHE_LINE 64
#define COMM_MAGIC UINT64_C(0x61726d6c6c6d6172) /* "armllmar" */
/* A rank waiting at a barrier spins this long before it sleeps: the other
 * ranks of a step arrive within microseconds unless they were descheduled. */
#define COMM_SPIN_NS 50000

struct comm_barrier {
  _Alignas(CACHE_LINE) int64_t count;        /* arrivals this round (fetch-add) */
  _Alignas(CACHE_LINE) uint32_t generation;  /* shared futex: bumped by the last arrival */
  uint32_t sleepers;                         /* ranks in futex_wait(generation) */
};

/* All-reduces of at most this many floats take the one-barrier path (comm.h):
 * 64 KB covers a decode step's hidden vectors (2,048-8,192 floats a token) for a
 * few tokens, past which the reduce-scatter's 1/N share of the adds pays for its
 * second barrier. */
#define COMM_SMALL_FLOATS 16384
#define LINE_FLOATS (CACHE_LINE / 4)
#ifndef PREFETCH_FLOATS
#define PREFETCH_FLOATS 1024
#endif

struct comm_header {
  _Alignas(CACHE_LINE) uint64_t magic;
  int64_t ranks, max_floats;
  uint32_t aborted;  /* set once by armllm_comm_abort */
  struct comm_barrier barrier[2];
  /* one-barrier all-reduces each rank has made: their parity picks the buffer set,
   * a line per rank so that no two ranks write one line */
  struct {
    _Alignas(CACHE_LINE) uint64_t n;
  } small_calls[ARMLLM_COMM_MAX_RANKS];
};

static size_t buffer_bytes(int64_t floats) {
  size_t b = (size_t)floats * sizeof(float);
  return (b + CACHE_LINE - 1) / CACHE_LINE * CACHE_LINE;
}

static int64_t small_floats(int64_t max_floats) {
  return max_floats < COMM_SMALL_FLOATS ? max_floats : COMM_SMALL_FLOATS;
}

size_t armllm_comm_segment_bytes(int ranks, int64_t max_floats) {
  /* the ranks' input buffers, the output buffer, then two sets of the ranks'
   * small buffers */
  return sizeof(struct comm_header) + ((size_t)ranks + 1) * buffer_bytes(max_floats) +
         2 * (size_t)ranks * buffer_bytes(small_floats(max_floats));
}

void armllm_comm_init(void *segment, int ranks, int64_t max_floats) {
  struct comm_header *h = segment;
  memset(h, 0, sizeof *h);
  h->ranks = ranks;
  h->max_floats = max_floats;
  __atomic_store_n(&h->magic, COMM_MAGIC, __ATOMIC_RELEASE);
}

int armllm_comm_check(const void *segment, int ranks, int64_t max_floats) {
  const struct comm_header *h = segment;
  return __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == COMM_MAGIC && h->ranks == ranks &&
                 h->max_floats == max_floats
             ? 0
             : -1;
}

const char *armllm_comm_atomic_impl(void) { return sync_atomic_impl(); }

static int aborted(const struct comm_header *h) {
  return __atomic_load_n(&h->aborted, __ATOMIC_ACQUIRE) != 0;
}

/* 0 once every rank has arrived, -1 if the segment is aborted first. */
static int barrier_wait(struct comm_header *h, struct comm_barrier *b) {
  const int64_t ranks = h->ranks;
  uint32_t gen = __atomic_load_n(&b->generation, __ATOMIC_ACQUIRE);
  if (aborted(h)) return -1;
  if (sync_fetch_add(&b->count, 1) == ranks - 1) {
    /* the last arrival: reset the count for the next round, then release the others */
    __atomic_store_n(&b->count, 0, __ATOMIC_RELAXED);
    __atomic_fetch_add(&b->generation, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&b->sleepers, __ATOMIC_SEQ_CST))
      futex_wake_on(&b->generation, INT_MAX, 1);
    return aborted(h) ? -1 : 0;
  }
  if (spin_while_equal(&b->generation, gen, COMM_SPIN_NS) == gen) {
    /* Dekker with the last arrival (and with abort): count ourselves asleep, then look
     * again */
    __atomic_fetch_add(&b->sleepers, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&b->generation, __ATOMIC_SEQ_CST) == gen && !aborted(h))
      futex_wait_on(&b->generation, gen, 1);
    __atomic_fetch_sub(&b->sleepers, 1, __ATOMIC_SEQ_CST);
  }
  return aborted(h) ? -1 : 0;
}

void armllm_comm_abort(void *segment) {
  struct comm_header *h = segment;
  __atomic_store_n(&h->aborted, 1, __ATOMIC_SEQ_CST);
  for (int i = 0; i < 2; i++) { /* a new generation wakes the spinners and the sleepers */
    __atomic_fetch_add(&h->barrier[i].generation, 1, __ATOMIC_SEQ_CST);
    futex_wake_on(&h->barrier[i].generation, INT_MAX, 1);
  }
}

static float *input_buffer(struct comm_header *h, int64_t r) {
  return (float *)((char *)h + sizeof *h + (size_t)r * buffer_bytes(h->max_floats));
}

static float *small_buffer(struct comm_header *h, uint64_t set, int64_t r) {
  const size_t bytes = buffer_bytes(small_floats(h->max_floats));
  return (float *)((char *)input_buffer(h, h->ranks + 1) + (set * h->ranks + r) * bytes);
}

/* The one-barrier all-reduce of n <= small_floats(max_floats) floats: each rank
 * copies data into its buffer of this call's set; barrier; each rank sums every
 * buffer in rank order into its own data. A set is written again two calls later,
 * after the next call's barrier, which every rank reaches only once it has read
 * this call's buffers. */
static int allreduce_small(struct comm_header *h, int rank, float *data, int64_t n,
                           int staged) {
  const int64_t ranks = h->ranks;
  const uint64_t set = h->small_calls[rank].n++ & 1;
  if (!staged) memcpy(small_buffer(h, set, rank), data, (size_t)n * sizeof(float));
  if (barrier_wait(h, &h->barrier[0])) return -1;
  const float *in0 = small_buffer(h, set, 0), *in1 = small_buffer(h, set, 1);
  for (int64_t i0 = 0; i0 < n; i0 += LINE_FLOATS) {
    const int64_t i1 = i0 + LINE_FLOATS < n ? i0 + LINE_FLOATS : n;
    __builtin_prefetch(in0 + i0 + PREFETCH_FLOATS);
    __builtin_prefetch(in1 + i0 + PREFETCH_FLOATS);
    for (int64_t i = i0; i < i1; i++) data[i] = in0[i] + in1[i];
  }
  for (int64_t r = 2; r < ranks; r++) { /* rank order: ((in0 + in1) + in2) + ... */
    const float *in = small_buffer(h, set, r);
    for (int64_t i = 0; i < n; i++) data[i] += in[i];
  }
  return 0;
}

int armllm_comm_allreduce(void *segment, int rank, float *data, int64_t n) {
  struct comm_header *h = segment;
  const int64_t ranks = h->ranks, max = h->max_floats;
  float *out = input_buffer(h, ranks);
  sync_detect_atomics();
  if (ranks > 1 && n <= small_floats(max)) return allreduce_small(h, rank, data, n, 0);
  for (int64_t off = 0; off < n; off += max) {
    const int64_t m = n - off < max ? n - off : max;
    memcpy(input_buffer(h, rank), data + off, (size_t)m * sizeof(float));
    if (barrier_wait(h, &h->barrier[0])) return -1;
    const int64_t lo = m * rank / ranks, hi = m * (rank + 1) / ranks;
    memcpy(out + lo, input_buffer(h, 0) + lo, (size_t)(hi - lo) * sizeof(float));
    for (int64_t r = 1; r < ranks; r++) { /* rank order: ((in0 + in1) + in2) + ... */
      const float *in = input_buffer(h, r);
      for (int64_t i = lo; i < hi; i++) out[i] += in[i];
    }
    if (barrier_wait(h, &h->barrier[1])) return -1;
    memcpy(data + off, out, (size_t)m * sizeof(float));
  }
  return 0;
}

float *armllm_comm_staging(void *segment, int rank, int64_t n) {
  struct comm_header *h = segment;
  if (h->ranks < 2 || n > small_floats(h->max_floats)) return NULL;
  return small_buffer(h, h->small_calls[rank].n & 1, rank);
}

int armllm_comm_allreduce_staged(void *segment, int rank, float *data, int64_t n) {
  sync_detect_atomics();
  return allreduce_small(segment, rank, data, n, 1);
}

int armllm_comm_broadcast(void *segment, int rank, void *data, int64_t bytes) {
  struct comm_header *h = segment;
  const int64_t max = h->max_floats * (int64_t)sizeof(float);
  char *out = (char *)input_buffer(h, h->ranks);
  sync_detect_atomics();
  for (int64_t off = 0; off < bytes; off += max) {
    const size_t m = (size_t)(bytes - off < max ? bytes - off : max);
    /* the first barrier: every rank has read the output buffer's last contents */
    if (barrier_wait(h, &h->barrier[0])) return -1;
    if (rank == 0) memcpy(out, (char *)data + off, m);
    if (barrier_wait(h, &h->barrier[1])) return -1;
    if (rank != 0) memcpy((char *)data + off, out, m);
  }
  return 0;
}

int armllm_comm_gather_cols(void *segment, int rank, float *data, int64_t rows, int64_t ld,
                            const int64_t *col_start) {
  struct comm_header *h = segment;
  const int64_t ranks = h->ranks;
  int64_t widest = 1;
  for (int64_t r = 1; r < ranks; r++)
    if (col_start[r + 1] - col_start[r] > widest) widest = col_start[r + 1] - col_start[r];
  const int64_t step = h->max_floats / widest; /* whole rows per slice */
  if (step < 1) return -1;                     /* the caller checks widths against max_floats */
  sync_detect_atomics();
  for (int64_t row0 = 0; row0 < rows; row0 += step) {
    const int64_t m = rows - row0 < step ? rows - row0 : step;
    if (rank != 0) {
      const int64_t w = col_start[rank + 1] - col_start[rank];
      float *buf = input_buffer(h, rank);
      for (int64_t i = 0; i < m; i++)
        memcpy(buf + i * w, data + (row0 + i) * ld, (size_t)w * sizeof(float));
    }
    if (barrier_wait(h, &h->barrier[0])) return -1;
    if (rank == 0) {
      for (int64_t r = 1; r < ranks; r++) {
        const int64_t w = col_start[r + 1] - col_start[r];
        const float *buf = input_buffer(h, r);
        for (int64_t i = 0; i < m; i++)
          memcpy(data + (row0 + i) * ld + col_start[r], buf + i * w, (size_t)w * sizeof(float));
      }
    }
    if (barrier_wait(h, &h->barrier[1])) return -1;
  }
  return 0;
}
