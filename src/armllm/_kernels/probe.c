/* probe.c: read-bandwidth and FMA-peak probes (see probe.h). Built at the
 * architecture baseline; the x86 FMA loop is compiled for AVX2+FMA and run
 * only where the CPU has them. */
#include "probe.h"

#include "cpu.h"

#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

/* The read probe streams like the decode GEMVs do: each thread reads several
 * distant regions at once (one hardware-prefetch stream each) with full-width
 * vector loads, over many small chunks handed out by the pool. A single
 * sequential stream per thread with baseline 16-byte loads measured 1.4-2.7x
 * below what the bf16 GEMV itself read on the same machine. */
#define READ_STREAMS 4             /* concurrent streams per chunk */
#define READ_CHUNK_BYTES (1 << 20) /* work item: 4 streams of 256 KiB */
#define READ_MAX_CHUNKS 65536      /* 64 GiB of buffer at 1 MiB a chunk */

typedef struct {
  const uint8_t *bytes;
  int64_t n_chunks;
  int wide; /* x86: the CPU has AVX2 */
  uint64_t sums[READ_MAX_CHUNKS];
} read_job;

#if defined(__x86_64__)
__attribute__((target("avx2"))) static uint64_t read_streams_avx2(const uint8_t *p, int64_t len) {
  const int64_t stride = len / READ_STREAMS;
  __m256i acc[READ_STREAMS * 2];
  for (int j = 0; j < READ_STREAMS * 2; j++) acc[j] = _mm256_setzero_si256();
  for (int64_t i = 0; i < stride; i += 64)
    for (int j = 0; j < READ_STREAMS; j++) {
      const uint8_t *q = p + j * stride + i;
      acc[2 * j] = _mm256_xor_si256(acc[2 * j], _mm256_loadu_si256((const __m256i *)q));
      acc[2 * j + 1] = _mm256_xor_si256(acc[2 * j + 1], _mm256_loadu_si256((const __m256i *)(q + 32)));
    }
  for (int j = 1; j < READ_STREAMS * 2; j++) acc[0] = _mm256_xor_si256(acc[0], acc[j]);
  return (uint64_t)_mm256_extract_epi64(acc[0], 0) ^ (uint64_t)_mm256_extract_epi64(acc[0], 1) ^
         (uint64_t)_mm256_extract_epi64(acc[0], 2) ^ (uint64_t)_mm256_extract_epi64(acc[0], 3);
}
#endif

/* Portable form (NEON on AArch64, SSE2 on x86-64 after vectorization). */
static uint64_t read_streams(const uint8_t *p, int64_t len) {
  const int64_t stride = len / READ_STREAMS;
  uint64_t acc[READ_STREAMS][8] = {{0}};
  for (int64_t i = 0; i < stride; i += 64)
    for (int j = 0; j < READ_STREAMS; j++) {
      const uint64_t *q = (const uint64_t *)(p + j * stride + i);
      for (int w = 0; w < 8; w++) acc[j][w] ^= q[w];
    }
  uint64_t sum = 0;
  for (int j = 0; j < READ_STREAMS; j++)
    for (int w = 0; w < 8; w++) sum ^= acc[j][w];
  return sum;
}

static void read_chunk(void *ctx, int64_t begin, int64_t end) {
  read_job *job = ctx;
  for (int64_t c = begin; c < end; c++) {
    const uint8_t *p = job->bytes + c * (int64_t)READ_CHUNK_BYTES;
#if defined(__x86_64__)
    job->sums[c] = job->wide ? read_streams_avx2(p, READ_CHUNK_BYTES) : read_streams(p, READ_CHUNK_BYTES);
#else
    job->sums[c] = read_streams(p, READ_CHUNK_BYTES);
#endif
  }
}

uint64_t armllm_probe_read(armllm_pool *pool, const void *buf, size_t bytes) {
  static read_job job; /* large; one probe at a time (the pool serializes jobs anyway) */
  job.bytes = buf;
  job.n_chunks = (int64_t)(bytes / READ_CHUNK_BYTES);
  if (job.n_chunks > READ_MAX_CHUNKS) job.n_chunks = READ_MAX_CHUNKS;
#if defined(__x86_64__)
  job.wide = armllm_cpu_has(armllm_cpu_detect(), ARMLLM_CPU_AVX2);
#else
  job.wide = 0;
#endif
  armllm_pool_run(pool, job.n_chunks, 1, read_chunk, &job);
  uint64_t sum = 0;
  for (int64_t c = 0; c < job.n_chunks; c++) sum ^= job.sums[c];
  return sum;
}

#define FMA_CHAINS 12 /* > latency x throughput of every core we target */

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) static double fma_loop_avx2(int64_t iters) {
  __m256 acc[FMA_CHAINS];
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int j = 0; j < FMA_CHAINS; j++) acc[j] = _mm256_set1_ps((float)j);
  for (int64_t i = 0; i < iters; i++)
    for (int j = 0; j < FMA_CHAINS; j++) acc[j] = _mm256_fmadd_ps(acc[j], a, b);
  float out[8], total = 0;
  for (int j = 0; j < FMA_CHAINS; j++) {
    _mm256_storeu_ps(out, acc[j]);
    total += out[0];
  }
  return total == 12345.0f ? 0.0 : (double)iters * FMA_CHAINS * 8 * 2;
}
#elif defined(__aarch64__)
static double fma_loop_neon(int64_t iters) {
  float32x4_t acc[FMA_CHAINS];
  const float32x4_t a = vdupq_n_f32(0.999999f), b = vdupq_n_f32(1e-7f);
  for (int j = 0; j < FMA_CHAINS; j++) acc[j] = vdupq_n_f32((float)j);
  for (int64_t i = 0; i < iters; i++)
    for (int j = 0; j < FMA_CHAINS; j++) acc[j] = vfmaq_f32(b, acc[j], a);
  float total = 0;
  for (int j = 0; j < FMA_CHAINS; j++) total += vgetq_lane_f32(acc[j], 0);
  return total == 12345.0f ? 0.0 : (double)iters * FMA_CHAINS * 4 * 2;
}
#endif

#if !defined(__aarch64__)
static double fma_loop_scalar(int64_t iters) {
  float acc[FMA_CHAINS];
  for (int j = 0; j < FMA_CHAINS; j++) acc[j] = (float)j;
  for (int64_t i = 0; i < iters; i++)
    for (int j = 0; j < FMA_CHAINS; j++) acc[j] = acc[j] * 0.999999f + 1e-7f;
  float total = 0;
  for (int j = 0; j < FMA_CHAINS; j++) total += acc[j];
  return total == 12345.0f ? 0.0 : (double)iters * FMA_CHAINS * 2;
}
#endif

typedef struct {
  int64_t iters;
  double flops[4096];
} fma_job;

static void fma_chunk(void *ctx, int64_t begin, int64_t end) {
  fma_job *job = ctx;
  for (int64_t t = begin; t < end; t++) {
#if defined(__x86_64__)
    const armllm_cpu *cpu = armllm_cpu_detect();
    job->flops[t] = armllm_cpu_has(cpu, ARMLLM_CPU_AVX2) && armllm_cpu_has(cpu, ARMLLM_CPU_FMA)
                        ? fma_loop_avx2(job->iters)
                        : fma_loop_scalar(job->iters);
#elif defined(__aarch64__)
    job->flops[t] = fma_loop_neon(job->iters);
#else
    job->flops[t] = fma_loop_scalar(job->iters);
#endif
  }
}

double armllm_probe_fma(armllm_pool *pool, int64_t iters) {
  static fma_job job; /* large; one probe at a time (the pool serializes jobs anyway) */
  int64_t n = armllm_pool_threads(pool);
  job.iters = iters;
  armllm_pool_run(pool, n, 1, fma_chunk, &job);
  double total = 0;
  for (int64_t t = 0; t < n; t++) total += job.flops[t];
  return total;
}
