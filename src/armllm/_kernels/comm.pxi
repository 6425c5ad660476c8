# comm.pxi: included by _ext.pyx (it uses _array, _addr and _writable): the
# shared-memory all-reduce and broadcast of tensor-parallel ranks (comm.h), for
# engine/comm.py.

cdef extern from "comm.h" nogil:
    size_t armllm_comm_segment_bytes(int ranks, int64_t max_floats)
    void armllm_comm_init(void *segment, int ranks, int64_t max_floats)
    int armllm_comm_check(const void *segment, int ranks, int64_t max_floats)
    int armllm_comm_allreduce(void *segment, int rank, float *data, int64_t n)
    float *armllm_comm_staging(void *segment, int rank, int64_t n)
    int armllm_comm_allreduce_staged(void *segment, int rank, float *data, int64_t n)
    int armllm_comm_broadcast(void *segment, int rank, void *data, int64_t nbytes)
    int armllm_comm_gather_cols(void *segment, int rank, float *data, int64_t rows,
                                int64_t ld, const int64_t *col_start)
    void armllm_comm_abort(void *segment)
    const char *armllm_comm_atomic_impl()
    int ARMLLM_COMM_MAX_RANKS


class CommAborted(RuntimeError):
    """A tensor-parallel collective ended because its segment was aborted (a rank
    failed)."""


cdef int _comm_ok(int rc) except -1:
    if rc != 0:
        raise CommAborted("tensor-parallel communication was aborted: a rank failed")
    return 0


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


def comm_init(segment, int ranks, int64_t max_floats):
    """Lays out a zeroed shared segment (a uint8 array over it) for the all-reduce."""
    armllm_comm_init(_segment(segment, ranks, max_floats), ranks, max_floats)


cdef class Comm:
    """Rank `rank`'s handle on a segment comm_init laid out for `ranks` ranks and
    slices of max_floats (comm.h): the collectives, which every rank calls in the
    same order with the same sizes. A DecoderLayer given one all-reduces its o and
    down projections' outputs through it."""
    cdef void *seg
    cdef readonly int rank, ranks
    cdef readonly int64_t max_floats
    cdef object keep

    def __init__(self, segment, int rank, int ranks, int64_t max_floats):
        self.seg = _segment(segment, ranks, max_floats)
        if armllm_comm_check(self.seg, ranks, max_floats) != 0:
            raise ValueError(f"segment is not an all-reduce segment for {ranks} ranks and "
                             f"{max_floats} floats")
        if not 0 <= rank < ranks:
            raise ValueError(f"rank must be in [0, {ranks}), got {rank}")
        self.keep, self.rank, self.ranks, self.max_floats = segment, rank, ranks, max_floats

    def allreduce(self, data):
        """Sums the float32 array `data` over the ranks in place; every rank calls it
        with arrays of the same length."""
        cdef cnp.ndarray da = _array(data, "data", np.float32, 1)
        _writable(da, "data")
        cdef float *dp = <float *>cnp.PyArray_DATA(da)
        cdef int64_t n = da.shape[0]
        cdef int rc
        with nogil:
            rc = armllm_comm_allreduce(self.seg, self.rank, dp, n)
        _comm_ok(rc)

    def staging(self, int64_t n):
        """A float32 [n] view of where this rank's values for its next all-reduce of
        n floats go to skip the copy in (allreduce_staged), or None where that
        all-reduce does not take the one-barrier path (comm.h)."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        cdef float *sp = armllm_comm_staging(self.seg, self.rank, n)
        if sp == NULL:
            return None
        base = np.asarray(self.keep)
        offset = <char *>sp - <char *>cnp.PyArray_DATA(base)
        return base[offset:offset + 4 * n].view(np.float32)

    def allreduce_staged(self, data):
        """allreduce of the values this rank wrote into staging(len(data)): the sum
        lands in the float32 array `data`."""
        cdef cnp.ndarray da = _array(data, "data", np.float32, 1)
        _writable(da, "data")
        cdef int64_t n = da.shape[0]
        if n < 1 or armllm_comm_staging(self.seg, self.rank, n) == NULL:
            raise ValueError(f"an all-reduce of {n} floats has no staging buffer")
        cdef float *dp = <float *>cnp.PyArray_DATA(da)
        cdef int rc
        with nogil:
            rc = armllm_comm_allreduce_staged(self.seg, self.rank, dp, n)
        _comm_ok(rc)

    def broadcast(self, data):
        """Copies rank 0's array `data` (any dtype, contiguous) into every other rank's
        array of the same size; every rank calls it with the same byte size."""
        if not isinstance(data, cnp.ndarray) or not data.flags.c_contiguous:
            raise ValueError("data must be a C-contiguous numpy array")
        cdef cnp.ndarray da = <cnp.ndarray>data
        if self.rank != 0:
            _writable(da, "data")
        cdef void *dp = cnp.PyArray_DATA(da)
        cdef int64_t nbytes = da.nbytes
        cdef int rc
        with nogil:
            rc = armllm_comm_broadcast(self.seg, self.rank, dp, nbytes)
        _comm_ok(rc)

    def gather_cols(self, data, col_start):
        """Gathers each rank's columns of a float32 [rows, cols] matrix onto rank 0:
        `data` is this rank's block, columns col_start[r]..col_start[r + 1] (rank 0:
        the whole matrix, its own block first); col_start (int64 [ranks + 1]) and the
        row count are the same on every rank."""
        cdef cnp.ndarray ca = _array(col_start, "col_start", np.int64, 1)
        if ca.shape[0] != self.ranks + 1:
            raise ValueError(f"col_start must have ranks + 1 = {self.ranks + 1} entries, got "
                             f"{ca.shape[0]}")
        cdef const int64_t *cs = <const int64_t *>cnp.PyArray_DATA(ca)
        cdef int64_t r, widest = 0
        for r in range(self.ranks):
            if cs[r + 1] < cs[r] or cs[0] != 0:
                raise ValueError(f"col_start must rise from 0, got {list(col_start)}")
            widest = max(widest, cs[r + 1] - cs[r])
        if widest > self.max_floats:
            raise ValueError(f"a block of {widest} columns exceeds the segment's "
                             f"{self.max_floats} floats")
        cdef cnp.ndarray da = _array(data, "data", np.float32, 2)
        _writable(da, "data")
        want = cs[self.ranks] if self.rank == 0 else cs[self.rank + 1] - cs[self.rank]
        if da.shape[1] != want:
            raise ValueError(f"rank {self.rank}'s data must have {want} columns, got shape "
                             f"{_shp(da)}")
        cdef float *dp = <float *>cnp.PyArray_DATA(da)
        cdef int64_t rows = da.shape[0], ld = _ld(da)
        cdef int rc
        with nogil:
            rc = armllm_comm_gather_cols(self.seg, self.rank, dp, rows, ld, cs)
        _comm_ok(rc)

    def abort(self):
        """Every rank's collective, now and later, raises CommAborted (a rank failed)."""
        armllm_comm_abort(self.seg)


def comm_atomic_impl():
    """The fetch-add the all-reduce's barriers use on this CPU."""
    return armllm_comm_atomic_impl().decode()
