/* armllm_kernels.h: the kernel ABI shared by every ISA variant.
 *
 * Every variant (ref, avx2, avx512, amx, neon, neon_mmla, sve) implements the slots of
 * ARMLLM_KERNEL_SLOTS (below: the one list of signatures) with identical
 * semantics; `armllm_kernels` is the dispatch table that names one
 * implementation per slot. Tables are filled statically in each variant's
 * table.c, one ARMLLM_SLOT per slot; a slot a variant does not port points at
 * the ref (or a lower Arm level's) function, and `impl` says so.
 *
 * Conventions (all kernels):
 *   - activations are float32; bf16 data is passed as raw uint16_t bits and
 *     widened with bf16_to_f32() (exact) inside the kernel;
 *   - kernels never allocate and never touch Python; scratch, if any, lives
 *     on the stack in small fixed-size tiles;
 *   - `pool` may be NULL: the kernel then runs on the calling thread only;
 *   - results are bit-identical whatever the pool's thread count: work is
 *     partitioned over outputs, never reduced across threads;
 *   - row strides (`ld*`) are in elements, >= the row length.
 */
#ifndef ARMLLM_KERNELS_H
#define ARMLLM_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "pool.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ bf16 */

static inline float armllm_bf16_to_f32(uint16_t bits) {
  uint32_t u = (uint32_t)bits << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Round to nearest even; NaN stays NaN (quiet bit forced). */
static inline uint16_t armllm_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* ---------------------------------------------------------------- kernels
 *
 * GEMM  y[m, n] = sum_k x[m, k] * W[n, k]  (+ bias[n])       m < M, n < N
 *   W is prepacked once by the same table's *_pack into *_packed_len(N, K)
 *   elements (layout named by *_layout; buffers of equal layout names are
 *   interchangeable between tables). x rows at x + m*ldx, y rows at
 *   y + m*ldy; bias may be NULL; y must not overlap x or W. M, N, K >= 1.
 *   Decode (small M, memory-bound) and prefill (register-tiled) paths are
 *   chosen inside. Accuracy: f32 weights, and bf16 weights widened to f32,
 *   are within 1e-5 * sum_k |x*w| of exact, and give ref's bits: each output
 *   is one FMA chain over k ascending from +0, then + bias; variants that
 *   round activations to bf16 (BFMMLA/BFDOT, round-to-nearest-even,
 *   gemm_bf16_compute "bf16") are within 2^-8 * sum_k |x*w|.
 *
 * GEMM columns (gemm_f32_cols, gemm_bf16_cols, gemm_wq_cols, gemm_gguf_cols):
 *   the same call without a pool, restricted to the output columns
 *   [n0, n1), 0 <= n0 < n1 <= N: x and W are the whole call's, y and bias
 *   the window's (output column n0 + c at y + c and bias[c]), and the
 *   window's n1 - n0 columns are computed on the calling thread with the
 *   whole call's bits (an output depends only on its x row and W row,
 *   whatever M's path). n0 starts a packed panel: a multiple of the table's
 *   gemm_*_panel (GGUF blocks: counted from the first row of n0's part). A
 *   layer that runs many small GEMMs (a mixture of experts' active experts)
 *   cuts them into column windows and runs them all as one pool job.
 *
 * RMSNorm  r = x (+ residual);  out = r / sqrt(mean(r^2) + eps) * weight
 *   For each of T rows of D elements. With residual != NULL, residual is
 *   updated in place to r (fused residual add). out may equal x (same
 *   pointer and stride); out must not overlap residual.
 *
 * RoPE  rotates n_heads heads of head_dim in each of T rows of x, in place:
 *   head h of row t starts at x + t*ldx + h*head_dim; only its first rot_dim
 *   (even, <= head_dim) elements rotate. cos_sin has max_pos rows of rot_dim
 *   floats: cos[0..rot_dim/2) then sin[0..rot_dim/2), for position p at
 *   cos_sin + p*rot_dim. Pairs (a, b) -> (a*cos - b*sin, b*cos + a*sin):
 *     ARMLLM_ROPE_NEOX: a = v[i], b = v[i + rot_dim/2]
 *     ARMLLM_ROPE_GPTJ: a = v[2i], b = v[2i + 1]
 *   Returns -1, or the first row whose position is outside [0, max_pos)
 *   (then nothing was modified).
 *
 * SiLU*mul  out[t, j] = silu(g) * u, g = gate_up[t*ldg + j],
 *   u = gate_up[t*ldg + inter + j], silu(g) = g / (1 + exp(-g)).
 *   out may equal gate_up (same pointer); otherwise no overlap.
 *
 * Embed  out[t, :] = table[ids[t], :]  (bf16 tables widened to f32).
 *   Returns -1, or the first t whose id is outside [0, vocab) (then nothing
 *   was written).
 *
 * Exp  y[i] = exp(x[i]), vectorized polynomial (the one attention softmax
 *   uses); y may equal x. Relative error <= 4e-7 for normal results;
 *   results below FLT_MIN may flush to 0; +-inf, NaN and overflow behave as
 *   expf.
 *
 * LayerNorm  out[r, :] = (x[r] - mean) / sqrt(var + eps) * weight (+ bias)
 *   For each of T rows of D elements; mean and var (biased: / D) are summed
 *   in double in two passes (so in any order: variants differ from ref only
 *   in a double's last bits), then rounded to float: m = (float)mean, s =
 *   (float)(1 / sqrt(var + eps)); out = (x - m) * s * weight [+ bias] in
 *   float, unfused, in that order. bias may be NULL. out may equal x (same
 *   pointer and stride); otherwise no overlap.
 *
 * GELU  y[i] = x[i] / 2 * (1 + erf(x[i] / sqrt(2))), exact (erf) GELU as
 *   PyTorch's nn.GELU(); y may equal x. ref: libm's erfc in double, rounded
 *   once. Vector variants: erfc(z) = t exp(-z^2 + u R(u)), t = 1 / (1 + z/2),
 *   u = 1 - t, z = |x| / sqrt(2), and y = x - x/2 erfc(z) (x > 0) or
 *   x/2 erfc(z) (family_jobs.h): within 3e-7 (1 + min(x, 0)^2) |y| + 1e-38
 *   of the exact value (exp magnifies the exponent's roundings by z^2 where
 *   y is small); y = x from 6 up, -0 from -16 down; +inf -> +inf, -inf ->
 *   -0 (PyTorch: NaN for both), NaN -> NaN.
 */

enum { ARMLLM_ROPE_NEOX = 0, ARMLLM_ROPE_GPTJ = 1 };

/* ------------------------------------------------------------ sampling
 *
 * The vectorizable passes of the batched sampler (sample.h, which defines
 * the rest); every variant gives ref's bits. n >= 1.
 *
 * sample_argmax  the lowest i of the largest non-NaN x[i]; -1 when every x is
 *   NaN.
 *
 * sample_find_above  the lowest i with x[i] > t (NaN never is); n if none
 *   (n may be 0 here).
 *
 * Block sum with floor f (the slots' keep_min) of v[0..n): blocks of
 *   ARMLLM_SAMPLE_BLOCK entries, the last padded with zeros; lanes
 *   w_j = v[16b + j] >= f ? v[16b + j] : 0;
 *   sums[b] = the float tree s8_j = w_j + w_{j+8}, s4_j = s8_j + s8_{j+4},
 *   s2_j = s4_j + s4_{j+2}, s = s2_0 + s2_1; the return value is the sums
 *   added in double in block order from 0. sums holds ceil(n / 16) floats.
 *
 * sample_exp  e[i] = d >= ARMLLM_SAMPLE_D_MIN ? exp(d) : 0 with d = (x[i] - m)
 *   * inv_t (two float operations, unfused; exp the shared one, vexp.h; NaN
 *   d gives 0), and the block sum of e with floor f (into sums, returned).
 *   m is at least every non-NaN x[i] and inv_t > 0, so d <= 0 (or NaN): on
 *   [-80, 0] a variant may leave out the shared exp's clamp, its NaN
 *   pass-through and its two-step scaling (every result there is a normal
 *   float), which change no bit. e may equal x.
 *
 * sample_block_sums  the block sum of e with floor f (into sums, returned).
 *
 * sample_collect  the entries with e[i] >= f and e[i] > 0, in order: their e
 *   into out_e, their ids (ids[i], or i when ids is NULL) into out_id;
 *   returns their count. out_e may be e and out_id ids (entries only move
 *   down); both hold ARMLLM_SAMPLE_BLOCK entries of slack past the count,
 *   which a variant may overwrite.
 */
#define ARMLLM_SAMPLE_BLOCK 16
#define ARMLLM_SAMPLE_D_MIN (-80.0f) /* exp(-80) < 2e-35: below any sum's rounding */

/* ---------------------------------------------------------- attention
 *
 * Paged KV cache, per layer: K and V of [n_kv_heads, num_blocks, block_size,
 * head_dim] (head-major: each KV head has a pool of its own, so a sequence
 * whose blocks are consecutive has each head's keys in one run) in
 * cache_dtype (armllm_kv_dtype): float32, bf16 bits, or int8 with one scale
 * per (token, head) in k_scale / v_scale [n_kv_heads, num_blocks,
 * block_size] (bf16 bits; NULL for the other dtypes): element d of a row is
 * row[d] * scale. Token slot s lives in block s / block_size at row s %
 * block_size (armllm_kv_row in attn_common.h).
 *
 * KV write: for each of T rows, K row k + t*ldk and V row v + t*ldv
 *   (n_kv_heads*head_dim floats, head-major) go to slot slot_mapping[t]
 *   (bf16: rounded to nearest even; int8: armllm_kv_quantize_row in
 *   attn_common.h, the same bits on every variant); slot -1 skips the row.
 *   Returns -1, or the first t whose slot is outside [-1,
 *   num_blocks*block_size) (then nothing was written).
 *
 * Attention (varlen, one call for prefill chunks and decodes): sequence b
 *   owns query rows [query_start[b], query_start[b+1]) of q (n_heads heads
 *   of head_dim per row, row stride ldq) and seq_lens[b] tokens in the cache
 *   (its new tokens included), at the blocks block_table[b*max_blocks + i].
 *   Query row i of a sequence with q_len rows sits at position
 *   pos = seq_len - q_len + i and attends keys [lo, pos] with
 *   lo = sliding_window ? max(0, pos - sliding_window + 1) : 0 (causal).
 *   With `bidirectional` set, every row attends all seq_len keys [0,
 *   seq_len) (no mask: an encoder's self-attention, or cross-attention over
 *   the encoder's keys); sliding_window must then be 0, and q_len may exceed
 *   seq_len (a sequence with rows needs seq_len >= 1).
 *   Query head h reads KV head h / (n_heads / n_kv_heads) (GQA).
 *   out = softmax(scale * q.K^T) V, written at out + row*ldo. With sinks
 *   (GPT-OSS), head h's softmax denominator also holds exp(sinks[h]): a
 *   logit with no value, out = sum_j e^(s_j) V_j / (sum_j e^(s_j) + e^sinks[h]).
 *
 *   Keys are taken in partitions of ARMLLM_ATTN_PARTITION absolute positions;
 *   each partition's (max, sum, weighted V) is merged into the running one in
 *   partition order with the shared exp, so a variant may compute partitions
 *   of one row on different threads (split-KV, when rows*heads are fewer than
 *   threads) and still return the same bits as on one thread. Splitting needs
 *   `scratch` of armllm_attn_scratch_len(...) floats; with NULL or too little,
 *   the variant does not split (same result).
 *   Returns -1, or the first sequence whose metadata is inconsistent
 *   (q_len > seq_len (bidirectional: rows and seq_len 0), query_start not
 *   increasing, a used block id outside [0, num_blocks), or more blocks than
 *   max_blocks; 0 for bidirectional with a sliding window); then nothing was
 *   written.
 *   Accuracy vs exact softmax attention in float64: 2e-6 * max|V| (f32 cache),
 *   bf16 caches hold bf16-rounded K/V, to which the same bound applies. int8
 *   caches hold K/V = row * scale and compute in integers (attn_common.h): q
 *   quantized as a K row is, the softmax weights meeting V as int16s of a
 *   partition's largest; vs exact attention of that q over those K/V, at most
 *   2^-8 * max|V| (measured: 1e-5 to 3e-5 on random K/V).
 */
#define ARMLLM_ATTN_PARTITION 256
#define ARMLLM_ATTN_MAX_HEAD_DIM 256

/* A KV cache's element type (cache_dtype). */
typedef enum { ARMLLM_KV_F32 = 0, ARMLLM_KV_BF16 = 1, ARMLLM_KV_I8 = 2 } armllm_kv_dtype;

typedef struct {
  const float *q;
  int64_t ldq;
  const void *k_cache, *v_cache;
  int cache_dtype;                    /* armllm_kv_dtype */
  const uint16_t *k_scale, *v_scale;  /* int8 caches: bf16 scale a (block, head, row) */
  const int32_t *block_table;
  int64_t max_blocks;
  const int32_t *seq_lens;    /* [n_seqs] */
  const int32_t *query_start; /* [n_seqs + 1] */
  int64_t n_seqs, n_heads, n_kv_heads, head_dim, block_size, num_blocks;
  float scale;
  int64_t sliding_window; /* 0: none */
  float *out;
  int64_t ldo;
  float *scratch; /* split-KV partials, may be NULL */
  size_t scratch_len;
  const float *sinks; /* [n_heads] logits in every row's softmax denominator, NULL: none */
  int bidirectional;  /* 0: causal; 1: every row sees all its sequence's keys */
} armllm_attn_args;

/* Floats of scratch that let a variant split every row's keys over threads. */
static inline size_t armllm_attn_scratch_len(int64_t rows, int64_t n_heads, int64_t head_dim,
                                             int64_t max_seq_len) {
  int64_t parts = (max_seq_len + ARMLLM_ATTN_PARTITION - 1) / ARMLLM_ATTN_PARTITION;
  return (size_t)(rows * n_heads * parts * (head_dim + 2));
}

/* ------------------------------------------------------ quantized GEMM
 *
 * Groups: K is padded to kpad = armllm_q_kpad(K) (a multiple of
 * ARMLLM_Q_KALIGN) and cut into groups of G = armllm_q_group_len(group)
 * columns: group 32, 64 or 128 (quant_act also 256: the GGUF-block GEMM's
 * super-block activations), or 0 (channelwise weights) = groups of
 * ARMLLM_Q_CHANNEL_GROUP. Group g covers [g*G, min((g+1)*G, kpad)); there are
 * ng = armllm_q_groups(K, group) of them. Activations get one scale per group
 * (finer than one per token: a token's outlier channels then cost only their
 * own group's resolution).
 *
 * Activation quantization (dynamic, per token and group):
 *   quant_act(pool, x, m, k, ldx, group, xq, ldq, scale, ldsc, gsum, ldgs,
 *             zp, ldzp)
 *   Symmetric (zp == NULL), for each row r and group g: amax = max |x[r,k]|
 *   over the group's columns below K; s = amax / 127 (0 for an all-zero
 *   group); xq[r,k] = (int8) clamp(nearbyintf(x[r,k] / s), -127, 127).
 *   Asymmetric (zp != NULL): lo = min(0, min x), hi = max(0, max x) over the
 *   same columns (the range holds 0, so 0 is exact: PyTorch's observers do
 *   the same); s = (hi - lo) / 254; z = (int32) nearbyintf(-127 - lo / s), in
 *   [-127, 127]; xq[r,k] = clamp(nearbyintf(x[r,k] / s) + z, -127, 127) (254
 *   steps, not 255: every kernel may then assume |xq| <= 127);
 *   zp[r*ldzp + g] = z, ldzp >= ng.
 *   Both: scale[r*ldsc + g] = s, ldsc >= ng; when s is 0 or not finite every
 *   xq of the group is 0 (and z = 0). Columns [K, kpad) of xq are written as
 *   0; ldq >= kpad. With gsum != NULL: gsum[r*ldgs + g] = the int32 sum of
 *   the group's xq (as stored, z included); ldgs >= ng. x / s and lo / s are
 *   correctly rounded float divisions; a NaN in a group makes its scale NaN,
 *   an Inf makes it Inf (the GEMM rows are then NaN or +-Inf).
 *   The GEMM below knows nothing of z: with asymmetric activations the
 *   caller subtracts sum_g (sx[r,g] * z[r,g]) * C[n,g] from its rows, C[n,g]
 *   = d[n,g] * (sum of q[n,k] over the group's real columns) + o[n,g] *
 *   (the group's real column count) (armllm.ops does it with the f32 GEMM).
 *
 * Fused RMSNorm + quantization (not a slot: composed from a table's own
 * rmsnorm and quant_act): armllm_rmsnorm_quant(table, pool, ...) runs one
 * job over row blocks; each block is normalized into out (and residual
 * updated) and quantized while it is in L1/L2: one call and one pass over
 * the rows instead of two, with exactly the bits of the two kernels.
 *
 * Quantized weights W[n, k] = d[n, g] * q[n, k] + o[n, g]:
 *   bits 8: q int8 in [-127, 127], o = 0 (symmetric);
 *   bits 4: q uint4 in [0, 15]; o is any float (symmetric int4 in [-8, 7]
 *     is q = v + 8, o = -8 d; GGUF Q4_1 is d, m; zero points zp give
 *     o = -d (zp + 8) for compressed-tensors' signed storage).
 *   wq_pack(q, n, k, bits, group, d, o, packed): q is [n, k] row-major (int8
 *   values; for bits 4 one value 0..15 per byte); d and o are f32 [n, ng], or
 *   [n, 1] when group is 0 (one scale per row: the pack repeats it over the
 *   row's groups); o may be NULL (0) and must be NULL for bits 8. packed holds
 *   wq_packed_len(n, k, bits, group, d, o) bytes in the variant's layout
 *   (`gemm_wq_layout`), scales and offsets included: the length may depend on
 *   the values (a variant may store scales that are exact in f16 as f16, which
 *   changes no result); with d == NULL it is the largest for any values.
 *   Packed buffers are 64-byte aligned (variants may use aligned loads).
 *   Padding columns have q = 0.
 *
 * GEMM  y[r, n] = sum_g sx[r,g] * (d[n,g] * acc[r,n,g] + o[n,g] * gsum[r,g])
 *   (+ bias[n]), acc[r,n,g] = sum_{k in g} xq[r,k] * q[n,k] exactly in int32,
 *   sx the activation scales. The float epilogue is fixed so every variant
 *   gives the same bits (no other fusion or reordering):
 *     t = 0.0f; for g in order: a = (float)acc_g * sx_g; t = fmaf(d_g, a, t);
 *               if o: b = (float)gsum_g * sx_g; t = fmaf(o_g, b, t);
 *     y = t; if bias: y = y + bias[n].
 *   gsum must be given (and be quant_act's sums for the same group) when the
 *   weights are 4-bit; kernels may read it for 8-bit weights when given.
 *   M, N, K >= 1.
 */
#define ARMLLM_Q_KALIGN 32
#define ARMLLM_Q_CHANNEL_GROUP 128 /* group length of channelwise weights */
static inline int64_t armllm_q_kpad(int64_t k) {
  return (k + ARMLLM_Q_KALIGN - 1) / ARMLLM_Q_KALIGN * ARMLLM_Q_KALIGN;
}
static inline int64_t armllm_q_group_len(int64_t group) {
  return group ? group : ARMLLM_Q_CHANNEL_GROUP;
}
static inline int64_t armllm_q_groups(int64_t k, int64_t group) {
  return (armllm_q_kpad(k) + armllm_q_group_len(group) - 1) / armllm_q_group_len(group);
}

/* ------------------------------------------------------ GGUF-block GEMM
 *
 * GGUF's quantized tensors run as stored (gguf_blocks.h: the ggml types, and
 * what a block decodes to: integer values v and, per weight group of 16 or
 * 32 columns, a scale d and maybe an offset o, so W = d * v + o exactly).
 * A packed matrix holds 1..ARMLLM_GGUF_MAX_PARTS parts of rows, each of its
 * own type (a fused QKV whose V is Q6_K and Q, K Q4_K):
 *   gemm_gguf_packed_len(k, nparts, types, rows)
 *   gemm_gguf_pack(blocks, k, nparts, types, rows, packed): blocks holds the
 *     parts' rows one after another, each armllm_gguf_row_bytes(type, k)
 *     bytes as in the file; the parts must pass armllm_gguf_parts_check (K a
 *     multiple of every part's block). packed (64-byte aligned) starts with
 *     the armllm_gguf_parts header and is in the variant's layout
 *     (`gemm_gguf_layout`).
 *   gemm_gguf(pool, xq, m, k, ldq, scale, ldsc, gsum, ldgs, packed_w, n, bias,
 *     y, ldy): xq, scale, gsum from symmetric quant_act with group G =
 *     armllm_gguf_act_group(parts): 256 when any part is a super-block type
 *     (the K-quants, IQ4_XS: llama.cpp's Q8_K activations), else 32 (gsum
 *     required; its sums per G columns serve a weight group only when G =
 *     32: with G = 256 the kernels sum x themselves). For each weight group j (16 or
 *     32 columns), acc_j = sum over j's columns of xq * v (int32, exact) and
 *     gs_j = the sum of xq over j's columns; sx(c) = the scale of the
 *     activation group holding column c. The float epilogue is fixed:
 *       t = 0.0f; then, in K order,
 *       for each block of a 32-element type (one weight group j, d_j, o_j):
 *         a = (float)acc_j * sx; t = fmaf(d_j, a, t);
 *         [b = (float)gs_j * sx; t = fmaf(o_j, b, t);]
 *       for each block B of a super-block type (its groups' integer
 *       sub-scales s_j and mins m_j, its D and O: armllm_gguf_decode_super):
 *         isum = sum_j s_j * acc_j, [msum = sum_j m_j * gs_j] in int32 (exact:
 *         |isum| < 2^28); a = (float)isum * sx; t = fmaf(D, a, t);
 *         [b = (float)msum * sx; t = fmaf(O, b, t);]
 *       y = t; if bias: y = y + bias[n].
 *     One float step per 256 columns instead of one per group: the integer
 *     sub-scales ride in the integer sums, as in llama.cpp's vec_dot_q*_K.
 */

/* ------------------------------------------------------ Gated DeltaNet
 *
 * The linear-attention layers of Qwen3.5 / Qwen3-Next (transformers'
 * Qwen3_5GatedDeltaNet). Both stateful kernels take a varlen batch like
 * attention: sequence b owns rows [query_start[b], query_start[b+1]) (q_len
 * rows, query_start[0] == 0), the last q_len of its seq_lens[b] tokens, so
 * its rows start at token start = seq_lens[b] - q_len; its state lives in
 * slot state_slots[b]. start == 0: the history before the rows is zero (the
 * slot's old contents are ignored); else the slot holds it. Afterwards the
 * slot holds the state after the sequence's last row. q_len == 0: nothing
 * is read or written, and the slot is not checked. Slots of sequences with
 * rows must be distinct (the Python wrappers check it). Both return -1, or
 * the first sequence whose metadata is bad (query_start[0] != 0, q_len < 0
 * or > seq_len, a slot outside [0, num_slots)); then nothing was written.
 * Tasks are (sequence, channel chunk) and (sequence, v head): bit-identical
 * for any thread count, and a sequence's results do not depend on the rest
 * of the batch.
 *
 * Conv  y[r, c] = silu(sum_{j < kernel} weight[c, j] * in(pos - (kernel-1) + j, c)),
 *   pos the row's token, in(p, c) = x[row of p, c] for the rows, the slot's
 *   entry for earlier tokens: state [num_slots, kernel - 1, channels] holds a
 *   slot's last kernel-1 inputs, oldest first. The sum is ref's order on
 *   every variant (w0*in0, then + w_j*in_j, products rounded: no FMA), silu(v)
 *   = v / (1 + exp(-v)) with the shared exp: every variant gives ref's bits.
 *   y must not overlap x or the state.
 *
 * Rule (the gated delta rule), per row r and v head h, k head kh = h /
 *   (n_v/n_k) (v_tiled 0: Hugging Face's order) or h % n_k (v_tiled 1:
 *   llama.cpp's GGUF order):
 *     qn = q_kh / sqrt(|q_kh|^2 + 1e-6) / sqrt(dk), kn = k_kh / sqrt(|k_kh|^2 + 1e-6),
 *     g = a_neg[h] * softplus(a[r,h] + dt_bias[h]) (x > 20: x, else log1p(exp(x))),
 *     beta = sigmoid(b[r,h]) = 1 / (1 + exp(-b)),
 *     S = exp(g) S; delta = beta (v - S^T kn); S += kn delta^T; o = S^T qn
 *   with S [dk, dv] the (sequence, head)'s state in the slot
 *   ([num_slots, n_v_heads, dk, dv] float32). Decode rows (and the rows after
 *   a sequence's last whole chunk) run that recurrence, two passes over S
 *   per token; each whole chunk of ARMLLM_GDN_CHUNK rows runs the chunked
 *   (WY/UT) form of flash-linear-attention's chunk_gated_delta_rule: the same
 *   values, other roundings. Exps are the shared exp (vexp.h). Variants
 *   differ from ref by FMA roundings, and may flush subnormals to zero (x86:
 *   gdn_common.h). A chunk's scratch lives on the task's stack: under 400 KB.
 *   out [rows, n_v_heads*dv] must not overlap the inputs or the state.
 *
 * Gated RMSNorm  out[r, h*d + i] = x[r, h*d + i] * (1/sqrt(mean_i x[r, h*d + .]^2 + eps))
 *   * weight[i] * silu(z[r, h*d + i]) over `heads` heads of d per row (the
 *   mean of squares in double); out may equal x (same pointer and stride).
 *
 * Sigmoid*mul  x[r, j] = x[r, j] / (1 + exp(-gate[r, j])), in place: the
 *   attention output gate. Every variant gives ref's bits.
 */
#define ARMLLM_GDN_MAX_KERNEL 8
#define ARMLLM_GDN_MAX_HEAD_DIM 256
#define ARMLLM_GDN_CHUNK 64

typedef struct {
  const float *x; /* [rows, channels]: the projection's conv part */
  int64_t ldx;
  float *y; /* [rows, channels]: silu(conv(x)) */
  int64_t ldy;
  const float *weight;       /* [channels, kernel] */
  int64_t channels, kernel;  /* kernel in [2, ARMLLM_GDN_MAX_KERNEL] */
  float *state;              /* [num_slots, kernel - 1, channels] */
  int64_t num_slots;
  const int32_t *query_start; /* [n_seqs + 1] */
  const int32_t *seq_lens;    /* [n_seqs] */
  const int32_t *state_slots; /* [n_seqs] */
  int64_t n_seqs;
} armllm_gdn_conv_args;

typedef struct {
  const float *q, *k, *v; /* rows of the conv output: q, k [n_k_heads*dk], v [n_v_heads*dv] */
  int64_t ldqkv;
  const float *a, *b; /* [rows, n_v_heads]: the raw a and b projections */
  int64_t ldab;
  const float *a_neg;   /* [n_v_heads] -exp(A_log) */
  const float *dt_bias; /* [n_v_heads] */
  float *out;           /* [rows, n_v_heads*dv] */
  int64_t ldo;
  float *state; /* [num_slots, n_v_heads, dk, dv] */
  int64_t num_slots, n_k_heads, n_v_heads, dk, dv; /* dk, dv <= ARMLLM_GDN_MAX_HEAD_DIM */
  int v_tiled;
  const int32_t *query_start, *seq_lens, *state_slots;
  int64_t n_seqs;
} armllm_gdn_args;

/* ------------------------------------------------------------ the slots
 *
 * The ABI, written once: X(variant, name, return type, (parameters)) for
 * every kernel slot, in table order. It generates the function-pointer typedefs
 * armllm_<name>_fn, the slot indices ARMLLM_K_<name>, the slot names, the
 * table's members and, for each variant v, the declarations of its functions
 * armllm_<v>_<name> (ARMLLM_DECLARE_VARIANT). A new kernel is its entry
 * here, one ARMLLM_SLOT in each table.c, and (for Python to call it) its
 * member in abi.pxi's armllm_kernels.
 */
#define ARMLLM_KERNEL_SLOTS(X, variant)                                                            \
  X(variant, gemm_f32_packed_len, size_t, (int64_t n, int64_t k))                                  \
  X(variant, gemm_f32_pack, void, (const float *w, int64_t n, int64_t k, float *packed))           \
  X(variant, gemm_f32, void,                                                                       \
    (armllm_pool *pool, const float *x, int64_t m, int64_t k, int64_t ldx,                         \
     const float *packed_w, int64_t n, const float *bias, float *y, int64_t ldy))                  \
  X(variant, gemm_bf16_packed_len, size_t, (int64_t n, int64_t k))                                 \
  X(variant, gemm_bf16_pack, void, (const uint16_t *w, int64_t n, int64_t k, uint16_t *packed))    \
  X(variant, gemm_bf16, void,                                                                      \
    (armllm_pool *pool, const float *x, int64_t m, int64_t k, int64_t ldx,                         \
     const uint16_t *packed_w, int64_t n, const float *bias, float *y, int64_t ldy))               \
  X(variant, gemm_f32_cols, void,                                                                  \
    (const float *x, int64_t m, int64_t k, int64_t ldx, const float *packed_w, int64_t n,          \
     int64_t n0, int64_t n1, const float *bias, float *y, int64_t ldy))                            \
  X(variant, gemm_bf16_cols, void,                                                                 \
    (const float *x, int64_t m, int64_t k, int64_t ldx, const uint16_t *packed_w, int64_t n,       \
     int64_t n0, int64_t n1, const float *bias, float *y, int64_t ldy))                            \
  X(variant, rmsnorm, void,                                                                        \
    (armllm_pool *pool, const float *x, int64_t ldx, float *residual, int64_t ldr,                 \
     const float *weight, int64_t t, int64_t d, float eps, float *out, int64_t ldo))               \
  X(variant, rope, int64_t,                                                                        \
    (armllm_pool *pool, float *x, int64_t t, int64_t n_heads, int64_t head_dim, int64_t ldx,       \
     const int32_t *positions, const float *cos_sin, int64_t max_pos, int64_t rot_dim,             \
     int style))                                                                                   \
  X(variant, silu_mul, void,                                                                       \
    (armllm_pool *pool, const float *gate_up, int64_t ldg, int64_t t, int64_t inter,               \
     float *out, int64_t ldo))                                                                     \
  X(variant, gelu_tanh_mul, void,                                                                  \
    (armllm_pool *pool, const float *gate_up, int64_t ldg, int64_t t, int64_t inter,               \
     float *out, int64_t ldo))                                                                     \
  X(variant, embed_f32, int64_t,                                                                   \
    (armllm_pool *pool, const int32_t *ids, int64_t t, const float *table, int64_t vocab,          \
     int64_t d, float *out, int64_t ldo))                                                          \
  X(variant, embed_bf16, int64_t,                                                                  \
    (armllm_pool *pool, const int32_t *ids, int64_t t, const uint16_t *table, int64_t vocab,       \
     int64_t d, float *out, int64_t ldo))                                                          \
  X(variant, exp, void, (const float *x, float *y, int64_t n))                                     \
  X(variant, kv_write, int64_t,                                                                    \
    (armllm_pool *pool, const float *k, int64_t ldk, const float *v, int64_t ldv,                  \
     const int32_t *slot_mapping, int64_t t, void *k_cache, void *v_cache, int cache_dtype,        \
     uint16_t *k_scale, uint16_t *v_scale, int64_t n_kv_heads, int64_t head_dim,                  \
     int64_t block_size, int64_t num_blocks))                                                      \
  X(variant, attention, int64_t, (armllm_pool *pool, const armllm_attn_args *args))                \
  X(variant, quant_act, void,                                                                      \
    (armllm_pool *pool, const float *x, int64_t m, int64_t k, int64_t ldx, int64_t group,          \
     int8_t *xq, int64_t ldq, float *scale, int64_t ldsc, int32_t *gsum, int64_t ldgs,             \
     int32_t *zp, int64_t ldzp))                                                                   \
  X(variant, gemm_wq_packed_len, size_t,                                                           \
    (int64_t n, int64_t k, int bits, int64_t group, const float *d, const float *o))               \
  X(variant, gemm_wq_pack, void,                                                                   \
    (const int8_t *q, int64_t n, int64_t k, int bits, int64_t group, const float *d,               \
     const float *o, void *packed))                                                                \
  X(variant, gemm_wq, void,                                                                        \
    (armllm_pool *pool, const int8_t *xq, int64_t m, int64_t k, int64_t ldq,                       \
     const float *scale, int64_t ldsc, const int32_t *gsum, int64_t ldgs,                          \
     const void *packed_w, int64_t n, int bits, int64_t group, const float *bias, float *y,        \
     int64_t ldy))                                                                                 \
  X(variant, gemm_wq_cols, void,                                                                   \
    (const int8_t *xq, int64_t m, int64_t k, int64_t ldq, const float *scale, int64_t ldsc,        \
     const int32_t *gsum, int64_t ldgs, const void *packed_w, int64_t n, int bits, int64_t group,  \
     int64_t n0, int64_t n1, const float *bias, float *y, int64_t ldy))                            \
  X(variant, gemm_gguf_packed_len, size_t,                                                         \
    (int64_t k, int64_t nparts, const int32_t *types, const int64_t *rows))                        \
  X(variant, gemm_gguf_pack, void,                                                                 \
    (const uint8_t *blocks, int64_t k, int64_t nparts, const int32_t *types, const int64_t *rows,  \
     void *packed))                                                                                \
  X(variant, gemm_gguf, void,                                                                      \
    (armllm_pool *pool, const int8_t *xq, int64_t m, int64_t k, int64_t ldq,                       \
     const float *scale, int64_t ldsc, const int32_t *gsum, int64_t ldgs, const void *packed_w,    \
     int64_t n, const float *bias, float *y, int64_t ldy))                                         \
  X(variant, gemm_gguf_cols, void,                                                                 \
    (const int8_t *xq, int64_t m, int64_t k, int64_t ldq, const float *scale, int64_t ldsc,        \
     const int32_t *gsum, int64_t ldgs, const void *packed_w, int64_t n, int64_t n0, int64_t n1,   \
     const float *bias, float *y, int64_t ldy))                                                    \
  X(variant, gdn_conv, int64_t, (armllm_pool *pool, const armllm_gdn_conv_args *args))             \
  X(variant, gdn_rule, int64_t, (armllm_pool *pool, const armllm_gdn_args *args))                  \
  X(variant, gated_rmsnorm, void,                                                                  \
    (armllm_pool *pool, const float *x, int64_t ldx, const float *z, int64_t ldz,                  \
     const float *weight, int64_t t, int64_t heads, int64_t d, float eps, float *out,              \
     int64_t ldo))                                                                                 \
  X(variant, sigmoid_mul, void,                                                                    \
    (armllm_pool *pool, const float *gate, int64_t ldg, int64_t t, int64_t n, float *x,            \
     int64_t ldx))                                                                                 \
  X(variant, layernorm, void,                                                                      \
    (armllm_pool *pool, const float *x, int64_t ldx, const float *weight, const float *bias,       \
     int64_t t, int64_t d, float eps, float *out, int64_t ldo))                                    \
  X(variant, gelu, void, (armllm_pool *pool, const float *x, float *y, int64_t n))                 \
  X(variant, sample_argmax, int64_t, (const float *x, int64_t n))                                  \
  X(variant, sample_find_above, int64_t, (const float *x, int64_t n, float t))                     \
  X(variant, sample_exp, double,                                                                   \
    (const float *x, float *e, int64_t n, float m, float inv_t, float keep_min, float *sums))      \
  X(variant, sample_block_sums, double, (const float *e, int64_t n, float keep_min, float *sums)) \
  X(variant, sample_collect, int64_t,                                                              \
    (const float *e, const int32_t *ids, int64_t n, float keep_min, float *out_e, int32_t *out_id))

#define ARMLLM_SLOT_TYPEDEF_(variant, name, ret, params) typedef ret(*armllm_##name##_fn) params;
#define ARMLLM_SLOT_INDEX_(variant, name, ret, params) ARMLLM_K_##name,
#define ARMLLM_SLOT_NAME_(variant, name, ret, params) #name,
#define ARMLLM_SLOT_MEMBER_(variant, name, ret, params) armllm_##name##_fn name;
#define ARMLLM_SLOT_DECLARE_(variant, name, ret, params) ret armllm_##variant##_##name params;

ARMLLM_KERNEL_SLOTS(ARMLLM_SLOT_TYPEDEF_, _)

enum { ARMLLM_KERNEL_SLOTS(ARMLLM_SLOT_INDEX_, _) ARMLLM_NUM_SLOTS };

static inline const char *armllm_slot_name(int slot) {
  static const char *const names[ARMLLM_NUM_SLOTS] = {ARMLLM_KERNEL_SLOTS(ARMLLM_SLOT_NAME_, _)};
  return slot >= 0 && slot < ARMLLM_NUM_SLOTS ? names[slot] : "?";
}

typedef struct armllm_kernels {
  const char *isa;                    /* this table's variant name */
  const char *impl[ARMLLM_NUM_SLOTS]; /* variant whose code runs in each slot (ARMLLM_SLOT) */
  const char *gemm_f32_layout;        /* packed layout names, e.g. "nr16k1" */
  const char *gemm_bf16_layout;
  const char *gemm_wq_layout;         /* packed layout of quantized weights */
  const char *gemm_gguf_layout;       /* packed layout of GGUF-block weights */
  int gemm_f32_panel, gemm_bf16_panel, /* columns per packed panel of each layout: */
      gemm_wq_panel, gemm_gguf_panel;  /* where a *_cols window may start */
  const char *gemm_bf16_compute;      /* "f32": weights widened; "bf16": activations rounded too */
  const char *attention_bf16_compute; /* with a bf16 cache: "f32" (K/V widened) or "bf16" (q and
                                         the softmax weights rounded to bf16 too, e.g. BFMMLA) */
  ARMLLM_KERNEL_SLOTS(ARMLLM_SLOT_MEMBER_, _)
} armllm_kernels;

/* In a table's initializer: slot `name` runs variant v's function
 * armllm_<v>_<name>, and impl says v. Pointing a slot at another variant
 * (a missing port: ARMLLM_SLOT(rope, neon) in the sve table) reports that
 * variant. Setting a slot twice is a -Woverride-init warning; a slot left out
 * makes armllm_isa_table refuse the table. */
#define ARMLLM_SLOT(name, v) .name = armllm_##v##_##name, .impl[ARMLLM_K_##name] = #v

/* Declares one variant's kernels: ARMLLM_DECLARE_VARIANT(avx2) declares
 * armllm_avx2_gemm_f32, ... and the table armllm_kernels_avx2. */
#define ARMLLM_DECLARE_VARIANT(v)                                                                  \
  ARMLLM_KERNEL_SLOTS(ARMLLM_SLOT_DECLARE_, v)                                                     \
  extern const armllm_kernels armllm_kernels_##v;

/* The fused RMSNorm + quant_act of the header comment above: rmsnorm's
 * arguments (out required), then quant_act's (of out). */
void armllm_rmsnorm_quant(const armllm_kernels *kt, armllm_pool *pool, const float *x,
                          int64_t ldx, float *residual, int64_t ldr, const float *weight,
                          int64_t t, int64_t d, float eps, float *out, int64_t ldo,
                          int64_t group, int8_t *xq, int64_t ldq, float *scale, int64_t ldsc,
                          int32_t *gsum, int64_t ldgs, int32_t *zp, int64_t ldzp);

/* Every variant declares the full set; a variant's table.c defines only the
 * table, and its kernel files define only the kernels it ports. */
ARMLLM_DECLARE_VARIANT(ref)
ARMLLM_DECLARE_VARIANT(avx2)
ARMLLM_DECLARE_VARIANT(avx512)
ARMLLM_DECLARE_VARIANT(amx)
ARMLLM_DECLARE_VARIANT(neon)
ARMLLM_DECLARE_VARIANT(neon_mmla)
ARMLLM_DECLARE_VARIANT(sve)

#ifdef __cplusplus
}
#endif
#endif /* ARMLLM_KERNELS_H */
