"""The server reaches the engine only through AsyncLLM's own members (DESIGN.md:
one door): no route reads `llm.engine` or anything private of the LLM."""
from __future__ import annotations

import ast
from pathlib import Path

SERVER = Path(__file__).resolve().parents[2] / "src" / "armllm" / "server"


def engine_reads(source: str) -> list[str]:
    """Each `.engine` attribute read, and each private attribute of something named
    llm, in `source` (imports of armllm.engine are not attribute reads)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        private = node.attr.startswith("_") and not node.attr.startswith("__") \
            and ast.unparse(node.value).endswith("llm")
        if node.attr == "engine" or private:
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_reader_finds_engine_internals_and_skips_imports():
    source = ("from armllm.engine.args import EngineArgs\n"
              "import armllm.engine.outputs\n"
              "def f(llm, state):\n"
              "    llm.tokenizer.encode('x')\n"
              "    state.llm._client.abort('r')\n"
              "    return llm.engine.harmony\n")
    assert sorted(engine_reads(source)) == ["5: state.llm._client", "6: llm.engine"]


def test_the_server_reads_no_engine_internals():
    reads = {path.name: found for path in sorted(SERVER.rglob("*.py"))
             if (found := engine_reads(path.read_text()))}
    assert not reads, reads
