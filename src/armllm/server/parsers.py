"""parsers: the tool-call parsers by name (the formats models write calls in:
server/tool_parsers.py's and qwen3_coder.py's) and detect_parser, which finds a
chat template's format. Kept apart from server/tools.py so that the CLI names
them without loading the server (starlette)."""
from __future__ import annotations

from armllm.server.qwen3_coder import Qwen3CoderParser
from armllm.server.tool_parsers import (
    HarmonyParser,
    HermesParser,
    Llama3JsonParser,
    MistralParser,
    ToolParser,
)

PARSERS: dict[str, type[ToolParser]] = {"hermes": HermesParser,
                                        "llama3_json": Llama3JsonParser,
                                        "mistral": MistralParser,
                                        "harmony": HarmonyParser,
                                        "qwen3_coder": Qwen3CoderParser}
TOOL_CALL_PARSERS = ("auto", *PARSERS)


def detect_parser(chat_template: str | None) -> str | None:
    """The parser a chat template's tool markup names, when it names one only."""
    if not chat_template:
        return None
    found = [name for name, marks in (("hermes", ("<tool_call>",)),
                                      ("mistral", ("[TOOL_CALLS]",)),
                                      ("llama3_json", ("<|python_tag|>", "ipython")))
             if any(m in chat_template for m in marks)]
    if "hermes" in found and all(m in chat_template for m in ("<function=", "<parameter=")):
        found[found.index("hermes")] = "qwen3_coder"    # XML calls inside <tool_call>
    return found[0] if len(found) == 1 else None
