"""armllm: a CPU-first LLM inference and serving engine.

Importing the package keeps numpy's OpenBLAS to one thread (unless the user
chose otherwise) so that it never competes with armllm's own thread pool.
"""
from armllm import _blas_threads

_blas_threads.keep_blas_single_threaded()

__version__ = "0.1.0"
__all__ = ["LLM", "AsyncLLM", "SamplingParams", "RequestOutput", "CompletionOutput",
           "EmbeddingOutput", "ScoreOutput", "EngineArgs", "TranscribeOptions"]


def __getattr__(name: str):
    """The public API, imported on first use so that `import armllm` stays light."""
    if name in ("LLM", "AsyncLLM", "RequestOutput", "CompletionOutput", "EmbeddingOutput",
                "ScoreOutput", "EngineArgs", "TranscribeOptions"):
        from armllm import api
        return getattr(api, name)
    if name == "SamplingParams":
        from armllm.sampling import SamplingParams
        return SamplingParams
    raise AttributeError(f"module 'armllm' has no attribute {name!r}")
