"""Grammars compile in worker processes: a worker that crashes (a test hook's os.abort(), or llguidance's real
segfault on issue 56's $defs chain) or overruns its time fails only that constraint, with a ValueError naming the
field, and the next constraint still compiles. One matcher per compiled grammar is copied for each sample."""

import json

import llguidance
import numpy as np
import pytest
from llguidance.numpy import fill_next_token_bitmask
from transformers import PreTrainedTokenizerFast

from jaxpaged.sampling.grammar import GrammarCompiler, worker_pool
from jaxpaged.sampling.grammar.grammar_source import grammar_of_key
from jaxpaged.sampling.grammar.worker_protocol import CRASH_ON_ENV
from jaxpaged.sampling.params import StructuredOutputsParams
from tests.sampling.test_grammar_limits import ref_chain


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer_dir):
    return PreTrainedTokenizerFast.from_pretrained(str(smollm2_tokenizer_dir))


@pytest.fixture(scope="module")
def compiler(tokenizer):
    """One worker, so every compile after a crash needs the replacement process."""
    compiler = GrammarCompiler(tokenizer, tokenizer.vocab_size, [tokenizer.eos_token_id], num_workers=1,
                               worker_env={CRASH_ON_ENV: "crash-here"})
    yield compiler
    compiler.close()


def test_a_worker_that_aborts_fails_only_its_constraint(compiler):
    """os.abort() in the worker is a ValueError naming the field and the signal; the next constraint compiles in a
    new worker process."""
    compiler.compile(StructuredOutputsParams(regex="[0-9]+"))
    (before,) = compiler.pool.processes()
    with pytest.raises(ValueError, match=r"^guided_regex: the grammar engine crashed on this constraint \(killed by "
                                         r"SIGABRT\)"):
        compiler.compile(StructuredOutputsParams(regex="crash-here", origin="guided_regex"))
    assert compiler.pool.processes() == [] and compiler.pool.num_crashes == 1
    grammar = compiler.compile(StructuredOutputsParams(choice=["yes", "no"]))
    (after,) = compiler.pool.processes()
    assert after.pid != before.pid and not grammar.matcher.is_error()


def test_the_real_ref_chain_segfaults_only_its_worker(compiler):
    """Issue 56's 1,200-link $defs chain, sent past the limits straight to a worker, kills that worker (llguidance
    overflows its stack); the server side gets a GrammarWorkerCrash and the next constraint compiles."""
    key = ("json", json.dumps(ref_chain(1200)))
    with pytest.raises(worker_pool.GrammarWorkerCrash, match=r"crashed on this constraint \(killed by SIG"):
        compiler.pool.compile(key)
    assert compiler.pool.compile(("regex", "[a-z]{3}"))[0] == "ok"


def test_a_compile_past_the_timeout_is_refused_and_the_worker_replaced(compiler, monkeypatch):
    """A constraint that keeps the worker busy past COMPILE_TIMEOUT_S is refused naming the field; the stuck worker
    is killed and the next constraint compiles."""
    monkeypatch.setattr(worker_pool, "COMPILE_TIMEOUT_S", 0.2)
    compiler.compile(StructuredOutputsParams(regex="[0-9]"))  # the worker is up before the clock starts
    with pytest.raises(ValueError, match=r"^structured_outputs.regex: the grammar engine took longer than 0.2 s"):
        compiler.compile(StructuredOutputsParams(regex="(a{1000}){1000}"))
    monkeypatch.undo()
    assert not compiler.compile(StructuredOutputsParams(regex="b+")).matcher.is_error()


def test_an_invalid_constraint_is_an_error_not_a_crash(compiler):
    """A regex llguidance refuses comes back as its message under the field; no worker is lost."""
    num_crashes = compiler.pool.num_crashes
    with pytest.raises(ValueError, match=r"^structured_outputs.regex: .+"):
        compiler.compile(StructuredOutputsParams(regex="(unclosed"))
    assert compiler.pool.num_crashes == num_crashes


def test_samples_get_independent_copies_of_one_matcher_with_the_right_first_mask(compiler, tokenizer):
    """Two samples of one compiled grammar start from its first mask (equal to a matcher built from scratch), and a
    token one of them accepts leaves the other at the start."""
    compiled = compiler.compile(StructuredOutputsParams(choice=["yes", "no"]))
    first, second = compiler.new_request_grammar(compiled), compiler.new_request_grammar(compiled)
    reference = llguidance.LLMatcher(compiler.tokenizer, grammar_of_key(("choice", ("yes", "no"))), log_level=0)
    expected = np.zeros((1, compiler.bitmask_words), np.int32)
    fill_next_token_bitmask(reference, expected, 0)
    masks = np.zeros((2, compiler.bitmask_words), np.int32)
    first.fill_bitmask(masks, 0)
    (yes,) = tokenizer.encode("yes")
    first.accept(yes)
    second.fill_bitmask(masks, 1)
    assert np.array_equal(masks[0], expected[0]) and np.array_equal(masks[1], expected[0])
    assert masks[0][yes // 32] >> (yes % 32) & 1
    assert first.is_finished and not second.is_finished
    assert not compiled.matcher.is_stopped()  # the compiled matcher itself never advances
