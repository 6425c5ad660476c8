# sample_slots.pxi: included by _ext.pyx after gdn.pxi: _SampleKernels, the batched
# sampler's vectorizable passes (sample_argmax, sample_find_above, sample_exp,
# sample_block_sums, sample_collect in armllm_kernels.h), for tests and tools that compare variants; RowSampler
# (sample.pxi) runs them.


cdef inline int64_t _sample_blocks(int64_t n):
    return (n + ARMLLM_SAMPLE_BLOCK - 1) // ARMLLM_SAMPLE_BLOCK


cdef float *_sums_out(object sums, int64_t n) except NULL:
    """The writable float32 array of one block sum per 16 entries of n."""
    cdef cnp.ndarray sa = _array(sums, "sums", np.float32, 1)
    _writable(sa, "sums")
    if sa.shape[0] != _sample_blocks(n):
        raise ValueError(f"sums must hold {_sample_blocks(n)} block sums for {n} values, "
                         f"got {sa.shape[0]}")
    return <float *>cnp.PyArray_DATA(sa)


cdef class _SampleKernels(_GDNKernels):
    """Kernels' sampling slots."""

    def sample_argmax(self, x):
        """The lowest index of the largest non-NaN entry of x (float32, 1-D); -1 when
        every entry is NaN."""
        cdef cnp.ndarray xa = _array(x, "x", np.float32, 1)
        cdef const float *xp = <const float *>cnp.PyArray_DATA(xa)
        cdef int64_t n = xa.shape[0], i
        with nogil:
            i = self.t.sample_argmax(xp, n)
        return i

    def sample_find_above(self, x, float t):
        """The lowest index of an entry of x (float32, 1-D) above t; len(x) if none."""
        cdef cnp.ndarray xa = _array(x, "x", np.float32, 1)
        cdef const float *xp = <const float *>cnp.PyArray_DATA(xa)
        cdef int64_t n = xa.shape[0], i
        with nogil:
            i = self.t.sample_find_above(xp, n, t)
        return i

    def sample_exp(self, x, float m, float inv_t, float keep_min, e, sums):
        """e = (d >= -80 ? exp(d) : 0), d = (x - m) * inv_t, and the block sums of
        e with floor keep_min into sums; returns their sum in double (e may be x)."""
        cdef cnp.ndarray xa = _array(x, "x", np.float32, 1)
        cdef cnp.ndarray ea = _array(e, "e", np.float32, 1)
        _writable(ea, "e")
        if ea.shape[0] != xa.shape[0]:
            raise ValueError(f"e must have shape ({xa.shape[0]},), got {_shp(ea)}")
        _same_or_disjoint(ea, "e", xa, "x")
        cdef int64_t n = xa.shape[0]
        cdef float *sp = _sums_out(sums, n)
        _no_overlap(<cnp.ndarray>sums, "sums", ea, "e")
        cdef const float *xp = <const float *>cnp.PyArray_DATA(xa)
        cdef float *ep = <float *>cnp.PyArray_DATA(ea)
        cdef double total
        with nogil:
            total = self.t.sample_exp(xp, ep, n, m, inv_t, keep_min, sp)
        return total

    def sample_block_sums(self, e, float keep_min, sums):
        """The block sums of e (float32) with floor keep_min into sums; returns
        their sum in double."""
        cdef cnp.ndarray ea = _array(e, "e", np.float32, 1)
        cdef int64_t n = ea.shape[0]
        cdef float *sp = _sums_out(sums, n)
        _no_overlap(<cnp.ndarray>sums, "sums", ea, "e")
        cdef const float *ep = <const float *>cnp.PyArray_DATA(ea)
        cdef double total
        with nogil:
            total = self.t.sample_block_sums(ep, n, keep_min, sp)
        return total

    def sample_collect(self, e, float keep_min, ids=None):
        """The entries of e (float32) >= keep_min and > 0, in order: (their values,
        their ids: ids[i] (int32, as long as e) or i)."""
        cdef cnp.ndarray ea = _array(e, "e", np.float32, 1)
        cdef int64_t n = ea.shape[0], count
        cdef const int32_t *ip = NULL
        cdef cnp.ndarray ia
        if ids is not None:
            ia = _array(ids, "ids", np.int32, 1)
            if ia.shape[0] != n:
                raise ValueError(f"ids must have shape ({n},), got {_shp(ia)}")
            ip = <const int32_t *>cnp.PyArray_DATA(ia)
        out_e = np.empty(n + ARMLLM_SAMPLE_BLOCK, np.float32)  # the slot's slack
        out_id = np.empty(n + ARMLLM_SAMPLE_BLOCK, np.int32)
        cdef const float *ep = <const float *>cnp.PyArray_DATA(ea)
        cdef float *oe = <float *>cnp.PyArray_DATA(<cnp.ndarray>out_e)
        cdef int32_t *oi = <int32_t *>cnp.PyArray_DATA(<cnp.ndarray>out_id)
        with nogil:
            count = self.t.sample_collect(ep, ip, n, keep_min, oe, oi)
        return out_e[:count], out_id[:count]
