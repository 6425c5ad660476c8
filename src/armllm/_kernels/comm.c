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

struct comm_header {
  _Alignas(CACHE_LINE) uint64_t magic;
  int64_t ranks, max_floats;
  struct comm_barrier barrier[2];
};

static size_t buffer_bytes(int64_t max_floats) {
  size_t b = (size_t)max_floats * sizeof(float);
  return (b + CACHE_LINE - 1) / CACHE_LINE * CACHE_LINE;
}

size_t armllm_comm_segment_bytes(int ranks, int64_t max_floats) {
  /* the ranks' input buffers, then the output buffer */
  return sizeof(struct comm_header) + ((size_t)ranks + 1) * buffer_bytes(max_floats);
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

static void barrier_wait(struct comm_barrier *b, int64_t ranks) {
  uint32_t gen = __atomic_load_n(&b->generation, __ATOMIC_ACQUIRE);
  if (sync_fetch_add(&b->count, 1) == ranks - 1) {
    /* the last arrival: reset the count for the next round, then release the others */
    __atomic_store_n(&b->count, 0, __ATOMIC_RELAXED);
    __atomic_fetch_add(&b->generation, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&b->sleepers, __ATOMIC_SEQ_CST))
      futex_wake_on(&b->generation, INT_MAX, 1);
    return;
  }
  if (spin_while_equal(&b->generation, gen, COMM_SPIN_NS) != gen) return;
  /* Dekker with the last arrival: count ourselves asleep, then look again */
  __atomic_fetch_add(&b->sleepers, 1, __ATOMIC_SEQ_CST);
  while (__atomic_load_n(&b->generation, __ATOMIC_SEQ_CST) == gen)
    futex_wait_on(&b->generation, gen, 1);
  __atomic_fetch_sub(&b->sleepers, 1, __ATOMIC_SEQ_CST);
}

void armllm_comm_allreduce(void *segment, int rank, float *data, int64_t n) {
  struct comm_header *h = segment;
  const int64_t ranks = h->ranks, max = h->max_floats;
  const size_t stride = buffer_bytes(max) / sizeof(float);
  float *bufs = (float *)((char *)segment + sizeof *h);
  float *out = bufs + ranks * stride;
  sync_detect_atomics();
  for (int64_t off = 0; off < n; off += max) {
    const int64_t m = n - off < max ? n - off : max;
    memcpy(bufs + rank * stride, data + off, (size_t)m * sizeof(float));
    barrier_wait(&h->barrier[0], ranks);
    const int64_t lo = m * rank / ranks, hi = m * (rank + 1) / ranks;
    memcpy(out + lo, bufs + lo, (size_t)(hi - lo) * sizeof(float));
    for (int64_t r = 1; r < ranks; r++) { /* rank order: ((in0 + in1) + in2) + ... */
      const float *in = bufs + r * stride;
      for (int64_t i = lo; i < hi; i++) out[i] += in[i];
    }
    barrier_wait(&h->barrier[1], ranks);
    memcpy(data + off, out, (size_t)m * sizeof(float));
  }
}

void armllm_comm_broadcast(void *segment, int rank, void *data, int64_t bytes) {
  struct comm_header *h = segment;
  const int64_t ranks = h->ranks, max = h->max_floats * (int64_t)sizeof(float);
  char *out = (char *)segment + sizeof *h + (size_t)ranks * buffer_bytes(h->max_floats);
  sync_detect_atomics();
  for (int64_t off = 0; off < bytes; off += max) {
    const size_t m = (size_t)(bytes - off < max ? bytes - off : max);
    /* the first barrier: every rank has read the output buffer's last contents */
    barrier_wait(&h->barrier[0], ranks);
    if (rank == 0) memcpy(out, (char *)data + off, m);
    barrier_wait(&h->barrier[1], ranks);
    if (rank != 0) memcpy((char *)data + off, out, m);
  }
}
