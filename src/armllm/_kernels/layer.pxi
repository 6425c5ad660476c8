# layer.pxi: included by _ext.pyx after linear.pxi and batch.pxi (it uses their
# LinearArgs, GEMM calls and StepBatch, and the validation helpers, Kernels and
# ThreadPool); DecoderLayer, the per-layer call of a decode step.

# ------------------------------------------------------------ decoder layers
#
# A decoder layer as one call (DecoderLayer.run): the steps its architecture file
# declares (model/layer.py: norm + linear, q/k norm, RoPE + KV write, attention,
# linear, post-norm, activation, sparse MLP, output gate, Gated DeltaNet) run in order in C over pointers bound
# once (DecoderLayer: weights, the workspace's buffers, the KV cache) and once per
# step (StepBatch), so a decode step costs one Python-level call per layer, with
# exactly the kernel calls, in the same order, the per-op wrappers of armllm.ops
# make.

from libc.string cimport memcpy

# kernel errors DecoderLayer.run reports (the bad index goes with them)
DEF ERR_ROPE = 1
DEF ERR_KV_WRITE = 2
DEF ERR_ATTENTION = 3
DEF ERR_COMM = 4       # a tensor-parallel all-reduce was aborted (a rank failed)
DEF ERR_STATE = 5      # a recurrent layer's batch metadata or state slot is bad
# the steps (model/layer.py's vocabulary)
DEF STEP_NORM_LINEAR = 0   # [residual += x]; normed = rmsnorm(residual); qkv|gate_up = normed W^T
DEF STEP_QK_NORM = 1       # rmsnorm over each head of q and k
DEF STEP_ROPE_KV = 2       # rope(q, k); K, V -> the cache
DEF STEP_ATTENTION = 3     # attn = attention(q, cache)
DEF STEP_LINEAR = 4        # x = attn|act W^T (+ all-reduce)
DEF STEP_NORM = 5          # x = rmsnorm(x)
DEF STEP_ACT = 6           # act = act(gate) * up
DEF STEP_SPARSE_MLP = 7    # [residual += x]; normed = rmsnorm(residual); x = experts(normed)
DEF STEP_OUTPUT_GATE = 8   # attn *= sigmoid(each query head's gate)
DEF STEP_DELTA_NET = 9     # attn = the Gated DeltaNet of qkv's projection (delta.pxi)
DEF MAX_STEPS = 16
DEF LIN_QKV = 0            # LayerArgs.lin's slots, in model/layer.LINEARS order
DEF LIN_O = 1
DEF LIN_GATE_UP = 2
DEF LIN_DOWN = 3
DEF ACT_SILU = 0
DEF ACT_GELU_TANH = 1

_STEP_CODES = {"norm_linear": STEP_NORM_LINEAR, "qk_norm": STEP_QK_NORM,
               "rope_kv": STEP_ROPE_KV, "attention": STEP_ATTENTION, "linear": STEP_LINEAR,
               "norm": STEP_NORM, "act": STEP_ACT, "sparse_mlp": STEP_SPARSE_MLP,
               "output_gate": STEP_OUTPUT_GATE, "delta_net": STEP_DELTA_NET}
_LINEAR_SLOTS = {"qkv": LIN_QKV, "o": LIN_O, "gate_up": LIN_GATE_UP, "down": LIN_DOWN}
_ACT_KINDS = {"silu": ACT_SILU, "gelu_tanh": ACT_GELU_TANH}


cdef struct StepArgs:
    int op
    int lin                   # STEP_NORM_LINEAR, STEP_LINEAR: the LayerArgs.lin slot
    int act                   # STEP_ACT: ACT_SILU or ACT_GELU_TANH
    const float *norm         # the step's [hidden] norm weight (NULL: none)


cdef struct LayerArgs:
    LinearArgs lin[4]
    StepArgs steps[MAX_STEPS]
    int n_steps
    const float *q_norm
    const float *k_norm
    const float *sinks        # [n_heads] attention sinks (GPT-OSS), NULL: none
    float eps, scale
    int64_t hidden, q_size, kv_size, inter, n_heads, n_kv_heads, head_dim, rot_dim
    int64_t sliding_window, max_rows, max_pos
    const float *cos_sin
    Buf res, x, normed, qkv, q_normed, k_normed, attn, gate_up, act
    float *attn_scratch
    size_t attn_scratch_len
    void *k_cache
    void *v_cache
    int cache_dtype
    uint16_t *k_scale
    uint16_t *v_scale
    int64_t num_blocks, block_size
    int first
    void *sparse              # the STEP_SPARSE_MLP's SparseArgs (moe.pxi)
    void *delta               # the STEP_DELTA_NET's DeltaArgs (delta.pxi)
    int gated                 # q_proj's rows are per head [q | gate] (output gate)
    int64_t k_off             # k's first column in qkv (q_size, or 2 q_size when gated)
    void *comm                # tensor parallel: the all-reduce segment (NULL: one rank)
    int rank


cdef class DecoderLayer:
    """One decoder layer bound to its steps, weights, a Workspace's buffers and its
    KV cache layer, for its run(). Built once per (model, workspace, cache) by
    model/decoder.py; holds references to everything it points at.

    steps: the layer's steps in order, each a tuple: ("norm_linear", "qkv" or
    "gate_up", norm [hidden]), ("qk_norm",), ("rope_kv",), ("attention",),
    ("linear", "o" or "down"), ("norm", norm [hidden]), ("act", "silu" or
    "gelu_tanh"), ("sparse_mlp", norm [hidden]), ("output_gate",) (attn *=
    sigmoid(gate) where q_proj's rows are per head [q | gate]: needs a qk_norm step,
    which gathers q), ("delta_net",) (a recurrent layer: `delta`, a DeltaNetMixer,
    in place of the KV cache, which is then None). linears: (weight, bias, scratch)
    for qkv, o, gate_up, down: a PackedWeight (None where no step uses it), a
    float32 [N] bias or None, and for a quantized weight the ActScratch its
    activations go to (None for float weights). buffers: the Workspace arrays
    residual, hidden, normed, qkv, q_normed, k_normed (None without a q/k norm),
    attn, gate_up, act, attn_scratch. cos_sin: the RoPE table [max_pos, rot_dim].
    first: layer 0 (its input is the residual stream itself, no residual add).
    sinks: None or each query head's attention sink logit, float32 [n_heads]
    (GPT-OSS). comm: a tensor-parallel rank's Comm (None: one rank): the layer
    holds this rank's heads and MLP columns, and the o and down projections' (and
    the experts') partial outputs are all-reduced before each residual add.
    sparse: the SparseLayer the sparse_mlp step runs (its input `normed`, its
    output `hidden`). k_scale, v_scale: an int8 cache's row scales (kv_write)."""
    cdef LayerArgs a
    cdef const armllm_kernels *kt
    cdef list keep

    def __init__(self, Kernels kernels, steps, linears, q_norm, k_norm, float eps, buffers,
                 k_cache, v_cache, cos_sin, int64_t n_heads, int64_t n_kv_heads,
                 int64_t head_dim, int64_t rot_dim, float scale, int64_t sliding_window,
                 bint first, sinks=None, Comm comm=None, sparse=None, delta=None,
                 k_scale=None, v_scale=None):
        self.keep = [steps, linears, q_norm, k_norm, buffers, k_cache, v_cache, cos_sin, sinks,
                     comm, sparse, delta, k_scale, v_scale]
        self.a.comm, self.a.rank = NULL, 0
        if comm is not None:
            self.a.comm, self.a.rank = comm.seg, comm.rank
        cdef cnp.ndarray kc, vc
        self.a.k_cache = self.a.v_cache = self.a.delta = NULL
        self.a.num_blocks, self.a.block_size, self.a.cache_dtype = 0, 1, ARMLLM_KV_F32
        self.a.k_scale = self.a.v_scale = NULL
        if delta is None:
            kc, vc = _kv_cache(k_cache, "k_cache"), _kv_cache(v_cache, "v_cache")
            _same_cache(kc, vc)
            if kc.shape[0] != n_kv_heads or kc.shape[3] != head_dim:
                raise ValueError(f"the KV cache holds {kc.shape[0]} heads of {kc.shape[3]}, "
                                 f"the layer {n_kv_heads} of {head_dim}")
            self.a.k_cache, self.a.v_cache = cnp.PyArray_DATA(kc), cnp.PyArray_DATA(vc)
            self.a.cache_dtype = _cache_dtype(kc)
            ks, vs = _kv_scales(kc, k_scale, v_scale)
            self.a.k_scale, self.a.v_scale = _scale_ptr(ks), _scale_ptr(vs)
            self.a.num_blocks, self.a.block_size = kc.shape[1], kc.shape[2]
        elif k_cache is not None or v_cache is not None or k_scale is not None:
            raise ValueError("a recurrent (delta_net) layer keeps no KV cache")
        if n_heads < 1 or n_heads % n_kv_heads or head_dim > ARMLLM_ATTN_MAX_HEAD_DIM:
            raise ValueError(f"unsupported heads: {n_heads} q / {n_kv_heads} kv of {head_dim}")
        if rot_dim < 2 or rot_dim % 2 or rot_dim > head_dim:
            raise ValueError(f"rot_dim must be even and in [2, {head_dim}], got {rot_dim}")
        self.a.n_heads, self.a.n_kv_heads, self.a.head_dim = n_heads, n_kv_heads, head_dim
        self.a.rot_dim = rot_dim
        self.a.q_size, self.a.kv_size = n_heads * head_dim, n_kv_heads * head_dim
        names = [step[0] for step in steps]
        self.a.gated = "output_gate" in names
        if self.a.gated and "qk_norm" not in names:
            raise ValueError("an output_gate step needs a qk_norm step (it gathers q from "
                             "q_proj's [q | gate] rows)")
        self.a.k_off = self.a.q_size * (2 if self.a.gated else 1)
        self.a.eps, self.a.scale, self.a.sliding_window, self.a.first = eps, scale, sliding_window, first
        weights = [lin[0] for lin in linears]
        qkv_w, o_w, gate_up_w, down_w = weights
        if qkv_w is None or o_w is None:
            raise ValueError("a decoder layer needs its qkv and o weights")
        if (gate_up_w is None) != (down_w is None):
            raise ValueError("a layer's gate_up and down weights come together")
        self.a.hidden = qkv_w.k
        self.a.inter = gate_up_w.n // 2 if gate_up_w is not None else 0
        mix_n, mix_k = self.a.k_off + 2 * self.a.kv_size, self.a.q_size   # qkv's N, o's K
        if delta is not None:
            mix_n, mix_k = _delta_sizes(delta)
        if (qkv_w.n != mix_n or o_w.k != mix_k
                or o_w.n != self.a.hidden or (gate_up_w is not None and (
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
        self.a.attn = _buf(attn, "attn", mix_k)
        self.a.max_rows = min(a.shape[0] for a in (res, x, normed, qkv, attn))
        if gate_up_w is not None:
            self.a.gate_up = _buf(gate_up, "gate_up", 2 * self.a.inter)
            self.a.act = _buf(act, "act", self.a.inter)
            self.a.max_rows = min(self.a.max_rows, gate_up.shape[0], act.shape[0])
        self._bind_steps(steps, weights, sparse, delta)
        self.a.q_norm = self.a.k_norm = NULL
        if q_norm is not None:
            self.a.q_normed = _buf(q_normed, "q_normed", self.a.q_size)
            self.a.k_normed = _buf(k_normed, "k_normed", self.a.kv_size)
            if self.a.q_normed.ld != self.a.q_size or self.a.k_normed.ld != self.a.kv_size:
                raise ValueError("q_normed and k_normed must be C-contiguous")
            self.a.max_rows = min(self.a.max_rows, q_normed.shape[0], k_normed.shape[0])
            self.a.q_norm = _vector(q_norm, "q_norm", head_dim)
            self.a.k_norm = _vector(k_norm, "k_norm", head_dim)
        if any(self.a.steps[i].op == STEP_QK_NORM for i in range(self.a.n_steps)) and \
                q_norm is None:
            raise ValueError("a qk_norm step needs q_norm and k_norm weights")
        self.a.sinks = NULL if sinks is None else _vector(sinks, "sinks", n_heads)
        cdef cnp.ndarray sa = _array(attn_scratch, "attn_scratch", np.float32, 1)
        _writable(sa, "attn_scratch")
        self.a.attn_scratch, self.a.attn_scratch_len = <float *>cnp.PyArray_DATA(sa), sa.shape[0]
        cdef cnp.ndarray ca = _array(cos_sin, "cos_sin", np.float32, 2)
        if ca.shape[1] != rot_dim or _ld(ca) != rot_dim:
            raise ValueError(f"cos_sin must be a contiguous (max_pos, {rot_dim}) array")
        self.a.cos_sin, self.a.max_pos = <const float *>cnp.PyArray_DATA(ca), ca.shape[0]
        for i in range(4):
            weight, bias, scratch = linears[i]
            if weight is not None:
                self.a.lin[i] = _bind_linear(kernels, weight, bias, scratch, self.a.max_rows)
        self.kt = kernels.t

    def _bind_steps(self, steps, weights, sparse, delta):
        """The steps as StepArgs, each checked against what it reads."""
        if not 0 < len(steps) <= MAX_STEPS:
            raise ValueError(f"a layer has 1 to {MAX_STEPS} steps, got {len(steps)}")
        self.a.n_steps, self.a.sparse = len(steps), NULL
        cdef StepArgs *s
        for i, step in enumerate(steps):
            name = step[0]
            if name not in _STEP_CODES:
                raise ValueError(f"step {i}: unknown step {name!r} (known: "
                                 f"{', '.join(_STEP_CODES)})")
            s = &self.a.steps[i]
            s.op, s.lin, s.act, s.norm = _STEP_CODES[name], 0, 0, NULL
            if s.op in (STEP_NORM_LINEAR, STEP_LINEAR):
                allowed = ("qkv", "gate_up") if s.op == STEP_NORM_LINEAR else ("o", "down")
                if step[1] not in allowed:
                    raise ValueError(f"step {i} ({name}) multiplies by one of {allowed}, got "
                                     f"{step[1]!r}")
                s.lin = _LINEAR_SLOTS[step[1]]
                if weights[s.lin] is None:
                    raise ValueError(f"step {i} ({name}) needs the {step[1]} weight")
            if s.op in (STEP_NORM_LINEAR, STEP_NORM, STEP_SPARSE_MLP):
                # wraparound is off: the norm is the step's last item
                s.norm = _vector(step[len(step) - 1], f"step {i}'s norm", self.a.hidden)
            if s.op == STEP_ACT:
                if step[1] not in _ACT_KINDS:
                    raise ValueError(f"step {i}: unknown activation {step[1]!r} (known: "
                                     f"{', '.join(_ACT_KINDS)})")
                if weights[LIN_GATE_UP] is None:
                    raise ValueError(f"step {i} (act) needs the gate_up weight")
                s.act = _ACT_KINDS[step[1]]
            if s.op == STEP_SPARSE_MLP:
                self.a.sparse = _sparse_args(sparse, self.a.hidden)
                self.a.max_rows = min(self.a.max_rows, sparse.max_rows)
            if s.op == STEP_DELTA_NET:
                self.a.delta = _delta_args(delta, self.a.hidden)
                self.a.max_rows = min(self.a.max_rows, delta.max_rows)
            if s.op in (STEP_ROPE_KV, STEP_ATTENTION) and self.a.k_cache == NULL:
                raise ValueError(f"step {i} ({name}) needs a KV cache")

    def run(self, StepBatch batch, ThreadPool pool=None, times=None):
        """Runs the layer on the batch's rows: reads the residual stream (layer 0) or
        the previous layer's output in `hidden`, leaves this layer's output in
        `hidden` and the stream in `residual`, writes its K/V to the cache. times:
        an int64 [4] array to which the nanoseconds spent in GEMMs, in the other
        kernels but attention, in attention and in sparse MLPs are added
        (profiling; None: not timed)."""
        cdef BatchArgs *b = &batch.a
        if b.rows > self.a.max_rows:
            raise ValueError(f"a batch of {b.rows} rows exceeds the layer's buffers "
                             f"({self.a.max_rows} rows)")
        if self.a.delta != NULL and b.state_slots == NULL:
            raise ValueError("a recurrent layer's batch needs its sequences' state slots")
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
        if err == ERR_STATE:
            raise ValueError(f"sequence {bad}: its state slot {b.state_slots[bad]} or its "
                             f"rows {b.query_start[bad]}..{b.query_start[bad + 1]} (seq_lens="
                             f"{b.seq_lens[bad]}) do not fit the recurrent layer's state pool")
        raise ValueError(f"sequence {bad}: inconsistent attention metadata (seq_lens="
                         f"{b.seq_lens[bad]}, query rows {b.query_start[bad]}.."
                         f"{b.query_start[bad + 1]}, num_blocks={self.a.num_blocks})")


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
    """The layer's steps; returns -1, or the bad index of the failing kernel (whose
    code goes to *err)."""
    cdef int64_t t = b.rows, r, bad, t0 = 0
    cdef int i
    cdef StepArgs *s
    cdef LinearArgs *L
    cdef float *q = d.qkv.p
    cdef float *k = d.qkv.p + d.k_off
    cdef float *v = d.qkv.p + d.k_off + d.kv_size
    cdef int64_t h
    cdef float *staged
    cdef float *src
    cdef int64_t ldq = d.qkv.ld, ldk = d.qkv.ld, lds
    cdef bint pending = not d.first   # x holds an output the residual stream has not taken
    cdef int bad_slot = 0
    cdef Buf out
    cdef armllm_attn_args args
    if times != NULL:
        t0 = _now_ns()
    for i in range(d.n_steps):
        s = &d.steps[i]
        if s.op == STEP_NORM_LINEAR:   # [res += x]; normalize; project
            out = d.qkv if s.lin == LIN_QKV else d.gate_up
            _norm_linear(kt, p, &d.lin[s.lin], d.x.p if pending else d.res.p,
                         d.x.ld if pending else d.res.ld, d.res.p if pending else NULL,
                         d.res.ld, s.norm, d.eps, d.normed, t, out.p, out.ld, times, &t0)
            pending = False
            if s.lin == LIN_QKV:
                q, k, ldq, ldk = d.qkv.p, d.qkv.p + d.k_off, d.qkv.ld, d.qkv.ld
        elif s.op == STEP_QK_NORM:   # each head of q and k, into contiguous rows
            for r in range(t):
                if d.gated:   # each head's q from its [q | gate] rows
                    for h in range(d.n_heads):
                        memcpy(d.q_normed.p + r * d.q_size + h * d.head_dim,
                               q + r * ldq + 2 * h * d.head_dim, d.head_dim * sizeof(float))
                else:
                    memcpy(d.q_normed.p + r * d.q_size, q + r * ldq, d.q_size * sizeof(float))
                memcpy(d.k_normed.p + r * d.kv_size, k + r * ldk, d.kv_size * sizeof(float))
            q, k, ldq, ldk = d.q_normed.p, d.k_normed.p, d.q_size, d.kv_size
            kt.rmsnorm(p, q, d.head_dim, NULL, 0, d.q_norm, t * d.n_heads, d.head_dim, d.eps,
                       q, d.head_dim)
            kt.rmsnorm(p, k, d.head_dim, NULL, 0, d.k_norm, t * d.n_kv_heads, d.head_dim,
                       d.eps, k, d.head_dim)
            _tick(times, 1, &t0)
        elif s.op == STEP_ROPE_KV:
            bad = armllm_rope_kv_write(kt, p, q, ldq, d.n_heads, k, ldk, v, d.qkv.ld,
                                       d.n_kv_heads, d.head_dim, d.rot_dim, ARMLLM_ROPE_NEOX,
                                       b.positions, d.cos_sin, d.max_pos, b.slot_mapping, t,
                                       d.k_cache, d.v_cache, d.cache_dtype, d.k_scale,
                                       d.v_scale, d.block_size,
                                       d.num_blocks, &bad_slot)
            if bad >= 0:
                err[0] = ERR_KV_WRITE if bad_slot else ERR_ROPE
                return bad
            _tick(times, 1, &t0)
        elif s.op == STEP_ATTENTION:
            args.q, args.ldq = q, ldq
            args.k_cache, args.v_cache, args.cache_dtype = d.k_cache, d.v_cache, d.cache_dtype
            args.k_scale, args.v_scale = d.k_scale, d.v_scale
            args.block_table, args.max_blocks = b.block_table, b.max_blocks
            args.seq_lens, args.query_start = b.seq_lens, b.query_start
            args.n_seqs, args.n_heads, args.n_kv_heads = b.n_seqs, d.n_heads, d.n_kv_heads
            args.head_dim, args.block_size, args.num_blocks = d.head_dim, d.block_size, d.num_blocks
            args.scale, args.sliding_window = d.scale, d.sliding_window
            args.out, args.ldo = d.attn.p, d.attn.ld
            args.scratch, args.scratch_len = d.attn_scratch, d.attn_scratch_len
            args.sinks = d.sinks
            args.bidirectional = 0   # a decoder layer: causal
            bad = kt.attention(p, &args)
            _tick(times, 2, &t0)
            if bad >= 0:
                err[0] = ERR_ATTENTION
                return bad
        elif s.op == STEP_OUTPUT_GATE:   # attn *= sigmoid(gate), head by head
            for h in range(d.n_heads):
                kt.sigmoid_mul(p, d.qkv.p + (2 * h + 1) * d.head_dim, d.qkv.ld, t, d.head_dim,
                               d.attn.p + h * d.head_dim, d.attn.ld)
            _tick(times, 1, &t0)
        elif s.op == STEP_DELTA_NET:
            bad = _run_delta(kt, p, d.delta, b, d.normed, d.qkv, d.attn, d.eps)
            _tick(times, 2, &t0)
            if bad >= 0:
                err[0] = ERR_STATE
                return bad
        elif s.op == STEP_LINEAR:   # x = in W^T, all-reduced over the ranks
            L = &d.lin[s.lin]
            if s.lin == LIN_O:
                src, lds = d.attn.p, d.attn.ld
            else:
                src, lds = d.act.p, d.act.ld
            if L.kind >= LIN_WQ:
                _quant(kt, p, L, src, lds, t)
            _tick(times, 1, &t0)
            staged = _staging(d, t)
            _matmul(kt, p, L, src, lds, t, staged if staged != NULL else d.x.p, d.x.ld)
            _tick(times, 0, &t0)
            if _allreduce(d, t, staged):
                err[0] = ERR_COMM
                return 0
            pending = True
        elif s.op == STEP_NORM:   # a post-norm, in place
            kt.rmsnorm(p, d.x.p, d.x.ld, NULL, 0, s.norm, t, d.hidden, d.eps, d.x.p, d.x.ld)
            _tick(times, 1, &t0)
        elif s.op == STEP_ACT:
            if s.act == ACT_GELU_TANH:
                kt.gelu_tanh_mul(p, d.gate_up.p, d.gate_up.ld, t, d.inter, d.act.p, d.act.ld)
            else:
                kt.silu_mul(p, d.gate_up.p, d.gate_up.ld, t, d.inter, d.act.p, d.act.ld)
            _tick(times, 1, &t0)
        elif s.op == STEP_SPARSE_MLP:   # [res += x]; normed = rmsnorm(res); x = experts
            kt.rmsnorm(p, d.x.p if pending else d.res.p, d.x.ld if pending else d.res.ld,
                       d.res.p if pending else NULL, d.res.ld, s.norm, t, d.hidden, d.eps,
                       d.normed.p, d.normed.ld)
            _tick(times, 1, &t0)
            _run_sparse_args(kt, p, d.sparse, t)
            _tick(times, 3, &t0)
            if _allreduce(d, t, NULL):   # each rank's experts' share of the sum
                err[0] = ERR_COMM
                return 0
            pending = True
    return -1
