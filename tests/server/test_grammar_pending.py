"""AsyncLLMEngine holds a constrained request outside the engine until its grammar is ready: other requests run
meanwhile, an abort while it waits frees its place, and a refused grammar is the ValueError wait_added raises."""

import asyncio
import concurrent.futures
import re

import pytest

from jaxpaged.async_engine import AsyncLLMEngine
from jaxpaged.sampling.params import SamplingParams, StructuredOutputsParams

REGEX = StructuredOutputsParams(regex="[0-9]{4}")


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_dir):
    """A 2-layer engine compiled lazily (only the buckets these tests touch)."""
    from jaxpaged.config import EngineConfig
    from jaxpaged.engine import LLMEngine
    from jaxpaged.weights.loader import load_model

    config = EngineConfig.from_options(max_model_len=128, max_num_seqs=4, max_num_batched_tokens=16,
                                       dtype="float32", attention_backend="xla", compilation_cache_dir="")
    engine = LLMEngine(load_model(str(tiny_model_dir)), config, warmup=False)
    yield engine
    engine.grammars.close()


class HeldGrammars:
    """Stands in for GrammarCompiler.submit: every grammar submitted is a future the test completes itself."""

    def __init__(self, compiler) -> None:
        self.futures: list[concurrent.futures.Future] = []
        self._real_submit = compiler.submit

    def submit(self, params: StructuredOutputsParams) -> concurrent.futures.Future:
        self.futures.append(concurrent.futures.Future())
        return self.futures[-1]

    def compile(self, params: StructuredOutputsParams):
        """The real compiled grammar (what the held future would have held)."""
        return self._real_submit(params).result()


@pytest.fixture
def held_grammars(tiny_engine, monkeypatch):
    held = HeldGrammars(tiny_engine.grammars)
    monkeypatch.setattr(tiny_engine.grammars, "submit", held.submit)
    return held


@pytest.fixture
def looped(tiny_engine):
    """The tiny engine on a loop thread, shut down after the test."""
    engine = AsyncLLMEngine(tiny_engine)
    engine.start()
    yield engine
    engine.shutdown()


def constrained(max_tokens: int = 8) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, structured_outputs=REGEX)


def test_a_request_waiting_for_its_grammar_is_not_in_the_engine_and_others_run(looped, tiny_engine, held_grammars):
    """While its grammar compiles the request is counted but not in the engine; a plain request runs to the end
    meanwhile; once the grammar is ready the held request runs and follows it."""

    async def scenario():
        held = looped.add_request("held", "Number:", constrained())
        free = looped.add_request("free", "Hello", SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
        await free.wait_added()
        output = [output async for output in free][-1]
        assert output.finished and len(output.outputs[0].token_ids) == 4
        assert "held" not in tiny_engine.requests and looped.num_unfinished_seqs == 1
        held_grammars.futures[0].set_result(held_grammars.compile(REGEX))
        await held.wait_added()
        return [output async for output in held][-1]

    final = asyncio.run(scenario())
    assert final.finished and re.fullmatch("[0-9]{4}", final.outputs[0].text), final.outputs[0].text


def test_an_abort_while_the_grammar_compiles_frees_the_request(looped, tiny_engine, held_grammars):
    """Closing the stream of a request that waits for its grammar uncounts it at once; the grammar arriving later
    brings nothing into the engine."""

    async def scenario():
        stream = looped.add_request("gone", "Number:", constrained())
        assert looped.num_unfinished_seqs == 1
        stream.close()
        assert looped.num_unfinished_seqs == 0
        held_grammars.futures[0].set_result(held_grammars.compile(REGEX))
        await asyncio.sleep(0.5)  # a loop turn or more: an add that slipped through would be in the engine now

    asyncio.run(scenario())
    assert "gone" not in tiny_engine.requests and looped.num_unfinished_seqs == 0


def test_a_refused_grammar_is_the_error_wait_added_raises(looped, held_grammars):
    """A grammar refused off the loop (a limit, a crash) reaches the client as the ValueError that names the field,
    and the request is no longer counted; a second add under the id of a waiting one is refused at once."""

    async def scenario():
        stream = looped.add_request("bad", "Number:", constrained())
        again = looped.add_request("bad", "Number:", constrained())
        with pytest.raises(ValueError, match="^request_id: 'bad' is already in use"):
            await again.wait_added()
        held_grammars.futures[0].set_exception(ValueError("guided_regex: the grammar engine crashed on it"))
        with pytest.raises(ValueError, match="^guided_regex: the grammar engine crashed"):
            await stream.wait_added()

    asyncio.run(scenario())
    assert looped.num_unfinished_seqs == 0
