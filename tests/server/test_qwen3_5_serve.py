"""A hybrid model through a real `armllm serve`: a tiny random Qwen3.5-MoE
checkpoint (Gated DeltaNet and gated attention layers, routed and shared
experts) with Qwen3.5's own chat template, driven by the official openai client:
chat completions streamed and not (the same greedy text), concurrent requests
batched with each other (each one's text equals its solo run: every sequence's
recurrent state is its own), a tool call in Qwen3.5's XML format read back as
OpenAI tool_calls, and the reasoning the template opens (<think>) returned as
reasoning_content."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.server.conftest import running_server
from tests.server.test_tools import ASK, TOOLS
from tests.tiny_model import QWEN3_5_TEMPLATE, write_tiny_chat_llama

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def qwen35_moe(tmp_path_factory):
    """The chat tokenizer and Qwen3.5's template of write_tiny_chat_llama, under a tiny
    random Qwen3_5MoeForCausalLM of its vocabulary."""
    path = write_tiny_chat_llama(tmp_path_factory.mktemp("qwen35-moe"),
                                 template=QWEN3_5_TEMPLATE)
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    torch.manual_seed(0)
    config = transformers.Qwen3_5MoeTextConfig(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, max_position_embeddings=4096,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, eos_token_id=json.loads(
            (path / "config.json").read_text())["eos_token_id"])
    transformers.Qwen3_5MoeForCausalLM(config).save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture(scope="module")
def client(qwen35_moe, tmp_path_factory):
    import openai
    with running_server(qwen35_moe, tmp_path_factory, "qwen35-moe", "--dtype", "float32",
                        "--kv-cache-dtype", "f32", "--kv-cache-gib", "0.1",
                        "--max-num-seqs", "8", "--reasoning-parser", "qwen3",
                        "--served-model-name", "tiny") as srv:
        yield openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)


def chat(client, content: str, **kw):
    return client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": content}], max_tokens=24,
        temperature=0.0, extra_body=NO_THINKING, **kw)


def test_streamed_and_whole_chat_agree(client):
    whole = chat(client, "Tell me about CPUs.").choices[0]
    assert whole.finish_reason == "length" and whole.message.content
    stream = chat(client, "Tell me about CPUs.", stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == whole.message.content


def test_concurrent_requests_each_keep_their_own_state(client):
    questions = [f"Question number {i}: what is {i} + {i}?" for i in range(6)]
    solo = [chat(client, q).choices[0].message.content for q in questions]
    with ThreadPoolExecutor(6) as pool:
        together = list(pool.map(lambda q: chat(client, q).choices[0].message.content,
                                 questions))
    assert together == solo


def test_a_required_tool_call_comes_back_as_tool_calls(client):
    choice = client.chat.completions.create(
        model="tiny", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=200,
        parallel_tool_calls=False, extra_body=NO_THINKING).choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name in {t["function"]["name"] for t in TOOLS}
    assert isinstance(json.loads(call.function.arguments), dict)


def test_thinking_is_returned_as_reasoning_content(client):
    """The template opens <think> (enable_thinking by default): a random model never
    closes it, so all its text is reasoning and none is content."""
    message = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Think first."}], max_tokens=16,
        temperature=0.0).choices[0].message
    assert getattr(message, "reasoning_content", None) or \
        (message.model_extra or {}).get("reasoning_content")
    assert not message.content
