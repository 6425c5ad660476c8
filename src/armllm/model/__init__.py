"""Model loading and architectures: config, tokenizer, weights (safetensors,
GGUF), and one flat file per architecture family."""
