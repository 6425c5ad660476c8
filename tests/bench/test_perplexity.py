"""`armllm eval perplexity` on a tiny model: the number against Hugging Face
transformers computing the same sliding windows, and the engine flags honoured
(context capped by --max-model-len and --kv-cache-gib, windows prefilled in
chunks of --max-num-batched-tokens, --kv-cache-dtype used) or refused."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from armllm.cli import main
from armllm.model.arch import load_hf_config
from armllm.model.decoder import KVCache
from tests.tiny_model import WORDS, write_tiny_llama

CONTEXT, STRIDE, TOKENS = 48, 20, 150


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-ppl"))


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    rng = np.random.default_rng(5)
    path = tmp_path_factory.mktemp("text") / "words.txt"
    path.write_text(" ".join(WORDS[i] for i in rng.integers(0, len(WORDS), TOKENS)))
    return path


def run(capsys, tiny, text, *flags: str) -> dict:
    assert main(["eval", "perplexity", str(tiny), "--text", str(text), "--json",
                 "--dtype", "float32", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def transformers_perplexity(tiny, ids: list[int], context: int, stride: int) -> float:
    """The Hugging Face sliding-window recipe: each window scores the tokens the
    previous one did not."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float32)
    nll, scored, prev_end = 0.0, 0, 0
    for begin in range(0, len(ids) - 1, stride):
        end = min(begin + context, len(ids))
        window = torch.tensor([ids[begin:end]])
        with torch.no_grad():
            logp = torch.log_softmax(model(window).logits[0].double(), dim=-1)
        for row in range(max(prev_end, begin + 1) - begin - 1, end - begin - 1):
            nll -= float(logp[row, ids[begin + row + 1]])
            scored += 1
        prev_end = end
        if end == len(ids):
            break
    return math.exp(nll / scored)


def test_matches_transformers_whole_and_in_chunks(capsys, tiny, text):
    from armllm.model.loader import load_tokenizer
    ids = load_tokenizer(tiny).encode(text.read_text())
    assert len(ids) == TOKENS
    want = transformers_perplexity(tiny, ids, CONTEXT, STRIDE)
    flags = ("--context", str(CONTEXT), "--stride", str(STRIDE), "--kv-cache-dtype", "f32")
    whole = run(capsys, tiny, text, *flags)
    chunked = run(capsys, tiny, text, *flags, "--max-num-batched-tokens", "7")
    assert whole["scored"] == chunked["scored"] == TOKENS - 1
    assert whole["context"] == CONTEXT and whole["kv_cache_dtype"] == "f32"
    assert whole["perplexity"] == pytest.approx(want, rel=1e-4)
    assert chunked["perplexity"] == pytest.approx(want, rel=1e-4)


def transformers_chunk_perplexity(tiny, ids: list[int], context: int, bos: int | None,
                                  chunks: int) -> float:
    """llama-perplexity's recipe: chunks of `context` ids, the first one BOS, each
    scoring the predictions of its second half."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float32)
    nll, scored = 0.0, 0
    for i in range(chunks):
        window = list(ids[i * context:(i + 1) * context])
        window[0] = window[0] if bos is None else bos
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([window])).logits[0].double(), dim=-1)
        for row in range(context // 2, context - 1):
            nll -= float(logp[row, window[row + 1]])
            scored += 1
    return math.exp(nll / scored)


def test_llama_cpp_recipe_matches_transformers(capsys, tiny, text):
    from armllm.model.loader import load_tokenizer
    ids = load_tokenizer(tiny).encode(text.read_text())
    context = 40
    got = run(capsys, tiny, text, "--context", str(context), "--llama-cpp", "--chunks", "2",
              "--kv-cache-dtype", "f32", "--max-num-batched-tokens", "16")
    assert got["windows"] == 2 and got["scored"] == 2 * (context - context // 2 - 1)
    # the tiny tokenizer adds no BOS: the chunks are the text's own ids
    want = transformers_chunk_perplexity(tiny, ids, context, None, 2)
    assert got["perplexity"] == pytest.approx(want, rel=1e-4)
    every = run(capsys, tiny, text, "--context", str(context), "--llama-cpp",
                "--kv-cache-dtype", "f32")
    assert every["windows"] == len(ids) // context
    for flags, message in ((["--chunks", "2"], "--chunks takes a positive count, with "
                                               "--llama-cpp"),
                           (["--llama-cpp", "--context", "100"], "need at least 200 tokens")):
        assert main(["eval", "perplexity", str(tiny), "--text", str(text), *flags]) == 2
        assert message in capsys.readouterr().err


def test_the_window_is_capped_by_max_model_len_and_the_kv_cache(capsys, tiny, text):
    assert run(capsys, tiny, text, "--context", "64", "--stride", "16",
               "--max-model-len", "40")["context"] == 40
    per_block = KVCache.bytes_per_block(load_hf_config(tiny), 8, "bf16")
    three_blocks = 3 * per_block / 2**30
    r = run(capsys, tiny, text, "--context", "64", "--stride", "16", "--block-size", "8",
            "--kv-cache-gib", repr(three_blocks))
    assert r["context"] == 24 and r["kv_cache_dtype"] == "bf16"


def test_flags_it_cannot_honour_are_refused(capsys, tiny, text):
    for flag in (["--max-num-seqs", "2"], ["--no-prefix-caching"]):
        with pytest.raises(SystemExit) as exc:
            main(["eval", "perplexity", str(tiny), "--text", str(text), *flag])
        assert exc.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err


def test_tensor_parallel_gives_the_same_number(capsys, tiny, text):
    """Two ranks score the same windows: the same perplexity within f32 summation
    order (the all-reduce's), and no worker left behind."""
    from tests.processes import tp_workers
    flags = ("--context", str(CONTEXT), "--stride", str(STRIDE), "--kv-cache-dtype", "f32",
             "--max-num-batched-tokens", "16")
    one = run(capsys, tiny, text, *flags)
    two = run(capsys, tiny, text, *flags, "-tp", "2")
    assert two["scored"] == one["scored"] and two["windows"] == one["windows"]
    assert abs(two["nll"] - one["nll"]) <= 1e-5 * one["nll"]
    assert not tp_workers(__import__("os").getpid())


def test_windows_run_through_the_model_runner():
    """Every forward goes through engine/runner.py's ModelRunner (DESIGN.md): perplexity
    builds no batch or workspace of its own and never calls the model's forward; its
    windows are ModelRunner.prompt_logits calls."""
    import ast
    import inspect

    from armllm.bench import perplexity
    tree = ast.parse(inspect.getsource(perplexity))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                for alias in node.names}
    assert not imported & {"Workspace", "BatchMeta"}
    called = {node.func.attr for node in ast.walk(tree)
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)}
    assert "forward" not in called and "prompt_logits" in called
