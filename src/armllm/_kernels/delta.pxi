# delta.pxi: included by _ext.pyx after linear.pxi and batch.pxi (it uses LinearArgs, Buf, BatchArgs,
# _bind_linear, _matmul); DeltaNetMixer, a hybrid model's recurrent (Gated DeltaNet)
# token mixer, which a DecoderLayer's delta_net step runs in place of attention.


cdef struct DeltaArgs:
    LinearArgs ba             # [2 v_heads, hidden] the b and a projections (float)
    const float *conv_w       # [conv channels, kernel]
    const float *a_neg        # [v_heads] -exp(A_log)
    const float *dt_bias      # [v_heads]
    const float *norm         # [v_dim] the gated RMSNorm's weight
    float *conv_state         # [slots, kernel - 1, conv channels]
    float *delta_state        # [slots, v_heads, k_dim, v_dim]
    int64_t num_slots, k_heads, v_heads, k_dim, v_dim, kernel, conv_size, value_size
    int64_t hidden, max_rows
    int v_tiled
    Buf conv_out, ba_out


cdef class DeltaNetMixer:
    """A recurrent layer's Gated DeltaNet bound to its own weights, its layer's state
    pool and a Workspace's conv_out and delta_ba buffers, for the DecoderLayer whose
    delta_net step runs it on rows of `normed` (the input norm's output) and `qkv`
    (the layer's input projection [q | k | v | z]), writing `attn` [value size]:

        [b | a] = normed @ ba.T
        c = silu(causal depthwise conv of qkv's [q | k | v], continuing each
            sequence's conv state)                                   (gdn_conv)
        o = the gated delta rule of c's q, k, v with a, b, a_neg, dt_bias,
            continuing each sequence's matrix state                  (gdn_rule)
        attn = rms_norm(o, norm) * silu(z), per value head           (gated_rmsnorm)

    A sequence whose rows start at token 0 starts from zero states. ba: a float
    PackedWeight; conv [conv channels, kernel], a_neg and dt_bias [v_heads], norm
    [v_dim] float32; conv_state [slots, kernel - 1, conv channels] and delta_state
    [slots, v_heads, k_dim, v_dim] float32 (model/kv_cache.py's state pool);
    v_tiled: value head h reads key head h % k_heads (else h // (v_heads /
    k_heads)); buffers: conv_out [rows, conv channels] and ba_out [rows, 2 v_heads]."""
    cdef DeltaArgs d
    cdef list keep

    def __init__(self, Kernels kernels, ba, conv, a_neg, dt_bias, norm, conv_state,
                 delta_state, int64_t k_heads, bint v_tiled, buffers):
        cdef cnp.ndarray ds = _array(delta_state, "delta_state", np.float32, 4)
        cdef cnp.ndarray cs = _array(conv_state, "conv_state", np.float32, 3)
        cdef cnp.ndarray cw = _array(conv, "conv", np.float32, 2)
        _writable(ds, "delta_state")
        _writable(cs, "conv_state")
        for arr, name in ((ds, "delta_state"), (cs, "conv_state"), (cw, "conv")):
            if not arr.flags.c_contiguous:
                raise ValueError(f"{name} must be C-contiguous")
        self.d.num_slots, self.d.v_heads, self.d.k_dim, self.d.v_dim = (
            ds.shape[0], ds.shape[1], ds.shape[2], ds.shape[3])
        self.d.k_heads, self.d.v_tiled = k_heads, v_tiled
        if k_heads < 1 or self.d.v_heads % k_heads:
            raise ValueError(f"{self.d.v_heads} value heads are no multiple of {k_heads} "
                             f"key heads")
        self.d.conv_size = 2 * k_heads * self.d.k_dim + self.d.v_heads * self.d.v_dim
        self.d.value_size = self.d.v_heads * self.d.v_dim
        self.d.kernel = cw.shape[1]
        if cw.shape[0] != self.d.conv_size or cs.shape[0] != self.d.num_slots or \
                cs.shape[1] != self.d.kernel - 1 or cs.shape[2] != self.d.conv_size:
            raise ValueError(f"conv {_shp(cw)} and conv_state {_shp(cs)} must be "
                             f"({self.d.conv_size}, kernel) and ({self.d.num_slots}, kernel - 1, "
                             f"{self.d.conv_size})")
        if not isinstance(ba, PackedWeight) or ba.quantized or ba.n != 2 * self.d.v_heads:
            raise ValueError(f"ba must be a float weight of {2 * self.d.v_heads} rows, got {ba!r}")
        self.d.hidden = ba.k
        self.d.a_neg = _vector(a_neg, "a_neg", self.d.v_heads)
        self.d.dt_bias = _vector(dt_bias, "dt_bias", self.d.v_heads)
        self.d.norm = _vector(norm, "norm", self.d.v_dim)
        self.d.conv_w = <const float *>cnp.PyArray_DATA(cw)
        self.d.conv_state = <float *>cnp.PyArray_DATA(cs)
        self.d.delta_state = <float *>cnp.PyArray_DATA(ds)
        conv_out, ba_out = buffers
        self.d.conv_out = _buf(conv_out, "conv_out", self.d.conv_size)
        self.d.ba_out = _buf(ba_out, "delta_ba", 2 * self.d.v_heads)
        self.d.max_rows = min(conv_out.shape[0], ba_out.shape[0])
        self.d.ba = _bind_linear(kernels, ba, None, None, self.d.max_rows)
        self.keep = [ba, cw, a_neg, dt_bias, norm, cs, ds, buffers]

    @property
    def max_rows(self):
        return self.d.max_rows


cdef tuple _delta_sizes(object mixer):
    """(qkv's N, o's K) of a DeltaNetMixer's layer: [q | k | v | z] and the value size."""
    if not isinstance(mixer, DeltaNetMixer):
        raise ValueError(f"a delta_net step needs a DeltaNetMixer, got {type(mixer).__name__}")
    cdef DeltaNetMixer m = <DeltaNetMixer>mixer
    return m.d.conv_size + m.d.value_size, m.d.value_size


cdef void *_delta_args(object mixer, int64_t hidden) except NULL:
    """A DecoderLayer's delta_net step's DeltaArgs (mixer: its DeltaNetMixer)."""
    _delta_sizes(mixer)
    cdef DeltaNetMixer m = <DeltaNetMixer>mixer
    if m.d.hidden != hidden:
        raise ValueError(f"the DeltaNet's input size {m.d.hidden} is not the layer's {hidden}")
    return &m.d


cdef int64_t _run_delta(const armllm_kernels *kt, armllm_pool *p, void *args, BatchArgs *b,
                        Buf normed, Buf proj, Buf out, float eps) noexcept nogil:
    """The mixer on the batch's rows: -1, or the first sequence whose metadata or state
    slot is bad (nothing is written then)."""
    cdef DeltaArgs *d = <DeltaArgs *>args
    cdef int64_t t = b.rows, bad
    cdef armllm_gdn_conv_args ca
    cdef armllm_gdn_args ra
    _matmul(kt, p, &d.ba, normed.p, normed.ld, t, d.ba_out.p, d.ba_out.ld)
    ca.x, ca.ldx, ca.y, ca.ldy = proj.p, proj.ld, d.conv_out.p, d.conv_out.ld
    ca.weight, ca.channels, ca.kernel = d.conv_w, d.conv_size, d.kernel
    ca.state, ca.num_slots = d.conv_state, d.num_slots
    ca.query_start, ca.seq_lens, ca.state_slots, ca.n_seqs = (
        b.query_start, b.seq_lens, b.state_slots, b.n_seqs)
    bad = kt.gdn_conv(p, &ca)
    if bad >= 0:
        return bad
    ra.q, ra.k = d.conv_out.p, d.conv_out.p + d.k_heads * d.k_dim
    ra.v, ra.ldqkv = d.conv_out.p + 2 * d.k_heads * d.k_dim, d.conv_out.ld
    ra.b, ra.a, ra.ldab = d.ba_out.p, d.ba_out.p + d.v_heads, d.ba_out.ld
    ra.a_neg, ra.dt_bias = d.a_neg, d.dt_bias
    ra.out, ra.ldo = out.p, out.ld
    ra.state, ra.num_slots = d.delta_state, d.num_slots
    ra.n_k_heads, ra.n_v_heads, ra.dk, ra.dv = d.k_heads, d.v_heads, d.k_dim, d.v_dim
    ra.v_tiled = d.v_tiled
    ra.query_start, ra.seq_lens, ra.state_slots, ra.n_seqs = (
        b.query_start, b.seq_lens, b.state_slots, b.n_seqs)
    bad = kt.gdn_rule(p, &ra)
    if bad >= 0:
        return bad
    # attn = rms_norm(o) * silu(z), z the projection's columns after the conv's
    kt.gated_rmsnorm(p, out.p, out.ld, proj.p + d.conv_size, proj.ld, d.norm, t, d.v_heads,
                     d.v_dim, eps, out.p, out.ld)
    return -1
