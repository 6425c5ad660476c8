# pool.pxi: included by _ext.pyx: ThreadPool, the persistent workers every kernel call
# may run on (pool.h), and _pool_ptr, the C pool of a ThreadPool argument.


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
