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

typedef struct {
  const uint64_t *words;
  int64_t n_words;
  uint64_t sums[256]; /* one slot per chunk */
  int64_t chunk;
} read_job;

static void read_chunk(void *ctx, int64_t begin, int64_t end) {
  read_job *job = ctx;
  for (int64_t c = begin; c < end; c++) {
    int64_t lo = c * job->chunk, hi = lo + job->chunk < job->n_words ? lo + job->chunk : job->n_words;
    uint64_t acc[8] = {0}; /* eight streams the compiler turns into vector loads */
    for (int64_t i = lo; i < hi; i += 8)
      for (int j = 0; j < 8; j++) acc[j] ^= job->words[i + j];
    job->sums[c] = acc[0] ^ acc[1] ^ acc[2] ^ acc[3] ^ acc[4] ^ acc[5] ^ acc[6] ^ acc[7];
  }
}

uint64_t armllm_probe_read(armllm_pool *pool, const void *buf, size_t bytes) {
  read_job job;
  job.words = buf;
  job.n_words = (int64_t)(bytes / 64) * 8;
  int64_t chunks = armllm_pool_threads(pool);
  if (chunks > 256) chunks = 256;
  job.chunk = (job.n_words / 8 + chunks - 1) / chunks * 8;
  for (int i = 0; i < 256; i++) job.sums[i] = 0;
  armllm_pool_run(pool, chunks, 1, read_chunk, &job);
  uint64_t sum = 0;
  for (int64_t i = 0; i < chunks; i++) sum ^= job.sums[i];
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
