/* probe.h: tiny machine probes for the kernel benchmark (read bandwidth and
 * FMA peak), so that kernel speed can be reported as a fraction of what this
 * machine can do. */
#ifndef ARMLLM_PROBE_H
#define ARMLLM_PROBE_H

#include <stddef.h>
#include <stdint.h>

#include "pool.h"

/* Reads the first bytes - bytes % 1 MiB of buf (whole 1 MiB chunks, at most
 * 64 GiB) across the pool's threads, several streams per thread; returns the
 * XOR of all 64-bit words read, so the reads cannot be optimized away. */
uint64_t armllm_probe_read(armllm_pool *pool, const void *buf, size_t bytes);

/* Each pool thread runs `iters` iterations of independent vector FMA chains;
 * returns the fp32 FLOPs performed in total (2 per lane per FMA). */
double armllm_probe_fma(armllm_pool *pool, int64_t iters);

#endif /* ARMLLM_PROBE_H */
