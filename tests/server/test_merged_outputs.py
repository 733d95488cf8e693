"""A streamed batch completion merges its prompts' outputs one pending output per prompt (issue 56, finding 9): a
reader that stops reading holds each prompt's newest output, never a backlog of every step's snapshot."""

import asyncio
from typing import Any, Optional

import pytest

from jaxpaged.outputs import CompletionOutput, RequestMetrics, RequestOutput
from jaxpaged.server.openai.merged_outputs import LatestOutputs, merged_outputs

NUM_PROMPTS = 3
NUM_STEPS = 500


def _output(prompt: int, step: int, finished: bool) -> RequestOutput:
    """Prompt `prompt`'s cumulative output after `step` + 1 tokens."""
    sample = CompletionOutput(index=0, text="x" * (step + 1), token_ids=list(range(step + 1)),
                              cumulative_logprob=None, logprobs=None, finish_reason="length" if finished else None)
    return RequestOutput(request_id=f"cmpl-{prompt}", prompt=None, prompt_token_ids=[1], num_cached_tokens=0,
                         outputs=[sample], finished=finished, metrics=RequestMetrics(arrival_time=0.0))


class _EngineStream:
    """Stands in for a RequestStream: NUM_STEPS cumulative outputs, one per event-loop turn (an engine step),
    then optionally an error."""

    def __init__(self, prompt: int, error: Optional[BaseException] = None) -> None:
        self.prompt, self.error = prompt, error
        self.num_produced = 0

    def __aiter__(self) -> "_EngineStream":
        return self

    async def __anext__(self) -> RequestOutput:
        await asyncio.sleep(0)
        if self.num_produced == NUM_STEPS:
            if self.error is not None:
                raise self.error
            raise StopAsyncIteration
        self.num_produced += 1
        return _output(self.prompt, self.num_produced - 1, self.num_produced == NUM_STEPS and self.error is None)


async def _lagging_reader(streams: list[Any]) -> tuple[list[tuple[int, RequestOutput]], list[tuple[int, Any]]]:
    """Reads one output, stops reading until every stream has produced all it will, then reads the rest."""
    merged = merged_outputs(streams)
    first = [await merged.__anext__()]
    while any(stream.num_produced < NUM_STEPS for stream in streams):
        await asyncio.sleep(0)
    for _ in range(3):  # the pumps take the last outputs and see their streams end
        await asyncio.sleep(0)
    rest: list[tuple[int, Any]] = []
    try:
        async for item in merged:
            rest.append(item)
    except RuntimeError as error:
        rest.append((-1, error))
    return first, rest


def test_a_lagging_reader_gets_each_prompts_newest_output_not_a_backlog():
    """After lagging 500 steps behind three prompts, the reader gets three outputs (each prompt's final one),
    not 1,500 snapshots; a prompt's outputs never go backwards."""
    streams = [_EngineStream(prompt) for prompt in range(NUM_PROMPTS)]
    first, rest = asyncio.run(_lagging_reader(streams))
    assert len(rest) == NUM_PROMPTS
    assert sorted(index for index, _ in rest) == list(range(NUM_PROMPTS))
    assert all(output.finished and len(output.outputs[0].token_ids) == NUM_STEPS for _, output in rest)
    assert first[0][1].outputs[0].token_ids == [0]


def test_a_failed_stream_reaches_the_reader_after_what_is_pending():
    """A prompt's stream that fails hands its error to the reader once the others' pending outputs are read."""
    streams = [_EngineStream(0), _EngineStream(1, error=RuntimeError("engine died")), _EngineStream(2)]
    _, rest = asyncio.run(_lagging_reader(streams))
    *outputs, (index, error) = rest
    assert index == -1 and isinstance(error, RuntimeError) and str(error) == "engine died"
    assert {index for index, _ in outputs} == {0, 1, 2}  # prompt 1's newest output still came first


def test_pending_outputs_are_replaced_in_place():
    """A newer output replaces the pending one of its prompt and keeps that prompt's place in line."""
    async def scenario() -> tuple[int, list[tuple[int, int]]]:
        latest = LatestOutputs(2)
        latest.put(1, _output(1, 0, False))
        latest.put(0, _output(0, 0, False))
        latest.put(1, _output(1, 5, False))
        pending = latest.num_pending
        latest.end()
        latest.end()
        taken = []
        while (item := await latest.next()) is not None:
            taken.append((item[0], len(item[1].outputs[0].token_ids)))
        return pending, taken

    pending, taken = asyncio.run(scenario())
    assert pending == 2 and taken == [(1, 6), (0, 1)]


@pytest.mark.parametrize("num_prompts", [1, 2, 8])
def test_a_reader_that_keeps_up_gets_each_prompts_outputs_in_order(num_prompts):
    """A reader that reads as fast as outputs come gets each prompt's outputs, never going backwards, ending with its
    final one."""
    async def read_all() -> dict[int, list[int]]:
        lengths: dict[int, list[int]] = {}
        async for index, output in merged_outputs([_EngineStream(prompt) for prompt in range(num_prompts)]):
            lengths.setdefault(index, []).append(len(output.outputs[0].token_ids))
        return lengths

    lengths = asyncio.run(read_all())
    assert sorted(lengths) == list(range(num_prompts))
    for seen in lengths.values():
        assert seen == sorted(seen) and seen[-1] == NUM_STEPS
