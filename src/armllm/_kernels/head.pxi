# head.pxi: included by _ext.pyx after linear.pxi (whose linear bindings and
# norm + linear helper it uses); NormHead, the final norm and the lm_head on only
# the rows that need logits.

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
