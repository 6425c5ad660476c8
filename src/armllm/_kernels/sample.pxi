# sample.pxi: included by _ext.pyx: one token of a logits row (sample.h: temperature,
# top-k/p, min-p) and the structured-output mask of a row.


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
