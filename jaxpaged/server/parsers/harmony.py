"""gpt-oss's harmony format (vLLM's `--reasoning-parser openai_gptoss` and `--tool-call-parser openai`): the output
is a run of messages, each a header and a body,

    <|channel|>analysis<|message|>I should look it up.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "P"}<|call|>
    <|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>

The `analysis` channel is the reasoning, `final` the answer (content), and a `commentary` message addressed
`to=functions.NAME` is a call of NAME whose body is its arguments (one without a recipient is a preamble, content
too). The markers are special tokens of gpt-oss's tokenizer, so requests keep special tokens in the text.

HarmonyStream keeps one output's place between steps: messages already closed are never read again, the open one's
body is searched from where the last step stopped (the markers all begin with `<|`), so a stream costs time linear
in its text. A body's text is sure up to a `<|` that may start its end marker.
"""

import dataclasses
import re
from typing import Optional

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
"""Markers that close a message's body (the last message may also just stop, its <|return|> being the EOS)."""
FUNCTIONS = "functions."
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL_NAME = re.compile(r"\s*([A-Za-z_]+)")


@dataclasses.dataclass
class HarmonyMessage:
    """One message of the output: its channel, its recipient (a call's `functions.NAME`), where its body is."""

    channel: str
    recipient: Optional[str]
    body_start: int
    body_end: int = -1
    """-1 while the body is still being written."""

    @property
    def function(self) -> Optional[str]:
        """The function this message calls, when it is addressed to one."""
        if self.recipient is None or not self.recipient.startswith(FUNCTIONS):
            return None
        return self.recipient[len(FUNCTIONS):] or None

    @property
    def kind(self) -> str:
        """"reasoning", "call" or "content": where the body goes in the chat message."""
        if self.function is not None:
            return "call"
        return "reasoning" if self.channel == "analysis" else "content"


def _header(text: str) -> tuple[str, Optional[str]]:
    """(channel, recipient) of a header's text (`<|start|>assistant<|channel|>commentary to=functions.f ...`)."""
    recipient = _RECIPIENT.search(text)
    channel_at = text.find(CHANNEL)
    channel = _CHANNEL_NAME.match(text, channel_at + len(CHANNEL)) if channel_at >= 0 else None
    return (channel.group(1) if channel else "final"), (recipient.group(1) if recipient else None)


class HarmonyStream:
    """The messages of one growing output (its text only grows between advance() calls)."""

    def __init__(self) -> None:
        self.messages: list[HarmonyMessage] = []
        """Every message so far; the last may be open (body_end -1)."""
        self._position = 0  # where the next header, or the open body's search, continues
        self.num_scanned = 0
        """Characters looked at so far (tests check the work is linear)."""

    @property
    def open(self) -> Optional[HarmonyMessage]:
        """The message whose body is still being written."""
        return self.messages[-1] if self.messages and self.messages[-1].body_end < 0 else None

    def advance(self, text: str, finished: bool) -> int:
        """Reads what is new; returns where the sure text of the open body ends (len(text) when none is open)."""
        while True:
            message = self.open
            if message is None:
                header_end = text.find(MESSAGE, self._position)
                if header_end < 0:
                    self.num_scanned += len(text) - self._position
                    return len(text)  # a header still being written (or trailing text without one)
                self.num_scanned += header_end + len(MESSAGE) - self._position
                channel, recipient = _header(text[self._position:header_end])
                self.messages.append(HarmonyMessage(channel, recipient, header_end + len(MESSAGE)))
                self._position = header_end + len(MESSAGE)
                continue
            marker_at = text.find("<|", self._position)
            if marker_at < 0:
                self.num_scanned += len(text) - self._position
                self._position = max(self._position, len(text) - 1)  # a lone "<" may begin a marker
                sure_end = len(text) if finished or not text.endswith("<") else len(text) - 1
                if finished:
                    message.body_end = len(text)
                return sure_end
            self.num_scanned += marker_at + 2 - self._position
            end = next((marker for marker in ENDS if text.startswith(marker, marker_at)), None)
            if end is None and not finished and any(marker.startswith(text[marker_at:]) for marker in ENDS):
                self._position = marker_at
                return marker_at  # an end marker cut off: wait
            message.body_end = marker_at  # an end marker, or another marker: the body stops here
            self._position = marker_at + (len(end) if end is not None else 0)
            if end is None and not text.startswith(START, marker_at) and not text.startswith(CHANNEL, marker_at):
                self._position = marker_at + 2  # an unknown marker: skip it so the next header search moves on


def split_message(text: str, stream: Optional[HarmonyStream] = None) -> tuple[str, str, list[tuple[str, str]]]:
    """(reasoning, content, calls) of a finished output: the analysis bodies, the final and preamble bodies, and
    each addressed commentary message's (function, arguments)."""
    stream = stream or HarmonyStream()
    stream.advance(text, finished=True)
    reasoning, content, calls = [], [], []
    for message in stream.messages:
        body = text[message.body_start:message.body_end]
        if message.kind == "call":
            calls.append((message.function or "", body.strip()))
        else:
            (reasoning if message.kind == "reasoning" else content).append(body)
    return "".join(reasoning), "".join(content), calls
