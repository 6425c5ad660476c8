# attn.pxi: included by _ext.pyx after elementwise.pxi: the paged KV cache's checks and
# _AttentionKernels, the slots that write the cache (kv_write) and read it (attention).


def attn_scratch_len(int64_t rows, int64_t n_heads, int64_t head_dim, int64_t max_seq_len):
    """Floats of scratch that let attention split every row's keys over threads."""
    return armllm_attn_scratch_len(rows, n_heads, head_dim, max_seq_len)


cdef cnp.ndarray _kv_cache(object a, str name):
    """A C-contiguous [n_kv_heads, num_blocks, block_size, head_dim] cache."""
    if not isinstance(a, cnp.ndarray):
        raise ValueError(f"{name} must be a numpy array, got {type(a).__name__}")
    cdef cnp.ndarray arr = <cnp.ndarray>a
    if arr.dtype != np.float32 and arr.dtype != np.uint16 and arr.dtype != np.int8:
        raise ValueError(f"{name} must be float32, uint16 (bf16 bits) or int8, got {arr.dtype}")
    if arr.ndim != 4:
        raise ValueError(f"{name} must be 4-D [n_kv_heads, num_blocks, block_size, head_dim],"
                         f" got shape {_shp(arr)}")
    if arr.size == 0:
        raise ValueError(f"{name} has a zero-size dimension: shape {_shp(arr)}")
    if not cnp.PyArray_IS_C_CONTIGUOUS(arr):
        raise ValueError(f"{name} must be C-contiguous")
    _writable(arr, name)
    return arr


cdef void _same_cache(cnp.ndarray k, cnp.ndarray v) except *:
    if k.dtype != v.dtype or _shp(k) != _shp(v):
        raise ValueError(f"k_cache and v_cache must match: {k.dtype} {_shp(k)} vs "
                         f"{v.dtype} {_shp(v)}")
    _no_overlap(k, "k_cache", v, "v_cache")


cdef int _cache_dtype(cnp.ndarray cache):
    """A checked cache's armllm_kv_dtype."""
    if cache.dtype == np.int8:
        return ARMLLM_KV_I8
    return ARMLLM_KV_BF16 if cache.dtype == np.uint16 else ARMLLM_KV_F32


cdef tuple _kv_scales(cnp.ndarray kc, k_scale, v_scale):
    """An int8 cache's row scales: uint16 (bf16 bits) [n_kv_heads, num_blocks, block_size],
    C-contiguous and writable, both given; (None, None) for the other dtypes, which take
    none."""
    if kc.dtype != np.int8:
        if k_scale is not None or v_scale is not None:
            raise ValueError(f"k_scale and v_scale belong to int8 caches, not {kc.dtype}")
        return None, None
    if k_scale is None or v_scale is None:
        raise ValueError("an int8 KV cache needs k_scale and v_scale")
    cdef tuple shape = _shp(kc)[:3]
    out = []
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if not isinstance(s, cnp.ndarray) or s.dtype != np.uint16 or _shp(s) != shape:
            raise ValueError(f"{name} must be a uint16 (bf16 bits) array of shape {shape}, got "
                             f"{getattr(s, 'dtype', type(s).__name__)} "
                             f"{getattr(s, 'shape', '')}")
        if not cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>s):
            raise ValueError(f"{name} must be C-contiguous")
        _writable(<cnp.ndarray>s, name)
        out.append(s)
    _no_overlap(<cnp.ndarray>out[0], "k_scale", <cnp.ndarray>out[1], "v_scale")
    return tuple(out)


cdef uint16_t *_scale_ptr(object s):
    return NULL if s is None else <uint16_t *>cnp.PyArray_DATA(<cnp.ndarray>s)


cdef class _AttentionKernels(_ElementwiseKernels):
    """Kernels' KV-cache write and paged attention slots."""

    @property
    def attention_bf16_compute(self):
        """With a bf16 cache: "f32" (K/V widened) or "bf16" (q and weights rounded too)."""
        return self.t.attention_bf16_compute.decode()

    def kv_write(self, k, v, slot_mapping, k_cache, v_cache, ThreadPool pool=None,
                 k_scale=None, v_scale=None):
        """Writes K/V rows [T, n_kv_heads*head_dim] to cache slots (-1 skips a row); an
        int8 cache quantizes each (row, head) with its scale into k_scale / v_scale."""
        cdef cnp.ndarray ka = _array(k, "k", np.float32, 2)
        cdef cnp.ndarray va = _array(v, "v", np.float32, 2)
        cdef cnp.ndarray sa = _array(slot_mapping, "slot_mapping", np.int32, 1)
        cdef cnp.ndarray kc = _kv_cache(k_cache, "k_cache")
        cdef cnp.ndarray vc = _kv_cache(v_cache, "v_cache")
        _same_cache(kc, vc)
        ks, vs = _kv_scales(kc, k_scale, v_scale)
        cdef uint16_t *ksp = _scale_ptr(ks)
        cdef uint16_t *vsp = _scale_ptr(vs)
        cdef int dtype = _cache_dtype(kc)
        cdef int64_t n_kv = kc.shape[0], num_blocks = kc.shape[1], bs = kc.shape[2]
        cdef int64_t hd = kc.shape[3], t = ka.shape[0]
        if ka.shape[1] != n_kv * hd or va.shape[1] != n_kv * hd:
            raise ValueError(f"k and v must have {n_kv * hd} columns (n_kv_heads*head_dim), "
                             f"got {ka.shape[1]} and {va.shape[1]}")
        if va.shape[0] != t or sa.shape[0] != t:
            raise ValueError(f"k, v and slot_mapping must have the same rows, got {t}, "
                             f"{va.shape[0]}, {sa.shape[0]}")
        cdef armllm_pool *p = _pool_ptr(pool)
        cdef int64_t ldk = _ld(ka), ldv = _ld(va), bad
        cdef const float *kp = <const float *>cnp.PyArray_DATA(ka)
        cdef const float *vp = <const float *>cnp.PyArray_DATA(va)
        cdef const int32_t *sp = <const int32_t *>cnp.PyArray_DATA(sa)
        cdef void *kcp = cnp.PyArray_DATA(kc)
        cdef void *vcp = cnp.PyArray_DATA(vc)
        with nogil:
            bad = self.t.kv_write(p, kp, ldk, vp, ldv, sp, t, kcp, vcp, dtype, ksp, vsp, n_kv, hd,
                                  bs, num_blocks)
        if bad >= 0:
            raise ValueError(f"slot_mapping[{bad}] = {slot_mapping[bad]} is outside the cache "
                             f"[-1, {num_blocks * bs})")

    def attention(self, q, k_cache, v_cache, block_table, seq_lens, query_start,
                  int64_t n_heads, float scale, out, int64_t sliding_window=0, scratch=None,
                  ThreadPool pool=None, sinks=None, bint causal=True, k_scale=None,
                  v_scale=None):
        """Varlen paged attention of q [T, n_heads*head_dim] into out (see the C header);
        sinks: None or float32 [n_heads], each head's logit in the softmax denominator;
        causal False: every row sees all seq_lens[b] keys of its sequence (an encoder's
        self-attention, cross-attention), with no sliding window; k_scale, v_scale: an
        int8 cache's row scales (see kv_write)."""
        cdef cnp.ndarray qa = _array(q, "q", np.float32, 2)
        cdef cnp.ndarray oa = _array(out, "out", np.float32, 2)
        cdef cnp.ndarray kc = _kv_cache(k_cache, "k_cache")
        cdef cnp.ndarray vc = _kv_cache(v_cache, "v_cache")
        cdef cnp.ndarray bt = _array(block_table, "block_table", np.int32, 2)
        cdef cnp.ndarray sl = _array(seq_lens, "seq_lens", np.int32, 1)
        cdef cnp.ndarray qs = _array(query_start, "query_start", np.int32, 1)
        cdef cnp.ndarray sc
        _same_cache(kc, vc)
        ks, vs = _kv_scales(kc, k_scale, v_scale)
        _writable(oa, "out")
        cdef int64_t n_kv = kc.shape[0], hd = kc.shape[3], n_seqs = sl.shape[0]
        if n_heads < 1 or n_heads % n_kv:
            raise ValueError(f"n_heads must be a positive multiple of n_kv_heads={n_kv}, "
                             f"got {n_heads}")
        if hd > ARMLLM_ATTN_MAX_HEAD_DIM:
            raise ValueError(f"head_dim {hd} is above the supported {ARMLLM_ATTN_MAX_HEAD_DIM}")
        if not scale > 0:
            raise ValueError(f"scale must be > 0, got {scale}")
        if sliding_window < 0:
            raise ValueError(f"sliding_window must be >= 0, got {sliding_window}")
        if not causal and sliding_window:
            raise ValueError(f"a sliding window needs causal attention, got "
                             f"sliding_window={sliding_window} with causal=False")
        if qs.shape[0] != n_seqs + 1 or bt.shape[0] != n_seqs:
            raise ValueError(f"query_start must have n_seqs+1 = {n_seqs + 1} entries and "
                             f"block_table n_seqs rows, got {qs.shape[0]} and {bt.shape[0]}")
        if _ld(bt) != bt.shape[1]:
            raise ValueError("block_table must be C-contiguous")
        cdef int64_t rows = (<cnp.int32_t *>cnp.PyArray_DATA(qs))[n_seqs]
        if rows != qa.shape[0] or oa.shape[0] != qa.shape[0]:
            raise ValueError(f"q and out must have query_start[-1] = {rows} rows, got "
                             f"{qa.shape[0]} and {oa.shape[0]}")
        if qa.shape[1] < n_heads * hd or oa.shape[1] < n_heads * hd:
            raise ValueError(f"q and out need n_heads*head_dim = {n_heads * hd} columns, got "
                             f"{qa.shape[1]} and {oa.shape[1]}")
        _no_overlap(oa, "out", qa, "q")
        cdef armllm_attn_args args
        args.q = <const float *>cnp.PyArray_DATA(qa)
        args.ldq = _ld(qa)
        args.k_cache = cnp.PyArray_DATA(kc)
        args.v_cache = cnp.PyArray_DATA(vc)
        args.cache_dtype = _cache_dtype(kc)
        args.k_scale, args.v_scale = _scale_ptr(ks), _scale_ptr(vs)
        args.block_table = <const int32_t *>cnp.PyArray_DATA(bt)
        args.max_blocks = bt.shape[1]
        args.seq_lens = <const int32_t *>cnp.PyArray_DATA(sl)
        args.query_start = <const int32_t *>cnp.PyArray_DATA(qs)
        args.n_seqs, args.n_heads, args.n_kv_heads = n_seqs, n_heads, n_kv
        args.head_dim, args.block_size, args.num_blocks = hd, kc.shape[2], kc.shape[1]
        args.scale, args.sliding_window = scale, sliding_window
        args.out = <float *>cnp.PyArray_DATA(oa)
        args.ldo = _ld(oa)
        args.scratch, args.scratch_len = NULL, 0
        args.sinks = NULL if sinks is None else _vector(sinks, "sinks", n_heads)
        args.bidirectional = not causal
        if scratch is not None:
            sc = _array(scratch, "scratch", np.float32, 1)
            _writable(sc, "scratch")
            args.scratch = <float *>cnp.PyArray_DATA(sc)
            args.scratch_len = sc.shape[0]
        cdef armllm_pool *p = _pool_ptr(pool)
        cdef int64_t bad
        with nogil:
            bad = self.t.attention(p, &args)
        if bad >= 0:
            raise ValueError(f"sequence {bad}: inconsistent attention metadata (seq_lens="
                             f"{seq_lens[bad]}, query rows {query_start[bad]}.."
                             f"{query_start[bad + 1]}, blocks "
                             f"{list(block_table[bad][:(int(seq_lens[bad]) + args.block_size - 1) // args.block_size])}"
                             f", num_blocks={args.num_blocks})")
        return out
