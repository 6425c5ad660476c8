# moe.pxi: included by _ext.pyx after linear.pxi (it uses LinearArgs, Buf, _bind_linear and
# _matmul); SparseLayer, a mixture-of-experts layer's MLP as one call (its router GEMM,
# then moe.h's armllm_moe_run), moe_route, its routing, and moe_accumulate, its weighted
# add, for Python.

cdef extern from "moe.h" nogil:
    void armllm_moe_route(const float *logits, int64_t ldl, int64_t rows, int64_t experts,
                          int64_t k, int renormalize, int32_t *ids, float *weights,
                          uint8_t *taken)
    void armllm_moe_group(const int32_t *ids, const float *weights, int64_t rows, int64_t k,
                          int64_t experts, int32_t *counts, int32_t *start, int32_t *pair_row,
                          float *pair_weight)
    void armllm_swiglu_clamped(const float *gate_up, int64_t ldg, int64_t t, int64_t inter,
                               float alpha, float limit, float *out, int64_t ldo)
    void armllm_moe_accumulate(const float *y, int64_t ldy, int64_t n, int64_t d,
                               const int32_t *row, const float *w, float *out, int64_t ldo)

    ctypedef struct armllm_moe_weights:
        int kind
        int64_t n, k
        int bits
        int64_t group
        const void *const *w
        const float *const *bias
        const float *const *corr
    ctypedef struct armllm_moe_act:
        int8_t *xq
        int64_t ldq
        float *scale
        int64_t ldsc
        int32_t *gsum
        int64_t ldgs
        int32_t *zp
        int64_t ldzp
        float *szp
        int64_t ldszp
        float *corr
        int64_t ldc
    ctypedef struct armllm_moe_layer:
        int64_t experts, top_k, hidden, inter
        int renormalize, clamped
        float alpha, limit
        int shared
        const float *shared_gate
        armllm_moe_weights gate_up, down
        int64_t max_tokens
        float *gate_up_out
        int64_t ldg
        float *x_pairs
        int64_t ldx
        float *act
        int64_t lda
        armllm_moe_act in_q, act_q
        int32_t *ids
        int32_t *counts
        int32_t *start
        int32_t *pair_row
        int32_t *active
        float *weights
        float *pair_weight
        float *shared_scale
        uint8_t *taken
    int armllm_moe_check(const armllm_kernels *kt, const armllm_moe_layer *layer, char *err,
                         size_t err_len)
    void armllm_moe_run(const armllm_kernels *kt, armllm_pool *pool,
                        const armllm_moe_layer *layer, const float *x, int64_t ldx,
                        const float *logits, int64_t ldl, int64_t t, float *out, int64_t ldo)

from libc.stdlib cimport calloc, free


def moe_route(logits, int64_t top_k, bint renormalize):
    """(ids [T, k] int32, weights [T, k] float32) of router logits [T, E] float32:
    the softmax's k largest, in descending order (ties: the lower id), renormalized
    to sum 1 if asked (see moe.h)."""
    cdef cnp.ndarray la = _array(logits, "logits", np.float32, 2)
    cdef int64_t t = la.shape[0], e = la.shape[1]
    if not 1 <= top_k <= e:
        raise ValueError(f"top_k must be in [1, {e}] (the experts), got {top_k}")
    cdef cnp.ndarray ids = np.empty((t, top_k), np.int32)
    cdef cnp.ndarray w = np.empty((t, top_k), np.float32)
    cdef cnp.ndarray taken = np.empty(e, np.uint8)
    cdef int64_t ldl = _ld(la)
    with nogil:
        armllm_moe_route(<const float *>cnp.PyArray_DATA(la), ldl, t, e, top_k, renormalize,
                         <int32_t *>cnp.PyArray_DATA(ids), <float *>cnp.PyArray_DATA(w),
                         <uint8_t *>cnp.PyArray_DATA(taken))
    return ids, w


def moe_accumulate(y, rows, w, out):
    """out[rows[i]] += w[i] * y[i] (float32; rows None: out[i]), in place, as a sparse
    layer adds each expert's weighted rows (moe.h)."""
    cdef cnp.ndarray ya = _array(y, "y", np.float32, 2)
    cdef cnp.ndarray wa = _array(w, "w", np.float32, 1)
    cdef cnp.ndarray oa = _array(out, "out", np.float32, 2)
    cdef cnp.ndarray ra
    cdef const int32_t *rp = NULL
    _writable(oa, "out")
    cdef int64_t n = ya.shape[0], d = ya.shape[1]
    if wa.shape[0] != n or oa.shape[1] != d:
        raise ValueError(f"w must have {n} entries and out {d} columns, got {_shp(wa)} and "
                         f"{_shp(oa)}")
    if rows is None:
        if oa.shape[0] < n:
            raise ValueError(f"out has {oa.shape[0]} rows, y {n}")
    else:
        ra = _array(rows, "rows", np.int32, 1)
        if ra.shape[0] != n or (n and (ra.min() < 0 or ra.max() >= oa.shape[0])):
            raise ValueError(f"rows must be {n} indices of out's {oa.shape[0]} rows")
        rp = <const int32_t *>cnp.PyArray_DATA(ra)
    cdef int64_t ldy = _ld(ya), ldo = _ld(oa)
    with nogil:
        armllm_moe_accumulate(<const float *>cnp.PyArray_DATA(ya), ldy, n, d, rp,
                              <const float *>cnp.PyArray_DATA(wa), <float *>cnp.PyArray_DATA(oa),
                              ldo)
    return out


cdef struct SparseArgs:
    LinearArgs router
    Buf normed, out, logits
    int64_t max_rows          # rows of normed / hidden / logits
    armllm_moe_layer moe


cdef armllm_moe_act _moe_act(LinearArgs *L):
    """A quantized expert's activation scratch as moe.h takes it (from its bound linear)."""
    cdef armllm_moe_act q
    q.xq, q.ldq, q.scale, q.ldsc, q.gsum, q.ldgs = L.xq, L.ldq, L.scale, L.ldsc, L.gsum, L.ldgs
    q.zp, q.ldzp, q.szp, q.ldszp = L.zp, L.ldzp, L.szp, L.ldszp
    q.corr, q.ldc = L.corr, L.n
    return q


cdef class SparseLayer:
    """A sparse layer's MLP bound to its router and experts and a Workspace's buffers:
    run(t) reads the MLP input rows in `normed` (the DecoderLayer left them there) and
    writes the weighted sum of each row's k experts to `hidden`, in one call:

        logits = normed @ router.T (+ bias); ids, w = moe_route(logits)
        hidden[r] = sum over r's experts e, in ascending e, of
                    w * down_e(act(normed[r] @ gate_up_e.T (+ bias))) (+ bias)

    act: silu(gate) * up (the silu_mul slot), or with clamped_swiglu = (alpha, limit)
    GPT-OSS's (moe.h). shared: None, or a shared expert (gate_up, down, gate): after
    the routed experts, hidden[r] += sigmoid(normed[r] . gate) * down(silu_mul(
    normed[r] @ gate_up.T)) on every row (Qwen3.5-MoE), its weights in the experts'
    format and sizes. The experts run as moe.h's armllm_moe_run: each row quantized
    once, every active expert's gate/up, activation and down as two pool jobs over
    column windows of the GEMM slots (the same bits as each expert's GEMMs on its rows
    alone: a row's result does not depend on its batch), and only the experts some row
    routes to are read.

    gate_up, down: lists of the experts' PackedWeights (one format); gate_up_bias
    [E, 2 inter] and down_bias [E, hidden] float32 or None; gate_up_scratch,
    down_scratch: the ActScratch of quantized experts' activations (None: float), of
    at least the pair rows; buffers: the Workspace's normed, hidden, router_logits (of
    max_rows rows), expert_in ([pairs, hidden]: float gate_up weights' inputs, else
    None), expert_gate_up ([pairs, max(2 inter, hidden)]) and expert_act ([pairs,
    inter]: a float down's inputs, else None). pairs = max_tokens * (top_k + 1): a pass
    of the layer takes max_tokens rows (more run in passes)."""
    cdef SparseArgs s
    cdef const armllm_kernels *kt
    cdef list keep
    cdef void **ptrs           # the experts' weight, bias and correction pointers

    def __cinit__(self):
        self.ptrs = NULL

    def __dealloc__(self):
        free(self.ptrs)

    def __init__(self, Kernels kernels, router, router_bias, gate_up, gate_up_bias, down,
                 down_bias, gate_up_scratch, down_scratch, int64_t top_k, bint renormalize,
                 clamped_swiglu, buffers, shared=None):
        cdef int64_t e, n = len(gate_up)
        if n < 1 or len(down) != n:
            raise ValueError(f"a sparse layer needs as many down as gate_up experts (>= 1), "
                             f"got {len(gate_up)} and {len(down)}")
        if not 1 <= top_k <= n:
            raise ValueError(f"top_k must be in [1, {n}] (the experts), got {top_k}")
        normed, hidden, logits, x_pairs, gu_out, act = buffers
        cdef armllm_moe_layer *m = &self.s.moe
        m.experts, m.top_k, m.renormalize = n, top_k, renormalize
        m.hidden, m.inter = gate_up[0].k, gate_up[0].n // 2
        m.clamped = clamped_swiglu is not None
        m.alpha, m.limit = clamped_swiglu if m.clamped else (1.0, 0.0)
        if not isinstance(router, PackedWeight) or router.quantized:
            raise ValueError(f"the router must be a float weight, got {router!r}")
        if router.n != n or router.k != m.hidden:
            raise ValueError(f"the router is {router.shape}, the layer has {n} experts of "
                             f"input {m.hidden}")
        self.s.normed = _buf(normed, "normed", m.hidden)
        self.s.out = _buf(hidden, "hidden", m.hidden)
        self.s.logits = _buf(logits, "router_logits", n)
        self.s.max_rows = min(a.shape[0] for a in (normed, hidden, logits))
        cdef Buf b = _buf(gu_out, "expert_gate_up", max(2 * m.inter, m.hidden))
        m.gate_up_out, m.ldg = b.p, b.ld
        pairs = gu_out.shape[0]
        m.max_tokens = pairs // (top_k + 1)
        if m.max_tokens < 1:
            raise ValueError(f"expert_gate_up's {pairs} rows hold no pass of top_k + 1 = "
                             f"{top_k + 1} pair rows a token")
        for e in range(n):
            if gate_up[e].shape != gate_up[0].shape or down[e].shape != (m.hidden, m.inter):
                raise ValueError(f"expert {e}: gate_up {gate_up[e].shape} and down "
                                 f"{down[e].shape} do not chain with expert 0's "
                                 f"{gate_up[0].shape}")
        gub = [None] * n if gate_up_bias is None else list(gate_up_bias)
        db = [None] * n if down_bias is None else list(down_bias)
        if len(gub) != n or len(db) != n:
            raise ValueError(f"expert biases for {len(gub)} / {len(db)} experts, the layer "
                             f"has {n}")
        gate_ups, downs = list(gate_up), list(down)
        m.shared = shared is not None
        if shared is not None:
            shared_gate_up, shared_down, gate = shared
            if shared_gate_up.shape != gate_up[0].shape or shared_down.shape != down[0].shape:
                raise ValueError(f"the shared expert ({shared_gate_up.shape}, "
                                 f"{shared_down.shape}) must have the experts' sizes")
            m.shared_gate = _vector(gate, "shared_gate", m.hidden)
            gate_ups.append(shared_gate_up)
            downs.append(shared_down)
            gub.append(None)
            db.append(None)
        if gate_up_scratch is not None and gate_up_scratch is down_scratch:
            raise ValueError("the experts' inputs and activations need scratches of their "
                             "own: a pass holds both at once")
        self.s.router = _bind_linear(kernels, router, router_bias, None, self.s.max_rows)
        cdef int64_t count = len(gate_ups)
        self.ptrs = <void **>calloc(6 * count, sizeof(void *))
        if self.ptrs == NULL:
            raise MemoryError()
        cdef LinearArgs gu0, d0
        gu0 = self._weights(kernels, &m.gate_up, gate_ups, gub, gate_up_scratch, pairs, 0)
        d0 = self._weights(kernels, &m.down, downs, db, down_scratch, pairs, 3 * count)
        if m.gate_up.kind >= LIN_WQ:
            m.in_q = _moe_act(&gu0)
            m.x_pairs, m.ldx = NULL, 0
        else:
            b = _buf(x_pairs, "expert_in", m.hidden)
            m.x_pairs, m.ldx = b.p, b.ld
        if m.down.kind >= LIN_WQ:
            m.act_q = _moe_act(&d0)
            m.act, m.lda = NULL, 0
        else:
            b = _buf(act, "expert_act", m.inter)
            m.act, m.lda = b.p, b.ld
        for name, a in (("expert_in", x_pairs), ("expert_act", act)):
            if a is not None and a.shape[0] < pairs:
                raise ValueError(f"{name} has {a.shape[0]} rows, expert_gate_up {pairs}")
        cdef int64_t routed = m.max_tokens * top_k
        ints = [np.empty(routed, np.int32), np.empty(n, np.int32), np.empty(n + 1, np.int32),
                np.empty(routed, np.int32), np.empty(n + 1, np.int32)]
        floats = [np.empty(routed, np.float32), np.empty(routed, np.float32),
                  np.empty(m.max_tokens, np.float32)]
        taken = np.empty(n, np.uint8)
        m.ids, m.counts, m.start, m.pair_row, m.active = (
            <int32_t *>cnp.PyArray_DATA(ints[0]), <int32_t *>cnp.PyArray_DATA(ints[1]),
            <int32_t *>cnp.PyArray_DATA(ints[2]), <int32_t *>cnp.PyArray_DATA(ints[3]),
            <int32_t *>cnp.PyArray_DATA(ints[4]))
        m.weights = <float *>cnp.PyArray_DATA(floats[0])
        m.pair_weight = <float *>cnp.PyArray_DATA(floats[1])
        m.shared_scale = <float *>cnp.PyArray_DATA(floats[2])
        m.taken = <uint8_t *>cnp.PyArray_DATA(taken)
        cdef char err[256]
        if armllm_moe_check(kernels.t, m, err, sizeof(err)):
            raise ValueError(err.decode())
        self.keep = [router, router_bias, gate_ups, gate_up_bias, downs, down_bias,
                     gate_up_scratch, down_scratch, buffers, ints, floats, taken, shared]
        self.kt = kernels.t

    cdef LinearArgs _weights(self, Kernels kernels, armllm_moe_weights *mw, list weights,
                             list biases, scratch, int64_t pairs, int64_t slot) except *:
        """Fills mw with the experts' (and shared expert's) weights, each bound and
        checked like a linear layer's (its format, layout and activation scratch of
        `pairs` rows), their pointers from self.ptrs[slot]; returns expert 0's."""
        cdef int64_t e, count = len(weights)
        cdef LinearArgs L, L0
        cdef PackedWeight w0 = weights[0]
        for e in range(count):
            w = weights[e]
            L = _bind_linear(kernels, w, biases[e], scratch, pairs)
            if e == 0:
                L0 = L
            elif (w.dtype, w.bits, w.group, w.zp_correction is None) != (
                    w0.dtype, w0.bits, w0.group, w0.zp_correction is None):
                raise ValueError(f"expert {e}'s {w!r} is not in the experts' format {w0!r}")
            self.ptrs[slot + e] = <void *>L.w
            self.ptrs[slot + count + e] = <void *>L.bias
            self.ptrs[slot + 2 * count + e] = <void *>L.corr_w
        mw.kind, mw.n, mw.k, mw.bits, mw.group = L0.kind, L0.n, L0.k, L0.bits, L0.group
        mw.w = <const void *const *>(self.ptrs + slot)
        mw.bias = <const float *const *>(self.ptrs + slot + count)
        mw.corr = <const float *const *>(self.ptrs + slot + 2 * count) if L0.corr_w != NULL \
            else NULL
        return L0

    @property
    def max_rows(self):
        return self.s.max_rows

    @property
    def max_tokens(self):
        """Rows of one pass (the pair buffers' rows / (top_k + 1))."""
        return self.s.moe.max_tokens

    def run(self, int64_t rows, ThreadPool pool=None):
        """The MLP of the first `rows` rows of `normed` into `hidden`."""
        if not 0 <= rows <= self.s.max_rows:
            raise ValueError(f"rows must be in [0, {self.s.max_rows}], got {rows}")
        cdef armllm_pool *p = _pool_ptr(pool)
        with nogil:
            _run_sparse(self.kt, p, &self.s, rows)


cdef void _run_sparse(const armllm_kernels *kt, armllm_pool *p, SparseArgs *s,
                      int64_t t) noexcept nogil:
    if t == 0:
        return
    _matmul(kt, p, &s.router, s.normed.p, s.normed.ld, t, s.logits.p, s.logits.ld)
    armllm_moe_run(kt, p, &s.moe, s.normed.p, s.normed.ld, s.logits.p, s.logits.ld, t, s.out.p,
                   s.out.ld)


cdef void *_sparse_args(object layer, int64_t hidden) except NULL:
    """A DecoderLayer's sparse_mlp step's SparseArgs (layer: its SparseLayer)."""
    if not isinstance(layer, SparseLayer):
        raise ValueError(f"a sparse_mlp step needs a SparseLayer, got {type(layer).__name__}")
    cdef SparseLayer sparse = <SparseLayer>layer
    if sparse.s.moe.hidden != hidden:
        raise ValueError(f"the sparse layer's hidden size {sparse.s.moe.hidden} is not the "
                         f"layer's {hidden}")
    return &sparse.s


cdef void _run_sparse_args(const armllm_kernels *kt, armllm_pool *p, void *s,
                           int64_t t) noexcept nogil:
    _run_sparse(kt, p, <SparseArgs *>s, t)
