# quant.pxi: included by _ext.pyx after gemm.pxi: int8 activations (quant_act's outputs,
# checked) and the quantized (w8/w4) weights' slots, _QuantKernels: quant_act, pack_wq,
# gemm_wq; and the group geometry (q_kpad, q_groups) the Python side sizes buffers by.


cdef struct QuantOut:
    int8_t *xq
    int64_t ldq
    float *scale
    int64_t ldsc
    int32_t *gsum
    int64_t ldgs
    int32_t *zp
    int64_t ldzp


cdef cnp.ndarray _group_array(object a, str name, object dtype, int64_t m, int64_t ng,
                              int64_t group, int64_t kpad):
    """A writable [m, >= ng] per-group output of quant_act."""
    cdef cnp.ndarray arr = _array(a, name, dtype, 2)
    _writable(arr, name)
    if arr.shape[0] != m or arr.shape[1] < ng:
        raise ValueError(f"{name} must have {m} rows of at least {ng} columns (groups of "
                         f"{armllm_q_group_len(group)} in kpad = {kpad}), got shape {_shp(arr)}")
    return arr


cdef QuantOut _quant_out(cnp.ndarray xa, int64_t group, xq, scale, gsum, zp) except *:
    """quant_act's outputs for x [M, K], checked: xq [M, >= kpad] int8, scale
    and the optional gsum / zp [M, >= n_groups], writable, disjoint."""
    cdef QuantOut qo
    cdef int64_t m = xa.shape[0], k = xa.shape[1]
    cdef int64_t kpad = armllm_q_kpad(k), ng = armllm_q_groups(k, group)
    cdef cnp.ndarray qa = _array(xq, "xq", np.int8, 2)
    cdef cnp.ndarray sa = _group_array(scale, "scale", np.float32, m, ng, group, kpad)
    cdef cnp.ndarray ga, za
    _writable(qa, "xq")
    if qa.shape[0] != m or qa.shape[1] < kpad:
        raise ValueError(f"xq must have {m} rows of at least kpad = {kpad} columns (K={k} "
                         f"rounded up to {ARMLLM_Q_KALIGN}), got shape {_shp(qa)}")
    _no_overlap(qa, "xq", xa, "x")
    _no_overlap(sa, "scale", xa, "x")
    _no_overlap(sa, "scale", qa, "xq")
    qo.xq, qo.ldq = <int8_t *>cnp.PyArray_DATA(qa), _ld(qa)
    qo.scale, qo.ldsc = <float *>cnp.PyArray_DATA(sa), _ld(sa)
    qo.gsum, qo.ldgs, qo.zp, qo.ldzp = NULL, 0, NULL, 0
    if gsum is not None:
        ga = _group_array(gsum, "gsum", np.int32, m, ng, group, kpad)
        _no_overlap(ga, "gsum", xa, "x")
        _no_overlap(ga, "gsum", qa, "xq")
        _no_overlap(ga, "gsum", sa, "scale")
        qo.gsum, qo.ldgs = <int32_t *>cnp.PyArray_DATA(ga), _ld(ga)
    if zp is not None:
        za = _group_array(zp, "zp", np.int32, m, ng, group, kpad)
        _no_overlap(za, "zp", xa, "x")
        _no_overlap(za, "zp", qa, "xq")
        _no_overlap(za, "zp", sa, "scale")
        if gsum is not None:
            _no_overlap(za, "zp", ga, "gsum")
        qo.zp, qo.ldzp = <int32_t *>cnp.PyArray_DATA(za), _ld(za)
    return qo


def q_kpad(int64_t k):
    """Columns of quantized activations for K: K rounded up to ARMLLM_Q_KALIGN."""
    return armllm_q_kpad(k)


def q_group_len(int64_t group):
    """Columns per scale group: group, or ARMLLM_Q_CHANNEL_GROUP for 0 (channelwise)."""
    return armllm_q_group_len(group)


def q_groups(int64_t k, int64_t group):
    """Scale groups (activation scales and group sums) per row for K and group
    (0: channelwise, groups of ARMLLM_Q_CHANNEL_GROUP)."""
    return armllm_q_groups(k, group)


cdef void _check_group(int64_t group) except *:
    if group != 0 and group != 32 and group != 64 and group != 128:
        raise ValueError(f"group must be 0 (channelwise), 32, 64 or 128, got {group}")


cdef void _check_act_group(int64_t group) except *:
    if group != ARMLLM_GGUF_SUPER:
        _check_group(group)


cdef cnp.ndarray _scales(object a, str name, int64_t n, int64_t ng, int64_t group):
    """A C-contiguous float32 [n, ng] array of per-group scales or offsets."""
    if isinstance(a, np.ndarray) and a.ndim == 2 and a.shape[1] == 1:
        a = np.ascontiguousarray(a)  # a [n, 1] view (d[:, None]) may have a last stride 0
    cdef cnp.ndarray arr = _array(a, name, np.float32, 2)
    if arr.shape[0] != n or arr.shape[1] != ng:
        what = f"group of {group}" if group else "row (channelwise)"
        raise ValueError(f"{name} must have shape ({n}, {ng}) (one per {what}), got "
                         f"{_shp(arr)}")
    if _ld(arr) != ng:
        arr = np.ascontiguousarray(arr)
    return arr


cdef class _QuantKernels(_GemmKernels):
    """Kernels' quantized-activation and w8/w4 GEMM slots."""

    @property
    def gemm_wq_layout(self):
        """The packed layout of quantized (w8/w4) weights."""
        return self.t.gemm_wq_layout.decode()

    def quant_act(self, x, xq, scale, gsum=None, int64_t group=0, ThreadPool pool=None,
                  zp=None):
        """Quantizes x[M, K] to int8 per row and group of `group` columns (0:
        groups of ARMLLM_Q_CHANNEL_GROUP) into xq[:, :kpad] (columns K..kpad
        zero) and scale[M, n_groups]; with gsum, also the int32 sums of xq over
        each group; with zp (int32 [M, n_groups]) asymmetric, zero points there.
        group may also be 256 (ARMLLM_GGUF_SUPER: the K-quant GEMM's activations)."""
        _check_act_group(group)
        cdef cnp.ndarray xa = _array(x, "x", np.float32, 2)
        cdef QuantOut qo = _quant_out(xa, group, xq, scale, gsum, zp)
        cdef armllm_pool *p = _pool_ptr(pool)
        cdef int64_t m = xa.shape[0], k = xa.shape[1], ldx = _ld(xa)
        cdef const float *xp = <const float *>cnp.PyArray_DATA(xa)
        with nogil:
            self.t.quant_act(p, xp, m, k, ldx, group, qo.xq, qo.ldq, qo.scale, qo.ldsc, qo.gsum,
                             qo.ldgs, qo.zp, qo.ldzp)

    def wq_packed_len(self, int64_t n, int64_t k, int bits, int64_t group=0, bint f16=True):
        """Bytes pack_wq allocates for an [n, k] weight of `bits` in groups of `group`,
        for scales exact in f16 (GGUF's, armllm's RTN ones) or, with f16=False, any."""
        if bits != 4 and bits != 8:
            raise ValueError(f"bits must be 4 or 8, got {bits}")
        _check_group(group)
        if n < 1 or k < 1:
            raise ValueError(f"n and k must be >= 1, got {n} and {k}")
        cdef cnp.ndarray ones = np.ones(n * armllm_q_groups(k, group), np.float32)
        cdef const float *dp = <const float *>cnp.PyArray_DATA(ones) if f16 else NULL
        return self.t.gemm_wq_packed_len(n, k, bits, group, dp, NULL)

    def pack_wq(self, q, d, o=None, int bits=8, int64_t group=0):
        """Prepacks quantized weights W = d * q + o: q[N, K] int8 (bits 8: -127..127;
        bits 4: 0..15, one per byte), d and o float32 [N, n_groups], or [N, 1]
        for group 0 (channelwise: one scale per row; o: bits 4 only, None for
        0), group columns per scale."""
        if bits != 4 and bits != 8:
            raise ValueError(f"bits must be 4 or 8, got {bits}")
        _check_group(group)
        cdef cnp.ndarray qa = _array(q, "q", np.int8, 2)
        if _ld(qa) != qa.shape[1]:
            qa = np.ascontiguousarray(qa)
        cdef int64_t n = qa.shape[0], k = qa.shape[1], ng = armllm_q_groups(k, group)
        cdef int64_t ngin = ng if group else 1
        cdef cnp.ndarray da = _scales(d, "d", n, ngin, group)
        cdef cnp.ndarray oa
        cdef const float *o_ptr = NULL
        if o is not None:
            if bits == 8:
                raise ValueError("o must be None for bits=8 (8-bit weights are symmetric)")
            oa = _scales(o, "o", n, ngin, group)
            o_ptr = <const float *>cnp.PyArray_DATA(oa)
        lo, hi = (-127, 127) if bits == 8 else (0, 15)
        qmin, qmax = int(qa.min()), int(qa.max())
        if qmin < lo or qmax > hi:
            raise ValueError(f"q values must be in [{lo}, {hi}] for bits={bits}, got "
                             f"[{qmin}, {qmax}]")
        cdef const int8_t *qp = <const int8_t *>cnp.PyArray_DATA(qa)
        cdef const float *dp = <const float *>cnp.PyArray_DATA(da)
        cdef cnp.ndarray packed = _aligned_empty(
            self.t.gemm_wq_packed_len(n, k, bits, group, dp, o_ptr), np.uint8)
        with nogil:
            self.t.gemm_wq_pack(qp, n, k, bits, group, dp, o_ptr, cnp.PyArray_DATA(packed))
        packed.flags.writeable = False
        cdef PackedWeight pw = PackedWeight.__new__(PackedWeight)
        pw.data, pw.n, pw.k, pw.isa = packed, n, k, self.isa
        pw.dtype, pw.bits, pw.group = f"w{bits}", bits, group
        pw.layout = self.t.gemm_wq_layout.decode()
        return pw

    def gemm_wq(self, xq, scale, gsum, w_obj, out, bias=None, ThreadPool pool=None, cols=None):
        """out[M, N] = sum_g scale[m, g] * (d * (xq . q over g) + o * gsum[m, g])
        (+ bias), with xq, scale, gsum from quant_act in the weight's groups
        (gsum required for 4-bit weights, optional for 8-bit, which then
        compute it) and W from pack_wq; cols = (n0, n1): only out's columns [n0,
        n1), on the calling thread (gemm_wq_cols)."""
        if not isinstance(w_obj, PackedWeight):
            raise ValueError(f"w must be a PackedWeight, got {type(w_obj).__name__}")
        cdef PackedWeight w = <PackedWeight>w_obj
        if not w.quantized:
            raise ValueError(f"w is a float weight ({w.dtype}): use gemm")
        if w.layout != self.t.gemm_wq_layout.decode():
            raise ValueError(f"w is packed as {w.layout!r} (by {w.isa}); the {self.isa} kernels"
                             f" read {self.t.gemm_wq_layout.decode()!r}: pack it with this table")
        cdef cnp.ndarray qa = _array(xq, "xq", np.int8, 2)
        cdef cnp.ndarray sa = _array(scale, "scale", np.float32, 2)
        cdef cnp.ndarray oa = _array(out, "out", np.float32, 2)
        cdef cnp.ndarray ga, ba
        cdef const int32_t *gs_ptr = NULL
        cdef const float *bias_ptr = NULL
        cdef int64_t ldgs = 0, m = qa.shape[0], kpad = w.kpad, ng = w.n_groups
        _writable(oa, "out")
        if qa.shape[1] < kpad:
            raise ValueError(f"xq must have at least kpad = {kpad} columns for K={w.k}, got "
                             f"{qa.shape[1]}")
        if sa.shape[0] != m or sa.shape[1] < ng or _ld(sa) < ng:
            raise ValueError(f"scale must have {m} rows of at least {ng} columns (groups of "
                             f"{armllm_q_group_len(w.group)}), got shape {_shp(sa)}")
        if oa.shape[0] != m or oa.shape[1] != w.n:
            raise ValueError(f"out must have shape ({m}, {w.n}), got {_shp(oa)}")
        _no_overlap(oa, "out", qa, "xq")
        _no_overlap(oa, "out", sa, "scale")
        _no_overlap(oa, "out", w.data, "w")
        if w.bits == 4 and gsum is None:
            raise ValueError("gsum is required for 4-bit weights (their offsets multiply "
                             "the activations' group sums): quant_act(..., gsum=...)")
        if gsum is not None:
            ga = _array(gsum, "gsum", np.int32, 2)
            if ga.shape[0] != m or ga.shape[1] < ng or _ld(ga) < ng:
                raise ValueError(f"gsum must have {m} rows of at least {ng} columns (groups of "
                                 f"{armllm_q_group_len(w.group)}), got shape {_shp(ga)}")
            _no_overlap(oa, "out", ga, "gsum")
            gs_ptr = <const int32_t *>cnp.PyArray_DATA(ga)
            ldgs = _ld(ga)
        if bias is not None:
            ba = _array(bias, "bias", np.float32, 1)
            if ba.shape[0] != w.n:
                raise ValueError(f"bias must have shape ({w.n},), got {_shp(ba)}")
            _no_overlap(oa, "out", ba, "bias")
            bias_ptr = <const float *>cnp.PyArray_DATA(ba)
        cdef armllm_pool *p = _pool_ptr(pool)
        cdef int64_t k = w.k, n = w.n, ldq = _ld(qa), ldy = _ld(oa), group = w.group
        cdef int64_t ldsc = _ld(sa)
        cdef int bits = w.bits
        cdef const int8_t *qp = <const int8_t *>cnp.PyArray_DATA(qa)
        cdef const float *sp = <const float *>cnp.PyArray_DATA(sa)
        cdef const void *wp = cnp.PyArray_DATA(w.data)
        cdef float *yp = <float *>cnp.PyArray_DATA(oa)
        cdef int64_t n0, n1
        if cols is not None:
            n0, n1 = _cols_window(cols, n, self.t.gemm_wq_panel, (n,))
            bias_ptr = bias_ptr + n0 if bias_ptr != NULL else NULL
            with nogil:
                self.t.gemm_wq_cols(qp, m, k, ldq, sp, ldsc, gs_ptr, ldgs, wp, n, bits, group, n0,
                                    n1, bias_ptr, yp + n0, ldy)
            return out
        with nogil:
            self.t.gemm_wq(p, qp, m, k, ldq, sp, ldsc, gs_ptr, ldgs, wp, n, bits, group, bias_ptr,
                           yp, ldy)
        return out
