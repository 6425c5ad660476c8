# gemm.pxi: included by _ext.pyx after dispatch.pxi (it uses the validation helpers and
# _KernelTable): PackedWeight, a weight prepacked for one table's GEMM micro-kernel, and
# _GemmKernels, the float (f32, bf16) GEMM's slots: pack and gemm.


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


cdef class _GemmKernels(_KernelTable):
    """Kernels' float GEMM slots (packed layouts, pack, gemm)."""

    @property
    def gemm_layouts(self):
        return {"f32": self.t.gemm_f32_layout.decode(), "bf16": self.t.gemm_bf16_layout.decode(),
                "wq": self.t.gemm_wq_layout.decode(), "gguf": self.t.gemm_gguf_layout.decode()}

    @property
    def gemm_panels(self):
        """Columns per packed panel of each layout (by format, as gemm_layouts): where a
        column window (the GEMMs' cols=) may start."""
        return {"f32": self.t.gemm_f32_panel, "bf16": self.t.gemm_bf16_panel,
                "wq": self.t.gemm_wq_panel, "gguf": self.t.gemm_gguf_panel}

    @property
    def gemm_bf16_compute(self):
        """"f32" (bf16 weights widened) or "bf16" (activations rounded to bf16 too)."""
        return self.t.gemm_bf16_compute.decode()

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

    def dense_packed_len(self, int64_t n, int64_t k, str dtype):
        """Bytes pack_weight allocates for an [n, k] weight in dtype "f32" or "bf16" (this
        variant's panels: n, and k in some, rounded up to whole ones)."""
        if n < 1 or k < 1:
            raise ValueError(f"n and k must be >= 1, got {n} and {k}")
        if dtype == "f32":
            return 4 * self.t.gemm_f32_packed_len(n, k)
        if dtype == "bf16":
            return 2 * self.t.gemm_bf16_packed_len(n, k)
        raise ValueError(f"dtype must be 'f32' or 'bf16', got {dtype!r}")

    def gemm(self, x, w_obj, out, bias=None, ThreadPool pool=None, cols=None):
        """out[M, N] = x[M, K] @ W.T (+ bias) with W packed by pack(); with cols = (n0,
        n1) only out's columns [n0, n1) are written, on the calling thread (the *_cols
        slots: n0 on a packed panel, gemm_panels)."""
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
        cdef int64_t n0, n1
        if cols is not None:
            n0, n1 = _cols_window(cols, n, self.t.gemm_f32_panel if w.dtype == "f32"
                                  else self.t.gemm_bf16_panel, (n,))
            bias_ptr = bias_ptr + n0 if bias_ptr != NULL else NULL
            if w.dtype == "f32":
                with nogil:
                    self.t.gemm_f32_cols(xp, m, k, ldx, <const float *>wp, n, n0, n1, bias_ptr,
                                         yp + n0, ldy)
            else:
                with nogil:
                    self.t.gemm_bf16_cols(xp, m, k, ldx, <const uint16_t *>wp, n, n0, n1,
                                          bias_ptr, yp + n0, ldy)
            return out
        if w.dtype == "f32":
            with nogil:
                self.t.gemm_f32(p, xp, m, k, ldx, <const float *>wp, n, bias_ptr, yp, ldy)
        else:
            with nogil:
                self.t.gemm_bf16(p, xp, m, k, ldx, <const uint16_t *>wp, n, bias_ptr, yp, ldy)
        return out


cdef tuple _cols_window(object cols, int64_t n, int64_t panel, tuple parts):
    """(n0, n1) of a GEMM's column window cols, checked: 0 <= n0 < n1 <= n, n0 on a
    packed panel of `panel` columns counted from the first row of its part (parts:
    the row counts of the matrix's parts in order)."""
    n0, n1 = cols
    if not 0 <= n0 < n1 <= n:
        raise ValueError(f"cols must be (n0, n1) with 0 <= n0 < n1 <= {n}, got {cols}")
    start = 0
    for rows in parts:
        if n0 < start + rows:
            break
        start += rows
    if (n0 - start) % panel:
        raise ValueError(f"cols must start on a packed panel: n0 - {start} a multiple of "
                         f"{panel}, got n0 = {n0}")
    return n0, n1
