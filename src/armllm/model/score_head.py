"""score_head: a reranker's relevance head (ScoreHead), read where the checkpoint
keeps it, and how a query and a document become its prompt (score_prompt).

The head reads the final hidden state h (after the final norm) of the prompt's
last token, as Hugging Face's `*ForSequenceClassification` pools, and gives one
relevance score in (0, 1):
- a sequence-classification head of one label (Hugging Face's `score.weight`,
  a cross-encoder such as a converted Qwen3-Reranker or bge-reranker-v2-gemma):
  sigmoid(w . h + b), as sentence-transformers' CrossEncoder and vLLM score;
- a GGUF reranker (llama.cpp's pooling type "rank"): its `cls.output.weight` of
  one row as above, or of two rows (llama.cpp's Qwen3-Reranker conversion: the
  "yes" then the "no" row of the lm_head) the softmax's first entry,
  sigmoid(l_0 - l_1), as llama.cpp's server scores it;
- a causal reranker run as it is (Qwen3-Reranker-0.6B/4B/8B: the logits of "no"
  and "yes" at the last token, --score-from-tokens no,yes): the same two-row
  form over those two rows of the lm_head, so only two of its rows are read.
The lm_head rows of a model soft-capping its logits (Gemma 3) cap each logit
first, as its lm_head does (a classification head is not capped, as in
transformers and llama.cpp). The arithmetic is float64 over float32 rows."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:   # the flags' parsers below load with the CLI: no model code for them
    from armllm.model.config import ModelConfig

# llama.cpp's LLAMA_POOLING_TYPE_RANK: a GGUF whose pooled output is a relevance score
GGUF_POOLING_RANK = 4
GGUF_CLS_OUT = "cls.output.weight"
GGUF_CLS_OUT_BIAS = "cls.output.bias"
HF_SCORE = "score.weight"
HF_SCORE_BIAS = "score.bias"
# the placeholders of a score template (llama.cpp's `tokenizer.chat_template.rerank`)
QUERY, DOCUMENT = "{query}", "{document}"
# rows of the lm_head's float32 read at a time while looking for two of them
_HEAD_CHUNK_ROWS = 4096


@dataclass(frozen=True)
class ScoreHead:
    """rows [1 or 2, hidden] float32 and their biases: one row scores sigmoid(l_0),
    two rows sigmoid(l_0 - l_1) (the first's softmax probability); softcap > 0: each
    logit l = softcap * tanh(l / softcap) first. `source` says where it was read."""
    rows: np.ndarray
    bias: tuple[float, ...]
    softcap: float = 0.0
    source: str = ""

    def __post_init__(self):
        if self.rows.ndim != 2 or self.rows.shape[0] not in (1, 2) \
                or len(self.bias) != self.rows.shape[0]:
            raise ValueError(f"{self.source}: a score head has 1 or 2 rows with a bias each, "
                             f"got rows of shape {self.rows.shape} and {len(self.bias)} biases")

    def score(self, hidden: np.ndarray) -> float:
        """The relevance score of a prompt whose last final hidden state is `hidden`."""
        logits = self.rows.astype(np.float64) @ np.asarray(hidden, np.float64) \
            + np.asarray(self.bias, np.float64)
        if self.softcap:
            logits = self.softcap * np.tanh(logits / self.softcap)
        z = float(logits[0] - logits[1]) if len(logits) == 2 else float(logits[0])
        return _sigmoid(z)


def _sigmoid(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)   # no overflow for a large negative z
    return e / (1.0 + e)


def _num_labels(config_json: dict[str, Any]) -> int:
    labels = config_json.get("id2label")
    return len(labels) if labels else int(config_json.get("num_labels", 2))


def head_from_hf(source, config_json: dict[str, Any], config: ModelConfig, where: str
                 ) -> ScoreHead:
    """A `*ForSequenceClassification` checkpoint's head (`score.weight`); a
    ValueError unless it has one label (one score a pair)."""
    from armllm.model.sources import as_f32
    labels = _num_labels(config_json)
    if labels != 1:
        raise ValueError(f"{where}: a sequence classifier of {labels} labels gives no single "
                         f"relevance score; armllm scores with one-label classifiers "
                         f"(cross-encoders and rerankers)")
    if HF_SCORE not in source.ckpt:
        raise ValueError(f"{where}: a sequence classifier without its {HF_SCORE} tensor")
    rows = as_f32(source.ckpt.array(HF_SCORE)).reshape(-1, config.hidden_size)
    bias = tuple(as_f32(source.ckpt.array(HF_SCORE_BIAS)).reshape(-1).tolist()) \
        if HF_SCORE_BIAS in source.ckpt else (0.0,) * len(rows)
    return ScoreHead(rows.copy(), bias, source=f"{where}: {HF_SCORE}")


def head_from_gguf(gguf, config: ModelConfig) -> ScoreHead | None:
    """A GGUF reranker's head (pooling type rank with cls.output.weight), else None."""
    arch_name = gguf.metadata.get("general.architecture")
    if gguf.metadata.get(f"{arch_name}.pooling_type") != GGUF_POOLING_RANK:
        return None
    if GGUF_CLS_OUT not in gguf.tensors:
        raise ValueError(f"{gguf.path}: a reranker GGUF (pooling type rank) without "
                         f"{GGUF_CLS_OUT}; armllm runs decoder rerankers with a "
                         f"classification head")
    rows = np.asarray(gguf.dequantize(GGUF_CLS_OUT), np.float32).reshape(-1, config.hidden_size)
    if len(rows) not in (1, 2):
        raise ValueError(f"{gguf.path}: {GGUF_CLS_OUT} has {len(rows)} rows; armllm scores "
                         f"with one (a relevance logit) or two (yes and no)")
    bias = tuple(np.asarray(gguf.dequantize(GGUF_CLS_OUT_BIAS), np.float32).reshape(-1)
                 .tolist()) if GGUF_CLS_OUT_BIAS in gguf.tensors else (0.0,) * len(rows)
    return ScoreHead(rows.copy(), bias, source=f"{gguf.path}: {GGUF_CLS_OUT}")


def parse_score_tokens(value: str | None) -> tuple[str, str] | None:
    """--score-from-tokens "no,yes": the tokens whose logits' difference (the second's
    minus the first's) is a causal reranker's relevance logit."""
    if value is None:
        return None
    parts = value.split(",") if isinstance(value, str) else []
    if len(parts) != 2 or not all(parts) or parts[0] == parts[1]:
        raise ValueError(f"score_from_tokens must be two different tokens as FALSE,TRUE "
                         f"(Qwen3-Reranker: no,yes), got {value!r}")
    return parts[0], parts[1]


def head_from_tokens(source, config: ModelConfig, head_tensor: str, tokenizer,
                     tokens: tuple[str, str], where: str) -> ScoreHead:
    """A causal reranker's head: the lm_head rows (read from `head_tensor`: the
    embedding when tied) of the TRUE then the FALSE token of `tokens`."""
    from armllm.model.sources import as_f32
    ids = []
    for token in (tokens[1], tokens[0]):
        token_id = tokenizer.token_to_id(token)
        if token_id is None or not 0 <= token_id < config.vocab_size:
            raise ValueError(f"score_from_tokens: {token!r} is not a token of {where}'s "
                             f"vocabulary")
        ids.append(token_id)
    rows = np.empty((2, config.hidden_size), np.float32)
    found = 0
    for row0, chunk in source.float_rows(head_tensor, _HEAD_CHUNK_ROWS):
        for slot, token_id in enumerate(ids):
            if row0 <= token_id < row0 + len(chunk):
                rows[slot] = as_f32(chunk[token_id - row0:token_id - row0 + 1])[0]
                found += 1
    if found != 2:
        raise ValueError(f"{where}: {head_tensor} holds no rows for tokens {tokens}")
    return ScoreHead(rows, (0.0, 0.0), config.final_logit_softcap,
                     f"{where}: the lm_head rows of {tokens[1]!r} and {tokens[0]!r}")


def read_score_template(value: str | None) -> str | None:
    """--score-template: a file's text or the template itself; it must hold both
    placeholders."""
    if value is None:
        return None
    path = Path(value)
    text = path.read_text() if len(value) < 4096 and path.is_file() else value
    missing = [p for p in (QUERY, DOCUMENT) if p not in text]
    if missing:
        raise ValueError(f"score_template must hold {QUERY} and {DOCUMENT} (missing "
                         f"{', '.join(missing)}), got {value!r}")
    return text


def score_prompt(tokenizer, template: str | None, query: str, document: str) -> list[int]:
    """The token ids a reranker scores the pair with: the template with the query and
    document put in (special tokens parsed, none added: the template holds them), else
    the tokenizer's own pair encoding (its post-processor's pair rule: what
    transformers' tokenizer(query, document) gives; a GGUF's, llama.cpp's
    [BOS] query [EOS] [SEP] document [EOS] as its flags say)."""
    if template is not None:
        # one pass, so a query holding "{document}" is not filled in again
        parts = template.split(QUERY)
        text = query.join(part.replace(DOCUMENT, document) for part in parts)
        return tokenizer.encode(text, add_special_tokens=False)
    return tokenizer.encode_pair(query, document)
