/* cpu.c: reads CPU features (getauxval on aarch64, cpuid/xgetbv on x86-64,
 * where it also asks Linux once for AMX tile data), maps variant names to
 * kernel tables with their feature requirements, and names what runs in each
 * slot, run-time choices inside a variant included. */
#define _GNU_SOURCE /* syscall (amx_permit) */
#include "cpu.h"

#include <stdio.h>
#include <string.h>

#if defined(__aarch64__)
#include <sys/auxv.h>
#include <sys/prctl.h>
#elif defined(__x86_64__)
#include <cpuid.h>
#include <errno.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define BIT(f) (UINT64_C(1) << (f))

static const char *const feature_names[ARMLLM_CPU_NUM_FEATURES] = {
    "asimd", "asimddp", "fp16", "bf16", "i8mm", "sve", "sve2", "svebf16", "svei8mm",
    "atomics", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
    "avx512vnni", "avx512bf16", "avxvnni", "avx512dq", "amx_tile", "amx_bf16", "amx_int8",
    "amx_perm",
};

const char *armllm_cpu_feature_name(int feature) {
  return feature >= 0 && feature < ARMLLM_CPU_NUM_FEATURES ? feature_names[feature] : "?";
}

int armllm_cpu_has(const armllm_cpu *cpu, int feature) {
  return (cpu->features & BIT(feature)) != 0;
}

#if defined(__aarch64__)
/* Linux HWCAP bits (arch/arm64/include/uapi/asm/hwcap.h), spelled out so an
 * old libc header does not hide a feature. */
#define HWCAP_ASIMD_ (1UL << 1)
#define HWCAP_ATOMICS_ (1UL << 8)
#define HWCAP_ASIMDHP_ (1UL << 10)
#define HWCAP_ASIMDDP_ (1UL << 20)
#define HWCAP_SVE_ (1UL << 22)
#define HWCAP2_SVE2_ (1UL << 1)
#define HWCAP2_SVEI8MM_ (1UL << 9)
#define HWCAP2_SVEBF16_ (1UL << 12)
#define HWCAP2_I8MM_ (1UL << 13)
#define HWCAP2_BF16_ (1UL << 14)
#ifndef PR_SVE_GET_VL
#define PR_SVE_GET_VL 51
#endif
#define PR_SVE_VL_LEN_MASK_ 0xffff

static void detect(armllm_cpu *cpu) {
  unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
  uint64_t f = 0;
  if (hw & HWCAP_ASIMD_) f |= BIT(ARMLLM_CPU_ASIMD);
  if (hw & HWCAP_ASIMDDP_) f |= BIT(ARMLLM_CPU_ASIMDDP);
  if (hw & HWCAP_ASIMDHP_) f |= BIT(ARMLLM_CPU_FP16);
  if (hw & HWCAP_ATOMICS_) f |= BIT(ARMLLM_CPU_ATOMICS);
  if (hw & HWCAP_SVE_) f |= BIT(ARMLLM_CPU_SVE);
  if (hw2 & HWCAP2_BF16_) f |= BIT(ARMLLM_CPU_BF16);
  if (hw2 & HWCAP2_I8MM_) f |= BIT(ARMLLM_CPU_I8MM);
  if (hw2 & HWCAP2_SVE2_) f |= BIT(ARMLLM_CPU_SVE2);
  if (hw2 & HWCAP2_SVEBF16_) f |= BIT(ARMLLM_CPU_SVEBF16);
  if (hw2 & HWCAP2_SVEI8MM_) f |= BIT(ARMLLM_CPU_SVEI8MM);
  cpu->arch = "aarch64";
  cpu->features = f;
  if (f & BIT(ARMLLM_CPU_SVE)) {
    int vl = prctl(PR_SVE_GET_VL);
    cpu->sve_vector_bits = vl > 0 ? (vl & PR_SVE_VL_LEN_MASK_) * 8 : 0;
  }
}
#elif defined(__x86_64__)
/* XSAVE state components (Intel SDM vol. 1, 13.1) and Linux's arch_prctl
 * codes for dynamically enabled ones (arch/x86/include/uapi/asm/prctl.h). */
#define XCR0_YMM_OS_ 0x6ull          /* SSE + AVX state */
#define XCR0_ZMM_OS_ 0xe6ull         /* plus opmask, ZMM_Hi256, Hi16_ZMM */
#define XFEATURE_XTILECFG_ 17
#define XFEATURE_XTILEDATA_ 18
#define ARCH_GET_XCOMP_PERM_ 0x1022
#define ARCH_REQ_XCOMP_PERM_ 0x1023

/* Tile data is off for a Linux process until it asks (kernel >= 5.16; the
 * first tile instruction without permission is SIGILL). Asked once, here;
 * the grant is process-wide, so the pool's workers inherit it. Returns 1
 * when granted, else 0 with the reason in cpu->amx_denied. */
static int amx_permit(armllm_cpu *cpu, uint64_t xcr0) {
  const uint64_t tile_bits = (1ull << XFEATURE_XTILECFG_) | (1ull << XFEATURE_XTILEDATA_);
  if ((xcr0 & tile_bits) != tile_bits) {
    snprintf(cpu->amx_denied, sizeof cpu->amx_denied,
             "the OS does not enable AMX tile state (XCR0 = %#llx lacks bits 17/18)",
             (unsigned long long)xcr0);
    return 0;
  }
  uint64_t perm = 0;
  if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM_, &perm) == 0 &&
      (perm & (1ull << XFEATURE_XTILEDATA_)))
    return 1;
  if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM_, XFEATURE_XTILEDATA_) == 0) return 1;
  const int e = errno;
  snprintf(cpu->amx_denied, sizeof cpu->amx_denied,
           "Linux refused AMX tile data: arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) failed: "
           "%s%s", strerror(e),
           e == ENOSPC ? " (a thread's sigaltstack is too small for the tile state)" :
           e == EINVAL ? " (kernel older than 5.16?)" : "");
  return 0;
}

static void detect(armllm_cpu *cpu) {
  unsigned a, b, c, d;
  uint64_t f = 0;
  cpu->arch = "x86_64";
  if (__get_cpuid(0, &a, &b, &c, &d)) { /* the vendor: ebx, edx, ecx */
    memcpy(cpu->vendor, &b, 4);
    memcpy(cpu->vendor + 4, &d, 4);
    memcpy(cpu->vendor + 8, &c, 4);
  }
  if (!__get_cpuid(1, &a, &b, &c, &d)) return;
  { /* display family and model: the extended fields count where the base family
     * is 15 (for the model, 6 too) */
    const int fam = (a >> 8) & 0xf, ext_fam = (a >> 20) & 0xff;
    const int mod = (a >> 4) & 0xf, ext_mod = (a >> 16) & 0xf;
    cpu->family = fam == 0xf ? fam + ext_fam : fam;
    cpu->model = fam == 0xf || fam == 0x6 ? (ext_mod << 4) + mod : mod;
  }
  int osxsave = (c >> 27) & 1;
  uint64_t xcr0 = 0;
  if (osxsave) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = ((uint64_t)hi << 32) | lo;
  }
  int ymm_os = (xcr0 & XCR0_YMM_OS_) == XCR0_YMM_OS_;
  int zmm_os = (xcr0 & XCR0_ZMM_OS_) == XCR0_ZMM_OS_;
  if (ymm_os && ((c >> 28) & 1)) f |= BIT(ARMLLM_CPU_AVX);
  if (ymm_os && ((c >> 12) & 1)) f |= BIT(ARMLLM_CPU_FMA);
  if (ymm_os && ((c >> 29) & 1)) f |= BIT(ARMLLM_CPU_F16C);
  if (__get_cpuid_max(0, NULL) >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    if (ymm_os && ((b >> 5) & 1)) f |= BIT(ARMLLM_CPU_AVX2);
    if (zmm_os && ((b >> 16) & 1)) f |= BIT(ARMLLM_CPU_AVX512F);
    if (zmm_os && ((b >> 17) & 1)) f |= BIT(ARMLLM_CPU_AVX512DQ);
    if (zmm_os && ((b >> 30) & 1)) f |= BIT(ARMLLM_CPU_AVX512BW);
    if (zmm_os && ((b >> 31) & 1)) f |= BIT(ARMLLM_CPU_AVX512VL);
    if (zmm_os && ((c >> 11) & 1)) f |= BIT(ARMLLM_CPU_AVX512VNNI);
    if ((d >> 22) & 1) f |= BIT(ARMLLM_CPU_AMXBF16);
    if ((d >> 24) & 1) f |= BIT(ARMLLM_CPU_AMXTILE);
    if ((d >> 25) & 1) f |= BIT(ARMLLM_CPU_AMXINT8);
    __cpuid_count(7, 1, a, b, c, d);
    if (ymm_os && ((a >> 4) & 1)) f |= BIT(ARMLLM_CPU_AVXVNNI);
    if (zmm_os && ((a >> 5) & 1)) f |= BIT(ARMLLM_CPU_AVX512BF16);
  }
  if ((f & BIT(ARMLLM_CPU_AMXTILE)) && amx_permit(cpu, xcr0)) f |= BIT(ARMLLM_CPU_AMXPERM);
  cpu->features = f;
}
#else
static void detect(armllm_cpu *cpu) { cpu->arch = "other"; }
#endif

const armllm_cpu *armllm_cpu_detect(void) {
  static armllm_cpu cpu;
  static int done;
  if (!__atomic_load_n(&done, __ATOMIC_ACQUIRE)) {
    armllm_cpu fresh = {0};
    detect(&fresh); /* idempotent: a racing second caller computes the same */
    cpu = fresh;
    __atomic_store_n(&done, 1, __ATOMIC_RELEASE);
  }
  return &cpu;
}

/* ------------------------------------------------------------- variants */

typedef struct {
  const char *name;
  const char *arch;
  uint64_t needs;
  const armllm_kernels *table; /* NULL when not built for this architecture */
} isa_entry;

/* What the avx2 variant needs; avx512 runs avx2 code in the slots it does not port,
 * amx avx512 code. */
#define AVX2_NEEDS_ (BIT(ARMLLM_CPU_AVX2) | BIT(ARMLLM_CPU_FMA) | BIT(ARMLLM_CPU_F16C))
#define AVX512_NEEDS_                                                                        \
  (AVX2_NEEDS_ | BIT(ARMLLM_CPU_AVX512F) | BIT(ARMLLM_CPU_AVX512BW) | BIT(ARMLLM_CPU_AVX512VL) | \
   BIT(ARMLLM_CPU_AVX512DQ) | BIT(ARMLLM_CPU_AVX512VNNI) | BIT(ARMLLM_CPU_AVX512BF16))
#define AMX_NEEDS_                                                                   \
  (AVX512_NEEDS_ | BIT(ARMLLM_CPU_AMXTILE) | BIT(ARMLLM_CPU_AMXBF16) |              \
   BIT(ARMLLM_CPU_AMXINT8) | BIT(ARMLLM_CPU_AMXPERM))

static const isa_entry isa_entries[] = {
#if defined(__aarch64__)
    {"sve", "aarch64",
     BIT(ARMLLM_CPU_ASIMD) | BIT(ARMLLM_CPU_SVE) | BIT(ARMLLM_CPU_SVEBF16) |
         BIT(ARMLLM_CPU_SVEI8MM) | BIT(ARMLLM_CPU_BF16) | BIT(ARMLLM_CPU_I8MM),
     &armllm_kernels_sve},
    {"neon_mmla", "aarch64",
     BIT(ARMLLM_CPU_ASIMD) | BIT(ARMLLM_CPU_BF16) | BIT(ARMLLM_CPU_I8MM),
     &armllm_kernels_neon_mmla},
    {"neon", "aarch64", BIT(ARMLLM_CPU_ASIMD), &armllm_kernels_neon},
    {"amx", "x86_64", 0, NULL},
    {"avx512", "x86_64", 0, NULL},
    {"avx2", "x86_64", 0, NULL},
#elif defined(__x86_64__)
    {"sve", "aarch64", 0, NULL},
    {"neon_mmla", "aarch64", 0, NULL},
    {"neon", "aarch64", 0, NULL},
    {"amx", "x86_64", AMX_NEEDS_, &armllm_kernels_amx},
    {"avx512", "x86_64", AVX512_NEEDS_, &armllm_kernels_avx512},
    {"avx2", "x86_64", AVX2_NEEDS_, &armllm_kernels_avx2},
#else
    {"sve", "aarch64", 0, NULL},
    {"neon_mmla", "aarch64", 0, NULL},
    {"neon", "aarch64", 0, NULL},
    {"amx", "x86_64", 0, NULL},
    {"avx512", "x86_64", 0, NULL},
    {"avx2", "x86_64", 0, NULL},
#endif
    {"ref", "any", 0, &armllm_kernels_ref},
};
#define N_ISA (sizeof isa_entries / sizeof isa_entries[0])

const char *const *armllm_isa_built(void) {
  static const char *names[N_ISA + 1];
  size_t n = 0;
  for (size_t i = 0; i < N_ISA; i++)
    if (isa_entries[i].table) names[n++] = isa_entries[i].name;
  names[n] = NULL;
  return names;
}

/* The first slot table t leaves without a function or an impl name, or NULL. */
static const char *empty_slot(const armllm_kernels *t) {
#define EMPTY_IF_(variant, name, ret, params) \
  if (!t->name || !t->impl[ARMLLM_K_##name]) return #name;
  ARMLLM_KERNEL_SLOTS(EMPTY_IF_, _)
#undef EMPTY_IF_
  return NULL;
}

const armllm_kernels *armllm_isa_table(const char *isa, const armllm_cpu *cpu, char *err,
                                       size_t err_len) {
  for (size_t i = 0; i < N_ISA; i++) {
    const isa_entry *e = &isa_entries[i];
    if (strcmp(e->name, isa) != 0) continue;
    if (!e->table) {
      snprintf(err, err_len, "kernel variant '%s' is for %s; this build is for %s", isa,
               e->arch, cpu->arch);
      return NULL;
    }
    uint64_t missing = e->needs & ~cpu->features;
    if (missing) {
      size_t used = (size_t)snprintf(err, err_len, "kernel variant '%s' needs CPU features this CPU lacks:", isa);
      for (int f = 0; f < ARMLLM_CPU_NUM_FEATURES && used < err_len; f++)
        if (missing & BIT(f)) used += (size_t)snprintf(err + used, err_len - used, " %s", feature_names[f]);
      if ((missing & BIT(ARMLLM_CPU_AMXPERM)) && cpu->amx_denied[0] && used < err_len)
        snprintf(err + used, err_len - used, " (%s)", cpu->amx_denied);
      return NULL;
    }
    const char *empty = empty_slot(e->table);
    if (empty) {
      snprintf(err, err_len, "kernel variant '%s' leaves slot '%s' empty (its table.c lacks "
               "an ARMLLM_SLOT)", isa, empty);
      return NULL;
    }
    return e->table;
  }
  size_t used = (size_t)snprintf(err, err_len, "unknown kernel variant '%s' (known:", isa);
  for (size_t i = 0; i < N_ISA && used < err_len; i++)
    used += (size_t)snprintf(err + used, err_len - used, " %s", isa_entries[i].name);
  if (used < err_len) snprintf(err + used, err_len - used, ")");
  return NULL;
}

const char *armllm_isa_best(const armllm_cpu *cpu) {
  for (size_t i = 0; i < N_ISA; i++) {
    const isa_entry *e = &isa_entries[i];
    if (e->table && (e->needs & ~cpu->features) == 0) return e->name;
  }
  return "ref";
}

/* ------------------------------------------------------ run-time choices */

int armllm_neon_sdot(void) { return armllm_cpu_has(armllm_cpu_detect(), ARMLLM_CPU_ASIMDDP); }

#define AMD_FAMILY_ZEN4_ 0x19 /* Zen 3 (no AVX-512, so never asked) and Zen 4 */
static int decode_streams_set_; /* armllm_set_x86_decode_streams's count; 0: the CPU's */

int armllm_x86_zen4(void) {
  const armllm_cpu *cpu = armllm_cpu_detect();
  return strcmp(cpu->vendor, "AuthenticAMD") == 0 && cpu->family == AMD_FAMILY_ZEN4_;
}

int armllm_x86_gemv_no_prefetch(void) { return armllm_x86_zen4(); }

int armllm_x86_decode_streams(void) {
  const int set = __atomic_load_n(&decode_streams_set_, __ATOMIC_RELAXED);
  if (set) return set;
  return armllm_x86_zen4() ? 1 : 2;
}

void armllm_set_x86_decode_streams(int streams) {
  __atomic_store_n(&decode_streams_set_, streams == 1 || streams == 2 ? streams : 0,
                   __ATOMIC_RELAXED);
}

int armllm_x86_one_stream(void) { return armllm_x86_decode_streams() == 1; }

typedef void (*any_fn)(void); /* any slot's function, for comparing pointers */

/* A run-time choice inside one variant's function. Keyed by the function, not
 * by a table, so every table whose slot points at it reports it. */
typedef struct {
  int slot;
  any_fn fn;
  const char *name; /* shown as impl+name when taken */
  int (*taken)(void);
} slot_choice;

static const slot_choice choices[] = {
#if defined(__aarch64__)
    {ARMLLM_K_gemm_wq, (any_fn)armllm_neon_gemm_wq, "dotprod", armllm_neon_sdot},
    {ARMLLM_K_gemm_gguf, (any_fn)armllm_neon_gemm_gguf, "dotprod", armllm_neon_sdot},
#elif defined(__x86_64__)
    {ARMLLM_K_gemm_bf16, (any_fn)armllm_avx512_gemm_bf16, "nopf", armllm_x86_gemv_no_prefetch},
    {ARMLLM_K_gemm_bf16_cols, (any_fn)armllm_avx512_gemm_bf16_cols, "nopf",
     armllm_x86_gemv_no_prefetch},
    {ARMLLM_K_gemm_wq, (any_fn)armllm_avx512_gemm_wq, "1stream", armllm_x86_one_stream},
    {ARMLLM_K_gemm_wq, (any_fn)armllm_amx_gemm_wq, "1stream", armllm_x86_one_stream},
    {ARMLLM_K_gemm_wq_cols, (any_fn)armllm_avx512_gemm_wq_cols, "1stream",
     armllm_x86_one_stream},
    {ARMLLM_K_gemm_wq_cols, (any_fn)armllm_amx_gemm_wq_cols, "1stream", armllm_x86_one_stream},
    {ARMLLM_K_gemm_gguf, (any_fn)armllm_avx512_gemm_gguf, "1stream", armllm_x86_one_stream},
    {ARMLLM_K_gemm_gguf_cols, (any_fn)armllm_avx512_gemm_gguf_cols, "1stream",
     armllm_x86_one_stream},
#endif
    {-1, NULL, NULL, NULL}, /* end */
};

static any_fn slot_fn(const armllm_kernels *t, int slot) {
  switch (slot) {
#define SLOT_FN_CASE_(variant, name, ret, params) \
  case ARMLLM_K_##name: return (any_fn)t->name;
    ARMLLM_KERNEL_SLOTS(SLOT_FN_CASE_, _)
#undef SLOT_FN_CASE_
  }
  return NULL;
}

const char *armllm_slot_impl(const armllm_kernels *t, int slot, char *buf, size_t len) {
  if (slot < 0 || slot >= ARMLLM_NUM_SLOTS) {
    snprintf(buf, len, "?");
    return buf;
  }
  size_t used = (size_t)snprintf(buf, len, "%s", t->impl[slot]);
  any_fn fn = slot_fn(t, slot);
  for (const slot_choice *c = choices; c->name; c++)
    if (c->slot == slot && c->fn == fn && c->taken() && used < len)
      used += (size_t)snprintf(buf + used, len - used, "+%s", c->name);
  return buf;
}
