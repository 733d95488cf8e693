"""CallDeltas: a stream's tool_calls entries, vLLM's shape: a call's first entry carries its index, id, type and name
(arguments ""), later entries only its index and the next fragment of its arguments.

While the text grows the entries follow the parser's drafts (scanner.py); when it ends they follow the finished
text's calls, which say what the non-streamed response holds: a call not yet begun is sent whole, a begun one gets
the rest of its arguments. Concatenated by index, the fragments are the finished calls' arguments.
"""

import dataclasses
import logging
from typing import Optional

from jaxpaged.server.openai.tool_calls import ToolCalling
from jaxpaged.server.parsers.tool.call_reader import CallDraft, CallReader
from jaxpaged.server.parsers.tool.scanner import Call

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class _SentCall:
    name: str
    num_fragments: int = 0
    """The draft's fragments sent so far."""
    sent: list[str] = dataclasses.field(default_factory=list)
    """The arguments text sent so far, in the pieces sent."""


class CallDeltas:
    """What one streamed choice has sent of its calls."""

    def __init__(self, calling: ToolCalling) -> None:
        self.calling = calling
        self._calls: list[_SentCall] = []
        self._num_settled = 0  # the drafts in front of this are complete and sent: a step skips them

    @property
    def num_started(self) -> int:
        """Calls whose first entry has been sent."""
        return len(self._calls)

    def step(self, drafts: list[CallDraft]) -> list[dict]:
        """The entries for what the drafts add to what was sent (a draft without a name yet, and those after
        it, wait)."""
        entries: list[dict] = []
        for index in range(self._num_settled, len(drafts)):
            draft = drafts[index]
            if draft.name is None:
                break
            sent = self._started(index, draft.name, entries)
            if sent is None or sent.name != draft.name:
                continue
            new = draft.fragments[sent.num_fragments:]
            sent.num_fragments = len(draft.fragments)
            self._arguments(index, "".join(new), sent, entries)
            if draft.complete and index == self._num_settled:
                self._num_settled += 1
        return entries

    def final(self, calls: list[Call]) -> list[dict]:
        """The entries that complete the finished text's calls."""
        entries: list[dict] = []
        for index, (name, arguments) in enumerate(calls):
            sent = self._started(index, name, entries)
            if sent is None:
                continue
            so_far = "".join(sent.sent)
            if sent.name != name or not arguments.startswith(so_far):
                # NOTE: what was sent cannot be taken back (a repeated key, or a draft the finished text does not
                # parse as this call): the stream keeps what it sent.
                logger.debug("streamed call %d differs from the finished text's call %r", index, name)
                continue
            self._arguments(index, arguments[len(so_far):], sent, entries)
        return entries

    def _started(self, index: int, name: str, entries: list[dict]) -> Optional[_SentCall]:
        """The call at `index`, its first entry added when it is new (None: an earlier call is missing)."""
        if index < len(self._calls):
            return self._calls[index]
        if index > len(self._calls):
            return None
        self._calls.append(_SentCall(name))
        entries.append({"index": index, **self.calling.call(name, "")})
        return self._calls[index]

    @staticmethod
    def _arguments(index: int, text: str, sent: _SentCall, entries: list[dict]) -> None:
        if text:
            sent.sent.append(text)
            entries.append({"index": index, "function": {"arguments": text}})


class RequiredCallStream:
    """tool_choice "required": the grammar's JSON array of {"name", "parameters"} calls, streamed as vLLM streams it
    (each call's name, then its parameters as they are sampled)."""

    def __init__(self, calling: ToolCalling) -> None:
        self.calling = calling
        self._reader = CallReader(0, ("parameters",), single=True)
        self._deltas = CallDeltas(calling)
        self.num_calls_sent = 0
        """Calls begun so far; once the text ended, the calls the finished array holds."""

    def delta(self, text: str, finished: bool) -> dict:
        """The stream delta for the choice's text so far (which only grows)."""
        if finished:
            calls = [(call["function"]["name"], call["function"]["arguments"]) for call in self.calling.calls(text)]
            entries = self._deltas.final(calls)
            self.num_calls_sent = len(calls)
        else:
            entries = self._deltas.step(self.calling.limited(self._reader.read(text, len(text))))
            self.num_calls_sent = self._deltas.num_started
        return {"tool_calls": entries} if entries else {}
