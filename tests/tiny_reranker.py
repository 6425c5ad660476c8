"""Tiny random rerankers for tests: one-label `*ForSequenceClassification`
checkpoints of each family and causal LMs whose "no" and "yes" rows are a
Qwen3-Reranker's, with transformers' own scores of query-document pairs (the
oracle). Needs torch and transformers."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import transformers

from tests import llama_cpp_tools as llama_cpp
from tests.model.test_architectures import BASE, FAMILIES, HF_ONLY
from tests.tiny_embedding import TINY, write_tokenizer

QUERY = "What is the capital of France?"
DOCUMENTS = ["Paris is the capital of France.", "The cat sat on the mat.",
             "France is a country in Europe whose capital is Paris, on the Seine.",
             "Bananas are yellow."]
# Qwen3-Reranker's prompt (its model card), as llama.cpp's converter writes it
RERANK_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the "
    "Query and the Instruct provided. Note that the answer can only be \"yes\" or \"no\"."
    "<|im_end|>\n<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant "
    "passages that answer the query\n<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n")
# the classifiers' score rows are scaled so that the scores spread over (0, 1)
SCORE_SCALE = 20.0


def _random_norms(model) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.3)


def write_classifier(path: Path, family: str, tokenizer: Path | None, seed: int = 0,
                     labels: int = 1):
    """A one-label `*ForSequenceClassification` of the family at path (tokenizer None:
    tiny_embedding's, with a pair rule); returns transformers' model."""
    config_cls, causal_cls, extra, _ = {**FAMILIES, **HF_ONLY}[family]
    model_cls = ("Gemma3TextForSequenceClassification" if family.startswith("gemma3")
                 else causal_cls.replace("ForCausalLM", "ForSequenceClassification"))
    base = {**BASE, **({} if tokenizer else {"vocab_size": TINY["vocab_size"]})}
    torch.manual_seed(seed)
    # transformers pools the last token that is not the pad token: tiny_embedding's
    # pair rule ends with <|endoftext|> (id 0), its pad token is <pad> (1)
    cfg = getattr(transformers, config_cls)(**{**base, **extra, "num_labels": labels,
                                               "pad_token_id": 0 if tokenizer else 1})
    model = getattr(transformers, model_cls)(cfg).eval()
    _random_norms(model)
    with torch.no_grad():
        model.score.weight.mul_(SCORE_SCALE)
    model.save_pretrained(path, safe_serialization=True)
    if tokenizer is None:
        write_tokenizer(path)
    else:
        llama_cpp.with_tokenizer(path, tokenizer)
    return model


def write_causal(path: Path, family: str, tokenizer: Path, tied: bool, seed: int = 0):
    """A causal LM of the family (tied or not) with SmolLM2's tokenizer."""
    config_cls, model_cls, extra, _ = {**FAMILIES, **HF_ONLY}[family]
    torch.manual_seed(seed)
    cfg = getattr(transformers, config_cls)(**{**BASE, **extra, "tie_word_embeddings": tied})
    model = getattr(transformers, model_cls)(cfg).eval()
    _random_norms(model)
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
    rows = [tok.token_to_id(t) for t in ("no", "yes")]
    with torch.no_grad():   # spread the yes and no rows apart, so that the scores do too
        head = model.get_output_embeddings().weight
        # Gemma's final norm scales by (1 + w): a smaller row keeps its soft cap unsaturated
        head[rows] = torch.randn(2, head.shape[1]) * (0.01 if "gemma" in family else 0.3)
    model.save_pretrained(path, safe_serialization=True)
    llama_cpp.with_tokenizer(path, tokenizer)
    return model


def hf_classifier_scores(model, path: Path, query: str, documents: list[str]) -> list[float]:
    tok = transformers.AutoTokenizer.from_pretrained(path)
    scores = []
    for doc in documents:
        enc = tok(query, doc, return_tensors="pt")
        with torch.no_grad():
            scores.append(torch.sigmoid(model(**enc).logits)[0, 0].item())
    return scores


def hf_token_scores(model, path: Path, template: str, query: str, documents: list[str],
                    false: str = "no", true: str = "yes") -> list[float]:
    """Qwen3-Reranker's own recipe: the template filled in, the last token's logits,
    softmax over (no, yes), the yes probability."""
    tok = transformers.AutoTokenizer.from_pretrained(path)
    ids = tok.convert_tokens_to_ids([false, true])
    scores = []
    for doc in documents:
        text = template.replace("{query}", query).replace("{document}", doc)
        enc = tok(text, add_special_tokens=False, return_tensors="pt")
        with torch.no_grad():
            logits = model(**enc).logits[0, -1, ids].double()
        scores.append(torch.softmax(logits, 0)[1].item())
    return scores


def logits(p) -> np.ndarray:
    p = np.asarray(p, np.float64)
    return np.log(p) - np.log1p(-p)


def assert_scores(ours, theirs, atol: float = 2e-4) -> None:
    """Equal as relevance logits (a score near 0 or 1 keeps its digits there), and
    differing between the documents, so that their order means something."""
    np.testing.assert_allclose(logits(ours), logits(theirs), atol=atol)
    assert np.ptp(logits(theirs)) > 0.01
