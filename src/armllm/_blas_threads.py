"""Keeps numpy's BLAS (OpenBLAS) from starting threads that compete with the pool.

armllm never calls BLAS on a hot path, but numpy loads OpenBLAS, which by
default starts one thread per core. Before numpy is imported, setting
OPENBLAS_NUM_THREADS=1 (unless the user set it) prevents that; if numpy is
already loaded, OpenBLAS is told through its own C entry point.
"""
from __future__ import annotations

import ctypes
import os
import sys

_SETTERS = ("openblas_set_num_threads", "scipy_openblas_set_num_threads64_",
            "openblas_set_num_threads64_", "scipy_openblas_set_num_threads")
_GETTERS = ("openblas_get_num_threads", "scipy_openblas_get_num_threads64_",
            "openblas_get_num_threads64_", "scipy_openblas_get_num_threads")


def _loaded_openblas() -> list[str]:
    """Paths of OpenBLAS libraries mapped into this process."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower()}
    except OSError:
        return []
    return sorted(p for p in paths if p.startswith("/"))


def _call_first(names: tuple[str, ...], *args: int) -> int | None:
    for path in _loaded_openblas():
        lib = ctypes.CDLL(path)
        for name in names:
            fn = getattr(lib, name, None)
            if fn is not None:
                return fn(*args)
    return None


def set_blas_threads(n: int) -> bool:
    """Sets the loaded OpenBLAS's thread count; False if none is loaded."""
    return _call_first(_SETTERS, int(n)) is not None or False


def blas_threads() -> int | None:
    """The loaded OpenBLAS's thread count, or None if none is loaded."""
    return _call_first(_GETTERS)


def keep_blas_single_threaded() -> None:
    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    elif "OPENBLAS_NUM_THREADS" not in os.environ:
        set_blas_threads(1)
