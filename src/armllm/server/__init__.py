"""The OpenAI-compatible HTTP server (`armllm serve`): a thin Starlette front
end over the engine thread."""
