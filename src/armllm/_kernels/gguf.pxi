# gguf.pxi: included by _ext.pyx after quant.pxi: GGUF blocks as stored (gguf_blocks.h):
# their geometry, dequantization and embedding rows, and _GGUFKernels, the GGUF-block
# GEMM's slots (pack_gguf, gemm_gguf), whose activations quant_act quantizes.


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


cdef class _GGUFKernels(_QuantKernels):
    """Kernels' GGUF-block GEMM slots."""

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

    def gemm_gguf(self, xq, scale, gsum, w_obj, out, bias=None, ThreadPool pool=None,
                  cols=None):
        """out[M, N] = the GGUF-block GEMM (armllm_kernels.h) of xq, scale, gsum from
        quant_act in groups of w.group (gguf_act_group) and W from pack_gguf; cols =
        (n0, n1): only out's columns [n0, n1), on the calling thread (gemm_gguf_cols:
        n0 on a panel of its part)."""
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
        cdef int64_t n0, n1
        if cols is not None:
            n0, n1 = _cols_window(cols, n, self.t.gemm_gguf_panel, w.gguf_rows)
            bias_ptr = bias_ptr + n0 if bias_ptr != NULL else NULL
            with nogil:
                self.t.gemm_gguf_cols(qp, m, k, ldq, sp, ldsc, gp, ldgs, wp, n, n0, n1, bias_ptr,
                                      yp + n0, ldy)
            return out
        with nogil:
            self.t.gemm_gguf(p, qp, m, k, ldq, sp, ldsc, gp, ldgs, wp, n, bias_ptr, yp, ldy)
        return out
