# moe.pxi: included by _ext.pyx after linear.pxi (it uses LinearArgs, Buf, _bind_linear,
# _matmul and _quant); SparseLayer, a mixture-of-experts layer's MLP as one call, and
# moe_route, its routing for Python.

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

from libc.math cimport expf
from libc.stdlib cimport calloc, free
from libc.string cimport memset


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


cdef struct SparseArgs:
    LinearArgs router
    LinearArgs *gate_up       # [experts]
    LinearArgs *down
    int64_t experts, top_k, hidden, inter, max_rows
    int renormalize, clamped
    float alpha, limit
    Buf normed, out, logits, xin, gate_up_buf, act, y
    int32_t *ids
    float *weights
    uint8_t *taken
    int32_t *counts
    int32_t *start
    int32_t *pair_row
    float *pair_weight
    int shared                # a shared expert runs on every row (Qwen3.5-MoE)
    LinearArgs shared_gate_up
    LinearArgs shared_down
    const float *shared_gate  # [hidden]: its rows are scaled by sigmoid(normed . gate)
    float *shared_scale       # [max_rows]


cdef class SparseLayer:
    """A sparse layer's MLP bound to its router and experts and a Workspace's buffers:
    run(t) reads the MLP input rows in `normed` (the DecoderLayer left them there) and
    writes the weighted sum of each row's k experts to `hidden`, in one call:

        logits = normed @ router.T (+ bias); ids, w = moe_route(logits)
        pairs grouped by expert (a counting sort); hidden = 0
        for each expert e with rows, in ascending e: x = its rows of normed;
            y = down_e(act(x @ gate_up_e.T (+ bias))) (+ bias)
            hidden[row] += w * y  for each of its rows

    act: silu(gate) * up (the silu_mul slot), or with clamped_swiglu = (alpha, limit)
    GPT-OSS's (moe.h). shared: None, or a shared expert (gate_up, down, gate): after
    the routed experts, hidden[r] += sigmoid(normed[r] . gate) * down(act(normed[r] @
    gate_up.T)) on every row (Qwen3.5-MoE), its weights in the experts' format and
    sizes (it uses their scratch). Every expert's GEMMs are the GEMM slots' own in its packed
    format, so a row's result does not depend on the rows it shares an expert with,
    and only the experts some row routes to are read.

    gate_up, down: lists of the experts' PackedWeights (one format); gate_up_bias
    [E, 2 inter] and down_bias [E, hidden] float32 or None; gate_up_scratch,
    down_scratch: the ActScratch of quantized experts' activations (None: float);
    buffers: the Workspace's normed, hidden, router_logits, expert_in,
    expert_gate_up, expert_act, expert_out."""
    cdef SparseArgs s
    cdef const armllm_kernels *kt
    cdef list keep

    def __cinit__(self):
        self.s.gate_up = self.s.down = NULL

    def __dealloc__(self):
        free(self.s.gate_up)
        free(self.s.down)

    def __init__(self, Kernels kernels, router, router_bias, gate_up, gate_up_bias, down,
                 down_bias, gate_up_scratch, down_scratch, int64_t top_k, bint renormalize,
                 clamped_swiglu, buffers, shared=None):
        cdef int64_t e, n = len(gate_up)
        if n < 1 or len(down) != n:
            raise ValueError(f"a sparse layer needs as many down as gate_up experts (>= 1), "
                             f"got {len(gate_up)} and {len(down)}")
        if not 1 <= top_k <= n:
            raise ValueError(f"top_k must be in [1, {n}] (the experts), got {top_k}")
        normed, hidden, logits, xin, gu, act, y = buffers
        self.s.experts, self.s.top_k, self.s.renormalize = n, top_k, renormalize
        self.s.hidden, self.s.inter = gate_up[0].k, gate_up[0].n // 2
        self.s.clamped = clamped_swiglu is not None
        self.s.alpha, self.s.limit = clamped_swiglu if self.s.clamped else (1.0, 0.0)
        if not isinstance(router, PackedWeight) or router.quantized:
            raise ValueError(f"the router must be a float weight, got {router!r}")
        if router.n != n or router.k != self.s.hidden:
            raise ValueError(f"the router is {router.shape}, the layer has {n} experts of "
                             f"input {self.s.hidden}")
        self.s.normed = _buf(normed, "normed", self.s.hidden)
        self.s.out = _buf(hidden, "hidden", self.s.hidden)
        self.s.logits = _buf(logits, "router_logits", n)
        self.s.xin = _buf(xin, "expert_in", self.s.hidden)
        self.s.gate_up_buf = _buf(gu, "expert_gate_up", 2 * self.s.inter)
        self.s.act = _buf(act, "expert_act", self.s.inter)
        self.s.y = _buf(y, "expert_out", self.s.hidden)
        self.s.max_rows = min(a.shape[0] for a in buffers)
        for e in range(n):
            if gate_up[e].shape != gate_up[0].shape or down[e].shape != (self.s.hidden,
                                                                         self.s.inter):
                raise ValueError(f"expert {e}: gate_up {gate_up[e].shape} and down "
                                 f"{down[e].shape} do not chain with expert 0's "
                                 f"{gate_up[0].shape}")
        gub = [None] * n if gate_up_bias is None else list(gate_up_bias)
        db = [None] * n if down_bias is None else list(down_bias)
        if len(gub) != n or len(db) != n:
            raise ValueError(f"expert biases for {len(gub)} / {len(db)} experts, the layer "
                             f"has {n}")
        self.s.router = _bind_linear(kernels, router, router_bias, None, self.s.max_rows)
        self.s.gate_up = <LinearArgs *>calloc(n, sizeof(LinearArgs))
        self.s.down = <LinearArgs *>calloc(n, sizeof(LinearArgs))
        if self.s.gate_up == NULL or self.s.down == NULL:
            raise MemoryError()
        for e in range(n):
            self.s.gate_up[e] = _bind_linear(kernels, gate_up[e], gub[e], gate_up_scratch,
                                             self.s.max_rows)
            self.s.down[e] = _bind_linear(kernels, down[e], db[e], down_scratch,
                                          self.s.max_rows)
        pairs = self.s.max_rows * top_k
        ints = [np.empty(pairs, np.int32), np.empty(n, np.int32), np.empty(n + 1, np.int32),
                np.empty(pairs, np.int32)]
        floats = [np.empty(pairs, np.float32), np.empty(pairs, np.float32)]
        taken = np.empty(n, np.uint8)
        self.s.ids, self.s.counts, self.s.start, self.s.pair_row = (
            <int32_t *>cnp.PyArray_DATA(ints[0]), <int32_t *>cnp.PyArray_DATA(ints[1]),
            <int32_t *>cnp.PyArray_DATA(ints[2]), <int32_t *>cnp.PyArray_DATA(ints[3]))
        self.s.weights = <float *>cnp.PyArray_DATA(floats[0])
        self.s.pair_weight = <float *>cnp.PyArray_DATA(floats[1])
        self.s.taken = <uint8_t *>cnp.PyArray_DATA(taken)
        self.s.shared = shared is not None
        if shared is not None:
            shared_gate_up, shared_down, gate = shared
            if shared_gate_up.shape != gate_up[0].shape or shared_down.shape != down[0].shape:
                raise ValueError(f"the shared expert ({shared_gate_up.shape}, "
                                 f"{shared_down.shape}) must have the experts' sizes")
            self.s.shared_gate_up = _bind_linear(kernels, shared_gate_up, None, gate_up_scratch,
                                                 self.s.max_rows)
            self.s.shared_down = _bind_linear(kernels, shared_down, None, down_scratch,
                                              self.s.max_rows)
            self.s.shared_gate = _vector(gate, "shared_gate", self.s.hidden)
            floats.append(np.empty(self.s.max_rows, np.float32))
            self.s.shared_scale = <float *>cnp.PyArray_DATA(floats[2])
        self.keep = [router, router_bias, gate_up, gate_up_bias, down, down_bias,
                     gate_up_scratch, down_scratch, buffers, ints, floats, taken, shared]
        self.kt = kernels.t

    @property
    def max_rows(self):
        return self.s.max_rows

    def run(self, int64_t rows, ThreadPool pool=None):
        """The MLP of the first `rows` rows of `normed` into `hidden`."""
        if not 0 <= rows <= self.s.max_rows:
            raise ValueError(f"rows must be in [0, {self.s.max_rows}], got {rows}")
        cdef armllm_pool *p = _pool_ptr(pool)
        with nogil:
            _run_sparse(self.kt, p, &self.s, rows)


cdef void _run_sparse(const armllm_kernels *kt, armllm_pool *p, SparseArgs *s,
                      int64_t t) noexcept nogil:
    cdef int64_t e, i, n
    cdef const int32_t *rows
    cdef LinearArgs *L
    if t == 0:
        return
    _matmul(kt, p, &s.router, s.normed.p, s.normed.ld, t, s.logits.p, s.logits.ld)
    armllm_moe_route(s.logits.p, s.logits.ld, t, s.experts, s.top_k, s.renormalize, s.ids,
                     s.weights, s.taken)
    armllm_moe_group(s.ids, s.weights, t, s.top_k, s.experts, s.counts, s.start, s.pair_row,
                     s.pair_weight)
    for i in range(t):
        memset(s.out.p + i * s.out.ld, 0, s.hidden * sizeof(float))
    for e in range(s.experts):
        n = s.counts[e]
        if n == 0:
            continue
        rows = s.pair_row + s.start[e]
        for i in range(n):
            memcpy(s.xin.p + i * s.xin.ld, s.normed.p + rows[i] * s.normed.ld,
                   s.hidden * sizeof(float))
        L = &s.gate_up[e]
        if L.kind >= LIN_WQ:
            _quant(kt, p, L, s.xin.p, s.xin.ld, n)
        _matmul(kt, p, L, s.xin.p, s.xin.ld, n, s.gate_up_buf.p, s.gate_up_buf.ld)
        if s.clamped:
            armllm_swiglu_clamped(s.gate_up_buf.p, s.gate_up_buf.ld, n, s.inter, s.alpha,
                                  s.limit, s.act.p, s.act.ld)
        else:
            kt.silu_mul(p, s.gate_up_buf.p, s.gate_up_buf.ld, n, s.inter, s.act.p, s.act.ld)
        L = &s.down[e]
        if L.kind >= LIN_WQ:
            _quant(kt, p, L, s.act.p, s.act.ld, n)
        _matmul(kt, p, L, s.act.p, s.act.ld, n, s.y.p, s.y.ld)
        armllm_moe_accumulate(s.y.p, s.y.ld, n, s.hidden, rows, s.pair_weight + s.start[e],
                              s.out.p, s.out.ld)
    if s.shared:
        _run_shared(kt, p, s, t)


cdef void _run_shared(const armllm_kernels *kt, armllm_pool *p, SparseArgs *s,
                      int64_t t) noexcept nogil:
    """hidden[r] += sigmoid(normed[r] . shared_gate) * the shared expert of normed[r]."""
    cdef int64_t r, j
    cdef float dot
    cdef LinearArgs *L = &s.shared_gate_up
    for r in range(t):
        dot = 0
        for j in range(s.hidden):
            dot = dot + s.normed.p[r * s.normed.ld + j] * s.shared_gate[j]
        s.shared_scale[r] = 1.0 / (1.0 + expf(-dot))
    if L.kind >= LIN_WQ:
        _quant(kt, p, L, s.normed.p, s.normed.ld, t)
    _matmul(kt, p, L, s.normed.p, s.normed.ld, t, s.gate_up_buf.p, s.gate_up_buf.ld)
    kt.silu_mul(p, s.gate_up_buf.p, s.gate_up_buf.ld, t, s.inter, s.act.p, s.act.ld)
    L = &s.shared_down
    if L.kind >= LIN_WQ:
        _quant(kt, p, L, s.act.p, s.act.ld, t)
    _matmul(kt, p, L, s.act.p, s.act.ld, t, s.y.p, s.y.ld)
    for r in range(t):
        for j in range(s.hidden):
            s.out.p[r * s.out.ld + j] = s.out.p[r * s.out.ld + j] + \
                s.shared_scale[r] * s.y.p[r * s.y.ld + j]


cdef void *_sparse_args(object layer, int64_t hidden) except NULL:
    """A DecoderLayer's sparse_mlp step's SparseArgs (layer: its SparseLayer)."""
    if not isinstance(layer, SparseLayer):
        raise ValueError(f"a sparse_mlp step needs a SparseLayer, got {type(layer).__name__}")
    cdef SparseLayer sparse = <SparseLayer>layer
    if sparse.s.hidden != hidden:
        raise ValueError(f"the sparse layer's hidden size {sparse.s.hidden} is not the "
                         f"layer's {hidden}")
    return &sparse.s


cdef void _run_sparse_args(const armllm_kernels *kt, armllm_pool *p, void *s,
                           int64_t t) noexcept nogil:
    _run_sparse(kt, p, <SparseArgs *>s, t)
