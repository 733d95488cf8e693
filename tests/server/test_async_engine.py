"""AsyncLLMEngine on a real (tiny, random-weight) LLMEngine: streaming, refusal, abort, and a failing step
(after which /health and new requests get 503)."""

import asyncio
import threading
import time

import httpx
import pytest

from jaxpaged.async_engine import AsyncLLMEngine, EngineDeadError
from jaxpaged.sampling.params import SamplingParams
from jaxpaged.server import ServerSettings, build_app
from tests.server.server_helpers import ServerThread


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_dir):
    """A 2-layer engine compiled lazily (only the buckets these tests touch)."""
    from jaxpaged.config import EngineConfig
    from jaxpaged.engine import LLMEngine
    from jaxpaged.weights.loader import load_model

    config = EngineConfig.from_options(max_model_len=128, max_num_seqs=4, max_num_batched_tokens=16,
                                       dtype="float32", attention_backend="xla", compilation_cache_dir="")
    return LLMEngine(load_model(str(tiny_model_dir)), config, warmup=False)


@pytest.fixture
def looped(tiny_engine):
    """The tiny engine on a loop thread, shut down after the test."""
    engine = AsyncLLMEngine(tiny_engine)
    engine.start()
    yield engine
    engine.shutdown()


def _params(max_tokens: int, n: int = 1) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, n=n, temperature=0.0, ignore_eos=True)


def test_stream_refuse_and_abort(looped, tiny_engine):
    """Outputs grow to max_tokens and finish; a duplicate id is refused with the engine's ValueError and
    nothing else is disturbed; closing a stream early aborts it and frees its KV blocks."""

    async def scenario():
        kept = looped.add_request("kept", {"prompt_token_ids": [1, 2, 3]}, _params(12, n=2))
        dropped = looped.add_request("dropped", {"prompt_token_ids": [4, 5, 6]}, _params(100))
        duplicate = looped.add_request("kept", {"prompt_token_ids": [7]}, _params(4))
        assert looped.num_unfinished_seqs == 4  # counted at once: 2 + 1 + 1
        await kept.wait_added()
        await dropped.wait_added()
        with pytest.raises(ValueError, match="request_id"):
            await duplicate.wait_added()
        await dropped.__anext__()
        dropped.close()
        lengths = []
        async for output in kept:
            lengths.append([len(sample.token_ids) for sample in output.outputs])
        return output, lengths

    final, lengths = asyncio.run(scenario())
    assert final.finished and [len(sample.token_ids) for sample in final.outputs] == [12, 12]
    assert all(a <= b for earlier, later in zip(lengths, lengths[1:]) for a, b in zip(earlier, later))
    for _ in range(200):
        stats = looped.get_stats()
        if looped.num_unfinished_seqs == 0 and stats.kv_cache_usage == 0.0 and stats.num_running == 0:
            break
        time.sleep(0.05)
    assert looped.num_unfinished_seqs == 0 and looped.get_stats().kv_cache_usage == 0.0
    assert not tiny_engine.has_unfinished_requests()
    assert looped.get_stats().generation_tokens_total < 24 + 50  # "dropped" stopped far short of 100


def test_failing_step_fails_every_stream(looped, tiny_engine, monkeypatch):
    """An engine step that raises ends every stream with EngineDeadError and marks the loop dead."""

    def broken_step():
        raise RuntimeError("simulated device failure")

    async def scenario():
        monkeypatch.setattr(tiny_engine, "step", broken_step)
        stream = looped.add_request("doomed", {"prompt_token_ids": [1, 2]}, _params(4))
        with pytest.raises(EngineDeadError):
            await stream.wait_added()
            async for _ in stream:
                pass

    asyncio.run(scenario())
    assert not looped.is_alive and looped.num_unfinished_seqs == 0
    with pytest.raises(EngineDeadError):
        asyncio.run(_add_one(looped))
    with ServerThread(build_app(looped, ServerSettings())) as running:  # the HTTP view of a dead engine
        assert httpx.get(running.base_url + "/health").status_code == 503
        refused = httpx.post(running.base_url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "engine_unavailable"
    monkeypatch.undo()
    tiny_engine.abort_request("doomed")


def test_health_reports_a_hung_step(looped, tiny_engine, monkeypatch):
    """A hung step raises nothing: /health answers 503 once no step has finished for engine_step_timeout_s while
    a request is pending (never while idle), and 200 again once steps resume."""
    release = threading.Event()
    real_step = tiny_engine.step

    def hanging_step():
        release.wait(60)
        return real_step()

    monkeypatch.setattr(tiny_engine, "step", hanging_step)
    with ServerThread(build_app(looped, ServerSettings(engine_step_timeout_s=0.5))) as running:
        health = running.base_url + "/health"
        time.sleep(1.0)
        assert httpx.get(health).status_code == 200  # idle for longer than the bound: not a hang
        answers = []
        body = {"prompt": "hi", "max_tokens": 2}
        client = threading.Thread(target=lambda: answers.append(
            httpx.post(running.base_url + "/v1/completions", json=body, timeout=60)))
        client.start()
        deadline = time.monotonic() + 30
        while (stalled := httpx.get(health)).status_code == 200:
            assert time.monotonic() < deadline, "/health stayed 200 with a step hung"
            time.sleep(0.1)
        assert stalled.status_code == 503 and stalled.json()["error"]["code"] == "engine_stalled"
        assert looped.seconds_without_progress > 0.5 and looped.num_unfinished_seqs == 1
        release.set()
        client.join(60)
        assert answers and answers[0].status_code == 200
        assert httpx.get(health).status_code == 200


async def _add_one(engine: AsyncLLMEngine) -> None:
    engine.add_request("late", {"prompt_token_ids": [1]}, _params(1))


def test_async_scheduling_streams_the_synchronous_tokens_and_aborts_cleanly(tiny_model_dir, tiny_engine):
    """The server's loop over an engine that plans each step ahead: the streamed tokens are those of the
    synchronous engine, and a stream closed with a step in flight frees its blocks."""
    from jaxpaged.config import EngineConfig
    from jaxpaged.engine import LLMEngine
    from jaxpaged.weights.loader import load_model

    config = EngineConfig.from_options(max_model_len=128, max_num_seqs=4, max_num_batched_tokens=16,
                                       dtype="float32", attention_backend="xla", compilation_cache_dir="",
                                       async_scheduling=True)
    ahead = LLMEngine(load_model(str(tiny_model_dir)), config, warmup=False)
    prompt = {"prompt_token_ids": [11, 12, 13, 14, 15]}
    tiny_engine.add_request("reference", prompt, _params(20))
    while tiny_engine.has_unfinished_requests():
        for output in tiny_engine.step():
            expected = list(output.outputs[0].token_ids)

    async def scenario(looped):
        kept = looped.add_request("kept", prompt, _params(20))
        dropped = looped.add_request("dropped", {"prompt_token_ids": [4, 5, 6]}, _params(100))
        await kept.wait_added()
        await dropped.wait_added()
        for _ in range(3):
            await dropped.__anext__()
        dropped.close()
        outputs = [output async for output in kept]
        return outputs[-1]

    looped = AsyncLLMEngine(ahead)
    looped.start()
    try:
        final = asyncio.run(scenario(looped))
        for _ in range(200):
            stats = looped.get_stats()
            if looped.num_unfinished_seqs == 0 and stats is not None and stats.kv_cache_usage == 0.0:
                break
            time.sleep(0.05)
        assert final.finished and list(final.outputs[0].token_ids) == expected
        stats = looped.get_stats()
        assert looped.num_unfinished_seqs == 0 and stats is not None and stats.kv_cache_usage == 0.0
    finally:
        looped.shutdown()


def test_a_reader_that_stops_reading_holds_one_output_and_then_gets_the_newest(looped, tiny_engine):
    """One slot per stream: however many steps pass unread, the stream keeps only the newest output (outputs are
    cumulative), so a client that stops reading pins no more memory, and the reader resumes from the newest."""

    async def scenario():
        stream = looped.add_request("slow", {"prompt_token_ids": [1, 2, 3]}, _params(20))
        await stream.wait_added()
        first = await stream.__anext__()
        for _ in range(400):  # let the engine run to the end while nobody reads
            if not tiny_engine.has_unfinished_requests():
                break
            await asyncio.sleep(0.01)
        held = stream._sink._latest
        rest = [output async for output in stream]
        return first, held, rest

    first, held, rest = asyncio.run(scenario())
    assert len(first.outputs[0].token_ids) < 20
    assert held is not None and held.finished and len(held.outputs[0].token_ids) == 20
    assert [output.finished for output in rest] == [True]  # the newest only: nothing queued behind it
    assert rest[0] is held


def test_a_final_only_request_gets_one_output_beside_a_streamed_one(looped):
    """SamplingParams(output_kind="final_only"): the server's non-streaming requests get their last output
    only; a streamed request beside it still gets one per step."""

    async def scenario():
        final_only = looped.add_request("final", {"prompt_token_ids": [5, 6]},
                                        SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True,
                                                       output_kind="final_only"))
        streamed = looped.add_request("streamed", {"prompt_token_ids": [5, 6]}, _params(9))
        streamed_lengths = [len(output.outputs[0].token_ids) async for output in streamed]
        final_outputs = [output async for output in final_only]
        return streamed_lengths, final_outputs

    streamed_lengths, final_outputs = asyncio.run(scenario())
    assert len(final_outputs) == 1 and final_outputs[0].finished
    assert list(final_outputs[0].outputs[0].token_ids) != [] and len(final_outputs[0].outputs[0].token_ids) == 9
    assert streamed_lengths[-1] == 9 and len(streamed_lengths) > 1
