# elementwise.pxi: included by _ext.pyx after gguf.pxi: _ElementwiseKernels, the slots
# that work row by row: RMSNorm (alone and fused with quant_act), LayerNorm, RoPE,
# SiLU*mul, exact GELU, the embedding lookup and the kernels' polynomial exp.


cdef class _ElementwiseKernels(_GGUFKernels):
    """Kernels' norm, rope, activation, embedding and exp slots."""

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

    def layernorm(self, x, weight, bias, float eps, out, ThreadPool pool=None):
        """out = (x - mean) / sqrt(var + eps) * weight (+ bias) per row of x [T, D];
        bias None: none; out may be x."""
        cdef cnp.ndarray xa = _array(x, "x", np.float32, 2)
        cdef cnp.ndarray wa = _array(weight, "weight", np.float32, 1)
        cdef cnp.ndarray oa = _array(out, "out", np.float32, 2)
        cdef cnp.ndarray ba
        cdef const float *bp = NULL
        _writable(oa, "out")
        if not eps > 0 or eps != eps:
            raise ValueError(f"eps must be > 0, got {eps}")
        if wa.shape[0] != xa.shape[1]:
            raise ValueError(f"weight must have shape ({xa.shape[1]},), got {_shp(wa)}")
        if bias is not None:
            ba = _array(bias, "bias", np.float32, 1)
            if ba.shape[0] != xa.shape[1]:
                raise ValueError(f"bias must have shape ({xa.shape[1]},), got {_shp(ba)}")
            _no_overlap(oa, "out", ba, "bias")
            bp = <const float *>cnp.PyArray_DATA(ba)
        if oa.shape[0] != xa.shape[0] or oa.shape[1] != xa.shape[1]:
            raise ValueError(f"out must have shape {_shp(xa)}, got {_shp(oa)}")
        _same_or_disjoint(oa, "out", xa, "x")
        _no_overlap(oa, "out", wa, "weight")
        cdef armllm_pool *p = _pool_ptr(pool)
        cdef int64_t t = xa.shape[0], d = xa.shape[1], ldx = _ld(xa), ldo = _ld(oa)
        cdef const float *xp = <const float *>cnp.PyArray_DATA(xa)
        cdef const float *wp = <const float *>cnp.PyArray_DATA(wa)
        cdef float *op = <float *>cnp.PyArray_DATA(oa)
        with nogil:
            self.t.layernorm(p, xp, ldx, wp, bp, t, d, eps, op, ldo)
        return out

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

    def gelu(self, x, out, ThreadPool pool=None):
        """out = x / 2 * (1 + erf(x / sqrt(2))) (exact GELU) over C-contiguous float32
        arrays of one shape; out may be x."""
        for name, a in (("x", x), ("out", out)):
            if not isinstance(a, cnp.ndarray):
                raise ValueError(f"{name} must be a numpy array, got {type(a).__name__}")
        cdef cnp.ndarray xa = <cnp.ndarray>x
        cdef cnp.ndarray oa = <cnp.ndarray>out
        for name, a in (("x", xa), ("out", oa)):
            if a.dtype != np.float32:
                raise ValueError(f"{name} must have dtype float32, got {a.dtype}")
            if not cnp.PyArray_IS_C_CONTIGUOUS(a) or not cnp.PyArray_ISALIGNED(a):
                raise ValueError(f"{name} must be C-contiguous and aligned")
        _writable(oa, "out")
        if _shp(oa) != _shp(xa):
            raise ValueError(f"out must have shape {_shp(xa)}, got {_shp(oa)}")
        cdef int64_t n = xa.size
        cdef uintptr_t xs = _addr(xa), os = _addr(oa), nbytes = <uintptr_t>(n * 4)
        if os != xs and os < xs + nbytes and xs < os + nbytes:
            raise ValueError("out and x must not overlap")
        cdef armllm_pool *p = _pool_ptr(pool)
        cdef const float *xp = <const float *>cnp.PyArray_DATA(xa)
        cdef float *op = <float *>cnp.PyArray_DATA(oa)
        if n:
            with nogil:
                self.t.gelu(p, xp, op, n)
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
