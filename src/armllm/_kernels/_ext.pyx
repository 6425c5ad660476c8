# cython: language_level=3
"""_ext: nogil glue between Python and the C kernels.

Owns the argument validation every wrapper shares (dtype, shape, contiguity,
aliasing; a ValueError naming the bad argument). Each family's wrappers live in
their own .pxi, included below: dispatch (CPU features, kernel tables), pool
(ThreadPool), gemm, quant, gguf, elementwise, attn, gdn and sample_slots (Kernels,
one variant's dispatch table), sample (RowSampler: a step's rows to tokens), probe,
comm, layer (a decoder layer as one call), head (the final norm and lm_head) and
moe. Every kernel call releases the GIL and never allocates: outputs are passed in.
"""
cimport numpy as cnp
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t

import numpy as np

cnp.import_array()


include "abi.pxi"


# -------------------------------------------------------------- validation


cdef inline int _typenum(object dtype):
    """numpy's type number of a scalar type (identity checks first: the hot path)."""
    if dtype is np.float32:
        return cnp.NPY_FLOAT32
    if dtype is np.int8:
        return cnp.NPY_INT8
    if dtype is np.int32:
        return cnp.NPY_INT32
    if dtype is np.uint16:
        return cnp.NPY_UINT16
    return np.dtype(dtype).num


cdef cnp.ndarray _array(object a, str name, object dtype, int ndim):
    """a as an ndarray of dtype and ndim whose rows are contiguous."""
    if not isinstance(a, cnp.ndarray):
        raise ValueError(f"{name} must be a numpy array, got {type(a).__name__}")
    cdef cnp.ndarray arr = <cnp.ndarray>a
    if cnp.PyArray_TYPE(arr) != _typenum(dtype):
        raise ValueError(f"{name} must have dtype {np.dtype(dtype).name}, got {arr.dtype}")
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {_shp(arr)}")
    cdef int i
    for i in range(ndim):
        if arr.shape[i] == 0:
            raise ValueError(f"{name} has a zero-size dimension: shape {_shp(arr)}")
    if arr.strides[ndim - 1] != arr.itemsize:
        raise ValueError(f"{name} must have contiguous rows (last stride {arr.strides[ndim - 1]}"
                         f" bytes, expected {arr.itemsize})")
    if ndim == 2 and (arr.strides[0] % arr.itemsize != 0 or arr.strides[0] < arr.shape[1] * arr.itemsize):
        raise ValueError(f"{name} has an unsupported row stride of {arr.strides[0]} bytes")
    if not cnp.PyArray_ISALIGNED(arr):
        raise ValueError(f"{name} is not aligned to its element size")
    return arr


cdef object _shp(cnp.ndarray arr):
    return tuple(arr.shape[i] for i in range(arr.ndim))


cdef inline void _writable(cnp.ndarray arr, str name) except *:
    if not cnp.PyArray_ISWRITEABLE(arr):
        raise ValueError(f"{name} is read-only")


cdef inline int64_t _ld(cnp.ndarray arr):
    """Row stride in elements of a 2-D array."""
    return arr.strides[0] // arr.itemsize


cdef inline uintptr_t _addr(cnp.ndarray arr):
    return <uintptr_t>cnp.PyArray_DATA(arr)


cdef uintptr_t _span(cnp.ndarray a):
    """Bytes from the first to one past the last element of a (rows may be strided)."""
    if a.ndim == 1:
        return <uintptr_t>(a.shape[0] * a.itemsize)
    return <uintptr_t>((a.shape[0] - 1) * a.strides[0] + a.shape[1] * a.itemsize)


cdef void _no_overlap(cnp.ndarray a, str a_name, cnp.ndarray b, str b_name) except *:
    """Raises unless the memory spans of a and b are disjoint."""
    cdef uintptr_t a0 = _addr(a), b0 = _addr(b)
    if a0 < b0 + _span(b) and b0 < a0 + _span(a):
        raise ValueError(f"{a_name} and {b_name} must not overlap")


cdef void _same_or_disjoint(cnp.ndarray out, str out_name, cnp.ndarray src, str src_name) except *:
    """out may be exactly src (same start and stride) or must not overlap it."""
    if _addr(out) == _addr(src) and out.strides[0] == src.strides[0]:
        return
    _no_overlap(out, out_name, src, src_name)


# ---------------------------------------------------------------- families
#
# Kernels is one class built family by family: each .pxi's class extends the one
# before it with its slots' wrappers (Cython allows no include inside a class body).

include "dispatch.pxi"
include "pool.pxi"
include "gemm.pxi"
include "quant.pxi"
include "gguf.pxi"
include "elementwise.pxi"
include "attn.pxi"
include "gdn.pxi"
include "sample_slots.pxi"


cdef class Kernels(_SampleKernels):
    """One kernel variant's dispatch table ("ref", "avx2", "neon", ...) with a typed
    wrapper per slot: dispatch.pxi, gemm.pxi, quant.pxi, gguf.pxi, elementwise.pxi,
    attn.pxi, gdn.pxi and sample_slots.pxi each add a family's."""


include "sample.pxi"
include "probe.pxi"
include "comm.pxi"
include "linear.pxi"
include "batch.pxi"
include "layer.pxi"
include "head.pxi"
include "moe.pxi"
include "delta.pxi"
