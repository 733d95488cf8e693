"""Reasoning parsers (--reasoning-parser NAME, vLLM's names): a thinking model's `<think> ... </think>` text goes to
the message's `reasoning` (vLLM's current name), the rest to `content`, in whole responses and in stream deltas.

  - qwen3: the output thinks only when it opens with `<think>` (Qwen3 with enable_thinking=false writes no tags:
    all content), or when the rendered prompt already opened the block (templates that end it with `<think>`);
  - deepseek_r1: the output starts inside the reasoning (R1's template opens it), up to `</think>`; an output cut
    off before `</think>` is all reasoning.

The split of a text is prefix-stable: what a stream sent as reasoning or content stays so when the text grows, so
the deltas add up to the whole response. Markers are found with str.find: linear in the text.
"""

from typing import Any, Optional

START, END = "<think>", "</think>"
REASONING_PARSERS = ("qwen3", "deepseek_r1")
"""The names --reasoning-parser accepts."""
_VLLM_ONLY = ("deepseek_v3", "ernie45", "glm45", "gpt_oss", "granite", "hunyuan_a13b", "mistral", "step3",
              "seed_oss", "olmo3", "minimax_m2")


def _held_back(text: str, marker: str) -> int:
    """How many trailing characters of `text` might begin `marker`."""
    for keep in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-keep:]):
            return keep
    return 0


class ReasoningParser:
    """Splits `<think>` reasoning from content; `starts_in_reasoning`: the prompt left the block open."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.always_starts_in_reasoning = name == "deepseek_r1"

    def starts_in_reasoning(self, prompt_text: Optional[str]) -> bool:
        """Whether an output of this prompt begins inside the reasoning block."""
        if self.always_starts_in_reasoning:
            return True
        tail = (prompt_text or "").rstrip()
        return tail.endswith(START)

    def split(self, text: str, starts_in_reasoning: bool, finished: bool = True) -> tuple[Optional[str], str]:
        """(reasoning, content) of an output; unfinished, only what is sure so far (a possible marker held back).
        Reasoning is None when the output has none."""
        stripped = text.lstrip()
        if stripped.startswith(START):
            body = stripped[len(START):]
        elif not finished and START.startswith(stripped):
            return None, ""  # "<thi": the block may still open
        elif starts_in_reasoning:
            body = text
        else:
            return None, text
        end = body.find(END)
        if end >= 0:
            return body[:end], body[end + len(END):]
        if finished:
            return body, ""
        return body[:len(body) - _held_back(body, END)], ""


def make_reasoning_parser(name: Optional[str]) -> Optional[ReasoningParser]:
    """The parser called `name` (None: none); ValueError naming the flag for an unknown one."""
    if name is None:
        return None
    if name in REASONING_PARSERS:
        return ReasoningParser(name)
    known = f"--reasoning-parser takes one of {list(REASONING_PARSERS)}"
    if name in _VLLM_ONLY:
        raise ValueError(f"reasoning_parser: vLLM's parser {name!r} is not implemented in jaxpaged; {known}")
    raise ValueError(f"reasoning_parser: unknown parser {name!r}; {known}")


def check_reasoning_markers(name: Optional[str], tokenizer: Any, chat_template: Optional[str]) -> None:
    """ValueError naming --reasoning-parser when neither the chat template nor the vocabulary knows `</think>`: the
    model never writes the markers, so every answer would be misread."""
    if name is None:
        return
    template = chat_template if chat_template is not None else getattr(tokenizer, "chat_template", None) or ""
    in_vocab = END in getattr(tokenizer, "get_vocab", dict)()
    if END not in str(template) and not in_vocab:
        raise ValueError(f"reasoning_parser: --reasoning-parser {name} needs a model that writes {START} ... {END}, "
                         f"but neither its chat template nor its vocabulary has {END}")
