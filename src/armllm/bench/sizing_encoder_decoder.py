"""sizing_encoder_decoder: what serving an encoder-decoder (a config with an
EncoderShape: Whisper) takes, from its config and tensor headers alone, as
model/whisper.py loads it and build_engine sizes it: the encoder's and the decoder's
parameters and packed bytes, the decoder's paged KV cache, the cross-attention pool
(state_bytes: one slot of every decoder layer's cross K/V a running sequence), the
decoder's workspace (WhisperWorkspace.nbytes), and a decode-step bound for the
decoder. `armllm plan` prints it (bench/plan.py); sizing.py does decoder-only models.

Decode, per step of b sequences, reads the decoder's linear weights and its packed
token embedding (the logits GEMM) once, and per sequence an embedding row, its self
KV at the average context (max_model_len / 2) and the cross K/V of its window (every
decoder layer's, over all encoder frames). The encoder runs once per 30 s window,
a prefill-like compute-bound pass, and is not in that bound."""
from __future__ import annotations

from pathlib import Path

from armllm import ops
from armllm.bench import sizing
from armllm.bench.sizing import ITEM_BYTES, PROCESS_BYTES, format_name
from armllm.engine.args import DEFAULT_KV_FRACTION, WEIGHT_DTYPES, EngineArgs
from armllm.model.arch.whisper import DEC, ENC, ct2_tensor
from armllm.model.config import ModelConfig
from armllm.model.kv_cache import (
    KV_DTYPE_BYTES,
    bytes_per_block,
    check_kv_dtype,
    state_bytes,
    state_slots,
)
from armllm.model.quantize import Scheme, parse_scheme
from armllm.model.sources import QuantFormat
from armllm.model.whisper import WhisperWorkspace, is_ct2_dir

W8A8_AS_STORED = QuantFormat(8, 0)   # CTranslate2's int8 rows, run as stored


def linear_bytes(n: int, k: int, dense: str, fmt: QuantFormat | None) -> int:
    """sizing.linear_bytes, with a dense weight in this variant's panels: Whisper's
    vocabularies (51864, 51865, 51866 rows) are not a whole number of them."""
    if fmt is None:
        return ops.kernels().dense_packed_len(n, k, dense)
    return sizing.linear_bytes(n, k, dense, fmt)


def _stored_int8(path: Path, c: ModelConfig):
    """Whether a Hugging Face tensor name is stored as int8 (a CTranslate2 int8
    conversion), from model.bin's header."""
    if not is_ct2_dir(path):
        return lambda name: False
    from armllm.model.ctranslate2 import CT2File
    file = CT2File(path / "model.bin")
    return lambda name: file.variable(ct2_tensor(name, c.hidden_size)[0]).dtype == "int8"


def _linears(c: ModelConfig) -> dict[str, list[tuple[str, list[str], int, int]]]:
    """The packed linear weights of the encoder and the decoder, as load_whisper stacks
    them: (what, the Hugging Face weights stacked by rows, N, K)."""
    e, h = c.encoder, c.hidden_size

    def attention(p: str) -> list[tuple[str, list[str], int, int]]:
        return [("qkv", [f"{p}{x}_proj.weight" for x in "qkv"], 3 * h, h),
                ("out", [f"{p}out_proj.weight"], h, h)]

    def mlp(p: str, ffn: int) -> list[tuple[str, list[str], int, int]]:
        return [("fc1", [f"{p}fc1.weight"], ffn, h), ("fc2", [f"{p}fc2.weight"], h, ffn)]

    encoder = []
    for i in range(e.layers):
        p = f"{ENC}layers.{i}."
        encoder += attention(p + "self_attn.") + mlp(p, e.ffn)
    decoder = []
    for i in range(c.num_layers):
        p, x = f"{DEC}layers.{i}.", f"{DEC}layers.{i}.encoder_attn."
        decoder += attention(p + "self_attn.") + [
            ("cross_q", [x + "q_proj.weight"], h, h),
            ("cross_kv", [x + "k_proj.weight", x + "v_proj.weight"], 2 * h, h),
            ("cross_out", [x + "out_proj.weight"], h, h)] + mlp(p, c.intermediate_size)
    return {"encoder": encoder, "decoder": decoder}


def param_counts(c: ModelConfig) -> dict:
    """The checkpoint's parameters (Hugging Face's: k_proj has no bias; the lm_head is
    the token embedding), of the encoder and of the decoder."""
    e, h = c.encoder, c.hidden_size
    attention = 4 * h * h + 3 * h   # q, k, v, out; biases of q, v, out
    enc_layer = attention + 2 * e.ffn * h + e.ffn + h + 2 * 2 * h
    dec_layer = 2 * attention + 2 * c.intermediate_size * h + c.intermediate_size + h \
        + 3 * 2 * h
    encoder = (h * e.n_mels * 3 + h + h * h * 3 + h + e.positions * h
               + e.layers * enc_layer + 2 * h)
    decoder = (c.vocab_size * h + c.max_position_embeddings * h + c.num_layers * dec_layer
               + 2 * h)
    return {"encoder": encoder, "decoder": decoder, "encoder_per_layer": enc_layer,
            "decoder_per_layer": dec_layer, "embedding": c.vocab_size * h,
            "total": encoder + decoder}


def weight_bytes(path: Path, c: ModelConfig, dense: str, quantization: str | Scheme
                 ) -> tuple[dict, dict[str, int]]:
    """Resident bytes as load_whisper packs them (WhisperWeights.encoder_nbytes and
    decoder_nbytes): linear weights int8 as stored (CTranslate2), else quantized by a
    scheme or in `dense`; the convs in `dense`; biases, norms and positions float32;
    the token embedding in `dense` plus its packed copy for the logits GEMM. Also how
    many linear weights run in each format."""
    e, h = c.encoder, c.hidden_size
    int8 = _stored_int8(path, c)
    formats: dict[str, int] = {}

    def fmt(names: list[str]) -> QuantFormat | None:
        if quantization != "none" and all(int8(n) for n in names):
            return W8A8_AS_STORED
        if isinstance(quantization, Scheme):
            return QuantFormat(quantization.bits, quantization.group)
        return None

    def packed(names: list[str], n: int, k: int) -> int:
        f = fmt(names)
        label = format_name(f, dense) + (" (as stored)" if f is W8A8_AS_STORED else "")
        formats[label] = formats.get(label, 0) + 1
        return linear_bytes(n, k, dense, f)

    linears = _linears(c)
    f32 = ITEM_BYTES["f32"]
    enc_linear = sum(packed(names, n, k) + f32 * n for _, names, n, k in linears["encoder"])
    dec_linear = sum(packed(names, n, k) + f32 * n for _, names, n, k in linears["decoder"])
    convs = (linear_bytes(h, e.n_mels * 3, dense, None) + linear_bytes(h, 3 * h, dense, None)
             + 2 * f32 * h)
    encoder = (convs + f32 * e.positions * h + enc_linear
               + f32 * 2 * h * (2 * e.layers + 1))
    embedding = c.vocab_size * h * ITEM_BYTES[dense]
    lm_head = packed([f"{DEC}embed_tokens.weight"], c.vocab_size, h)
    decoder = (embedding + f32 * c.max_position_embeddings * h + dec_linear
               + f32 * 2 * h * (3 * c.num_layers + 1) + lm_head)
    return ({"encoder": encoder, "decoder": decoder, "embedding": embedding,
             "lm_head": lm_head, "decoder_linear": dec_linear, "total": encoder + decoder},
            dict(sorted(formats.items())))


def make_plan(path: Path, c: ModelConfig, engine: EngineArgs, max_model_len: int,
              bandwidth_gbs: float | None = None, mem_available: int | None = None) -> dict:
    """Every figure of an encoder-decoder's plan, in bytes, seconds and tokens."""
    dense, seqs, block = WEIGHT_DTYPES[engine.dtype], engine.max_num_seqs, engine.block_size
    dtype = engine.kv_cache_dtype
    check_kv_dtype(c, dtype)
    quantization = engine.quantization if engine.quantization in ("auto", "none") else \
        parse_scheme(engine.quantization)
    weights, formats = weight_bytes(path, c, dense, quantization)
    # the cross-attention pool: a slot a running sequence, taken from the KV budget
    live, _ = state_slots(c, seqs, engine.enable_prefix_caching)
    cross = state_bytes(c, live, dtype)
    per_block = bytes_per_block(c, c.num_layers, block, dtype)
    blocks_per_seq = -(-max_model_len // block)
    if engine.kv_cache_gib is not None:   # as build_engine sizes it
        kv_blocks = int((engine.kv_cache_gib * 2**30 - cross) // per_block)
        kv_source = "--kv-cache-gib"
    else:
        kv_blocks = seqs * blocks_per_seq
        kv_source = "--max-num-seqs sequences at --max-model-len"
    workspace = WhisperWorkspace.nbytes(c, engine.max_num_batched_tokens, seqs,
                                        max_seq_len=max_model_len)
    overhead = workspace + PROCESS_BYTES
    total = weights["total"] + kv_blocks * per_block + cross + overhead
    kv_item = KV_DTYPE_BYTES[dtype]
    cross_slot = cross // live
    plan = {
        "kernel_variant": ops.selected_isa(), "max_model_len": max_model_len,
        "max_num_seqs": seqs, "weight_dtype": dense, "quantization": engine.quantization,
        "kv_cache_dtype": dtype, "linear_formats": formats,
        "params": param_counts(c), "weight_bytes": weights,
        "kv_cache": {"bytes_per_token": per_block // block, "block_size": block,
                     "blocks_per_sequence": blocks_per_seq, "blocks": kv_blocks,
                     "sized_by": kv_source, "self_attention_bytes": kv_blocks * per_block,
                     "bytes": kv_blocks * per_block + cross,
                     "sequences_at_full_length": kv_blocks / blocks_per_seq,
                     "kv_cache_gib_flag": -(-(seqs * blocks_per_seq * per_block + cross)
                                            * 100 // 2**30) / 100},
        "cross_attention_pool": {"slots": live, "bytes_per_slot": cross_slot,
                                 "layers": c.num_layers, "encoder_frames": c.encoder.positions,
                                 "bytes": cross},
        "overhead": {"max_num_batched_tokens": engine.max_num_batched_tokens,
                     "workspace_bytes": workspace, "process_bytes": PROCESS_BYTES,
                     "bytes": overhead},
        "total_bytes": total, "mem_available_bytes": mem_available,
    }
    if mem_available is not None:
        plan["fits"] = total <= mem_available
        room = mem_available - weights["total"] - overhead
        plan["max_concurrency_that_fits"] = max(0, room // (blocks_per_seq * per_block
                                                           + cross_slot))
        if engine.kv_cache_gib is None:   # serve caps its default KV cache (size_kv_cache)
            cap = int(max(0, (mem_available - weights["total"]) * DEFAULT_KV_FRACTION
                          - cross) // per_block)
            plan["kv_cache"]["serve_default_cap_blocks"] = cap
    context = max_model_len // 2
    row = weights["embedding"] // c.vocab_size
    step_weights = weights["decoder"] - weights["embedding"]   # the embedding: a row each

    def step(batch: int) -> dict:
        kv = batch * context * (per_block // block)
        nbytes = step_weights + batch * (row + cross_slot) + kv
        d = {"batch": batch, "bytes": nbytes, "weight_bytes": step_weights + batch * row,
             "kv_bytes": kv, "cross_bytes": batch * cross_slot}
        if bandwidth_gbs:
            t = nbytes / (bandwidth_gbs * 1e9)
            d.update(min_step_s=t, max_tokens_per_s=batch / t)
        return d

    plan["decode"] = {"bandwidth_gbs": bandwidth_gbs, "context": max_model_len / 2,
                      "batch_1": step(1), "batch_c": step(seqs),
                      "cross_bytes_per_token": 2 * c.num_layers * c.hidden_size * kv_item}
    return plan


def assumptions(p: dict) -> list[str]:
    return [
        "linear weights as model/whisper.py packs them: a CTranslate2 int8 weight as stored "
        "(W8A8), else quantized by --quantization's scheme or in --dtype; the convs in "
        "--dtype; biases, norms and positions f32; the token embedding in --dtype and once "
        "more packed for the logits GEMM",
        f"KV cache: {p['kv_cache']['sized_by']}, in whole {p['kv_cache']['block_size']}-token "
        "blocks, plus the cross-attention pool: a slot of every decoder layer's K and V of "
        "one window per running sequence, taken from the same budget",
        f"overhead: the decoder's workspace (WhisperWorkspace.nbytes) for "
        f"{p['overhead']['max_num_batched_tokens']} batched tokens, and "
        f"{p['overhead']['process_bytes'] >> 20} MiB for the Python process; the encoder's "
        "activations for a window are allocated when it runs, not counted here",
        "decode bound: the decoder's weights once per step, and per sequence an embedding "
        "row, its self-attention KV at half of --max-model-len and its window's cross K/V; "
        "the encoder (once per 30 s window, compute-bound) is not in it",
    ]
