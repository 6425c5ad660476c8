# abi.pxi: the C kernel ABI as Cython sees it (pool.h, armllm_kernels.h,
# cpu.h, probe.h, fused.h, sample.h), included by _ext.pyx.

cdef extern from "pool.h" nogil:
    ctypedef struct armllm_pool:
        pass
    armllm_pool *armllm_pool_create(int n_threads, int pin, char *err, size_t err_len)
    void armllm_pool_destroy(armllm_pool *pool)
    int armllm_pool_threads(const armllm_pool *pool)
    int armllm_allowed_cpus()
    const char *armllm_pool_atomic_impl()
    void armllm_pool_count_items(armllm_pool *pool, int64_t n_items, int64_t grain,
                                 uint32_t *counts)
    void armllm_pool_count_items_nested(armllm_pool *pool, int64_t n_outer, int64_t n_inner,
                                        uint32_t *counts)


# the act(gate) * up kernels' signature (silu_mul, gelu_tanh_mul)
ctypedef void (*armllm_act_mul_fn)(armllm_pool *pool, const float *gate_up, int64_t ldg,
                                   int64_t t, int64_t inter, float *out,
                                   int64_t ldo) noexcept nogil

cdef extern from "armllm_kernels.h" nogil:
    enum:
        ARMLLM_ROPE_NEOX
        ARMLLM_ROPE_GPTJ
        ARMLLM_KV_F32
        ARMLLM_KV_BF16
        ARMLLM_KV_I8

    ctypedef struct armllm_attn_args:
        const float *q
        int64_t ldq
        const void *k_cache
        const void *v_cache
        int cache_dtype
        const uint16_t *k_scale
        const uint16_t *v_scale
        const int32_t *block_table
        int64_t max_blocks
        const int32_t *seq_lens
        const int32_t *query_start
        int64_t n_seqs, n_heads, n_kv_heads, head_dim, block_size, num_blocks
        float scale
        int64_t sliding_window
        float *out
        int64_t ldo
        float *scratch
        size_t scratch_len
        const float *sinks
        int bidirectional
    enum:
        ARMLLM_ATTN_MAX_HEAD_DIM
    size_t armllm_attn_scratch_len(int64_t rows, int64_t n_heads, int64_t head_dim,
                                   int64_t max_seq_len)

    enum:
        ARMLLM_GDN_MAX_KERNEL
        ARMLLM_GDN_MAX_HEAD_DIM
        ARMLLM_GDN_CHUNK
    ctypedef struct armllm_gdn_conv_args:
        const float *x
        int64_t ldx
        float *y
        int64_t ldy
        const float *weight
        int64_t channels, kernel
        float *state
        int64_t num_slots
        const int32_t *query_start
        const int32_t *seq_lens
        const int32_t *state_slots
        int64_t n_seqs
    ctypedef struct armllm_gdn_args:
        const float *q
        const float *k
        const float *v
        int64_t ldqkv
        const float *a
        const float *b
        int64_t ldab
        const float *a_neg
        const float *dt_bias
        float *out
        int64_t ldo
        float *state
        int64_t num_slots, n_k_heads, n_v_heads, dk, dv
        int v_tiled
        const int32_t *query_start
        const int32_t *seq_lens
        const int32_t *state_slots
        int64_t n_seqs

    enum:
        ARMLLM_Q_KALIGN
        ARMLLM_Q_CHANNEL_GROUP
        ARMLLM_SAMPLE_BLOCK
    int64_t armllm_q_kpad(int64_t k)
    int64_t armllm_q_group_len(int64_t group)
    int64_t armllm_q_groups(int64_t k, int64_t group)

    # The slots (ARMLLM_KERNEL_SLOTS): their number and names come from C; the
    # members below repeat the signatures Python calls, because Cython cannot
    # expand the X-macro. The C compiler checks each call Cython emits against
    # the real member types.
    enum:
        ARMLLM_NUM_SLOTS
    const char *armllm_slot_name(int slot)

    ctypedef struct armllm_kernels:
        const char *isa
        const char *gemm_f32_layout
        const char *gemm_bf16_layout
        const char *gemm_wq_layout
        const char *gemm_gguf_layout
        int gemm_f32_panel, gemm_bf16_panel, gemm_wq_panel, gemm_gguf_panel
        const char *gemm_bf16_compute
        const char *attention_bf16_compute
        size_t (*gemm_f32_packed_len)(int64_t n, int64_t k) noexcept nogil
        void (*gemm_f32_pack)(const float *w, int64_t n, int64_t k,
                              float *packed) noexcept nogil
        void (*gemm_f32)(armllm_pool *pool, const float *x, int64_t m, int64_t k, int64_t ldx,
                         const float *packed_w, int64_t n, const float *bias, float *y,
                         int64_t ldy) noexcept nogil
        size_t (*gemm_bf16_packed_len)(int64_t n, int64_t k) noexcept nogil
        void (*gemm_bf16_pack)(const uint16_t *w, int64_t n, int64_t k,
                               uint16_t *packed) noexcept nogil
        void (*gemm_bf16)(armllm_pool *pool, const float *x, int64_t m, int64_t k, int64_t ldx,
                          const uint16_t *packed_w, int64_t n, const float *bias, float *y,
                          int64_t ldy) noexcept nogil
        void (*gemm_f32_cols)(const float *x, int64_t m, int64_t k, int64_t ldx,
                              const float *packed_w, int64_t n, int64_t n0, int64_t n1,
                              const float *bias, float *y, int64_t ldy) noexcept nogil
        void (*gemm_bf16_cols)(const float *x, int64_t m, int64_t k, int64_t ldx,
                               const uint16_t *packed_w, int64_t n, int64_t n0, int64_t n1,
                               const float *bias, float *y, int64_t ldy) noexcept nogil
        void (*rmsnorm)(armllm_pool *pool, const float *x, int64_t ldx, float *residual,
                        int64_t ldr, const float *weight, int64_t t, int64_t d, float eps,
                        float *out, int64_t ldo) noexcept nogil
        int64_t (*rope)(armllm_pool *pool, float *x, int64_t t, int64_t n_heads,
                        int64_t head_dim, int64_t ldx, const int32_t *positions,
                        const float *cos_sin, int64_t max_pos, int64_t rot_dim,
                        int style) noexcept nogil
        void (*silu_mul)(armllm_pool *pool, const float *gate_up, int64_t ldg, int64_t t,
                         int64_t inter, float *out, int64_t ldo) noexcept nogil
        void (*gelu_tanh_mul)(armllm_pool *pool, const float *gate_up, int64_t ldg,
                              int64_t t, int64_t inter, float *out, int64_t ldo) noexcept nogil
        int64_t (*embed_f32)(armllm_pool *pool, const int32_t *ids, int64_t t,
                             const float *table, int64_t vocab, int64_t d, float *out,
                             int64_t ldo) noexcept nogil
        int64_t (*embed_bf16)(armllm_pool *pool, const int32_t *ids, int64_t t,
                              const uint16_t *table, int64_t vocab, int64_t d, float *out,
                              int64_t ldo) noexcept nogil
        void (*exp)(const float *x, float *y, int64_t n) noexcept nogil
        int64_t (*kv_write)(armllm_pool *pool, const float *k, int64_t ldk, const float *v,
                            int64_t ldv, const int32_t *slot_mapping, int64_t t,
                            void *k_cache, void *v_cache, int cache_dtype, uint16_t *k_scale,
                            uint16_t *v_scale, int64_t n_kv_heads,
                            int64_t head_dim, int64_t block_size,
                            int64_t num_blocks) noexcept nogil
        int64_t (*attention)(armllm_pool *pool, const armllm_attn_args *args) noexcept nogil
        void (*quant_act)(armllm_pool *pool, const float *x, int64_t m, int64_t k, int64_t ldx,
                          int64_t group, int8_t *xq, int64_t ldq, float *scale, int64_t ldsc,
                          int32_t *gsum, int64_t ldgs, int32_t *zp,
                          int64_t ldzp) noexcept nogil
        size_t (*gemm_wq_packed_len)(int64_t n, int64_t k, int bits, int64_t group,
                                     const float *d, const float *o) noexcept nogil
        void (*gemm_wq_pack)(const int8_t *q, int64_t n, int64_t k, int bits, int64_t group,
                             const float *d, const float *o, void *packed) noexcept nogil
        void (*gemm_wq)(armllm_pool *pool, const int8_t *xq, int64_t m, int64_t k, int64_t ldq,
                        const float *scale, int64_t ldsc, const int32_t *gsum, int64_t ldgs,
                        const void *packed_w, int64_t n, int bits, int64_t group,
                        const float *bias, float *y, int64_t ldy) noexcept nogil
        void (*gemm_wq_cols)(const int8_t *xq, int64_t m, int64_t k, int64_t ldq,
                             const float *scale, int64_t ldsc, const int32_t *gsum, int64_t ldgs,
                             const void *packed_w, int64_t n, int bits, int64_t group, int64_t n0,
                             int64_t n1, const float *bias, float *y, int64_t ldy) noexcept nogil
        size_t (*gemm_gguf_packed_len)(int64_t k, int64_t nparts, const int32_t *types,
                                       const int64_t *rows) noexcept nogil
        void (*gemm_gguf_pack)(const uint8_t *blocks, int64_t k, int64_t nparts,
                               const int32_t *types, const int64_t *rows,
                               void *packed) noexcept nogil
        void (*gemm_gguf)(armllm_pool *pool, const int8_t *xq, int64_t m, int64_t k,
                          int64_t ldq, const float *scale, int64_t ldsc, const int32_t *gsum,
                          int64_t ldgs, const void *packed_w, int64_t n, const float *bias,
                          float *y, int64_t ldy) noexcept nogil
        void (*gemm_gguf_cols)(const int8_t *xq, int64_t m, int64_t k, int64_t ldq,
                               const float *scale, int64_t ldsc, const int32_t *gsum,
                               int64_t ldgs, const void *packed_w, int64_t n, int64_t n0,
                               int64_t n1, const float *bias, float *y,
                               int64_t ldy) noexcept nogil
        int64_t (*gdn_conv)(armllm_pool *pool, const armllm_gdn_conv_args *args) noexcept nogil
        int64_t (*gdn_rule)(armllm_pool *pool, const armllm_gdn_args *args) noexcept nogil
        void (*gated_rmsnorm)(armllm_pool *pool, const float *x, int64_t ldx, const float *z,
                              int64_t ldz, const float *weight, int64_t t, int64_t heads,
                              int64_t d, float eps, float *out, int64_t ldo) noexcept nogil
        void (*sigmoid_mul)(armllm_pool *pool, const float *gate, int64_t ldg, int64_t t,
                            int64_t n, float *x, int64_t ldx) noexcept nogil
        void (*layernorm)(armllm_pool *pool, const float *x, int64_t ldx, const float *weight,
                          const float *bias, int64_t t, int64_t d, float eps, float *out,
                          int64_t ldo) noexcept nogil
        void (*gelu)(armllm_pool *pool, const float *x, float *y, int64_t n) noexcept nogil
        int64_t (*sample_argmax)(const float *x, int64_t n) noexcept nogil
        int64_t (*sample_find_above)(const float *x, int64_t n, float t) noexcept nogil
        double (*sample_exp)(const float *x, float *e, int64_t n, float m, float inv_t,
                             float keep_min, float *sums) noexcept nogil
        double (*sample_block_sums)(const float *e, int64_t n, float keep_min,
                                    float *sums) noexcept nogil
        int64_t (*sample_collect)(const float *e, const int32_t *ids, int64_t n, float keep_min,
                                  float *out_e, int32_t *out_id) noexcept nogil

    void armllm_rmsnorm_quant(const armllm_kernels *kt, armllm_pool *pool, const float *x,
                              int64_t ldx, float *residual, int64_t ldr, const float *weight,
                              int64_t t, int64_t d, float eps, float *out, int64_t ldo,
                              int64_t group, int8_t *xq, int64_t ldq, float *scale,
                              int64_t ldsc, int32_t *gsum, int64_t ldgs, int32_t *zp,
                              int64_t ldzp)


cdef extern from "gguf_blocks.h" nogil:
    enum:
        ARMLLM_GGUF_ACT_GROUP
        ARMLLM_GGUF_SUPER
        ARMLLM_GGUF_MAX_PARTS
    int armllm_gguf_block_elems(int type)
    int armllm_gguf_is_super(int type)
    int armllm_gguf_block_bytes(int type)
    int armllm_gguf_parts_check(int64_t k, int64_t nparts, const int32_t *types,
                                const int64_t *rows)
    void armllm_gguf_dequant_rows(int type, const uint8_t *src, int64_t rows, int64_t k,
                                  float *out, int64_t ldo)
    int64_t armllm_gguf_embed(armllm_pool *pool, const int32_t *ids, int64_t t,
                              const uint8_t *table, int type, int64_t vocab, int64_t d,
                              float *out, int64_t ldo)


cdef extern from "cpu.h" nogil:
    enum:
        ARMLLM_CPU_NUM_FEATURES
    ctypedef struct armllm_cpu:
        const char *arch
        uint64_t features
        int sve_vector_bits
        char vendor[16]
        int family
        int model
        char amx_denied[256]
    const armllm_cpu *armllm_cpu_detect()
    const char *armllm_cpu_feature_name(int feature)
    int armllm_cpu_has(const armllm_cpu *cpu, int feature)
    const char *const *armllm_isa_built()
    const armllm_kernels *armllm_isa_table(const char *isa, const armllm_cpu *cpu, char *err,
                                           size_t err_len)
    const char *armllm_isa_best(const armllm_cpu *cpu)
    const char *armllm_slot_impl(const armllm_kernels *t, int slot, char *buf, size_t len)
    int armllm_x86_decode_streams()
    void armllm_set_x86_decode_streams(int streams)


cdef extern from "probe.h" nogil:
    uint64_t armllm_probe_read(armllm_pool *pool, const void *buf, size_t nbytes)
    double armllm_probe_fma(armllm_pool *pool, int64_t iters)


cdef extern from "fused.h" nogil:
    int64_t armllm_rope_kv_write(const armllm_kernels *kt, armllm_pool *pool, float *q,
                                 int64_t ldq, int64_t n_heads, float *k, int64_t ldk,
                                 const float *v, int64_t ldv, int64_t n_kv_heads,
                                 int64_t head_dim, int64_t rot_dim, int style,
                                 const int32_t *positions, const float *cos_sin,
                                 int64_t max_pos, const int32_t *slot_mapping, int64_t t,
                                 void *k_cache, void *v_cache, int cache_dtype,
                                 uint16_t *k_scale, uint16_t *v_scale,
                                 int64_t block_size, int64_t num_blocks, int *bad_slot)


cdef extern from "sample.h" nogil:
    enum:
        ARMLLM_SAMPLE_MAX_LOGPROBS
    ctypedef struct armllm_sample_batch:
        int64_t rows, n
        float **row
        const float *temperature
        const float *top_p
        const float *min_p
        const float *repetition_penalty
        const float *presence_penalty
        const float *frequency_penalty
        const int32_t *top_k
        const int32_t *num_logprobs
        const uint64_t *seed
        const uint64_t *stream
        const uint64_t *counter
        const int32_t **history
        const int64_t *history_len
        const int64_t *prompt_len
        const int32_t **bias_ids
        const float **bias_values
        const int64_t *bias_len
        const uint32_t *masks
        int64_t mask_ld
        const int32_t *mask_row
        const int8_t *keep_row
        const int32_t **bad_words
        const float *dry_multiplier
        const float *dry_base
        const int32_t *dry_allowed_length
        const int64_t *dry_last_n
        const int32_t **dry_breakers
        const float *xtc_probability
        const float *xtc_threshold
        void *dry_scratch
        int64_t dry_window
        int32_t *token
        float *logprob
        int32_t *top_ids
        float *top_logprobs
        void *scratch
        int64_t slots
    size_t armllm_sample_rows_slot_bytes(int64_t n)
    size_t armllm_sample_dry_bytes(int64_t window)
    void armllm_sample_rows(const armllm_kernels *kt, armllm_pool *pool,
                            const armllm_sample_batch *b)
    double armllm_sample_uniform(uint64_t seed, uint64_t stream, uint64_t counter)
    void armllm_mask_logits(float *row, int64_t n, const uint32_t *words)
