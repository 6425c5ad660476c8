# layer.pxi: included by _ext.pyx (it uses its validation helpers, Kernels and
# ThreadPool); DecoderLayer, NormHead and StepBatch, the per-layer call of a decode step.

# ------------------------------------------------------------ decoder layers
#
# One Llama-family decoder layer as one call (DecoderLayer.run): the layer's
# sequence of kernel calls (the graph model/llama.py describes) runs in C over
# pointers bound once (DecoderLayer: weights, the workspace's buffers, the KV
# cache) and once per step (StepBatch), so a decode step costs one Python-level
# call per layer instead of about twenty, with exactly the kernel calls, in the
# same order, the per-op wrappers of armllm.ops make.

from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC
from libc.string cimport memcpy

DEF LIN_F32 = 0
DEF LIN_BF16 = 1
DEF LIN_WQ = 2    # from here on, kinds whose activations are quantized first
DEF LIN_GGUF = 3
# kernel errors DecoderLayer.run reports (the bad index goes with them)
DEF ERR_ROPE = 1
DEF ERR_KV_WRITE = 2
DEF ERR_ATTENTION = 3
DEF ERR_COMM = 4       # a tensor-parallel all-reduce was aborted (a rank failed)


cdef struct LinearArgs:
    int kind                  # LIN_F32, LIN_BF16, LIN_WQ or LIN_GGUF
    const void *w             # the packed weight
    int64_t n, k, group, ng
    int bits
    const float *bias         # NULL: none
    int8_t *xq                # quantized: the activations' scratch (ActScratch)
    int64_t ldq
    float *scale
    int64_t ldsc
    int32_t *gsum
    int64_t ldgs
    int32_t *zp               # NULL: symmetric activations
    int64_t ldzp
    float *szp                # [rows, ng] scale * zp
    int64_t ldszp
    const float *corr_w       # the zero points' correction weight [n, ng], packed f32
    float *corr               # [rows, n] its product, contiguous


cdef struct Buf:
    float *p
    int64_t ld


cdef inline int64_t _now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec * 1000000000 + ts.tv_nsec


cdef Buf _buf(object a, str name, int64_t cols):
    """A writable float32 [rows, cols] buffer's pointer and row stride."""
    cdef cnp.ndarray arr = _array(a, name, np.float32, 2)
    _writable(arr, name)
    if arr.shape[1] != cols:
        raise ValueError(f"{name} must have {cols} columns, got shape {_shp(arr)}")
    cdef Buf b
    b.p, b.ld = <float *>cnp.PyArray_DATA(arr), _ld(arr)
    return b


cdef struct LayerArgs:
    LinearArgs lin[4]
    const float *input_norm
    const float *post_norm
    const float *q_norm
    const float *k_norm
    const float *sinks        # [n_heads] attention sinks (GPT-OSS), NULL: none
    float eps, scale
    int64_t hidden, q_size, kv_size, inter, n_heads, n_kv_heads, head_dim
    int64_t sliding_window, max_rows, max_pos
    const float *cos_sin
    Buf res, x, normed, qkv, q_normed, k_normed, attn, gate_up, act
    float *attn_scratch
    size_t attn_scratch_len
    void *k_cache
    void *v_cache
    int cache_bf16
    int64_t num_blocks, block_size
    int first
    int has_mlp               # 0: a sparse layer's MLP runs after run() (armllm.model.moe)
    void *comm                # tensor parallel: the all-reduce segment (NULL: one rank)
    int rank


cdef const float *_vector(object a, str name, int64_t n) except NULL:
    """A float32 [n] array's data."""
    cdef cnp.ndarray arr = _array(a, name, np.float32, 1)
    if arr.shape[0] != n:
        raise ValueError(f"{name} must have shape ({n},), got {_shp(arr)}")
    return <const float *>cnp.PyArray_DATA(arr)


cdef class DecoderLayer:
    """One decoder layer bound to its weights, a Workspace's buffers and its KV
    cache layer, for its run(). Built once per (model, workspace,
    cache) by model/llama.py; holds references to everything it points at.

    linears: (weight, bias, scratch) for qkv, o, gate_up, down: a PackedWeight,
    a float32 [N] bias or None, and for a quantized weight the ActScratch its
    activations go to (None for float weights); gate_up and down None for a
    sparse layer, whose run() ends with the residual add and the post-attention
    RMSNorm in `normed`, the MLP's input, for the caller to run the experts on
    and leave their sum in `hidden`. buffers: the Workspace arrays
    residual, hidden, normed, qkv, q_normed, k_normed (None without qk_norm),
    attn, gate_up, act, attn_scratch. first: layer 0 (its input is the
    residual stream itself, no residual add). sinks: None or each query head's
    attention sink logit, float32 [n_heads] (GPT-OSS). comm: a tensor-parallel
    rank's Comm (None: one rank): the layer holds this rank's heads and MLP columns,
    and the o and down projections' partial outputs are all-reduced before each
    residual add (a sparse layer: the o projection's; the experts' sum is the
    caller's to all-reduce)."""
    cdef LayerArgs a
    cdef const armllm_kernels *kt
    cdef list keep

    def __init__(self, Kernels kernels, linears, input_norm, post_norm, q_norm, k_norm,
                 float eps, buffers, k_cache, v_cache, cos_sin, int64_t n_heads,
                 int64_t n_kv_heads, int64_t head_dim, float scale, int64_t sliding_window,
                 bint first, sinks=None, Comm comm=None):
        self.keep = [linears, input_norm, post_norm, q_norm, k_norm, buffers, k_cache,
                     v_cache, cos_sin, sinks, comm]
        self.a.comm, self.a.rank = NULL, 0
        if comm is not None:
            self.a.comm, self.a.rank = comm.seg, comm.rank
        cdef cnp.ndarray kc = _kv_cache(k_cache, "k_cache")
        cdef cnp.ndarray vc = _kv_cache(v_cache, "v_cache")
        _same_cache(kc, vc)
        if kc.shape[1] != n_kv_heads or kc.shape[3] != head_dim:
            raise ValueError(f"the KV cache holds {kc.shape[1]} heads of {kc.shape[3]}, the "
                             f"layer {n_kv_heads} of {head_dim}")
        if n_heads < 1 or n_heads % n_kv_heads or head_dim > ARMLLM_ATTN_MAX_HEAD_DIM:
            raise ValueError(f"unsupported heads: {n_heads} q / {n_kv_heads} kv of {head_dim}")
        self.a.k_cache, self.a.v_cache = cnp.PyArray_DATA(kc), cnp.PyArray_DATA(vc)
        self.a.cache_bf16 = kc.dtype == np.uint16
        self.a.num_blocks, self.a.block_size = kc.shape[0], kc.shape[2]
        self.a.n_heads, self.a.n_kv_heads, self.a.head_dim = n_heads, n_kv_heads, head_dim
        self.a.q_size, self.a.kv_size = n_heads * head_dim, n_kv_heads * head_dim
        self.a.eps, self.a.scale, self.a.sliding_window, self.a.first = eps, scale, sliding_window, first
        qkv_w, o_w, gate_up_w, down_w = (lin[0] for lin in linears)
        self.a.has_mlp = gate_up_w is not None
        if not self.a.has_mlp and down_w is not None:
            raise ValueError("a sparse layer has neither gate_up nor down")
        self.a.hidden = qkv_w.k
        self.a.inter = gate_up_w.n // 2 if self.a.has_mlp else 0
        if (qkv_w.n != self.a.q_size + 2 * self.a.kv_size or o_w.k != self.a.q_size
                or o_w.n != self.a.hidden or (self.a.has_mlp and (
                    gate_up_w.k != self.a.hidden or down_w.k != self.a.inter
                    or down_w.n != self.a.hidden))):
            raise ValueError("the layer's weights do not chain: qkv "
                             f"{qkv_w.shape}, o {o_w.shape}, gate_up {getattr(gate_up_w, 'shape', None)}, "
                             f"down {getattr(down_w, 'shape', None)} for {n_heads}/{n_kv_heads} heads of {head_dim}")
        (res, x, normed, qkv, q_normed, k_normed, attn, gate_up, act, attn_scratch) = buffers
        self.a.res, self.a.x = _buf(res, "residual", self.a.hidden), _buf(x, "hidden", self.a.hidden)
        if comm is not None and self.a.x.ld != self.a.hidden:
            raise ValueError("a tensor-parallel layer's hidden buffer must be C-contiguous")
        self.a.normed = _buf(normed, "normed", self.a.hidden)
        self.a.qkv = _buf(qkv, "qkv", qkv_w.n)
        self.a.attn = _buf(attn, "attn", self.a.q_size)
        if self.a.has_mlp:
            self.a.gate_up = _buf(gate_up, "gate_up", 2 * self.a.inter)
            self.a.act = _buf(act, "act", self.a.inter)
        self.a.max_rows = min(a.shape[0] for a in (res, x, normed, qkv, attn, gate_up, act))
        self.a.q_norm = self.a.k_norm = NULL
        if q_norm is not None:
            self.a.q_normed = _buf(q_normed, "q_normed", self.a.q_size)
            self.a.k_normed = _buf(k_normed, "k_normed", self.a.kv_size)
            if self.a.q_normed.ld != self.a.q_size or self.a.k_normed.ld != self.a.kv_size:
                raise ValueError("q_normed and k_normed must be C-contiguous")
            self.a.max_rows = min(self.a.max_rows, q_normed.shape[0], k_normed.shape[0])
            self.a.q_norm = _vector(q_norm, "q_norm", head_dim)
            self.a.k_norm = _vector(k_norm, "k_norm", head_dim)
        self.a.sinks = NULL if sinks is None else _vector(sinks, "sinks", n_heads)
        self.a.input_norm = _vector(input_norm, "input_norm", self.a.hidden)
        self.a.post_norm = _vector(post_norm, "post_norm", self.a.hidden)
        cdef cnp.ndarray sa = _array(attn_scratch, "attn_scratch", np.float32, 1)
        _writable(sa, "attn_scratch")
        self.a.attn_scratch, self.a.attn_scratch_len = <float *>cnp.PyArray_DATA(sa), sa.shape[0]
        cdef cnp.ndarray ca = _array(cos_sin, "cos_sin", np.float32, 2)
        if ca.shape[1] != head_dim or _ld(ca) != head_dim:
            raise ValueError(f"cos_sin must be a contiguous (max_pos, {head_dim}) array")
        self.a.cos_sin, self.a.max_pos = <const float *>cnp.PyArray_DATA(ca), ca.shape[0]
        for i in range(4 if self.a.has_mlp else 2):
            weight, bias, scratch = linears[i]
            self.a.lin[i] = _bind_linear(kernels, weight, bias, scratch, self.a.max_rows)
        self.kt = kernels.t

    def run(self, StepBatch batch, ThreadPool pool=None, times=None):
        """Runs the layer on the batch's rows: reads the residual stream (layer 0) or
        the previous layer's output in `hidden`, leaves this layer's MLP output in
        `hidden` and the stream in `residual`, writes its K/V to the cache. times:
        an int64 [3] array to which the nanoseconds spent in GEMMs, in the other
        kernels but attention, and in attention are added (profiling; None: not
        timed)."""
        cdef BatchArgs *b = &batch.a
        if b.rows > self.a.max_rows:
            raise ValueError(f"a batch of {b.rows} rows exceeds the layer's buffers "
                             f"({self.a.max_rows} rows)")
        cdef int64_t *tp = _times_ptr(times)
        cdef armllm_pool *p = _pool_ptr(pool)
        cdef int err = 0
        cdef int64_t bad
        with nogil:
            bad = _run_layer(self.kt, p, &self.a, b, tp, &err)
        if bad < 0:
            return
        if err == ERR_COMM:
            _comm_ok(-1)
        if err == ERR_ROPE:
            raise ValueError(f"positions[{bad}] = {b.positions[bad]} is outside the cos/sin "
                             f"cache [0, {self.a.max_pos})")
        if err == ERR_KV_WRITE:
            raise ValueError(f"slot_mapping[{bad}] = {b.slot_mapping[bad]} is outside the cache "
                             f"[-1, {self.a.num_blocks * self.a.block_size})")
        raise ValueError(f"sequence {bad}: inconsistent attention metadata (seq_lens="
                         f"{b.seq_lens[bad]}, query rows {b.query_start[bad]}.."
                         f"{b.query_start[bad + 1]}, num_blocks={self.a.num_blocks})")



cdef LinearArgs _bind_linear(Kernels kernels, object w_obj, object bias, object scratch,
                         int64_t max_rows) except *:
    """A linear layer's pointers: its weight, bias and (quantized) activation scratch
    of at least max_rows rows, checked against the kernels' layouts."""
    if not isinstance(w_obj, PackedWeight):
        raise ValueError(f"weights must be PackedWeights, got {type(w_obj).__name__}")
    cdef PackedWeight w = <PackedWeight>w_obj
    cdef LinearArgs L
    cdef cnp.ndarray a
    L.w, L.n, L.k, L.group, L.bits = cnp.PyArray_DATA(w.data), w.n, w.k, w.group, w.bits
    L.ng = armllm_q_groups(w.k, w.group)
    L.bias, L.xq, L.scale, L.gsum, L.zp, L.szp, L.corr_w, L.corr = (
        NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)
    L.ldq = L.ldsc = L.ldgs = L.ldzp = L.ldszp = 0
    if bias is not None:
        L.bias = _vector(bias, "bias", w.n)
    cdef const armllm_kernels *t = kernels.t
    if not w.quantized:
        L.kind = LIN_F32 if w.dtype == "f32" else LIN_BF16
        layout = t.gemm_f32_layout if w.dtype == "f32" else t.gemm_bf16_layout
        if w.layout != layout.decode():
            raise ValueError(f"a weight is packed as {w.layout!r}, the {kernels.isa} "
                             f"kernels read {layout.decode()!r}")
        return L
    L.kind = LIN_GGUF if w.dtype == "gguf" else LIN_WQ
    layout = t.gemm_gguf_layout if w.dtype == "gguf" else t.gemm_wq_layout
    if w.layout != layout.decode():
        raise ValueError(f"a weight is packed as {w.layout!r}, the {kernels.isa} kernels "
                         f"read {layout.decode()!r}")
    if scratch is None or scratch.gsum is None or scratch.k != w.k or \
            armllm_q_group_len(scratch.group) != armllm_q_group_len(w.group) or \
            scratch.rows < max_rows:
        raise ValueError(f"a quantized weight ({w!r}) needs an ActScratch with sums for "
                         f"its K and group of {max_rows} rows, got {scratch!r}")
    a = _array(scratch.xq, "xq", np.int8, 2)
    L.xq, L.ldq = <int8_t *>cnp.PyArray_DATA(a), _ld(a)
    a = _array(scratch.scale, "scale", np.float32, 2)
    L.scale, L.ldsc = <float *>cnp.PyArray_DATA(a), _ld(a)
    a = _array(scratch.gsum, "gsum", np.int32, 2)
    L.gsum, L.ldgs = <int32_t *>cnp.PyArray_DATA(a), _ld(a)
    if w.zp_correction is not None:
        if scratch.zp is None or scratch.asym_n < w.n:
            raise ValueError(f"{w!r} takes asymmetric activations: its ActScratch needs "
                             f"zero points for {w.n} outputs")
        a = _array(scratch.zp, "zp", np.int32, 2)
        L.zp, L.ldzp = <int32_t *>cnp.PyArray_DATA(a), _ld(a)
        a = _array(scratch.scaled_zp, "scaled_zp", np.float32, 2)
        L.szp, L.ldszp = <float *>cnp.PyArray_DATA(a), _ld(a)
        a = _array(scratch.correction(scratch.rows, w.n), "correction", np.float32, 2)
        L.corr = <float *>cnp.PyArray_DATA(a)
        L.corr_w = <const float *>cnp.PyArray_DATA((<PackedWeight>w.zp_correction).data)
    return L


cdef class NormHead:
    """The final RMSNorm (with the last residual add) and the lm_head, bound to the
    Workspace's buffers, for only the rows that need logits: run() gathers those rows
    of `hidden` and `residual` into `selected` and `selected_residual`, normalizes
    them (into `selected`) and writes their logits. The same kernel calls as
    ops.rms_norm_linear on the gathered rows."""
    cdef LinearArgs lin
    cdef const armllm_kernels *kt
    cdef const float *norm_w
    cdef float eps
    cdef Buf hidden, res, sel, sel_res, logits
    cdef int64_t max_rows, max_logits, d
    cdef list keep

    def __init__(self, Kernels kernels, weight, scratch, norm_weight, float eps, hidden,
                 residual, selected, selected_residual, logits):
        self.keep = [weight, scratch, norm_weight, hidden, residual, selected,
                     selected_residual, logits]
        if not isinstance(weight, PackedWeight):
            raise ValueError(f"weight must be a PackedWeight, got {type(weight).__name__}")
        self.d = (<PackedWeight>weight).k
        self.hidden, self.res = _buf(hidden, "hidden", self.d), _buf(residual, "residual", self.d)
        self.sel = _buf(selected, "selected", self.d)
        self.sel_res = _buf(selected_residual, "selected_residual", self.d)
        self.logits = _buf(logits, "logits", (<PackedWeight>weight).n)
        self.max_rows = min(hidden.shape[0], residual.shape[0])
        self.max_logits = min(selected.shape[0], selected_residual.shape[0], logits.shape[0])
        cdef cnp.ndarray na = _array(norm_weight, "norm_weight", np.float32, 1)
        if na.shape[0] != self.d:
            raise ValueError(f"norm_weight must have shape ({self.d},), got {_shp(na)}")
        self.norm_w, self.eps, self.kt = <const float *>cnp.PyArray_DATA(na), eps, kernels.t
        self.lin = _bind_linear(kernels, weight, None, scratch, self.max_logits)

    def run(self, rows, int64_t batch_rows, ThreadPool pool=None, times=None):
        """Logits of the batch rows `rows` (int64 [R], each < batch_rows) into the
        first R rows of `logits`; times as DecoderLayer.run's."""
        cdef cnp.ndarray ra = _array(rows, "rows", np.int64, 1)
        cdef int64_t r = ra.shape[0], i, row
        cdef const int64_t *rp = <const int64_t *>cnp.PyArray_DATA(ra)
        if r > self.max_logits or batch_rows > self.max_rows:
            raise ValueError(f"{r} logits rows of a batch of {batch_rows} exceed the buffers "
                             f"({self.max_logits} / {self.max_rows} rows)")
        for i in range(r):
            if not 0 <= rp[i] < batch_rows:
                raise ValueError(f"rows[{i}] = {rp[i]} is outside the batch [0, {batch_rows})")
        cdef int64_t *tp = _times_ptr(times)
        cdef armllm_pool *p = _pool_ptr(pool)
        cdef int64_t t0 = 0
        cdef size_t row_bytes = self.d * sizeof(float)
        with nogil:
            if tp != NULL:
                t0 = _now_ns()
            for i in range(r):
                row = rp[i]
                memcpy(self.sel.p + i * self.sel.ld, self.hidden.p + row * self.hidden.ld,
                       row_bytes)
                memcpy(self.sel_res.p + i * self.sel_res.ld, self.res.p + row * self.res.ld,
                       row_bytes)
            _norm_linear(self.kt, p, &self.lin, self.sel.p, self.sel.ld, self.sel_res.p,
                         self.sel_res.ld, self.norm_w, self.eps, self.sel, r, self.logits.p,
                         self.logits.ld, tp, &t0)


cdef int64_t *_times_ptr(object times) except? NULL:
    """The int64 [3] profiling accumulator's data, or NULL for None."""
    if times is None:
        return NULL
    cdef cnp.ndarray ta = _array(times, "times", np.int64, 1)
    _writable(ta, "times")
    if ta.shape[0] != 3:
        raise ValueError(f"times must have shape (3,), got {_shp(ta)}")
    return <int64_t *>cnp.PyArray_DATA(ta)


cdef struct BatchArgs:
    int64_t rows
    const int32_t *positions
    const int32_t *slot_mapping
    const int32_t *block_table
    const int32_t *seq_lens
    const int32_t *query_start
    int64_t n_seqs, max_blocks


cdef class StepBatch:
    """One step's batch metadata (model/llama.py's BatchMeta) as DecoderLayer.run
    reads it: positions and slot_mapping [T] int32, block_table [B, max_blocks],
    seq_lens [B] and query_start [B + 1] int32, checked once for every layer."""
    cdef BatchArgs a
    cdef tuple keep

    def __init__(self, positions, slot_mapping, block_table, seq_lens, query_start):
        cdef cnp.ndarray pa = _array(positions, "positions", np.int32, 1)
        cdef cnp.ndarray sa = _array(slot_mapping, "slot_mapping", np.int32, 1)
        cdef cnp.ndarray bt = _array(block_table, "block_table", np.int32, 2)
        cdef cnp.ndarray sl = _array(seq_lens, "seq_lens", np.int32, 1)
        cdef cnp.ndarray qs = _array(query_start, "query_start", np.int32, 1)
        self.keep = (pa, sa, bt, sl, qs)
        self.a.rows, self.a.n_seqs = pa.shape[0], sl.shape[0]
        if sa.shape[0] != self.a.rows:
            raise ValueError(f"slot_mapping has {sa.shape[0]} entries for {self.a.rows} positions")
        if qs.shape[0] != self.a.n_seqs + 1 or bt.shape[0] != self.a.n_seqs or _ld(bt) != bt.shape[1]:
            raise ValueError(f"query_start must have n_seqs+1 = {self.a.n_seqs + 1} entries and "
                             f"block_table n_seqs C-contiguous rows, got {qs.shape[0]} and "
                             f"{_shp(bt)}")
        self.a.query_start = <const int32_t *>cnp.PyArray_DATA(qs)
        if self.a.query_start[self.a.n_seqs] != self.a.rows:
            raise ValueError(f"query_start[-1] = {self.a.query_start[self.a.n_seqs]}, but the batch "
                             f"has {self.a.rows} rows")
        self.a.positions = <const int32_t *>cnp.PyArray_DATA(pa)
        self.a.slot_mapping = <const int32_t *>cnp.PyArray_DATA(sa)
        self.a.block_table = <const int32_t *>cnp.PyArray_DATA(bt)
        self.a.seq_lens = <const int32_t *>cnp.PyArray_DATA(sl)
        self.a.max_blocks = bt.shape[1]


    @property
    def rows(self):
        return self.a.rows


cdef inline void _tick(int64_t *times, int which, int64_t *t0) noexcept nogil:
    """Adds the time since *t0 to times[which] (0: GEMMs, 1: other kernels but
    attention, 2: attention)."""
    cdef int64_t now
    if times != NULL:
        now = _now_ns()
        times[which] += now - t0[0]
        t0[0] = now


cdef void _matmul(const armllm_kernels *kt, armllm_pool *p, LinearArgs *L, const float *x,
                  int64_t ldx, int64_t t, float *y, int64_t ldy) noexcept nogil:
    """y = x W^T (+ bias); a quantized weight reads L's already quantized x, and
    takes off the zero points' correction as armllm.ops does."""
    cdef int64_t r, j, g
    if L.kind == LIN_F32:
        kt.gemm_f32(p, x, t, L.k, ldx, <const float *>L.w, L.n, L.bias, y, ldy)
    elif L.kind == LIN_BF16:
        kt.gemm_bf16(p, x, t, L.k, ldx, <const uint16_t *>L.w, L.n, L.bias, y, ldy)
    elif L.kind == LIN_GGUF:
        kt.gemm_gguf(p, L.xq, t, L.k, L.ldq, L.scale, L.ldsc, L.gsum, L.ldgs, L.w, L.n, L.bias,
                     y, ldy)
    else:
        kt.gemm_wq(p, L.xq, t, L.k, L.ldq, L.scale, L.ldsc, L.gsum, L.ldgs, L.w, L.n, L.bits,
                   L.group, L.bias, y, ldy)
        if L.zp != NULL:  # y -= (scale * zp) @ C.T
            for r in range(t):
                for g in range(L.ng):
                    L.szp[r * L.ldszp + g] = <float>L.zp[r * L.ldzp + g] * L.scale[r * L.ldsc + g]
            kt.gemm_f32(p, L.szp, t, L.ng, L.ldszp, L.corr_w, L.n, NULL, L.corr, L.n)
            for r in range(t):
                for j in range(L.n):
                    y[r * ldy + j] = y[r * ldy + j] - L.corr[r * L.n + j]


cdef inline void _quant(const armllm_kernels *kt, armllm_pool *p, LinearArgs *L, const float *x,
                        int64_t ldx, int64_t t) noexcept nogil:
    kt.quant_act(p, x, t, L.k, ldx, L.group, L.xq, L.ldq, L.scale, L.ldsc, L.gsum, L.ldgs,
                 L.zp, L.ldzp)


cdef void _norm_linear(const armllm_kernels *kt, armllm_pool *p, LinearArgs *L, const float *x,
                       int64_t ldx, float *residual, int64_t ldr, const float *norm_w,
                       float eps, Buf normed, int64_t t, float *y, int64_t ldy,
                       int64_t *times, int64_t *t0) noexcept nogil:
    """linear(rmsnorm(x [+ residual])) as ops.rms_norm_linear runs it."""
    if L.kind >= LIN_WQ:
        armllm_rmsnorm_quant(kt, p, x, ldx, residual, ldr, norm_w, t, L.k, eps, normed.p,
                             normed.ld, L.group, L.xq, L.ldq, L.scale, L.ldsc, L.gsum, L.ldgs,
                             L.zp, L.ldzp)
    else:
        kt.rmsnorm(p, x, ldx, residual, ldr, norm_w, t, L.k, eps, normed.p, normed.ld)
    _tick(times, 1, t0)
    _matmul(kt, p, L, normed.p, normed.ld, t, y, ldy)
    _tick(times, 0, t0)


cdef inline float *_staging(LayerArgs *d, int64_t t) noexcept nogil:
    """Where a tensor-parallel rank's o or down projection writes its output so
    that the all-reduce skips the copy in (comm.h), or NULL: write to x."""
    if d.comm == NULL:
        return NULL
    return armllm_comm_staging(d.comm, d.rank, t * d.hidden)


cdef inline int _allreduce(LayerArgs *d, int64_t t, float *staged) noexcept nogil:
    """Sums the projection's output over the ranks into x: 0, or -1 if aborted."""
    if d.comm == NULL:
        return 0
    if staged != NULL:
        return armllm_comm_allreduce_staged(d.comm, d.rank, d.x.p, t * d.hidden)
    return armllm_comm_allreduce(d.comm, d.rank, d.x.p, t * d.hidden)


cdef int64_t _run_layer(const armllm_kernels *kt, armllm_pool *p, LayerArgs *d, BatchArgs *b,
                        int64_t *times, int *err) noexcept nogil:
    """The layer's kernel calls; returns -1, or the bad index of the failing kernel
    (whose code goes to *err)."""
    cdef int64_t t = b.rows, r, bad, t0 = 0
    cdef float *q
    cdef float *k
    cdef float *staged
    cdef float *v = d.qkv.p + d.q_size + d.kv_size
    cdef int64_t ldq = d.qkv.ld, ldk = d.qkv.ld
    cdef armllm_attn_args args
    if times != NULL:
        t0 = _now_ns()
    # res += x (the previous MLP's output; none before layer 0), normalize, project
    _norm_linear(kt, p, &d.lin[0], d.res.p if d.first else d.x.p,
                 d.res.ld if d.first else d.x.ld, NULL if d.first else d.res.p, d.res.ld,
                 d.input_norm, d.eps, d.normed, t, d.qkv.p, d.qkv.ld, times, &t0)
    q, k = d.qkv.p, d.qkv.p + d.q_size
    if d.q_norm != NULL:  # RMSNorm over each head of q and k (Qwen3), into contiguous rows
        for r in range(t):
            memcpy(d.q_normed.p + r * d.q_size, q + r * d.qkv.ld, d.q_size * sizeof(float))
            memcpy(d.k_normed.p + r * d.kv_size, k + r * d.qkv.ld, d.kv_size * sizeof(float))
        q, k, ldq, ldk = d.q_normed.p, d.k_normed.p, d.q_size, d.kv_size
        kt.rmsnorm(p, q, d.head_dim, NULL, 0, d.q_norm, t * d.n_heads, d.head_dim, d.eps, q,
                   d.head_dim)
        kt.rmsnorm(p, k, d.head_dim, NULL, 0, d.k_norm, t * d.n_kv_heads, d.head_dim, d.eps, k,
                   d.head_dim)
    cdef int bad_slot = 0
    bad = armllm_rope_kv_write(kt, p, q, ldq, d.n_heads, k, ldk, v, d.qkv.ld, d.n_kv_heads,
                               d.head_dim, d.head_dim, ARMLLM_ROPE_NEOX, b.positions, d.cos_sin,
                               d.max_pos, b.slot_mapping, t, d.k_cache, d.v_cache, d.cache_bf16,
                               d.block_size, d.num_blocks, &bad_slot)
    if bad >= 0:
        err[0] = ERR_KV_WRITE if bad_slot else ERR_ROPE
        return bad
    args.q, args.ldq = q, ldq
    args.k_cache, args.v_cache, args.cache_bf16 = d.k_cache, d.v_cache, d.cache_bf16
    args.block_table, args.max_blocks = b.block_table, b.max_blocks
    args.seq_lens, args.query_start = b.seq_lens, b.query_start
    args.n_seqs, args.n_heads, args.n_kv_heads = b.n_seqs, d.n_heads, d.n_kv_heads
    args.head_dim, args.block_size, args.num_blocks = d.head_dim, d.block_size, d.num_blocks
    args.scale, args.sliding_window = d.scale, d.sliding_window
    args.out, args.ldo = d.attn.p, d.attn.ld
    args.scratch, args.scratch_len = d.attn_scratch, d.attn_scratch_len
    args.sinks = d.sinks
    _tick(times, 1, &t0)
    bad = kt.attention(p, &args)
    _tick(times, 2, &t0)
    if bad >= 0:
        err[0] = ERR_ATTENTION
        return bad
    if d.lin[1].kind >= LIN_WQ:
        _quant(kt, p, &d.lin[1], d.attn.p, d.attn.ld, t)
    _tick(times, 1, &t0)
    staged = _staging(d, t)
    _matmul(kt, p, &d.lin[1], d.attn.p, d.attn.ld, t, staged if staged != NULL else d.x.p, d.x.ld)
    _tick(times, 0, &t0)
    if _allreduce(d, t, staged):
        err[0] = ERR_COMM
        return 0
    if not d.has_mlp:  # res += x; normed = rmsnorm(res): the experts' input
        kt.rmsnorm(p, d.x.p, d.x.ld, d.res.p, d.res.ld, d.post_norm, t, d.hidden, d.eps,
                   d.normed.p, d.normed.ld)
        _tick(times, 1, &t0)
        return -1
    _norm_linear(kt, p, &d.lin[2], d.x.p, d.x.ld, d.res.p, d.res.ld, d.post_norm, d.eps,
                 d.normed, t, d.gate_up.p, d.gate_up.ld, times, &t0)
    kt.silu_mul(p, d.gate_up.p, d.gate_up.ld, t, d.inter, d.act.p, d.act.ld)
    if d.lin[3].kind >= LIN_WQ:
        _quant(kt, p, &d.lin[3], d.act.p, d.act.ld, t)
    _tick(times, 1, &t0)
    staged = _staging(d, t)
    _matmul(kt, p, &d.lin[3], d.act.p, d.act.ld, t, staged if staged != NULL else d.x.p, d.x.ld)
    _tick(times, 0, &t0)
    if _allreduce(d, t, staged):
        err[0] = ERR_COMM
        return 0
    return -1
