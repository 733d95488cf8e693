"""Reasoning parsers (--reasoning-parser NAME, vLLM's names): a thinking model's `<think> ... </think>` text goes to
the message's `reasoning` (vLLM's current name), the rest to `content`, in whole responses and in stream deltas.

  - qwen3: the output thinks only when it opens with `<think>` (Qwen3 with enable_thinking=false writes no tags:
    all content), or when the rendered prompt already opened the block (templates that end it with `<think>`);
  - deepseek_r1: the output starts inside the reasoning (R1's template opens it), up to `</think>`; an output cut
    off before `</think>` is all reasoning;
  - mistral: Magistral's `[THINK] ... [/THINK]`, read as qwen3 reads `<think>`; the markers are control tokens of
    Mistral's tokenizer, so requests keep special tokens in the text (`keeps_special_tokens`);
  - openai_gptoss: gpt-oss's harmony messages, the analysis channel being the reasoning (harmony.py).

The split of a text is prefix-stable: what a stream sent as reasoning or content stays so when the text grows, so
the deltas add up to the whole response. A stream keeps a ReasoningStream, which remembers where the reasoning and
the content start and looks only at the new text at each step (markers found with str.find: linear in the text).
"""

import re
from typing import Any, Optional

from jaxpaged.server.parsers.marker_search import MarkerSearch

START, END = "<think>", "</think>"
_MARKERS = {"qwen3": (START, END), "deepseek_r1": (START, END), "mistral": ("[THINK]", "[/THINK]"),
            # gpt-oss's harmony channels (server/parsers/harmony.py reads its messages); the answer's body starts
            # after the final channel's header, which is where a grammar starts (starts_after).
            "openai_gptoss": ("<|channel|>analysis<|message|>", "<|channel|>final<|message|>")}
REASONING_PARSERS = tuple(_MARKERS)
"""The names --reasoning-parser accepts."""
_VLLM_ONLY = ("deepseek_v3", "ernie45", "glm45", "gpt_oss", "granite", "hunyuan_a13b", "step3",
              "seed_oss", "olmo3", "minimax_m2")


_NON_SPACE = re.compile(r"\S")  # \s is str.isspace's whitespace, as str.lstrip() uses


class ReasoningStream:
    """Where one growing output's reasoning and content are, as absolute indices into its text.

    While the output opens with whitespace and a prefix of `<think>` nothing is decided; then the reasoning runs
    from after `<think>` (or from the start, when the output starts inside the reasoning) to `</think>`, and the
    content from after it. An output that neither opens a block nor starts in one is all content.
    """

    def __init__(self, starts_in_reasoning: bool, start: str = START, end: str = END) -> None:
        self.starts_in_reasoning = starts_in_reasoning
        self.start, self.end = start, end
        """The markers that open and close the reasoning (`<think>`, `</think>` unless the parser says)."""
        self.reasoning_start: Optional[int] = None
        """Where the reasoning starts (None: the output has none, or it is not decided yet)."""
        self.reasoning_end = 0
        """Where the sure reasoning ends so far (a possible `</think>` cut off at the end is held back)."""
        self.content_start: Optional[int] = None
        """Where the content starts (None: not yet, the output is undecided or still reasoning)."""
        self._lead = -1  # the output's first non-space character, once found
        self._lead_resume = 0
        self._end_search = MarkerSearch(end)

    @property
    def num_scanned(self) -> int:
        """Characters of the text looked at so far."""
        return self._lead_resume + self._end_search.num_scanned

    def advance(self, text: str, finished: bool) -> None:
        """Reads the output so far (`text` only grows between calls); `finished`: it is the whole output."""
        if self.reasoning_start is None and self.content_start is None:
            self._decide(text, finished)
        if self.reasoning_start is None or self.content_start is not None:
            return
        end = self._end_search.find(text, self.reasoning_start)
        if end >= 0:
            self.reasoning_end, self.content_start = end, end + len(self.end)
        else:
            self.reasoning_end = len(text) if finished else self._end_search.resume

    def _decide(self, text: str, finished: bool) -> None:
        """Whether the output opens a `<think>` block, starts inside one, or has no reasoning."""
        if self._lead < 0:
            lead = _NON_SPACE.search(text, self._lead_resume)
            self._lead, self._lead_resume = (lead.start(), lead.start() + 1) if lead else (-1, len(text))
        start = self.start
        if self._lead >= 0 and text.startswith(start, self._lead):
            self.reasoning_start = self._lead + len(start)
        elif not finished and (self._lead < 0 or start.startswith(text[self._lead:self._lead + len(start)])):
            return  # "<thi": the block may still open
        elif self.starts_in_reasoning:
            self.reasoning_start = 0
        else:
            self.content_start = 0


class ReasoningParser:
    """Splits `<think>` reasoning from content; `starts_in_reasoning`: the prompt left the block open."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.always_starts_in_reasoning = name == "deepseek_r1"
        self.start, self.end = _MARKERS[name]
        """The markers that open and close the reasoning block."""
        self.keeps_special_tokens = name in ("mistral", "openai_gptoss")
        self.harmony = name == "openai_gptoss"
        """The output is harmony messages (server/openai/harmony_text.py reads them), not one marked block."""
        """The markers are special tokens: the output's text must keep them."""

    def stream(self, starts_in_reasoning: bool) -> ReasoningStream:
        """A new stream's place in one output."""
        return ReasoningStream(starts_in_reasoning, self.start, self.end)

    def starts_in_reasoning(self, prompt_text: Optional[str]) -> bool:
        """Whether an output of this prompt begins inside the reasoning block."""
        if self.always_starts_in_reasoning:
            return True
        tail = (prompt_text or "").rstrip()
        return tail.endswith(self.start)

    def ended_in_prompt(self, prompt_text: Optional[str]) -> bool:
        """Whether the rendered prompt already closed the reasoning block (a template with thinking switched off
        ends with an empty `<think></think>`): the output then starts with the answer."""
        return (prompt_text or "").rstrip().endswith(self.end)

    def split(self, text: str, starts_in_reasoning: bool, finished: bool = True) -> tuple[Optional[str], str]:
        """(reasoning, content) of an output; unfinished, only what is sure so far (a possible marker held back).
        Reasoning is None when the output has none."""
        stream = self.stream(starts_in_reasoning)
        stream.advance(text, finished)
        reasoning = None if stream.reasoning_start is None else text[stream.reasoning_start:stream.reasoning_end]
        return reasoning, "" if stream.content_start is None else text[stream.content_start:]


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
    if name is None or name not in _MARKERS:
        return
    start, end = _MARKERS[name]
    if name == "openai_gptoss":
        end = "<|channel|>"  # the harmony header's own token
    template = chat_template if chat_template is not None else getattr(tokenizer, "chat_template", None) or ""
    in_vocab = end in getattr(tokenizer, "get_vocab", dict)()
    if end not in str(template) and not in_vocab:
        raise ValueError(f"reasoning_parser: --reasoning-parser {name} needs a model that writes {start} ... {end}, "
                         f"but neither its chat template nor its vocabulary has {end}")
