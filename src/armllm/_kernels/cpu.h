/* cpu.h: CPU feature detection (once) and the choice of a kernel table. */
#ifndef ARMLLM_CPU_H
#define ARMLLM_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "armllm_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Feature bits; names in armllm_cpu_feature_name(). AMX: amx_tile, amx_bf16
 * and amx_int8 are cpuid's bits; amx_perm means this process may use tile
 * data (XCR0 enables XTILECFG and XTILEDATA, and Linux granted
 * ARCH_REQ_XCOMP_PERM at detection); without it, amx_denied says why. */
enum {
  ARMLLM_CPU_ASIMD, ARMLLM_CPU_ASIMDDP, ARMLLM_CPU_FP16, ARMLLM_CPU_BF16, ARMLLM_CPU_I8MM,
  ARMLLM_CPU_SVE, ARMLLM_CPU_SVE2, ARMLLM_CPU_SVEBF16, ARMLLM_CPU_SVEI8MM, ARMLLM_CPU_ATOMICS,
  ARMLLM_CPU_AVX, ARMLLM_CPU_AVX2, ARMLLM_CPU_FMA, ARMLLM_CPU_F16C, ARMLLM_CPU_AVX512F,
  ARMLLM_CPU_AVX512BW, ARMLLM_CPU_AVX512VL, ARMLLM_CPU_AVX512VNNI, ARMLLM_CPU_AVX512BF16,
  ARMLLM_CPU_AVXVNNI, ARMLLM_CPU_AVX512DQ, ARMLLM_CPU_AMXTILE, ARMLLM_CPU_AMXBF16,
  ARMLLM_CPU_AMXINT8, ARMLLM_CPU_AMXPERM,
  ARMLLM_CPU_NUM_FEATURES
};

typedef struct armllm_cpu {
  const char *arch;         /* "aarch64", "x86_64" or "other" */
  uint64_t features;        /* bit i set = feature i present */
  int sve_vector_bits;      /* 0 without SVE */
  char amx_denied[256];     /* with amx_tile but no amx_perm: why not (else "") */
  char vendor[16];          /* x86: cpuid's vendor ("AuthenticAMD", "GenuineIntel"), else "" */
  int family, model;        /* x86: cpuid's display family and model, else 0 */
} armllm_cpu;

/* Detected once; later calls return the same object. */
const armllm_cpu *armllm_cpu_detect(void);
const char *armllm_cpu_feature_name(int feature);
int armllm_cpu_has(const armllm_cpu *cpu, int feature);

/* Variants built into this binary, best first, NULL-terminated. */
const char *const *armllm_isa_built(void);

/* The table for `isa`, or NULL with a message in err: unknown name, not
 * built for this architecture, not supported by this CPU (naming the
 * missing features), or a table that leaves a slot empty. */
const armllm_kernels *armllm_isa_table(const char *isa, const armllm_cpu *cpu, char *err,
                                       size_t err_len);

/* The best variant this CPU runs. */
const char *armllm_isa_best(const armllm_cpu *cpu);

/* Run-time choices inside a variant's function: the code branches on one of
 * these predicates, and armllm_slot_impl names the path it takes, so that
 * `armllm info` shows what runs. */

/* neon's quantized GEMMs (armllm_neon_gemm_wq, armllm_neon_gemm_gguf) run SDOT
 * (FEAT_DotProd, HWCAP asimddp) rather than SMULL/SMLAL. */
int armllm_neon_sdot(void);

/* An AMD family 19h CPU (Zen 4; Zen 3 too, which runs no AVX-512 code): the
 * CPU some AVX-512 decode constants are chosen for. */
int armllm_x86_zen4(void);
/* The choice armllm_slot_impl reports as "+nopf": avx512/gemm.c's bf16 decode
 * GEMV without software prefetch (on Zen 4). */
int armllm_x86_gemv_no_prefetch(void);

/* Panel streams a thread of the AVX-512 quantized decode GEMVs (avx512/quant.c's
 * w8/w4 and avx512/gguf.c's GGUF blocks, M <= 8) reads at once: 1 on AMD family
 * 19h (Zen 4), else 2. Measured on the 1B chain at M = 1, 2 threads
 * (tools/bench_decode_chain.py, one stream and two in turn): a Zen 4 read 4-5%
 * more of the probe's bandwidth with one (Q4_K_M 0.93 against 0.89, Q4_0 0.94
 * against 0.89); on Zen 5 one was as fast as two for GGUF blocks, and a Xeon read
 * 14% faster with two. */
int armllm_x86_decode_streams(void);
/* Sets that count (1 or 2; 0: the CPU's again) for every later call: for
 * measuring a new CPU (ARMLLM_DECODE_STREAMS) and for tests. Either count gives
 * the same bits. */
void armllm_set_x86_decode_streams(int streams);
/* The choice armllm_slot_impl reports as "+1stream". */
int armllm_x86_one_stream(void);

/* What runs in `slot` of table t: the variant named by its ARMLLM_SLOT, then
 * "+choice" for each run-time choice that function takes on this CPU (e.g.
 * "neon+dotprod"). Written to buf (at most len bytes); returns buf. */
const char *armllm_slot_impl(const armllm_kernels *t, int slot, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* ARMLLM_CPU_H */
