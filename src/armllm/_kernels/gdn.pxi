# gdn.pxi: included by _ext.pyx after attn.pxi: _GDNKernels, the Gated DeltaNet slots
# (Qwen3.5 / Qwen3-Next linear attention): the causal conv and the gated delta rule, each
# with its per-sequence state slots, the gated RMSNorm and the sigmoid output gate.


cdef cnp.ndarray _state(object a, str name, int ndim):
    """A writable, C-contiguous float32 state array of ndim dimensions."""
    cdef cnp.ndarray arr = _array(a, name, np.float32, ndim)
    if not cnp.PyArray_IS_C_CONTIGUOUS(arr):
        raise ValueError(f"{name} must be C-contiguous")
    _writable(arr, name)
    return arr


cdef struct GDNMeta:
    const int32_t *query_start
    const int32_t *seq_lens
    const int32_t *state_slots
    int64_t n_seqs


cdef GDNMeta _gdn_meta(state_slots, query_start, seq_lens, int64_t rows,
                       int64_t num_slots) except *:
    """The varlen metadata of a GDN call: int32 query_start [n_seqs + 1] ending at
    rows, seq_lens and state_slots [n_seqs], the slots of sequences with rows distinct
    (the kernels check the rest and name the first bad sequence)."""
    cdef cnp.ndarray ss = _array(state_slots, "state_slots", np.int32, 1)
    cdef cnp.ndarray qs = _array(query_start, "query_start", np.int32, 1)
    cdef cnp.ndarray sl = _array(seq_lens, "seq_lens", np.int32, 1)
    cdef int64_t n_seqs = sl.shape[0]
    if ss.shape[0] != n_seqs or qs.shape[0] != n_seqs + 1:
        raise ValueError(f"state_slots must have n_seqs = {n_seqs} entries and query_start "
                         f"n_seqs+1, got {ss.shape[0]} and {qs.shape[0]}")
    cdef GDNMeta m
    m.query_start = <const int32_t *>cnp.PyArray_DATA(qs)
    m.seq_lens = <const int32_t *>cnp.PyArray_DATA(sl)
    m.state_slots = <const int32_t *>cnp.PyArray_DATA(ss)
    m.n_seqs = n_seqs
    if m.query_start[n_seqs] != rows:
        raise ValueError(f"query_start[-1] must be the rows, {rows}, got {query_start[n_seqs]}")
    cdef bytearray seen = bytearray(num_slots)  # slots in range; the kernel names the others
    cdef unsigned char *mark = seen
    cdef int64_t b
    cdef int32_t slot
    for b in range(n_seqs):
        slot = m.state_slots[b]
        if m.query_start[b + 1] > m.query_start[b] and 0 <= slot < num_slots:
            if mark[slot]:
                raise ValueError(f"state_slots of sequences with rows must be distinct: "
                                 f"sequence {b} repeats slot {slot}")
            mark[slot] = 1
    return m


cdef _gdn_bad(int64_t bad, state_slots, query_start, seq_lens, int64_t num_slots):
    raise ValueError(f"sequence {bad}: inconsistent metadata (query rows {query_start[bad]}.."
                     f"{query_start[bad + 1]}, seq_lens={seq_lens[bad]}, state slot "
                     f"{state_slots[bad]} of num_slots={num_slots})")


cdef class _GDNKernels(_AttentionKernels):
    """Kernels' Gated DeltaNet slots."""

    def gdn_conv(self, x, weight, state, state_slots, query_start, seq_lens, out,
                 ThreadPool pool=None):
        """out = silu(causal depthwise conv(x)) per sequence, the history from and back to
        each sequence's state slot: x, out [rows, channels], weight [channels, kernel],
        state [num_slots, kernel - 1, channels] (see the C header)."""
        cdef cnp.ndarray xa = _array(x, "x", np.float32, 2)
        cdef cnp.ndarray wa = _array(weight, "weight", np.float32, 2)
        cdef cnp.ndarray sa = _state(state, "state", 3)
        cdef cnp.ndarray oa = _array(out, "out", np.float32, 2)
        _writable(oa, "out")
        cdef int64_t rows = xa.shape[0], channels = xa.shape[1], kernel = wa.shape[1]
        if not 2 <= kernel <= ARMLLM_GDN_MAX_KERNEL:
            raise ValueError(f"weight's kernel size must be in [2, {ARMLLM_GDN_MAX_KERNEL}], "
                             f"got {kernel}")
        if wa.shape[0] != channels or _ld(wa) != kernel:
            raise ValueError(f"weight must be a contiguous ({channels}, kernel) array, got "
                             f"shape {_shp(wa)}")
        if sa.shape[1] != kernel - 1 or sa.shape[2] != channels:
            raise ValueError(f"state must have shape (num_slots, {kernel - 1}, {channels}), got "
                             f"{_shp(sa)}")
        if oa.shape[0] != rows or oa.shape[1] != channels:
            raise ValueError(f"out must have shape {_shp(xa)}, got {_shp(oa)}")
        cdef cnp.ndarray flat = sa.reshape(-1)  # its span, for the overlap checks
        _no_overlap(oa, "out", xa, "x")
        _no_overlap(oa, "out", flat, "state")
        _no_overlap(flat, "state", xa, "x")
        _no_overlap(flat, "state", wa, "weight")
        cdef armllm_gdn_conv_args args
        cdef GDNMeta m = _gdn_meta(state_slots, query_start, seq_lens, rows, sa.shape[0])
        args.x, args.ldx = <const float *>cnp.PyArray_DATA(xa), _ld(xa)
        args.y, args.ldy = <float *>cnp.PyArray_DATA(oa), _ld(oa)
        args.weight = <const float *>cnp.PyArray_DATA(wa)
        args.channels, args.kernel = channels, kernel
        args.state, args.num_slots = <float *>cnp.PyArray_DATA(sa), sa.shape[0]
        args.query_start, args.seq_lens, args.state_slots = m.query_start, m.seq_lens, m.state_slots
        args.n_seqs = m.n_seqs
        cdef armllm_pool *p = _pool_ptr(pool)
        cdef int64_t bad
        with nogil:
            bad = self.t.gdn_conv(p, &args)
        if bad >= 0:
            _gdn_bad(bad, state_slots, query_start, seq_lens, args.num_slots)
        return out

    def gdn_rule(self, qkv, a, b, a_neg, dt_bias, state, state_slots, query_start, seq_lens,
                 int64_t n_k_heads, int64_t n_v_heads, out, bint v_tiled=False,
                 ThreadPool pool=None):
        """The gated delta rule over each sequence's rows into out [rows, n_v_heads*dv]:
        qkv [rows, 2*n_k_heads*dk + n_v_heads*dv] the conv's output (q | k | v), a and b
        [rows, n_v_heads] (one row stride), a_neg = -exp(A_log) and dt_bias [n_v_heads],
        state [num_slots, n_v_heads, dk, dv]; v_tiled: v head h reads k head h % n_k_heads
        (GGUF order), else h // (n_v_heads // n_k_heads) (see the C header)."""
        cdef cnp.ndarray qa = _array(qkv, "qkv", np.float32, 2)
        cdef cnp.ndarray aa = _array(a, "a", np.float32, 2)
        cdef cnp.ndarray ba = _array(b, "b", np.float32, 2)
        cdef cnp.ndarray sa = _state(state, "state", 4)
        cdef cnp.ndarray oa = _array(out, "out", np.float32, 2)
        _writable(oa, "out")
        if n_k_heads < 1 or n_v_heads < 1 or n_v_heads % n_k_heads:
            raise ValueError(f"n_v_heads must be a positive multiple of n_k_heads, got "
                             f"{n_v_heads} and {n_k_heads}")
        cdef int64_t rows = qa.shape[0], dk = sa.shape[2], dv = sa.shape[3]
        if sa.shape[1] != n_v_heads or dk > ARMLLM_GDN_MAX_HEAD_DIM or dv > ARMLLM_GDN_MAX_HEAD_DIM:
            raise ValueError(f"state must be (num_slots, n_v_heads={n_v_heads}, dk, dv) with "
                             f"dk, dv <= {ARMLLM_GDN_MAX_HEAD_DIM}, got {_shp(sa)}")
        if qa.shape[1] != 2 * n_k_heads * dk + n_v_heads * dv:
            raise ValueError(f"qkv must have 2*n_k_heads*dk + n_v_heads*dv = "
                             f"{2 * n_k_heads * dk + n_v_heads * dv} columns, got {qa.shape[1]}")
        for name, arr in (("a", aa), ("b", ba)):
            if arr.shape[0] != rows or arr.shape[1] != n_v_heads:
                raise ValueError(f"{name} must have shape ({rows}, {n_v_heads}), got {_shp(arr)}")
        if aa.strides[0] != ba.strides[0]:
            raise ValueError(f"a and b must have the same row stride, got {aa.strides[0]} and "
                             f"{ba.strides[0]} bytes")
        if oa.shape[0] != rows or oa.shape[1] != n_v_heads * dv:
            raise ValueError(f"out must have shape ({rows}, {n_v_heads * dv}), got {_shp(oa)}")
        cdef armllm_gdn_args args
        args.a_neg = _vector(a_neg, "a_neg", n_v_heads)
        args.dt_bias = _vector(dt_bias, "dt_bias", n_v_heads)
        cdef cnp.ndarray flat = sa.reshape(-1)  # its span, for the overlap checks
        for name, arr in (("qkv", qa), ("a", aa), ("b", ba), ("a_neg", a_neg),
                          ("dt_bias", dt_bias)):
            _no_overlap(oa, "out", arr, name)
            _no_overlap(flat, "state", arr, name)
        _no_overlap(oa, "out", flat, "state")
        cdef GDNMeta m = _gdn_meta(state_slots, query_start, seq_lens, rows, sa.shape[0])
        cdef const float *qp = <const float *>cnp.PyArray_DATA(qa)
        args.q, args.k, args.v = qp, qp + n_k_heads * dk, qp + 2 * n_k_heads * dk
        args.ldqkv = _ld(qa)
        args.a, args.b = <const float *>cnp.PyArray_DATA(aa), <const float *>cnp.PyArray_DATA(ba)
        args.ldab = _ld(aa)
        args.out, args.ldo = <float *>cnp.PyArray_DATA(oa), _ld(oa)
        args.state, args.num_slots = <float *>cnp.PyArray_DATA(sa), sa.shape[0]
        args.n_k_heads, args.n_v_heads, args.dk, args.dv = n_k_heads, n_v_heads, dk, dv
        args.v_tiled = v_tiled
        args.query_start, args.seq_lens, args.state_slots = m.query_start, m.seq_lens, m.state_slots
        args.n_seqs = m.n_seqs
        cdef armllm_pool *p = _pool_ptr(pool)
        cdef int64_t bad
        with nogil:
            bad = self.t.gdn_rule(p, &args)
        if bad >= 0:
            _gdn_bad(bad, state_slots, query_start, seq_lens, args.num_slots)
        return out

    def gated_rmsnorm(self, x, z, weight, float eps, out, ThreadPool pool=None):
        """out = rmsnorm(x per head of d = weight's length) * weight * silu(z); x, z, out
        [t, heads*d]; out may be x."""
        cdef cnp.ndarray xa = _array(x, "x", np.float32, 2)
        cdef cnp.ndarray za = _array(z, "z", np.float32, 2)
        cdef cnp.ndarray wa = _array(weight, "weight", np.float32, 1)
        cdef cnp.ndarray oa = _array(out, "out", np.float32, 2)
        _writable(oa, "out")
        if not eps > 0:
            raise ValueError(f"eps must be > 0, got {eps}")
        cdef int64_t t = xa.shape[0], d = wa.shape[0]
        if xa.shape[1] % d:
            raise ValueError(f"x's {xa.shape[1]} columns are not whole heads of weight's {d}")
        for name, arr in (("z", za), ("out", oa)):
            if arr.shape[0] != t or arr.shape[1] != xa.shape[1]:
                raise ValueError(f"{name} must have shape {_shp(xa)}, got {_shp(arr)}")
        _same_or_disjoint(oa, "out", xa, "x")
        _no_overlap(oa, "out", za, "z")
        _no_overlap(oa, "out", wa, "weight")
        cdef armllm_pool *p = _pool_ptr(pool)
        cdef int64_t heads = xa.shape[1] // d, ldx = _ld(xa), ldz = _ld(za), ldo = _ld(oa)
        cdef const float *xp = <const float *>cnp.PyArray_DATA(xa)
        cdef const float *zp = <const float *>cnp.PyArray_DATA(za)
        cdef const float *wp = <const float *>cnp.PyArray_DATA(wa)
        cdef float *op = <float *>cnp.PyArray_DATA(oa)
        with nogil:
            self.t.gated_rmsnorm(p, xp, ldx, zp, ldz, wp, t, heads, d, eps, op, ldo)
        return out

    def sigmoid_mul(self, gate, x, ThreadPool pool=None):
        """x *= sigmoid(gate) in place (x [t, n], gate [t, n]): the output gate."""
        cdef cnp.ndarray ga = _array(gate, "gate", np.float32, 2)
        cdef cnp.ndarray xa = _array(x, "x", np.float32, 2)
        _writable(xa, "x")
        if ga.shape[0] != xa.shape[0] or ga.shape[1] != xa.shape[1]:
            raise ValueError(f"gate must have shape {_shp(xa)}, got {_shp(ga)}")
        _no_overlap(xa, "x", ga, "gate")
        cdef armllm_pool *p = _pool_ptr(pool)
        cdef int64_t t = xa.shape[0], n = xa.shape[1], ldg = _ld(ga), ldx = _ld(xa)
        cdef const float *gp = <const float *>cnp.PyArray_DATA(ga)
        cdef float *xp = <float *>cnp.PyArray_DATA(xa)
        with nogil:
            self.t.sigmoid_mul(p, gp, ldg, t, n, xp, ldx)
        return x
