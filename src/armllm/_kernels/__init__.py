"""C kernels, the thread pool and CPU dispatch; reached only through armllm.ops."""
