# linear.pxi: included by _ext.pyx before batch.pxi and layer.pxi (it uses the validation
# helpers, Kernels and PackedWeight): a linear layer's pointers (LinearArgs) and the
# float / quantized GEMM calls every bound layer makes (DecoderLayer, NormHead,
# SparseLayer, DeltaNetMixer), the buffer and timing helpers they share.

from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

DEF LIN_F32 = 0
DEF LIN_BF16 = 1
DEF LIN_WQ = 2    # from here on, kinds whose activations are quantized first
DEF LIN_GGUF = 3


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


cdef const float *_vector(object a, str name, int64_t n) except NULL:
    """A float32 [n] array's data."""
    cdef cnp.ndarray arr = _array(a, name, np.float32, 1)
    if arr.shape[0] != n:
        raise ValueError(f"{name} must have shape ({n},), got {_shp(arr)}")
    return <const float *>cnp.PyArray_DATA(arr)


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


cdef int64_t *_times_ptr(object times) except? NULL:
    """The int64 [4] profiling accumulator's data, or NULL for None."""
    if times is None:
        return NULL
    cdef cnp.ndarray ta = _array(times, "times", np.int64, 1)
    _writable(ta, "times")
    if ta.shape[0] != 4:
        raise ValueError(f"times must have shape (4,), got {_shp(ta)}")
    return <int64_t *>cnp.PyArray_DATA(ta)


cdef inline void _tick(int64_t *times, int which, int64_t *t0) noexcept nogil:
    """Adds the time since *t0 to times[which] (0: GEMMs, 1: other kernels but
    attention, 2: attention, 3: sparse MLPs)."""
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
