"""Benchmarks behind `armllm bench`."""
