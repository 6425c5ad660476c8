/* pool.h: armllm's thread pool (no OpenMP).
 *
 * Persistent workers pinned to the CPUs the process may use; the calling
 * thread takes part in every job. A job is `n_items` items cut into chunks
 * of `grain` items, claimed with one atomic fetch-add per chunk (LDADDAL on
 * aarch64 with LSE, an LDAXR/STLXR loop without it, LOCK XADD on x86-64).
 * Idle workers spin briefly, then sleep on a futex. A job returns as soon as
 * all its chunks have run: it never waits for a worker that claimed none
 * (one still waking up, or descheduled on a CPU shared with other work).
 *
 * armllm_pool_run() calls from several threads are serialized; a call made
 * from inside a running task (nesting) runs its items on the calling thread.
 */
#ifndef ARMLLM_POOL_H
#define ARMLLM_POOL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct armllm_pool armllm_pool;

/* Runs items [begin, end) of a job. */
typedef void (*armllm_task_fn)(void *ctx, int64_t begin, int64_t end);

/* n_threads counts the caller. pin != 0 pins worker i to the i-th allowed
 * CPU (the caller is left where it is). Returns NULL and fills err on
 * failure. */
armllm_pool *armllm_pool_create(int n_threads, int pin, char *err, size_t err_len);
void armllm_pool_destroy(armllm_pool *pool);
int armllm_pool_threads(const armllm_pool *pool);

/* Runs fn over [0, n_items) in chunks of `grain` (>= 1) and returns when all
 * are done. pool may be NULL (serial). */
void armllm_pool_run(armllm_pool *pool, int64_t n_items, int64_t grain,
                     armllm_task_fn fn, void *ctx);

/* Chunks of a job that fit `n_items` work evenly on the pool: a grain that
 * gives each thread about `chunks_per_thread` chunks, at least min_grain. */
int64_t armllm_pool_grain(const armllm_pool *pool, int64_t n_items,
                          int64_t chunks_per_thread, int64_t min_grain);

/* Number of CPUs in the process's affinity mask (>= 1). */
int armllm_allowed_cpus(void);

/* The fetch-add in use: "ldaddal", "ldaxr/stlxr" or "lock xadd". */
const char *armllm_pool_atomic_impl(void);

/* Test hook: counts[i] += 1 (atomically) for every item i of a job. */
void armllm_pool_count_items(armllm_pool *pool, int64_t n_items, int64_t grain,
                             uint32_t *counts);

/* Test hook: a job of n_outer items, each of which runs a nested job of
 * n_inner items on the same pool; counts has n_outer * n_inner slots. */
void armllm_pool_count_items_nested(armllm_pool *pool, int64_t n_outer, int64_t n_inner,
                                    uint32_t *counts);

#ifdef __cplusplus
}
#endif
#endif /* ARMLLM_POOL_H */
