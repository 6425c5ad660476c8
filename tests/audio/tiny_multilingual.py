"""A tiny random multilingual Whisper, for what whisper-tiny.en (English-only)
cannot test: language detection and the <|startoftranscript|> <|xx|> <|task|>
prompt. Its tokenizer is byte-level BPE over the 256 bytes and a few merges, then
Whisper's special tokens in a multilingual vocabulary's order (all 100 languages);
its weights are transformers' random initialization (seeded), converted by
CTranslate2's converter as faster-whisper's models are."""
from __future__ import annotations

import json
from pathlib import Path

from armllm.audio.tokens import LANGUAGES

MERGES = [("Ġ", "-"), ("Ġ", "'"), ("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("Ġ", "a"),
          ("i", "n"), ("Ġ", "("), ("Ġ", "[")]
SPECIALS = (["<|endoftext|>", "<|startoftranscript|>"] + [f"<|{c}|>" for c in LANGUAGES]
            + ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>",
               "<|nospeech|>", "<|notimestamps|>"])


def _byte_chars() -> list[str]:
    """GPT-2's byte-level alphabet: byte b is shown as this character."""
    shown = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
             *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in shown:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def build_tokenizer():
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    vocab = {c: i for i, c in enumerate(_byte_chars())}
    for a, b in MERGES:
        vocab[a + b] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab, MERGES))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in SPECIALS])
    return tokenizer


def build_model(directory: Path) -> tuple[Path, int]:
    """The CTranslate2 model directory (model.bin, config.json, vocabulary.json,
    tokenizer.json) and its vocabulary size."""
    import ctranslate2
    import torch
    import transformers
    tokenizer = build_tokenizer()
    n_text = tokenizer.get_vocab_size() - len(SPECIALS)
    eot, sot = n_text, n_text + 1
    no_timestamps = n_text + len(SPECIALS) - 1
    vocab_size = no_timestamps + 1 + 1501
    config = transformers.WhisperConfig(
        vocab_size=vocab_size, num_mel_bins=80, d_model=64, encoder_layers=2,
        encoder_attention_heads=2, decoder_layers=2, decoder_attention_heads=2,
        encoder_ffn_dim=128, decoder_ffn_dim=128, max_source_positions=1500,
        max_target_positions=448, decoder_start_token_id=sot, bos_token_id=eot,
        eos_token_id=eot, pad_token_id=eot, init_std=0.3)
    torch.manual_seed(0)
    model = transformers.WhisperForConditionalGeneration(config).eval()
    generation = model.generation_config
    generation.suppress_tokens = []
    generation.begin_suppress_tokens = [tokenizer.token_to_id("Ġ"), eot]
    generation.lang_to_id = {f"<|{c}|>": sot + 1 + i for i, c in enumerate(LANGUAGES)}
    generation.alignment_heads = [[1, 0], [1, 1]]
    generation.no_timestamps_token_id = no_timestamps
    hf_dir = directory / "hf"
    model.save_pretrained(hf_dir)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer).save_pretrained(hf_dir)
    ct2_dir = directory / "ct2"
    ctranslate2.converters.TransformersConverter(
        str(hf_dir), copy_files=["tokenizer.json"]).convert(str(ct2_dir), force=True)
    # the converter reads the language ids from a generation config that no longer
    # keeps lang_to_id (transformers 5): write them as it would
    config_path = ct2_dir / "config.json"
    config_json = json.loads(config_path.read_text())
    config_json["lang_ids"] = sorted(generation.lang_to_id.values())
    config_path.write_text(json.dumps(config_json))
    # CTranslate2 takes a vocabulary for multilingual when it holds the token "" (as
    # the real multilingual one does): give byte 0's token that name, on its side only
    vocabulary_path = ct2_dir / "vocabulary.json"
    vocabulary = json.loads(vocabulary_path.read_text())
    vocabulary[0] = ""
    vocabulary_path.write_text(json.dumps(vocabulary))
    return ct2_dir, vocab_size
