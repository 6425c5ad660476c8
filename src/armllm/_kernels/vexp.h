/* vexp.h: the exp approximation every kernel family shares (scalar form).
 *
 * Each ISA's vector exp performs exactly these operations in this order
 * (fused multiply-adds where written), so all variants agree with ref to
 * the bit on FMA hardware. Cephes-style: n = round(x*log2(e)) with the
 * 1.5*2^23 rounding trick, r = x - n*ln2 in two parts, a degree-6
 * polynomial for exp(r) on [-ln2/2, ln2/2], then scaling by 2^n as two
 * normal powers of two so that results that underflow to subnormals round
 * once and n = 128 does not overflow the exponent field.
 */
#ifndef ARMLLM_VEXP_H
#define ARMLLM_VEXP_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define ARMLLM_EXP_LO (-104.0f)           /* exp(-104) < smallest subnormal / 2 */
#define ARMLLM_EXP_HI (88.8f)             /* exp(88.8) > FLT_MAX: overflows to inf */
#define ARMLLM_EXP_LOG2E (1.44269504088896341f)
#define ARMLLM_EXP_ROUND (12582912.0f)    /* 1.5 * 2^23: adding it rounds to an integer */
#define ARMLLM_EXP_LN2_HI (0.693359375f)  /* ln 2 = LN2_HI - LN2_LO, LN2_HI exact in 9 bits */
#define ARMLLM_EXP_LN2_LO (2.12194440e-4f)
#define ARMLLM_EXP_P0 (1.9875691500e-4f)  /* Cephes expf minimax coefficients */
#define ARMLLM_EXP_P1 (1.3981999507e-3f)
#define ARMLLM_EXP_P2 (8.3334519073e-3f)
#define ARMLLM_EXP_P3 (4.1665795894e-2f)
#define ARMLLM_EXP_P4 (1.6666665459e-1f)
#define ARMLLM_EXP_P5 (5.0000001201e-1f)

static inline float armllm_pow2i(int32_t e) { /* 2^e for -126 <= e <= 127 */
  uint32_t u = (uint32_t)(e + 127) << 23;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static inline float armllm_exp_scalar(float x) {
  if (x != x) return x;
  float xc = x < ARMLLM_EXP_LO ? ARMLLM_EXP_LO : (x > ARMLLM_EXP_HI ? ARMLLM_EXP_HI : x);
  float n = fmaf(xc, ARMLLM_EXP_LOG2E, ARMLLM_EXP_ROUND) - ARMLLM_EXP_ROUND;
  float r = fmaf(n, -ARMLLM_EXP_LN2_HI, xc);
  r = fmaf(n, ARMLLM_EXP_LN2_LO, r);
  float p = ARMLLM_EXP_P0;
  p = fmaf(p, r, ARMLLM_EXP_P1);
  p = fmaf(p, r, ARMLLM_EXP_P2);
  p = fmaf(p, r, ARMLLM_EXP_P3);
  p = fmaf(p, r, ARMLLM_EXP_P4);
  p = fmaf(p, r, ARMLLM_EXP_P5);
  p = fmaf(p, r * r, r);
  p = p + 1.0f;
  int32_t ni = (int32_t)n;
  int32_t half = ni >> 1; /* floor(n/2): both factors stay normal for n in [-150, 128] */
  return p * armllm_pow2i(half) * armllm_pow2i(ni - half);
}

#endif /* ARMLLM_VEXP_H */
