"""armllm: a CPU-first LLM inference and serving engine.

Importing the package keeps numpy's OpenBLAS to one thread (unless the user
chose otherwise) so that it never competes with armllm's own thread pool.
"""
from armllm import _blas_threads

_blas_threads.keep_blas_single_threaded()

__version__ = "0.1.0"
