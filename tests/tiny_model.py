"""Writes tiny random-weight Llama-family checkpoints (config.json,
model.safetensors, tokenizer.json) with numpy alone, for fast engine tests."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from tests.gguf_blocks import BLOCKS, RANDOM_ONLY, TYPICAL, random_blocks

WORDS = [f"w{i}" for i in range(120)]
SPECIALS = ["<s>", "</s>"]


def write_tiny_llama(path: Path, seed: int = 0, hidden: int = 64, layers: int = 2,
                     heads: int = 4, kv_heads: int = 2, inter: int = 96,
                     max_position: int = 512) -> Path:
    vocab = len(SPECIALS) + len(WORDS)
    _write_weights(path, vocab, seed, hidden, layers, heads, kv_heads, inter,
                   max_position=max_position)
    vocab_map = {t: i for i, t in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab_map, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.add_special_tokens(SPECIALS)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": False,
         "chat_template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
                          "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"}))
    return path


# the special tokens of write_tiny_chat_llama's tokenizer, after its 256 byte tokens
CHAT_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>"]  # not special (Qwen's)
CHAT_MERGES = [("\"", ":"), ("Ġ", "Ġ"), ("e", "r"), ("i", "n"), ("a", "n"), ("o", "n")]
# Qwen2.5's chat template, tools included (as transformers renders it)
QWEN_TEMPLATE = (Path(__file__).parent / "qwen_template.jinja")
# Qwen3.5's (Qwen3-Coder's XML tool calls, <think> opened by the generation prompt): a
# copy of llama.cpp's models/templates/Qwen3.5-4B.jinja
QWEN3_5_TEMPLATE = (Path(__file__).parent / "qwen3_5_template.jinja")


def write_tiny_chat_llama(path: Path, seed: int = 0, template: Path = QWEN_TEMPLATE) -> Path:
    """A tiny random Llama with a byte-level BPE tokenizer (any text, JSON included,
    has tokens), ChatML special tokens, Qwen's <think>/<tool_call> tokens and Qwen's
    chat template with tools (Qwen2.5's, or `template`): for structured outputs, tool
    calls and reasoning."""
    byte_tokens = list(pre_tokenizers.ByteLevel.alphabet())
    byte_tokens.sort(key=lambda c: ord(c))
    merged = ["".join(m) for m in CHAT_MERGES]
    vocab_list = byte_tokens + merged
    vocab_map = {t: i for i, t in enumerate(vocab_list)}
    tok = Tokenizer(models.BPE(vocab_map, [tuple(m) for m in CHAT_MERGES]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(CHAT_SPECIALS)
    tok.add_tokens(CHAT_ADDED)
    vocab = tok.get_vocab_size()
    _write_weights(path, vocab, seed, 64, 2, 4, 2, 96,
                   eos=tok.token_to_id("<|im_end|>"), bos=tok.token_to_id("<|endoftext|>"),
                   max_position=4096)  # byte-level tokens: tool prompts are long
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
         "add_bos_token": False, "chat_template": template.read_text()}))
    return path


THINKING_MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]


def write_tiny_thinking_llama(path: Path, seed: int = 0, think_at: int = 0,
                              end_at: int = 6) -> dict:
    """write_tiny_chat_llama's model made to think: its greedy answer to
    THINKING_MESSAGES (chat template, thinking on) starts with <think> (output
    position think_at) and closes it at position end_at, because the rows of the
    embedding and lm_head of the tokens it greedily writes there are swapped with
    those of <think> and </think> (swapping two tokens' rows swaps them wherever the
    model reads or writes them, and changes nothing else). Returns the greedy
    output ids (max 24 tokens) and the swapped pairs."""
    from safetensors.numpy import load_file

    from armllm import LLM
    from armllm.sampling import SamplingParams
    write_tiny_chat_llama(path, seed)
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)

    def run() -> tuple[list[int], list[int]]:
        llm = LLM(path, dtype="float32", kv_cache_dtype="f32", kv_cache_gib=0.01,
                  max_num_seqs=2)
        prompt = llm.chat_prompt(THINKING_MESSAGES)
        return prompt, llm.generate(prompt, greedy)[0].outputs[0].token_ids

    prompt, out = run()
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    start, end = tok.token_to_id("<think>"), tok.token_to_id("</think>")
    first_seen = {}
    for i, t in enumerate(out):
        first_seen.setdefault(t, i)
    a, b = out[think_at], out[end_at]
    assert first_seen[a] == think_at and first_seen[b] == end_at, out
    assert not {a, b, start, end} & set(prompt), prompt
    tensors = load_file(str(path / "model.safetensors"))
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        w = tensors[name]
        w[[a, start]] = w[[start, a]]
        w[[b, end]] = w[[end, b]]
    save_file(tensors, str(path / "model.safetensors"))
    swap = {a: start, start: a, b: end, end: b}
    prompt_after, out_after = run()
    assert prompt_after == prompt and out_after == [swap.get(t, t) for t in out]
    return {"output_ids": out_after, "start": start, "end": end}


def _write_weights(path: Path, vocab: int, seed: int, hidden: int, layers: int, heads: int,
                   kv_heads: int, inter: int, eos: int = 1, bos: int = 0,
                   max_position: int = 512) -> None:
    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    hd = hidden // heads

    def w(*shape, scale=None):
        return (rng.standard_normal(shape) * (scale or shape[-1] ** -0.5)).astype(np.float32)

    tensors = {"model.embed_tokens.weight": w(vocab, hidden, scale=1.0),
               "model.norm.weight": 1 + 0.1 * w(hidden, scale=1.0),
               "lm_head.weight": w(vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors.update({
            p + "input_layernorm.weight": 1 + 0.1 * w(hidden, scale=1.0),
            p + "post_attention_layernorm.weight": 1 + 0.1 * w(hidden, scale=1.0),
            p + "self_attn.q_proj.weight": w(heads * hd, hidden),
            p + "self_attn.k_proj.weight": w(kv_heads * hd, hidden),
            p + "self_attn.v_proj.weight": w(kv_heads * hd, hidden),
            p + "self_attn.o_proj.weight": w(hidden, heads * hd),
            p + "mlp.gate_proj.weight": w(inter, hidden),
            p + "mlp.up_proj.weight": w(inter, hidden),
            p + "mlp.down_proj.weight": w(hidden, inter),
        })
    save_file(tensors, str(path / "model.safetensors"))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": inter,
              "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": kv_heads, "max_position_embeddings": max_position,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
              "bos_token_id": bos, "eos_token_id": eos}
    (path / "config.json").write_text(json.dumps(config))


def write_tiny_gguf(path: Path, types: dict[str, str], seed: int = 0, hidden: int = 64,
                    layers: int = 2, heads: int = 4, kv_heads: int = 2, inter: int = 96,
                    vocab: int = 122, metadata: dict | None = None) -> Path:
    """A llama GGUF of random weights (no tokenizer) with the ggml type of each
    tensor in `types` (e.g. {"blk.0.attn_q.weight": "Q8_0"}; default F32), written
    and quantized by the gguf package (llama.cpp's); the types it cannot quantize
    (K-quants, IQ4) get random blocks of about the same magnitude
    (tests/gguf_blocks.py). token_embd is the tied head.
    `metadata` adds keys: str, bool, int (uint32), float (float32) or list values."""
    import gguf
    rng = np.random.default_rng(seed)
    hd = hidden // heads
    shapes = {"token_embd.weight": (vocab, hidden), "output_norm.weight": (hidden,)}
    for i in range(layers):
        p = f"blk.{i}."
        shapes.update({p + "attn_norm.weight": (hidden,), p + "ffn_norm.weight": (hidden,),
                       p + "attn_q.weight": (heads * hd, hidden),
                       p + "attn_k.weight": (kv_heads * hd, hidden),
                       p + "attn_v.weight": (kv_heads * hd, hidden),
                       p + "attn_output.weight": (hidden, heads * hd),
                       p + "ffn_gate.weight": (inter, hidden), p + "ffn_up.weight": (inter, hidden),
                       p + "ffn_down.weight": (hidden, inter)})
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in (("embedding_length", hidden), ("feed_forward_length", inter),
                       ("block_count", layers), ("attention.head_count", heads),
                       ("attention.head_count_kv", kv_heads), ("context_length", 256),
                       ("vocab_size", vocab)):
        writer.add_uint32(f"llama.{key}", value)
    for key, value in (metadata or {}).items():
        add = {str: writer.add_string, bool: writer.add_bool, int: writer.add_uint32,
               float: writer.add_float32, list: writer.add_array}[type(value)]
        add(key, value)
    tensors = {name: (rng.standard_normal(shape) * shape[-1] ** -0.5).astype(np.float32)
               for name, shape in shapes.items()}
    write_gguf_tensors(writer, tensors, types, rng)
    return path


def write_gguf_tensors(writer, tensors: dict[str, np.ndarray], types: dict[str, str],
                       rng: np.random.Generator) -> None:
    """Adds float tensors to a gguf.GGUFWriter in the ggml type `types` names for each
    (default F32): quantized by the gguf package, or for the types it cannot quantize
    (K-quants, IQ4) random blocks of about the same magnitude; then writes the file."""
    import gguf
    for name, data in tensors.items():
        qtype = getattr(gguf.GGMLQuantizationType, types.get(name, "F32"))
        if qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, np.ascontiguousarray(data, np.float32))
        elif qtype.name in RANDOM_ONLY:
            blocks = random_blocks(rng, qtype.name, data.size // BLOCKS[qtype.name][0],
                                   data.shape[-1] ** -0.5 / TYPICAL[qtype.name])
            writer.add_tensor(name, blocks.reshape(*data.shape[:-1], -1), raw_dtype=qtype)
        else:
            writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_gguf_model(path: Path, arch: str, keys: dict, tensors: dict[str, np.ndarray],
                     types: dict[str, str] | None = None, seed: int = 0) -> Path:
    """A GGUF of general.architecture `arch` without a tokenizer: `keys` (without the
    "arch." prefix; ints as uint32, floats as float32, strings) and the tensors (as
    write_gguf_tensors, in `types`)."""
    import gguf
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in keys.items():
        if isinstance(value, str):
            writer.add_string(f"{arch}.{key}", value)
        elif isinstance(value, float):
            writer.add_float32(f"{arch}.{key}", value)
        else:
            writer.add_uint32(f"{arch}.{key}", value)
    write_gguf_tensors(writer, tensors, types or {}, np.random.default_rng(seed))
    return path
