/* pool.c: the thread pool described in pool.h.
 *
 * One job at a time: the caller publishes (fn, ctx, n_items, grain) and one
 * 64-bit claim word, (number of chunks << 32) | next chunk, bumps
 * `generation` and joins in. Workers wait for `generation` to change (spin,
 * then futex) and claim chunks with fetch-add on the claim word until none is
 * left. A claim describes itself: its chunk index is valid only if it is
 * below the chunk count it came with, and then the job cannot end before that
 * chunk is done, so the job fields it reads next are that job's. Each thread
 * adds the chunks it ran to `chunks_done` once, after its last claim; the
 * caller returns as soon as every chunk is done. It never waits for a worker
 * that claimed nothing (one that was descheduled, or spun into the next job
 * late: its first claim simply lands on whatever job is current). Sleep/wake
 * use the Dekker pattern on sequentially consistent atomics (`sleepers`,
 * `caller_sleeping`), so a futex wake costs a system call only when somebody
 * really sleeps.
 */
#define _GNU_SOURCE
#include "pool.h"
#include "sync.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>


#define CACHE_LINE 64
/* How long an idle thread spins before it sleeps: long enough to catch the
 * next kernel of a decode step (a few Python-side microseconds apart), short
 * enough that an idle engine burns no CPU. */
#define SPIN_NS 200000

const char *armllm_pool_atomic_impl(void) { return sync_atomic_impl(); }

static inline int64_t claim(int64_t *p, int64_t v) { return sync_fetch_add(p, v); }
static void detect_atomics(void) { sync_detect_atomics(); }
static void futex_wait(uint32_t *addr, uint32_t expected) { futex_wait_on(addr, expected, 0); }
static void futex_wake(uint32_t *addr, int count) { futex_wake_on(addr, count, 0); }

/* ----------------------------------------------------------------- pool */

struct armllm_pool {
  int n_threads;
  int n_workers_started;
  pthread_t *workers;
  pthread_mutex_t run_lock; /* one job at a time */

  /* the current job (one round of it, see armllm_pool_run), written by the
   * caller before it publishes `claim_word`; chunk c covers items
   * [first + c * grain, min(first + (c + 1) * grain, end)) */
  armllm_task_fn fn;
  void *ctx;
  int64_t first, end, grain;

  _Alignas(CACHE_LINE) int64_t claim_word;  /* (chunks << 32) | next chunk, fetch-add */
  _Alignas(CACHE_LINE) uint32_t generation; /* futex: workers wait for it to change */
  uint32_t sleepers;                        /* workers in futex_wait(generation) */
  uint32_t stop;
  _Alignas(CACHE_LINE) uint32_t chunks_done; /* futex: the caller waits for all chunks */
  uint32_t caller_sleeping;

  /* Pinning: worker i runs on the (i+1)-th allowed CPU; the first is kept
   * for the calling thread, whose own affinity is left alone except while a
   * job runs if it happens to sit on a worker's CPU (see step_aside). */
  int pinned;
  int caller_cpu;
  cpu_set_t worker_cpus;
};

static __thread int in_pool_task; /* nesting guard: set while running a task */

/* Chunks per round: the claim word's low half counts claims, which pass the
 * chunk count by at most one per thread (a thread stops at its first failed
 * claim), so a round keeps well inside 31 bits. */
#define MAX_ROUND_CHUNKS (INT64_C(1) << 30)

/* Claims and runs chunks of the current job until a claim fails, then reports
 * the chunks it ran (the job cannot end, nor another start, before it does). */
static void run_chunks(armllm_pool *pool) {
  uint32_t ran = 0, chunks = 0;
  for (;;) {
    int64_t word = claim(&pool->claim_word, 1);
    uint32_t chunk = (uint32_t)word;
    chunks = (uint32_t)((uint64_t)word >> 32);
    if (chunk >= chunks) break;
    int64_t begin = pool->first + (int64_t)chunk * pool->grain;
    int64_t end = pool->end - begin < pool->grain ? pool->end : begin + pool->grain;
    pool->fn(pool->ctx, begin, end);
    ran++;
  }
  if (ran && __atomic_add_fetch(&pool->chunks_done, ran, __ATOMIC_SEQ_CST) == chunks &&
      __atomic_load_n(&pool->caller_sleeping, __ATOMIC_SEQ_CST))
    futex_wake(&pool->chunks_done, 1);
}

typedef struct {
  armllm_pool *pool;
  int cpu; /* -1: no pinning */
} worker_start;

static void *worker_main(void *arg) {
  worker_start start = *(worker_start *)arg;
  free(arg);
  armllm_pool *pool = start.pool;
  if (start.cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(start.cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set); /* best effort */
  }
  in_pool_task = 1;
  uint32_t seen = 0;
  for (;;) {
    uint32_t g = spin_while_equal(&pool->generation, seen, SPIN_NS);
    while (g == seen) {
      __atomic_fetch_add(&pool->sleepers, 1, __ATOMIC_SEQ_CST);
      if (__atomic_load_n(&pool->generation, __ATOMIC_SEQ_CST) == seen)
        futex_wait(&pool->generation, seen);
      __atomic_fetch_sub(&pool->sleepers, 1, __ATOMIC_SEQ_CST);
      g = __atomic_load_n(&pool->generation, __ATOMIC_ACQUIRE);
    }
    seen = g;
    if (__atomic_load_n(&pool->stop, __ATOMIC_ACQUIRE)) break;
    run_chunks(pool);
  }
  return NULL;
}

/* A pinned worker cannot leave its CPU, so a caller that the scheduler put on
 * that CPU would run the whole job before the worker gets a turn. Such a
 * caller moves to the CPU kept for it for the job's duration; afterwards
 * its affinity is restored, and the scheduler normally leaves it where it
 * is, so the next job finds it there at the cost of one sched_getcpu(). */
static int step_aside(armllm_pool *pool, cpu_set_t *saved) {
  if (!pool->pinned) return 0;
  int cpu = sched_getcpu();
  if (cpu < 0 || !CPU_ISSET(cpu, &pool->worker_cpus)) return 0;
  if (sched_getaffinity(0, sizeof *saved, saved) != 0 || !CPU_ISSET(pool->caller_cpu, saved))
    return 0; /* the caller chose its CPUs itself: respect that */
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(pool->caller_cpu, &one);
  return sched_setaffinity(0, sizeof one, &one) == 0;
}

static void publish_and_wake(armllm_pool *pool) {
  __atomic_fetch_add(&pool->generation, 1, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&pool->sleepers, __ATOMIC_SEQ_CST))
    futex_wake(&pool->generation, INT_MAX);
}

/* Returns once all `chunks` chunks of the job are done (spin, then futex). */
static void wait_for_chunks(armllm_pool *pool, uint32_t chunks) {
  uint32_t done = __atomic_load_n(&pool->chunks_done, __ATOMIC_ACQUIRE);
  while (done != chunks) {
    done = spin_while_equal(&pool->chunks_done, done, SPIN_NS);
    if (done == chunks) break;
    __atomic_store_n(&pool->caller_sleeping, 1, __ATOMIC_SEQ_CST);
    done = __atomic_load_n(&pool->chunks_done, __ATOMIC_SEQ_CST);
    if (done != chunks) futex_wait(&pool->chunks_done, done);
    __atomic_store_n(&pool->caller_sleeping, 0, __ATOMIC_SEQ_CST);
    done = __atomic_load_n(&pool->chunks_done, __ATOMIC_ACQUIRE);
  }
}

int armllm_allowed_cpus(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  int n = CPU_COUNT(&set);
  return n > 0 ? n : 1;
}

static void stop_workers(armllm_pool *pool) {
  __atomic_store_n(&pool->stop, 1, __ATOMIC_RELEASE);
  publish_and_wake(pool);
  for (int i = 0; i < pool->n_workers_started; i++) pthread_join(pool->workers[i], NULL);
}

armllm_pool *armllm_pool_create(int n_threads, int pin, char *err, size_t err_len) {
  detect_atomics();
  if (n_threads < 1 || n_threads > 4096) {
    snprintf(err, err_len, "thread count must be between 1 and 4096, got %d", n_threads);
    return NULL;
  }
  armllm_pool *pool = aligned_alloc(CACHE_LINE, (sizeof *pool + CACHE_LINE - 1) / CACHE_LINE * CACHE_LINE);
  if (!pool) {
    snprintf(err, err_len, "out of memory creating the thread pool");
    return NULL;
  }
  memset(pool, 0, sizeof *pool);
  pool->n_threads = n_threads;
  pthread_mutex_init(&pool->run_lock, NULL);
  pool->workers = calloc((size_t)n_threads, sizeof *pool->workers);
  if (!pool->workers) {
    snprintf(err, err_len, "out of memory creating the thread pool");
    free(pool);
    return NULL;
  }
  /* Worker i goes to the (i+1)-th allowed CPU; the caller keeps the first.
   * Only without oversubscription: more threads than CPUs float freely. */
  int cpus[CPU_SETSIZE], n_cpus = 0;
  cpu_set_t set;
  if (pin && sched_getaffinity(0, sizeof set, &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; c++)
      if (CPU_ISSET(c, &set)) cpus[n_cpus++] = c;
  pool->pinned = n_threads > 1 && n_cpus >= n_threads;
  CPU_ZERO(&pool->worker_cpus);
  if (pool->pinned) {
    pool->caller_cpu = cpus[0];
    for (int i = 1; i < n_threads; i++) CPU_SET(cpus[i], &pool->worker_cpus);
  }
  for (int i = 0; i < n_threads - 1; i++) {
    worker_start *start = malloc(sizeof *start);
    int rc = start ? 0 : ENOMEM;
    if (start) {
      start->pool = pool;
      start->cpu = pool->pinned ? cpus[i + 1] : -1;
      rc = pthread_create(&pool->workers[i], NULL, worker_main, start);
      if (rc) free(start);
    }
    if (rc) {
      snprintf(err, err_len, "could not start worker thread %d of %d: %s", i + 1, n_threads - 1,
               strerror(rc));
      stop_workers(pool);
      free(pool->workers);
      free(pool);
      return NULL;
    }
    pool->n_workers_started++;
  }
  return pool;
}

void armllm_pool_destroy(armllm_pool *pool) {
  if (!pool) return;
  pthread_mutex_lock(&pool->run_lock);
  stop_workers(pool);
  pthread_mutex_unlock(&pool->run_lock);
  pthread_mutex_destroy(&pool->run_lock);
  free(pool->workers);
  free(pool);
}

int armllm_pool_threads(const armllm_pool *pool) { return pool ? pool->n_threads : 1; }

int64_t armllm_pool_grain(const armllm_pool *pool, int64_t n_items, int64_t chunks_per_thread,
                          int64_t min_grain) {
  int64_t chunks = (int64_t)armllm_pool_threads(pool) * chunks_per_thread;
  int64_t grain = (n_items + chunks - 1) / chunks;
  return grain < min_grain ? min_grain : grain;
}

void armllm_pool_run(armllm_pool *pool, int64_t n_items, int64_t grain, armllm_task_fn fn,
                     void *ctx) {
  if (n_items <= 0) return;
  if (grain < 1) grain = 1;
  if (!pool || pool->n_threads == 1 || n_items <= grain || in_pool_task) {
    int saved = in_pool_task;
    in_pool_task = 1;
    for (int64_t b = 0; b < n_items; b += grain) fn(ctx, b, n_items - b < grain ? n_items : b + grain);
    in_pool_task = saved;
    return;
  }
  pthread_mutex_lock(&pool->run_lock);
  cpu_set_t saved_affinity;
  int moved = step_aside(pool, &saved_affinity);
  pool->fn = fn;
  pool->ctx = ctx;
  pool->grain = grain;
  in_pool_task = 1;
  for (int64_t first = 0; first < n_items;) { /* one round unless the job is huge */
    int64_t chunks = (n_items - first + grain - 1) / grain;
    if (chunks > MAX_ROUND_CHUNKS) chunks = MAX_ROUND_CHUNKS;
    pool->first = first;
    pool->end = chunks == MAX_ROUND_CHUNKS ? first + chunks * grain : n_items;
    __atomic_store_n(&pool->chunks_done, 0, __ATOMIC_RELAXED);
    /* release: the job fields above are visible to whoever claims a chunk */
    __atomic_store_n(&pool->claim_word, chunks << 32, __ATOMIC_RELEASE);
    publish_and_wake(pool);
    run_chunks(pool);
    wait_for_chunks(pool, (uint32_t)chunks);
    first = pool->end;
  }
  in_pool_task = 0;
  if (moved) sched_setaffinity(0, sizeof saved_affinity, &saved_affinity);
  pthread_mutex_unlock(&pool->run_lock);
}

/* ------------------------------------------------------------ test hook */

static void count_items(void *ctx, int64_t begin, int64_t end) {
  uint32_t *counts = ctx;
  for (int64_t i = begin; i < end; i++) __atomic_fetch_add(&counts[i], 1, __ATOMIC_RELAXED);
}

void armllm_pool_count_items(armllm_pool *pool, int64_t n_items, int64_t grain, uint32_t *counts) {
  armllm_pool_run(pool, n_items, grain, count_items, counts);
}

typedef struct {
  armllm_pool *pool;
  int64_t n_inner;
  uint32_t *counts;
} nested_job;

static void count_nested(void *ctx, int64_t begin, int64_t end) {
  const nested_job *job = ctx;
  for (int64_t i = begin; i < end; i++) /* a job started from inside a job */
    armllm_pool_run(job->pool, job->n_inner, 1, count_items, job->counts + i * job->n_inner);
}

void armllm_pool_count_items_nested(armllm_pool *pool, int64_t n_outer, int64_t n_inner,
                                    uint32_t *counts) {
  nested_job job = {pool, n_inner, counts};
  armllm_pool_run(pool, n_outer, 1, count_nested, &job);
}
