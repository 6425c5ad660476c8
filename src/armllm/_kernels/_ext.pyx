# cython: language_level=3
"""_ext: nogil glue between Python and the C kernels.

Owns argument validation (dtype, shape, contiguity, aliasing; a ValueError
naming the bad argument), the ThreadPool and Kernels (one dispatch table)
objects, and CPU feature queries. Every kernel call releases the GIL and
never allocates: outputs are passed in.
"""
cimport numpy as cnp
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t

import numpy as np

cnp.import_array()


include "abi.pxi"


# Kernel slot names, in table order (ARMLLM_KERNEL_SLOTS in armllm_kernels.h).
KERNEL_NAMES = tuple(armllm_slot_name(i).decode() for i in range(ARMLLM_NUM_SLOTS))

# ---------------------------------------------------------------- CPU info


def cpu_features():
    """Architecture, detected feature names, SVE vector length in bits, and why
    AMX tile data is not usable ("" when it is, or without AMX)."""
    cdef const armllm_cpu *cpu = armllm_cpu_detect()
    names = [armllm_cpu_feature_name(f).decode() for f in range(ARMLLM_CPU_NUM_FEATURES)
             if armllm_cpu_has(cpu, f)]
    return {"arch": cpu.arch.decode(), "features": names,
            "sve_vector_bits": cpu.sve_vector_bits, "amx_denied": cpu.amx_denied.decode()}


def isa_built():
    """Kernel variants compiled into this build, best first."""
    cdef const char *const *names = armllm_isa_built()
    out = []
    cdef int i = 0
    while names[i] != NULL:
        out.append(names[i].decode())
        i += 1
    return out


def isa_best():
    """The best variant this CPU can run."""
    return armllm_isa_best(armllm_cpu_detect()).decode()


def allowed_cpus():
    """CPUs in this process's affinity mask."""
    return armllm_allowed_cpus()


def atomic_impl():
    """The fetch-add the pool uses on this CPU."""
    return armllm_pool_atomic_impl().decode()


cdef const armllm_kernels *_table(str isa) except NULL:
    cdef char err[512]
    cdef bytes name = isa.encode()
    cdef const armllm_kernels *t = armllm_isa_table(name, armllm_cpu_detect(), err, sizeof(err))
    if t == NULL:
        raise ValueError(err.decode())
    return t


# -------------------------------------------------------------- validation


cdef inline int _typenum(object dtype):
    """numpy's type number of a scalar type (identity checks first: the hot path)."""
    if dtype is np.float32:
        return cnp.NPY_FLOAT32
    if dtype is np.int8:
        return cnp.NPY_INT8
    if dtype is np.int32:
        return cnp.NPY_INT32
    if dtype is np.uint16:
        return cnp.NPY_UINT16
    return np.dtype(dtype).num


cdef cnp.ndarray _array(object a, str name, object dtype, int ndim):
    """a as an ndarray of dtype and ndim whose rows are contiguous."""
    if not isinstance(a, cnp.ndarray):
        raise ValueError(f"{name} must be a numpy array, got {type(a).__name__}")
    cdef cnp.ndarray arr = <cnp.ndarray>a
    if cnp.PyArray_TYPE(arr) != _typenum(dtype):
        raise ValueError(f"{name} must have dtype {np.dtype(dtype).name}, got {arr.dtype}")
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {_shp(arr)}")
    cdef int i
    for i in range(ndim):
        if arr.shape[i] == 0:
            raise ValueError(f"{name} has a zero-size dimension: shape {_shp(arr)}")
    if arr.strides[ndim - 1] != arr.itemsize:
        raise ValueError(f"{name} must have contiguous rows (last stride {arr.strides[ndim - 1]}"
                         f" bytes, expected {arr.itemsize})")
    if ndim == 2 and (arr.strides[0] % arr.itemsize != 0 or arr.strides[0] < arr.shape[1] * arr.itemsize):
        raise ValueError(f"{name} has an unsupported row stride of {arr.strides[0]} bytes")
    if not cnp.PyArray_ISALIGNED(arr):
        raise ValueError(f"{name} is not aligned to its element size")
    return arr


cdef object _shp(cnp.ndarray arr):
    return tuple(arr.shape[i] for i in range(arr.ndim))


cdef inline void _writable(cnp.ndarray arr, str name) except *:
    if not cnp.PyArray_ISWRITEABLE(arr):
        raise ValueError(f"{name} is read-only")


cdef inline int64_t _ld(cnp.ndarray arr):
    """Row stride in elements of a 2-D array."""
    return arr.strides[0] // arr.itemsize


cdef inline uintptr_t _addr(cnp.ndarray arr):
    return <uintptr_t>cnp.PyArray_DATA(arr)


cdef uintptr_t _span(cnp.ndarray a):
    """Bytes from the first to one past the last element of a (rows may be strided)."""
    if a.ndim == 1:
        return <uintptr_t>(a.shape[0] * a.itemsize)
    return <uintptr_t>((a.shape[0] - 1) * a.strides[0] + a.shape[1] * a.itemsize)


cdef void _no_overlap(cnp.ndarray a, str a_name, cnp.ndarray b, str b_name) except *:
    """Raises unless the memory spans of a and b are disjoint."""
    cdef uintptr_t a0 = _addr(a), b0 = _addr(b)
    if a0 < b0 + _span(b) and b0 < a0 + _span(a):
        raise ValueError(f"{a_name} and {b_name} must not overlap")


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


cdef void _same_or_disjoint(cnp.ndarray out, str out_name, cnp.ndarray src, str src_name) except *:
    """out may be exactly src (same start and stride) or must not overlap it."""
    if _addr(out) == _addr(src) and out.strides[0] == src.strides[0]:
        return
    _no_overlap(out, out_name, src, src_name)


# ------------------------------------------------------------- thread pool


cdef class ThreadPool:
    """Persistent worker threads (the caller counts as one) for the kernels."""
    cdef armllm_pool *pool
    cdef readonly int num_threads

    def __cinit__(self, int num_threads, bint pin=True):
        cdef char err[256]
        self.pool = armllm_pool_create(num_threads, pin, err, sizeof(err))
        if self.pool == NULL:
            raise ValueError(err.decode())
        self.num_threads = num_threads

    def close(self):
        """Stops the workers; later calls with this pool raise ValueError."""
        cdef armllm_pool *p = self.pool
        self.pool = NULL
        with nogil:
            armllm_pool_destroy(p)

    def __dealloc__(self):
        if self.pool != NULL:
            armllm_pool_destroy(self.pool)

    def count_items(self, int64_t n_items, int64_t grain):
        """Test hook: runs a job and returns how often each item ran."""
        if n_items < 1 or grain < 1:
            raise ValueError(f"n_items and grain must be >= 1, got {n_items} and {grain}")
        counts = np.zeros(n_items, dtype=np.uint32)
        cdef cnp.ndarray arr = counts
        cdef armllm_pool *p = _pool_ptr(self)
        with nogil:
            armllm_pool_count_items(p, n_items, grain, <uint32_t *>cnp.PyArray_DATA(arr))
        return counts

    def count_items_nested(self, int64_t n_outer, int64_t n_inner):
        """Test hook: each of n_outer items starts a nested job of n_inner items."""
        if n_outer < 1 or n_inner < 1:
            raise ValueError(f"n_outer and n_inner must be >= 1, got {n_outer} and {n_inner}")
        counts = np.zeros((n_outer, n_inner), dtype=np.uint32)
        cdef cnp.ndarray arr = counts
        cdef armllm_pool *p = _pool_ptr(self)
        with nogil:
            armllm_pool_count_items_nested(p, n_outer, n_inner,
                                           <uint32_t *>cnp.PyArray_DATA(arr))
        return counts


cdef armllm_pool *_pool_ptr(ThreadPool pool) except? NULL:
    if pool is None:
        return NULL
    if pool.pool == NULL:
        raise ValueError("the thread pool is closed")
    return pool.pool


# ---------------------------------------------------------- packed weights


cdef class PackedWeight:
    """A weight W[N, K] prepacked for one kernel table's GEMM micro-kernel.

    dtype "f32" and "bf16" are float weights (gemm); "w8" and "w4" are
    quantized ones (gemm_wq), W = d * q + o per group of `group` columns
    (0: one scale per row, run as groups of ARMLLM_Q_CHANNEL_GROUP), scales
    and offsets packed with q; "gguf" holds GGUF blocks as stored (gemm_gguf),
    row parts of the ggml types gguf_types with gguf_rows rows each, meeting
    activations quantized in groups of `group` (gguf_act_group: 32 or 256)."""
    cdef readonly cnp.ndarray data
    cdef readonly int64_t n, k
    cdef readonly str dtype     # "f32", "bf16", "w8", "w4" or "gguf"
    cdef readonly tuple gguf_types  # "gguf": each part's ggml type id
    cdef readonly tuple gguf_rows   # "gguf": each part's row count
    cdef readonly str layout
    cdef readonly str isa
    cdef readonly int bits      # bits per weight: 32, 16, 8 or 4
    cdef readonly int64_t group  # quantized: columns per scale group, 0 = channelwise
    # quantized with asymmetric activations: the f32 weight [N, n_groups] of the
    # zero points' correction (armllm_kernels.h, quant_act), set by ops.pack_quantized
    cdef public object zp_correction

    @property
    def shape(self):
        return (self.n, self.k)

    @property
    def nbytes(self):
        return self.data.nbytes

    @property
    def quantized(self):
        return self.bits <= 8

    @property
    def kpad(self):
        """Columns the quantized activations for this weight need (K rounded up)."""
        return armllm_q_kpad(self.k)

    @property
    def n_groups(self):
        """Scale groups per row (quantized weights), = activation scales and group
        sums per activation row."""
        return armllm_q_groups(self.k, self.group)

    def __repr__(self):
        grp = f", group={self.group}" if self.quantized else ""
        if self.dtype == "gguf":
            grp += f", gguf_types={self.gguf_types}, gguf_rows={self.gguf_rows}"
        return (f"PackedWeight(shape=({self.n}, {self.k}), dtype={self.dtype}{grp}, "
                f"layout={self.layout}, isa={self.isa})")


# Packed buffers start on a cache line so micro-kernels may stream them.
DEF PACK_ALIGN = 64


cdef cnp.ndarray _aligned_empty(size_t count, object dtype):
    itemsize = np.dtype(dtype).itemsize
    raw = np.empty(count * itemsize + PACK_ALIGN, dtype=np.uint8)
    offset = (-raw.ctypes.data) % PACK_ALIGN
    return raw[offset:offset + count * itemsize].view(dtype)


# ----------------------------------------------------------------- kernels


cdef class Kernels:
    """One kernel variant's dispatch table ("ref", "avx2", "neon", ...)."""
    cdef const armllm_kernels *t

    def __cinit__(self, str isa):
        self.t = _table(isa)

    @property
    def isa(self):
        return self.t.isa.decode()

    @property
    def impl(self):
        """What runs in each kernel slot: the variant whose code it is, with
        "+choice" for a run-time choice inside that code (e.g. "neon+dotprod")."""
        cdef char buf[64]
        impl = {}
        for i, name in enumerate(KERNEL_NAMES):
            impl[name] = armllm_slot_impl(self.t, i, buf, sizeof(buf)).decode()
        return impl

    @property
    def gemm_layouts(self):
        return {"f32": self.t.gemm_f32_layout.decode(), "bf16": self.t.gemm_bf16_layout.decode(),
                "wq": self.t.gemm_wq_layout.decode(), "gguf": self.t.gemm_gguf_layout.decode()}

    @property
    def gemm_bf16_compute(self):
        """"f32" (bf16 weights widened) or "bf16" (activations rounded to bf16 too)."""
        return self.t.gemm_bf16_compute.decode()

    @property
    def attention_bf16_compute(self):
        """With a bf16 cache: "f32" (K/V widened) or "bf16" (q and weights rounded too)."""
        return self.t.attention_bf16_compute.decode()

    def pack(self, w, str dtype):
        """Prepacks W[N, K] (float32 for "f32", uint16 bf16 bits for "bf16")."""
        cdef cnp.ndarray arr
        cdef cnp.ndarray packed
        cdef int64_t n, k
        cdef PackedWeight pw = PackedWeight.__new__(PackedWeight)
        if dtype == "f32":
            arr = _array(w, "w", np.float32, 2)
        elif dtype == "bf16":
            arr = _array(w, "w", np.uint16, 2)
        else:
            raise ValueError(f"dtype must be 'f32' or 'bf16', got {dtype!r}")
        if _ld(arr) != arr.shape[1]:
            arr = np.ascontiguousarray(arr)
        n, k = arr.shape[0], arr.shape[1]
        if dtype == "f32":
            packed = _aligned_empty(self.t.gemm_f32_packed_len(n, k), np.float32)
            with nogil:
                self.t.gemm_f32_pack(<const float *>cnp.PyArray_DATA(arr), n, k,
                                     <float *>cnp.PyArray_DATA(packed))
            pw.layout = self.t.gemm_f32_layout.decode()
        else:
            packed = _aligned_empty(self.t.gemm_bf16_packed_len(n, k), np.uint16)
            with nogil:
                self.t.gemm_bf16_pack(<const uint16_t *>cnp.PyArray_DATA(arr), n, k,
                                      <uint16_t *>cnp.PyArray_DATA(packed))
            pw.layout = self.t.gemm_bf16_layout.decode()
        packed.flags.writeable = False
        pw.data, pw.n, pw.k, pw.dtype, pw.isa = packed, n, k, dtype, self.isa
        pw.bits, pw.group = (32 if dtype == "f32" else 16), 0
        return pw

    def gemm(self, x, w_obj, out, bias=None, ThreadPool pool=None):
        """out[M, N] = x[M, K] @ W.T (+ bias) with W packed by pack()."""
        if not isinstance(w_obj, PackedWeight):
            raise ValueError(f"w must be a PackedWeight, got {type(w_obj).__name__}")
        cdef PackedWeight w = <PackedWeight>w_obj
        if w.quantized:
            raise ValueError(f"w is a quantized weight ({w.dtype}): use gemm_wq")
        cdef cnp.ndarray xa = _array(x, "x", np.float32, 2)
        cdef cnp.ndarray oa = _array(out, "out", np.float32, 2)
        cdef cnp.ndarray ba
        cdef const float *bias_ptr = NULL
        _writable(oa, "out")
        expected = self.t.gemm_f32_layout if w.dtype == "f32" else self.t.gemm_bf16_layout
        if w.layout != expected.decode():
            raise ValueError(f"w is packed as {w.layout!r} (by {w.isa}); the {self.isa} "
                             f"kernels read {expected.decode()!r}: pack it with this table")
        if xa.shape[1] != w.k:
            raise ValueError(f"x has {xa.shape[1]} columns but w has K={w.k}")
        if oa.shape[0] != xa.shape[0] or oa.shape[1] != w.n:
            raise ValueError(f"out must have shape ({xa.shape[0]}, {w.n}), got {_shp(oa)}")
        _no_overlap(oa, "out", xa, "x")
        if bias is not None:
            ba = _array(bias, "bias", np.float32, 1)
            if ba.shape[0] != w.n:
                raise ValueError(f"bias must have shape ({w.n},), got {_shp(ba)}")
            bias_ptr = <const float *>cnp.PyArray_DATA(ba)
        cdef armllm_pool *p = _pool_ptr(pool)
        cdef int64_t m = xa.shape[0], k = w.k, n = w.n, ldx = _ld(xa), ldy = _ld(oa)
        cdef const float *xp = <const float *>cnp.PyArray_DATA(xa)
        cdef float *yp = <float *>cnp.PyArray_DATA(oa)
        cdef void *wp = cnp.PyArray_DATA(w.data)
        if w.dtype == "f32":
            with nogil:
                self.t.gemm_f32(p, xp, m, k, ldx, <const float *>wp, n, bias_ptr, yp, ldy)
        else:
            with nogil:
                self.t.gemm_bf16(p, xp, m, k, ldx, <const uint16_t *>wp, n, bias_ptr, yp, ldy)
        return out

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

    def rmsnorm_quant(self, x, weight, float eps, out, xq, scale, gsum=None, int64_t group=0,
                      residual=None, ThreadPool pool=None, zp=None):
        """rmsnorm (as `rmsnorm`, into out) and quant_act of out in one pass
        over the rows: the same bits as the two calls."""
        _check_act_group(group)
        self.rmsnorm(x, weight, eps, out, residual, None, check_only=True)
        cdef cnp.ndarray xa = <cnp.ndarray>x
        cdef cnp.ndarray oa = <cnp.ndarray>out
        cdef QuantOut qo = _quant_out(oa, group, xq, scale, gsum, zp)
        for name, a in (("xq", xq), ("scale", scale), ("gsum", gsum), ("zp", zp)):
            if a is not None:
                _no_overlap(<cnp.ndarray>a, name, xa, "x")
                if residual is not None:
                    _no_overlap(<cnp.ndarray>a, name, <cnp.ndarray>residual, "residual")
        cdef float *res_ptr = NULL
        cdef int64_t ldr = 0
        if residual is not None:
            res_ptr = <float *>cnp.PyArray_DATA(<cnp.ndarray>residual)
            ldr = _ld(<cnp.ndarray>residual)
        cdef armllm_pool *p = _pool_ptr(pool)
        cdef int64_t t = xa.shape[0], d = xa.shape[1], ldx = _ld(xa), ldo = _ld(oa)
        cdef const float *xp = <const float *>cnp.PyArray_DATA(xa)
        cdef const float *wp = <const float *>cnp.PyArray_DATA(<cnp.ndarray>weight)
        cdef float *op = <float *>cnp.PyArray_DATA(oa)
        with nogil:
            armllm_rmsnorm_quant(self.t, p, xp, ldx, res_ptr, ldr, wp, t, d, eps, op, ldo,
                                 group, qo.xq, qo.ldq, qo.scale, qo.ldsc, qo.gsum, qo.ldgs,
                                 qo.zp, qo.ldzp)
        return out

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

    def gemm_wq(self, xq, scale, gsum, w_obj, out, bias=None, ThreadPool pool=None):
        """out[M, N] = sum_g scale[m, g] * (d * (xq . q over g) + o * gsum[m, g])
        (+ bias), with xq, scale, gsum from quant_act in the weight's groups
        (gsum required for 4-bit weights, optional for 8-bit, which then
        compute it) and W from pack_wq."""
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
        with nogil:
            self.t.gemm_wq(p, qp, m, k, ldq, sp, ldsc, gs_ptr, ldgs, wp, n, bits, group, bias_ptr,
                           yp, ldy)
        return out

    def gguf_packed_len(self, int64_t k, types, rows):
        """Bytes pack_gguf allocates for parts of these ggml types and row counts."""
        cdef cnp.ndarray ta, ra
        ta, ra = _gguf_parts(k, types, rows)
        return self.t.gemm_gguf_packed_len(k, ta.shape[0], <const int32_t *>cnp.PyArray_DATA(ta),
                                           <const int64_t *>cnp.PyArray_DATA(ra))

    def pack_gguf(self, blocks, int64_t k, types, rows):
        """Prepacks GGUF-block weights as stored: blocks (uint8) holds the rows of
        each part in turn (rows[i] rows of ggml type types[i], K columns each, as
        in the file), the whole matrix [sum(rows), K]."""
        cdef cnp.ndarray ta, ra
        ta, ra = _gguf_parts(k, types, rows)
        cdef cnp.ndarray ba = np.ascontiguousarray(blocks, dtype=np.uint8).reshape(-1)
        cdef int64_t expected = 0, i, nparts = ta.shape[0]
        for i in range(nparts):
            expected += ra[i] * (k // armllm_gguf_block_elems(ta[i])) * \
                armllm_gguf_block_bytes(ta[i])
        if ba.shape[0] != expected:
            raise ValueError(f"blocks hold {ba.shape[0]} bytes; parts {list(types)} x rows "
                             f"{list(rows)} of K={k} take {expected}")
        cdef const int32_t *tp = <const int32_t *>cnp.PyArray_DATA(ta)
        cdef const int64_t *rp = <const int64_t *>cnp.PyArray_DATA(ra)
        cdef cnp.ndarray packed = _aligned_empty(
            self.t.gemm_gguf_packed_len(k, nparts, tp, rp), np.uint8)
        with nogil:
            self.t.gemm_gguf_pack(<const uint8_t *>cnp.PyArray_DATA(ba), k, nparts, tp, rp,
                                  cnp.PyArray_DATA(packed))
        packed.flags.writeable = False
        cdef PackedWeight pw = PackedWeight.__new__(PackedWeight)
        pw.data, pw.n, pw.k, pw.isa = packed, int(ra.sum()), k, self.isa
        pw.dtype, pw.bits, pw.group = "gguf", 8, gguf_act_group(ta)
        pw.gguf_types, pw.gguf_rows = tuple(int(t) for t in ta), tuple(int(r) for r in ra)
        pw.layout = self.t.gemm_gguf_layout.decode()
        return pw

    def gemm_gguf(self, xq, scale, gsum, w_obj, out, bias=None, ThreadPool pool=None):
        """out[M, N] = the GGUF-block GEMM (armllm_kernels.h) of xq, scale, gsum from
        quant_act in groups of w.group (gguf_act_group) and W from pack_gguf."""
        if not isinstance(w_obj, PackedWeight) or (<PackedWeight>w_obj).dtype != "gguf":
            raise ValueError(f"w must be a PackedWeight from pack_gguf, got {w_obj!r}")
        cdef PackedWeight w = <PackedWeight>w_obj
        if w.layout != self.t.gemm_gguf_layout.decode():
            raise ValueError(f"w is packed as {w.layout!r} (by {w.isa}); the {self.isa} kernels"
                             f" read {self.t.gemm_gguf_layout.decode()!r}: pack it with this "
                             f"table")
        if gsum is None:
            raise ValueError("gsum is required for GGUF-block weights: quant_act(..., gsum=...)")
        cdef cnp.ndarray qa = _array(xq, "xq", np.int8, 2)
        cdef cnp.ndarray sa = _array(scale, "scale", np.float32, 2)
        cdef cnp.ndarray ga = _array(gsum, "gsum", np.int32, 2)
        cdef cnp.ndarray oa = _array(out, "out", np.float32, 2)
        cdef cnp.ndarray ba
        cdef const float *bias_ptr = NULL
        cdef int64_t m = qa.shape[0], ng = w.k // w.group
        _writable(oa, "out")
        if qa.shape[1] < w.k:
            raise ValueError(f"xq must have at least K = {w.k} columns, got {qa.shape[1]}")
        for name, arr in (("scale", sa), ("gsum", ga)):
            if arr.shape[0] != m or arr.shape[1] < ng or _ld(arr) < ng:
                raise ValueError(f"{name} must have {m} rows of at least {ng} columns (groups "
                                 f"of {w.group}), got shape {_shp(arr)}")
            _no_overlap(oa, "out", arr, name)
        if oa.shape[0] != m or oa.shape[1] != w.n:
            raise ValueError(f"out must have shape ({m}, {w.n}), got {_shp(oa)}")
        _no_overlap(oa, "out", qa, "xq")
        _no_overlap(oa, "out", w.data, "w")
        if bias is not None:
            ba = _array(bias, "bias", np.float32, 1)
            if ba.shape[0] != w.n:
                raise ValueError(f"bias must have shape ({w.n},), got {_shp(ba)}")
            _no_overlap(oa, "out", ba, "bias")
            bias_ptr = <const float *>cnp.PyArray_DATA(ba)
        cdef armllm_pool *p = _pool_ptr(pool)
        cdef int64_t k = w.k, n = w.n, ldq = _ld(qa), ldy = _ld(oa), ldsc = _ld(sa)
        cdef int64_t ldgs = _ld(ga)
        cdef const int8_t *qp = <const int8_t *>cnp.PyArray_DATA(qa)
        cdef const float *sp = <const float *>cnp.PyArray_DATA(sa)
        cdef const int32_t *gp = <const int32_t *>cnp.PyArray_DATA(ga)
        cdef const void *wp = cnp.PyArray_DATA(w.data)
        cdef float *yp = <float *>cnp.PyArray_DATA(oa)
        with nogil:
            self.t.gemm_gguf(p, qp, m, k, ldq, sp, ldsc, gp, ldgs, wp, n, bias_ptr, yp, ldy)
        return out

    def rmsnorm(self, x, weight, float eps, out, residual=None, ThreadPool pool=None,
                bint check_only=False):
        """out = rmsnorm(x [+ residual]) * weight; residual is updated to x + residual.
        check_only: validate the arguments, run nothing."""
        cdef cnp.ndarray xa = _array(x, "x", np.float32, 2)
        cdef cnp.ndarray wa = _array(weight, "weight", np.float32, 1)
        cdef cnp.ndarray oa = _array(out, "out", np.float32, 2)
        cdef cnp.ndarray ra
        cdef float *res_ptr = NULL
        cdef int64_t ldr = 0
        _writable(oa, "out")
        if not eps > 0 or eps != eps:
            raise ValueError(f"eps must be > 0, got {eps}")
        if wa.shape[0] != xa.shape[1]:
            raise ValueError(f"weight must have shape ({xa.shape[1]},), got {_shp(wa)}")
        if oa.shape[0] != xa.shape[0] or oa.shape[1] != xa.shape[1]:
            raise ValueError(f"out must have shape {_shp(xa)}, got {_shp(oa)}")
        _same_or_disjoint(oa, "out", xa, "x")
        if residual is not None:
            ra = _array(residual, "residual", np.float32, 2)
            _writable(ra, "residual")
            if ra.shape[0] != xa.shape[0] or ra.shape[1] != xa.shape[1]:
                raise ValueError(f"residual must have shape {_shp(xa)}, got {_shp(ra)}")
            _no_overlap(oa, "out", ra, "residual")
            _no_overlap(xa, "x", ra, "residual")
            res_ptr = <float *>cnp.PyArray_DATA(ra)
            ldr = _ld(ra)
        if check_only:
            return out
        cdef armllm_pool *p = _pool_ptr(pool)
        cdef int64_t t = xa.shape[0], d = xa.shape[1], ldx = _ld(xa), ldo = _ld(oa)
        cdef const float *xp = <const float *>cnp.PyArray_DATA(xa)
        cdef const float *wp = <const float *>cnp.PyArray_DATA(wa)
        cdef float *op = <float *>cnp.PyArray_DATA(oa)
        with nogil:
            self.t.rmsnorm(p, xp, ldx, res_ptr, ldr, wp, t, d, eps, op, ldo)
        return out

    def rope(self, x, positions, cos_sin, int64_t n_heads, int64_t head_dim,
             int64_t rot_dim=0, str style="neox", ThreadPool pool=None):
        """Rotates the first rot_dim (default head_dim) dims of each head of x in place."""
        cdef cnp.ndarray xa = _array(x, "x", np.float32, 2)
        cdef cnp.ndarray pa = _array(positions, "positions", np.int32, 1)
        cdef cnp.ndarray ca = _array(cos_sin, "cos_sin", np.float32, 2)
        _writable(xa, "x")
        if rot_dim == 0:
            rot_dim = head_dim
        if style not in ("neox", "gptj"):
            raise ValueError(f"style must be 'neox' or 'gptj', got {style!r}")
        if n_heads < 1 or head_dim < 2:
            raise ValueError(f"n_heads must be >= 1 and head_dim >= 2, got {n_heads}, {head_dim}")
        if rot_dim < 2 or rot_dim % 2 or rot_dim > head_dim:
            raise ValueError(f"rot_dim must be even and in [2, head_dim={head_dim}], got {rot_dim}")
        if n_heads * head_dim > xa.shape[1]:
            raise ValueError(f"x has {xa.shape[1]} columns, fewer than n_heads*head_dim = "
                             f"{n_heads * head_dim}")
        if pa.shape[0] != xa.shape[0]:
            raise ValueError(f"positions has {pa.shape[0]} entries for {xa.shape[0]} rows of x")
        if ca.shape[1] != rot_dim or _ld(ca) != rot_dim:
            raise ValueError(f"cos_sin must be a contiguous (max_pos, {rot_dim}) array, got "
                             f"shape {_shp(ca)}")
        _no_overlap(xa, "x", ca, "cos_sin")
        cdef armllm_pool *p = _pool_ptr(pool)
        cdef int st = ARMLLM_ROPE_NEOX if style == "neox" else ARMLLM_ROPE_GPTJ
        cdef int64_t t = xa.shape[0], ldx = _ld(xa), max_pos = ca.shape[0], bad
        cdef float *xp = <float *>cnp.PyArray_DATA(xa)
        cdef const int32_t *pp = <const int32_t *>cnp.PyArray_DATA(pa)
        cdef const float *cp = <const float *>cnp.PyArray_DATA(ca)
        with nogil:
            bad = self.t.rope(p, xp, t, n_heads, head_dim, ldx, pp, cp, max_pos, rot_dim, st)
        if bad >= 0:
            raise ValueError(f"positions[{bad}] = {positions[bad]} is outside the cos/sin "
                             f"cache [0, {max_pos})")
        return x

    def silu_mul(self, gate_up, out, ThreadPool pool=None):
        """out[t, j] = silu(gate_up[t, j]) * gate_up[t, inter + j], inter = columns / 2."""
        return self._act_mul(self.t.silu_mul, gate_up, out, pool)

    def gelu_tanh_mul(self, gate_up, out, ThreadPool pool=None):
        """out[t, j] = gelu_tanh(gate_up[t, j]) * gate_up[t, inter + j] (GeGLU)."""
        return self._act_mul(self.t.gelu_tanh_mul, gate_up, out, pool)

    cdef _act_mul(self, armllm_act_mul_fn kernel, gate_up, out, ThreadPool pool):
        cdef cnp.ndarray ga = _array(gate_up, "gate_up", np.float32, 2)
        cdef cnp.ndarray oa = _array(out, "out", np.float32, 2)
        _writable(oa, "out")
        if ga.shape[1] % 2:
            raise ValueError(f"gate_up must have an even number of columns, got {ga.shape[1]}")
        cdef int64_t inter = ga.shape[1] // 2
        if oa.shape[0] != ga.shape[0] or oa.shape[1] != inter:
            raise ValueError(f"out must have shape ({ga.shape[0]}, {inter}), got {_shp(oa)}")
        if not (_addr(oa) == _addr(ga) and oa.strides[0] == ga.strides[0]):
            _no_overlap(oa, "out", ga, "gate_up")
        cdef armllm_pool *p = _pool_ptr(pool)
        cdef int64_t t = ga.shape[0], ldg = _ld(ga), ldo = _ld(oa)
        cdef const float *gp = <const float *>cnp.PyArray_DATA(ga)
        cdef float *op = <float *>cnp.PyArray_DATA(oa)
        with nogil:
            kernel(p, gp, ldg, t, inter, op, ldo)
        return out

    def embed(self, ids, table, out, ThreadPool pool=None):
        """out[t] = table[ids[t]]; table float32 or uint16 (bf16 bits)."""
        cdef cnp.ndarray ia = _array(ids, "ids", np.int32, 1)
        if not isinstance(table, cnp.ndarray):
            raise ValueError(f"table must be a numpy array, got {type(table).__name__}")
        cdef bint bf16 = (<cnp.ndarray>table).dtype == np.uint16
        cdef cnp.ndarray ta = _array(table, "table", np.uint16 if bf16 else np.float32, 2)
        cdef cnp.ndarray oa = _array(out, "out", np.float32, 2)
        _writable(oa, "out")
        if _ld(ta) != ta.shape[1]:
            raise ValueError("table must be C-contiguous")
        if oa.shape[0] != ia.shape[0] or oa.shape[1] != ta.shape[1]:
            raise ValueError(f"out must have shape ({ia.shape[0]}, {ta.shape[1]}), got {_shp(oa)}")
        cdef armllm_pool *p = _pool_ptr(pool)
        cdef int64_t t = ia.shape[0], vocab = ta.shape[0], d = ta.shape[1], ldo = _ld(oa), bad
        cdef const int32_t *ip = <const int32_t *>cnp.PyArray_DATA(ia)
        cdef void *tp = cnp.PyArray_DATA(ta)
        cdef float *op = <float *>cnp.PyArray_DATA(oa)
        with nogil:
            if bf16:
                bad = self.t.embed_bf16(p, ip, t, <const uint16_t *>tp, vocab, d, op, ldo)
            else:
                bad = self.t.embed_f32(p, ip, t, <const float *>tp, vocab, d, op, ldo)
        if bad >= 0:
            raise ValueError(f"ids[{bad}] = {ids[bad]} is outside the vocabulary [0, {vocab})")
        return out

    def kv_write(self, k, v, slot_mapping, k_cache, v_cache, ThreadPool pool=None):
        """Writes K/V rows [T, n_kv_heads*head_dim] to cache slots (-1 skips a row)."""
        cdef cnp.ndarray ka = _array(k, "k", np.float32, 2)
        cdef cnp.ndarray va = _array(v, "v", np.float32, 2)
        cdef cnp.ndarray sa = _array(slot_mapping, "slot_mapping", np.int32, 1)
        cdef cnp.ndarray kc = _kv_cache(k_cache, "k_cache")
        cdef cnp.ndarray vc = _kv_cache(v_cache, "v_cache")
        _same_cache(kc, vc)
        cdef int64_t num_blocks = kc.shape[0], n_kv = kc.shape[1], bs = kc.shape[2]
        cdef int64_t hd = kc.shape[3], t = ka.shape[0]
        if ka.shape[1] != n_kv * hd or va.shape[1] != n_kv * hd:
            raise ValueError(f"k and v must have {n_kv * hd} columns (n_kv_heads*head_dim), "
                             f"got {ka.shape[1]} and {va.shape[1]}")
        if va.shape[0] != t or sa.shape[0] != t:
            raise ValueError(f"k, v and slot_mapping must have the same rows, got {t}, "
                             f"{va.shape[0]}, {sa.shape[0]}")
        cdef armllm_pool *p = _pool_ptr(pool)
        cdef int bf16 = kc.dtype == np.uint16
        cdef int64_t ldk = _ld(ka), ldv = _ld(va), bad
        cdef const float *kp = <const float *>cnp.PyArray_DATA(ka)
        cdef const float *vp = <const float *>cnp.PyArray_DATA(va)
        cdef const int32_t *sp = <const int32_t *>cnp.PyArray_DATA(sa)
        cdef void *kcp = cnp.PyArray_DATA(kc)
        cdef void *vcp = cnp.PyArray_DATA(vc)
        with nogil:
            bad = self.t.kv_write(p, kp, ldk, vp, ldv, sp, t, kcp, vcp, bf16, n_kv, hd, bs,
                                  num_blocks)
        if bad >= 0:
            raise ValueError(f"slot_mapping[{bad}] = {slot_mapping[bad]} is outside the cache "
                             f"[-1, {num_blocks * bs})")

    def attention(self, q, k_cache, v_cache, block_table, seq_lens, query_start,
                  int64_t n_heads, float scale, out, int64_t sliding_window=0, scratch=None,
                  ThreadPool pool=None, sinks=None):
        """Varlen paged attention of q [T, n_heads*head_dim] into out (see the C header);
        sinks: None or float32 [n_heads], each head's logit in the softmax denominator."""
        cdef cnp.ndarray qa = _array(q, "q", np.float32, 2)
        cdef cnp.ndarray oa = _array(out, "out", np.float32, 2)
        cdef cnp.ndarray kc = _kv_cache(k_cache, "k_cache")
        cdef cnp.ndarray vc = _kv_cache(v_cache, "v_cache")
        cdef cnp.ndarray bt = _array(block_table, "block_table", np.int32, 2)
        cdef cnp.ndarray sl = _array(seq_lens, "seq_lens", np.int32, 1)
        cdef cnp.ndarray qs = _array(query_start, "query_start", np.int32, 1)
        cdef cnp.ndarray sc
        _same_cache(kc, vc)
        _writable(oa, "out")
        cdef int64_t n_kv = kc.shape[1], hd = kc.shape[3], n_seqs = sl.shape[0]
        if n_heads < 1 or n_heads % n_kv:
            raise ValueError(f"n_heads must be a positive multiple of n_kv_heads={n_kv}, "
                             f"got {n_heads}")
        if hd > ARMLLM_ATTN_MAX_HEAD_DIM:
            raise ValueError(f"head_dim {hd} is above the supported {ARMLLM_ATTN_MAX_HEAD_DIM}")
        if not scale > 0:
            raise ValueError(f"scale must be > 0, got {scale}")
        if sliding_window < 0:
            raise ValueError(f"sliding_window must be >= 0, got {sliding_window}")
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
        args.cache_bf16 = kc.dtype == np.uint16
        args.block_table = <const int32_t *>cnp.PyArray_DATA(bt)
        args.max_blocks = bt.shape[1]
        args.seq_lens = <const int32_t *>cnp.PyArray_DATA(sl)
        args.query_start = <const int32_t *>cnp.PyArray_DATA(qs)
        args.n_seqs, args.n_heads, args.n_kv_heads = n_seqs, n_heads, n_kv
        args.head_dim, args.block_size, args.num_blocks = hd, kc.shape[2], kc.shape[0]
        args.scale, args.sliding_window = scale, sliding_window
        args.out = <float *>cnp.PyArray_DATA(oa)
        args.ldo = _ld(oa)
        args.scratch, args.scratch_len = NULL, 0
        args.sinks = NULL if sinks is None else _vector(sinks, "sinks", n_heads)
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

    def exp(self, x, out):
        """out = exp(x) with the kernels' polynomial exp (1-D float32)."""
        cdef cnp.ndarray xa = _array(x, "x", np.float32, 1)
        cdef cnp.ndarray oa = _array(out, "out", np.float32, 1)
        _writable(oa, "out")
        if oa.shape[0] != xa.shape[0]:
            raise ValueError(f"out must have shape {_shp(xa)}, got {_shp(oa)}")
        if _addr(oa) != _addr(xa):
            _no_overlap(oa, "out", xa, "x")
        cdef int64_t n = xa.shape[0]
        cdef const float *xp = <const float *>cnp.PyArray_DATA(xa)
        cdef float *op = <float *>cnp.PyArray_DATA(oa)
        with nogil:
            self.t.exp(xp, op, n)
        return out


include "comm.pxi"
include "layer.pxi"


# --------------------------------------------------------------- quantized


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


# -------------------------------------------------------------- GGUF blocks


GGUF_ACT_GROUP = ARMLLM_GGUF_ACT_GROUP
GGUF_SUPER = ARMLLM_GGUF_SUPER


def gguf_act_group(types) -> int:
    """Columns per activation scale of a GGUF-block GEMM of parts of these ggml
    types (gguf_blocks.h's armllm_gguf_act_group): 256 with a super-block type
    among them, else 32."""
    return ARMLLM_GGUF_SUPER if any(armllm_gguf_is_super(int(t)) for t in types) \
        else ARMLLM_GGUF_ACT_GROUP


cdef tuple _gguf_parts(int64_t k, types, rows):
    """(types int32, rows int64) arrays of a packed matrix's parts, checked."""
    cdef cnp.ndarray ta = np.ascontiguousarray(types, dtype=np.int32).reshape(-1)
    cdef cnp.ndarray ra = np.ascontiguousarray(rows, dtype=np.int64).reshape(-1)
    if ta.shape[0] != ra.shape[0]:
        raise ValueError(f"{ta.shape[0]} types for {ra.shape[0]} row counts")
    if armllm_gguf_parts_check(k, ta.shape[0], <const int32_t *>cnp.PyArray_DATA(ta),
                               <const int64_t *>cnp.PyArray_DATA(ra)):
        raise ValueError(f"cannot pack GGUF parts of types {list(types)} and rows {list(rows)} "
                         f"over K={k}: 1 to {ARMLLM_GGUF_MAX_PARTS} parts of known types, "
                         f"rows >= 1, K a multiple of each type's block")
    return ta, ra


def gguf_block_geometry(int ggml_type):
    """(elements, bytes) of one block of a ggml type the kernels decode, else None."""
    cdef int e = armllm_gguf_block_elems(ggml_type)
    return (e, armllm_gguf_block_bytes(ggml_type)) if e else None


def gguf_dequantize(int ggml_type, blocks, int64_t rows, int64_t k):
    """[rows, k] float32 of rows of GGUF blocks as stored (the gguf package's
    dequantization, bit for bit)."""
    cdef int e = armllm_gguf_block_elems(ggml_type)
    if not e:
        raise ValueError(f"ggml type {ggml_type} is not one the kernels decode")
    if rows < 0 or k < 1 or k % e:
        raise ValueError(f"rows must be >= 0 and k a positive multiple of {e}, got {rows}, {k}")
    cdef cnp.ndarray ba = np.ascontiguousarray(blocks, dtype=np.uint8).reshape(-1)
    if ba.shape[0] != rows * (k // e) * armllm_gguf_block_bytes(ggml_type):
        raise ValueError(f"{ba.shape[0]} bytes are not {rows} rows of {k} elements")
    cdef cnp.ndarray out = np.empty((rows, k), np.float32)
    with nogil:
        armllm_gguf_dequant_rows(ggml_type, <const uint8_t *>cnp.PyArray_DATA(ba), rows, k,
                                 <float *>cnp.PyArray_DATA(out), k)
    return out


def gguf_embed(ids, table, int ggml_type, int64_t d, out):
    """out[t] = row ids[t] of a [vocab, d] GGUF tensor as stored (table: its
    bytes, uint8 [vocab, row bytes]), dequantized."""
    cdef cnp.ndarray ia = _array(ids, "ids", np.int32, 1)
    cdef cnp.ndarray ta = _array(table, "table", np.uint8, 2)
    cdef cnp.ndarray oa = _array(out, "out", np.float32, 2)
    cdef int e = armllm_gguf_block_elems(ggml_type)
    _writable(oa, "out")
    if not e or d % e or ta.shape[1] != (d // e) * armllm_gguf_block_bytes(ggml_type) \
            or _ld(ta) != ta.shape[1]:
        raise ValueError(f"table of shape {_shp(ta)} is not C-contiguous rows of {d} elements "
                         f"of ggml type {ggml_type}")
    if oa.shape[0] != ia.shape[0] or oa.shape[1] != d:
        raise ValueError(f"out must have shape ({ia.shape[0]}, {d}), got {_shp(oa)}")
    cdef int64_t t = ia.shape[0], vocab = ta.shape[0], ldo = _ld(oa), bad
    with nogil:
        bad = armllm_gguf_embed(NULL, <const int32_t *>cnp.PyArray_DATA(ia), t,
                                <const uint8_t *>cnp.PyArray_DATA(ta), ggml_type, vocab, d,
                                <float *>cnp.PyArray_DATA(oa), ldo)
    if bad >= 0:
        raise ValueError(f"ids[{bad}] = {ids[bad]} is outside the vocabulary [0, {vocab})")
    return out


# --------------------------------------------------------------- attention


def attn_scratch_len(int64_t rows, int64_t n_heads, int64_t head_dim, int64_t max_seq_len):
    """Floats of scratch that let attention split every row's keys over threads."""
    return armllm_attn_scratch_len(rows, n_heads, head_dim, max_seq_len)


cdef cnp.ndarray _kv_cache(object a, str name):
    """A C-contiguous [num_blocks, n_kv_heads, block_size, head_dim] cache."""
    if not isinstance(a, cnp.ndarray):
        raise ValueError(f"{name} must be a numpy array, got {type(a).__name__}")
    cdef cnp.ndarray arr = <cnp.ndarray>a
    if arr.dtype != np.float32 and arr.dtype != np.uint16:
        raise ValueError(f"{name} must be float32 or uint16 (bf16 bits), got {arr.dtype}")
    if arr.ndim != 4:
        raise ValueError(f"{name} must be 4-D [num_blocks, n_kv_heads, block_size, head_dim],"
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



# ---------------------------------------------------------------- sampling


def sample_scratch_bytes(int64_t n):
    """Bytes of scratch sample_token needs for a row of n logits."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return armllm_sample_scratch_bytes(n)


def sample_token(row, double temperature, int64_t top_k, double top_p, double min_p, double u,
                 scratch):
    """A token of a float32 logits row under temperature (> 0), top_k (<= 0: off),
    top_p (in (0, 1]) and min_p (in [0, 1]) for the uniform draw u in [0, 1)
    (sample.h); scratch: a uint8 array of sample_scratch_bytes(len(row))."""
    cdef cnp.ndarray ra = _array(row, "row", np.float32, 1)
    cdef cnp.ndarray sa = _array(scratch, "scratch", np.uint8, 1)
    _writable(sa, "scratch")
    cdef int64_t n = ra.shape[0], token
    if <size_t>sa.shape[0] < armllm_sample_scratch_bytes(n) or _addr(sa) % 8:
        raise ValueError(f"scratch must be 8-byte aligned and hold "
                         f"{armllm_sample_scratch_bytes(n)} bytes, got {sa.shape[0]}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if not 0 < top_p <= 1 or not 0 <= min_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] and min_p in [0, 1], got {top_p}, {min_p}")
    if not 0 <= u < 1:
        raise ValueError(f"u must be in [0, 1), got {u}")
    cdef const float *rp = <const float *>cnp.PyArray_DATA(ra)
    cdef void *sp = cnp.PyArray_DATA(sa)
    with nogil:
        token = armllm_sample(rp, n, temperature, top_k, top_p, min_p, u, sp)
    return token


def mask_logits(row, words):
    """Sets row[i] (float32) to -inf where bit i % 32 of words[i // 32] (int32 or
    uint32, llguidance's token bitmask) is 0 (sample.h)."""
    cdef cnp.ndarray ra = _array(row, "row", np.float32, 1)
    _writable(ra, "row")
    cdef cnp.ndarray wa = _array(words, "words", np.uint32 if getattr(words, "dtype", None) == np.uint32
                                 else np.int32, 1)
    cdef int64_t n = ra.shape[0]
    if wa.shape[0] != (n + 31) // 32:
        raise ValueError(f"words must hold {(n + 31) // 32} entries for a row of {n}, "
                         f"got {wa.shape[0]}")
    cdef float *rp = <float *>cnp.PyArray_DATA(ra)
    cdef const uint32_t *wp = <const uint32_t *>cnp.PyArray_DATA(wa)
    with nogil:
        armllm_mask_logits(rp, n, wp)


def probe_read(buf, ThreadPool pool=None):
    """Reads a uint8 buffer (length a multiple of 1 MiB) across the pool's threads."""
    cdef cnp.ndarray arr = _array(buf, "buf", np.uint8, 1)
    if arr.shape[0] == 0 or arr.shape[0] % (1 << 20):
        raise ValueError(f"buf length must be a positive multiple of 1 MiB, got {arr.shape[0]}")
    cdef armllm_pool *p = _pool_ptr(pool)
    cdef size_t nbytes = arr.shape[0]
    cdef const void *data = cnp.PyArray_DATA(arr)
    cdef uint64_t sum
    with nogil:
        sum = armllm_probe_read(p, data, nbytes)
    return sum


def probe_fma(int64_t iters, ThreadPool pool=None):
    """Runs independent FMA chains on every pool thread; returns FLOPs done."""
    cdef armllm_pool *p = _pool_ptr(pool)
    cdef double flops
    with nogil:
        flops = armllm_probe_fma(p, iters)
    return flops
include "moe.pxi"
