/* sync.h: what threads and processes that share memory synchronize with:
 * a 64-bit fetch-add (LSE `ldaddal` on Arm when HWCAP_ATOMICS says so, an
 * LL/SC loop otherwise, `lock xadd` on x86-64), the spin-loop hint, and
 * futex wait/wake (private to a process, or shared through a mapping between
 * processes). Static inline: each user includes it; sync_detect_atomics()
 * runs once before the first fetch-add. */
#ifndef ARMLLM_SYNC_H
#define ARMLLM_SYNC_H

#include <linux/futex.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__aarch64__)
#include <sys/auxv.h>
#define HWCAP_ATOMICS_ (1UL << 8)

static int sync_has_lse = -1;

static inline int64_t fetch_add_lse(int64_t *p, int64_t v) {
  int64_t old;
  __asm__ volatile(".arch_extension lse\n\t"
                   "ldaddal %x[v], %x[old], %[mem]"
                   : [old] "=r"(old), [mem] "+Q"(*p)
                   : [v] "r"(v)
                   : "memory");
  return old;
}

static inline int64_t fetch_add_llsc(int64_t *p, int64_t v) {
  int64_t old, sum;
  uint32_t failed;
  __asm__ volatile("1: ldaxr %x[old], %[mem]\n\t"
                   "add %x[sum], %x[old], %x[v]\n\t"
                   "stlxr %w[failed], %x[sum], %[mem]\n\t"
                   "cbnz %w[failed], 1b"
                   : [old] "=&r"(old), [sum] "=&r"(sum), [failed] "=&r"(failed),
                     [mem] "+Q"(*p)
                   : [v] "r"(v)
                   : "memory");
  return old;
}

/* A sequentially consistent fetch-add (acquire and release both). */
static inline int64_t sync_fetch_add(int64_t *p, int64_t v) {
  /* sync_has_lse is set once before any other thread starts; the branch predicts well */
  return sync_has_lse ? fetch_add_lse(p, v) : fetch_add_llsc(p, v);
}

static inline void sync_detect_atomics(void) {
  if (sync_has_lse < 0) sync_has_lse = (getauxval(AT_HWCAP) & HWCAP_ATOMICS_) != 0;
}

static inline const char *sync_atomic_impl(void) {
  sync_detect_atomics();
  return sync_has_lse ? "ldaddal" : "ldaxr/stlxr";
}

static inline void cpu_relax(void) { __asm__ volatile("yield" ::: "memory"); }
#else
static inline int64_t sync_fetch_add(int64_t *p, int64_t v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); /* lock xadd on x86-64 */
}
static inline void sync_detect_atomics(void) {}
static inline const char *sync_atomic_impl(void) {
#if defined(__x86_64__)
  return "lock xadd";
#else
  return "compiler builtin";
#endif
}
#if defined(__x86_64__)
static inline void cpu_relax(void) { __asm__ volatile("pause" ::: "memory"); }
#else
static inline void cpu_relax(void) {}
#endif
#endif

/* shared: the word lives in memory mapped by several processes */
static inline void futex_wait_on(uint32_t *addr, uint32_t expected, int shared) {
  syscall(SYS_futex, addr, shared ? FUTEX_WAIT : FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static inline void futex_wake_on(uint32_t *addr, int count, int shared) {
  syscall(SYS_futex, addr, shared ? FUTEX_WAKE : FUTEX_WAKE_PRIVATE, count, NULL, NULL, 0);
}

static inline int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Spins until *addr != value or spin_ns pass; returns the last value seen. */
static inline uint32_t spin_while_equal(uint32_t *addr, uint32_t value, int64_t spin_ns) {
  uint32_t seen = __atomic_load_n(addr, __ATOMIC_ACQUIRE);
  if (seen != value) return seen;
  int64_t deadline = now_ns() + spin_ns;
  for (unsigned i = 1;; i++) {
    cpu_relax();
    seen = __atomic_load_n(addr, __ATOMIC_ACQUIRE);
    if (seen != value) return seen;
    if ((i & 255) == 0 && now_ns() > deadline) return seen;
  }
}

#endif /* ARMLLM_SYNC_H */
