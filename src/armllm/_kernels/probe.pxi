# probe.pxi: included by _ext.pyx: the machine's limits as bench and `armllm plan` measure
# them (probe.h): memory read bandwidth and FMA throughput across the pool's threads.


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
