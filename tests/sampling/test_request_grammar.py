"""RequestGrammar's masks computed ahead (prefetch_bitmasks) are the masks computed on the spot, at every position
of a JSON output, and a token accepted after a prefetch makes the next fill follow the new position."""

import numpy as np
import pytest
from transformers import PreTrainedTokenizerFast

from jaxpaged.sampling.grammar import GrammarCompiler, fill_bitmasks, prefetch_bitmasks
from jaxpaged.sampling.params import StructuredOutputsParams

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
          "required": ["name", "n"]}


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer_dir):
    return PreTrainedTokenizerFast.from_pretrained(str(smollm2_tokenizer_dir))


@pytest.fixture(scope="module")
def compiler(tokenizer):
    compiler = GrammarCompiler(tokenizer, tokenizer.vocab_size, [tokenizer.eos_token_id])
    yield compiler
    compiler.close()


def masks_on_the_spot(grammars, num_rows: int) -> np.ndarray:
    bitmask = np.full((num_rows, grammars[0].bitmask_words), -1, np.int32)
    for row, grammar in enumerate(grammars):
        grammar.fill_bitmask(bitmask, row)
    return bitmask


def test_prefetched_masks_are_the_masks_computed_on_the_spot_at_every_position(compiler, tokenizer):
    grammar = compiler.compile(StructuredOutputsParams(json=SCHEMA))
    ahead, on_the_spot = compiler.new_request_grammar(grammar), compiler.new_request_grammar(grammar)
    tokens = tokenizer.encode('{"name": "a b", "n": 12}')
    for position, token_id in enumerate(tokens):
        prefetch_bitmasks([ahead])
        bitmask = np.full((3, ahead.bitmask_words), -1, np.int32)
        fill_bitmasks([(ahead, 2)], bitmask)
        expected = masks_on_the_spot([on_the_spot], 1)[0]
        assert np.array_equal(bitmask[2], expected), position
        assert (bitmask[:2] == -1).all()  # other rows untouched
        assert expected[token_id // 32] >> (token_id % 32) & 1  # the output's own token is allowed
        ahead.accept(token_id)
        on_the_spot.accept(token_id)
        assert ahead.is_finished == on_the_spot.is_finished == (position == len(tokens) - 1)


def test_a_token_accepted_after_a_prefetch_drops_the_prefetched_mask(compiler, tokenizer):
    grammar = compiler.compile(StructuredOutputsParams(json=SCHEMA))
    ahead, reference = compiler.new_request_grammar(grammar), compiler.new_request_grammar(grammar)
    prefetch_bitmasks([ahead])
    first_token = tokenizer.encode('{"')[0]
    ahead.accept(first_token)  # waits for the job it overtakes, then moves on
    reference.accept(first_token)
    assert np.array_equal(masks_on_the_spot([ahead], 1), masks_on_the_spot([reference], 1))


def test_several_grammars_prefetched_together_or_not_fill_one_step_s_bitmask(compiler):
    choice = compiler.compile(StructuredOutputsParams(choice=["yes", "no"]))
    digits = compiler.compile(StructuredOutputsParams(regex="[0-9]{3}"))
    prefetched = [compiler.new_request_grammar(choice), compiler.new_request_grammar(digits)]
    prefetch_bitmasks(prefetched)
    plain = compiler.new_request_grammar(digits)
    bitmask = np.full((4, plain.bitmask_words), -1, np.int32)
    fill_bitmasks([(prefetched[0], 0), (plain, 1), (prefetched[1], 3)], bitmask)
    expected = masks_on_the_spot([prefetched[0], plain, prefetched[1]], 3)
    assert np.array_equal(bitmask[[0, 1, 3]], expected) and (bitmask[2] == -1).all()


def test_a_grammar_that_starts_after_a_marker_leaves_the_text_before_it_free(compiler, tokenizer):
    """starts_after: no mask and no matcher step until the output has written the marker's tokens; from there the
    masks are a fresh grammar's, and the schema's text is accepted to its end (vLLM's grammar after reasoning)."""
    from jaxpaged.core.request import Request
    from jaxpaged.sampling.bitmask import fill_step_bitmask

    marker = tokenizer.encode("</think>")
    assert len(marker) > 1  # SmolLM2 spells it in pieces: the search must match a sequence
    grammar = compiler.compile(StructuredOutputsParams(json=SCHEMA))
    waiting, fresh = compiler.new_request_grammar(grammar, marker), compiler.new_request_grammar(grammar)
    request = Request("r", [1, 2, 3])
    request.grammar = waiting
    free_text = tokenizer.encode("not json at all </think") + marker[:1]  # a partial marker does not start it
    for token_id in free_text:
        assert waiting.is_waiting and not waiting.constrains_next
        assert fill_step_bitmask([request], 8, tokenizer.vocab_size) is None
        waiting.accept(token_id)
        assert not waiting.is_finished
    for token_id in marker:
        waiting.accept(token_id)
    assert not waiting.is_waiting and waiting.constrains_next
    assert fill_step_bitmask([request], 8, tokenizer.vocab_size) is not None
    answer = tokenizer.encode('{"name": "x", "n": 1}')
    for token_id in answer:
        assert np.array_equal(masks_on_the_spot([waiting], 1), masks_on_the_spot([fresh], 1))
        waiting.accept(token_id)
        fresh.accept(token_id)
    assert waiting.is_finished


def test_starts_after_must_be_a_non_empty_string():
    """A bad starts_after is refused naming the field."""
    with pytest.raises(ValueError, match="structured_outputs.starts_after"):
        StructuredOutputsParams(json=SCHEMA, starts_after="")
