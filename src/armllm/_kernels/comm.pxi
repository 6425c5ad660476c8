# comm.pxi: included by _ext.pyx (it uses _array, _addr and _writable): the
# shared-memory all-reduce and broadcast of tensor-parallel ranks (comm.h), for
# engine/comm.py.

cdef extern from "comm.h" nogil:
    size_t armllm_comm_segment_bytes(int ranks, int64_t max_floats)
    void armllm_comm_init(void *segment, int ranks, int64_t max_floats)
    int armllm_comm_check(const void *segment, int ranks, int64_t max_floats)
    void armllm_comm_allreduce(void *segment, int rank, float *data, int64_t n)
    void armllm_comm_broadcast(void *segment, int rank, void *data, int64_t nbytes)
    const char *armllm_comm_atomic_impl()
    int ARMLLM_COMM_MAX_RANKS


def comm_segment_bytes(int ranks, int64_t max_floats):
    """Bytes of an all-reduce segment for `ranks` ranks and slices of max_floats (comm.h)."""
    if not 1 <= ranks <= ARMLLM_COMM_MAX_RANKS:
        raise ValueError(f"ranks must be in [1, {ARMLLM_COMM_MAX_RANKS}], got {ranks}")
    if max_floats < 1:
        raise ValueError(f"max_floats must be >= 1, got {max_floats}")
    return armllm_comm_segment_bytes(ranks, max_floats)


cdef void *_segment(object segment, int ranks, int64_t max_floats) except NULL:
    cdef cnp.ndarray sa = _array(segment, "segment", np.uint8, 1)
    _writable(sa, "segment")
    cdef size_t need = comm_segment_bytes(ranks, max_floats)
    if <size_t>sa.shape[0] < need or _addr(sa) % 64:
        raise ValueError(f"segment must be 64-byte aligned and hold {need} bytes, got "
                         f"{sa.shape[0]}")
    return cnp.PyArray_DATA(sa)


cdef void *_rank_segment(object segment, int rank, int ranks, int64_t max_floats) except NULL:
    """A segment comm_init laid out for ranks and max_floats, used by rank `rank`."""
    cdef void *seg = _segment(segment, ranks, max_floats)
    if armllm_comm_check(seg, ranks, max_floats) != 0:
        raise ValueError(f"segment is not an all-reduce segment for {ranks} ranks and "
                         f"{max_floats} floats")
    if not 0 <= rank < ranks:
        raise ValueError(f"rank must be in [0, {ranks}), got {rank}")
    return seg


def comm_init(segment, int ranks, int64_t max_floats):
    """Lays out a zeroed shared segment (a uint8 array over it) for the all-reduce."""
    armllm_comm_init(_segment(segment, ranks, max_floats), ranks, max_floats)


def comm_allreduce(segment, int rank, int ranks, int64_t max_floats, data):
    """Sums the float32 array `data` over the ranks in place (comm.h); every rank calls
    it with arrays of the same length. The segment must have been laid out by
    comm_init for the same ranks and max_floats."""
    cdef void *seg = _rank_segment(segment, rank, ranks, max_floats)
    cdef cnp.ndarray da = _array(data, "data", np.float32, 1)
    _writable(da, "data")
    cdef float *dp = <float *>cnp.PyArray_DATA(da)
    cdef int64_t n = da.shape[0]
    with nogil:
        armllm_comm_allreduce(seg, rank, dp, n)


def comm_broadcast(segment, int rank, int ranks, int64_t max_floats, data):
    """Copies rank 0's array `data` (any dtype, contiguous) into every other rank's
    array of the same size (comm.h); every rank calls it with the same byte size."""
    cdef void *seg = _rank_segment(segment, rank, ranks, max_floats)
    if not isinstance(data, cnp.ndarray) or not data.flags.c_contiguous:
        raise ValueError("data must be a C-contiguous numpy array")
    cdef cnp.ndarray da = <cnp.ndarray>data
    if rank != 0:
        _writable(da, "data")
    cdef void *dp = cnp.PyArray_DATA(da)
    cdef int64_t nbytes = da.nbytes
    with nogil:
        armllm_comm_broadcast(seg, rank, dp, nbytes)


def comm_atomic_impl():
    """The fetch-add the all-reduce's barriers use on this CPU."""
    return armllm_comm_atomic_impl().decode()
