"""The OpenAI-compatible HTTP server (`armllm serve`): a thin Starlette front
end that talks to the engine only through AsyncLLM (routes → AsyncLLM →
engine thread → LLMEngine)."""
