"""Parsers of a model's own tool-call syntax (--tool-call-parser NAME, vLLM's names), for tool_choice "auto": the
model decides whether to call a tool, and its text is split into content and OpenAI tool_calls."""

from typing import Optional

from jaxpaged.server.parsers.tool.base import Call, ToolParser
from jaxpaged.server.parsers.tool.deepseek import DeepSeekToolParser
from jaxpaged.server.parsers.tool.functiongemma import FunctionGemmaToolParser
from jaxpaged.server.parsers.tool.harmony_calls import HarmonyToolParser
from jaxpaged.server.parsers.tool.hermes import HermesToolParser
from jaxpaged.server.parsers.tool.llama3_json import Llama3JsonToolParser
from jaxpaged.server.parsers.tool.mistral import MistralToolParser
from jaxpaged.server.parsers.tool.pythonic import PythonicToolParser
from jaxpaged.server.parsers.tool.qwen3_xml import Qwen3XmlToolParser
from jaxpaged.server.parsers.tool.xlam import XlamToolParser

_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesToolParser, "llama3_json": Llama3JsonToolParser, "pythonic": PythonicToolParser,
    "mistral": MistralToolParser, "deepseek_v3": DeepSeekToolParser, "deepseek_v31": DeepSeekToolParser,
    "qwen3_xml": Qwen3XmlToolParser, "qwen3_coder": Qwen3XmlToolParser, "xlam": XlamToolParser,
    "openai": HarmonyToolParser, "functiongemma": FunctionGemmaToolParser,
}
TOOL_CALL_PARSERS = tuple(_PARSERS)
"""The names `--tool-call-parser` accepts."""

_VLLM_ONLY = ("granite", "granite-20b-fc", "internlm", "jamba", "llama4_json", "llama4_pythonic", "phi4_mini_json",
              "kimi_k2", "hunyuan_a13b", "glm45", "minimax", "step3",
              "seed_oss", "longcat")


def make_tool_parser(name: Optional[str]) -> Optional[ToolParser]:
    """The parser called `name` (None: no parser); ValueError naming the flag for an unknown one."""
    if name is None:
        return None
    if name in _PARSERS:
        return _PARSERS[name]()
    known = f"--tool-call-parser takes one of {list(TOOL_CALL_PARSERS)}"
    if name in _VLLM_ONLY:
        raise ValueError(f"tool_call_parser: vLLM's parser {name!r} is not implemented in jaxpaged; {known}")
    raise ValueError(f"tool_call_parser: unknown parser {name!r}; {known}")


__all__ = ["Call", "ToolParser", "TOOL_CALL_PARSERS", "make_tool_parser", "HermesToolParser", "Llama3JsonToolParser",
           "PythonicToolParser", "MistralToolParser", "DeepSeekToolParser", "Qwen3XmlToolParser", "XlamToolParser",
           "HarmonyToolParser", "FunctionGemmaToolParser"]
