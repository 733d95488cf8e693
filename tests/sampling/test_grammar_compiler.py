"""GrammarCompiler on the embedded model's tokenizer: a schema nested past MAX_SCHEMA_DEPTH is refused as bad
input naming the field (as a dict, or as JSON text that would exhaust Python's recursion), and a constraint
sent again is served from the cache instead of being compiled again."""

import json

import numpy as np
import pytest
from transformers import PreTrainedTokenizerFast

from jaxpaged.sampling.grammar import GrammarCompiler, fill_bitmasks, limits
from jaxpaged.sampling.params import StructuredOutputsParams


@pytest.fixture(scope="module")
def compiler(smollm2_tokenizer_dir):
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(smollm2_tokenizer_dir))
    compiler = GrammarCompiler(tokenizer, tokenizer.vocab_size, [tokenizer.eos_token_id])
    yield compiler
    compiler.close()


def nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth - 1):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def test_a_schema_nested_too_deep_is_bad_input_naming_the_field(compiler):
    limit = limits.MAX_SCHEMA_DEPTH
    compiler.compile(StructuredOutputsParams(json=nested(limit // 2)))  # "properties" doubles the JSON depth
    with pytest.raises(ValueError, match=f"^guided_json: the schema is nested deeper than {limit} levels"):
        compiler.compile(StructuredOutputsParams(json=nested(limit), origin="guided_json"))
    deep_text = '{"a": ' * 100_000 + "1" + "}" * 100_000  # json.loads alone raises RecursionError on this
    with pytest.raises(ValueError, match="^response_format: the schema is nested deeper"):
        compiler.compile(StructuredOutputsParams(json=deep_text, origin="response_format"))


def test_the_same_constraint_compiles_once(compiler):
    """A constraint sent again (a schema as a dict, then as JSON text laid out otherwise) is served from the cache,
    not sent to a worker again."""
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}}}
    first = compiler.compile(StructuredOutputsParams(json=schema))
    num_compiles = compiler.pool.num_compiles
    again = compiler.compile(StructuredOutputsParams(json=json.dumps(schema, indent=2)))
    other = compiler.compile(StructuredOutputsParams(regex="[a-z]+"))
    assert first is again and other is not first and compiler.pool.num_compiles == num_compiles + 1


def test_several_rows_fill_their_masks_as_one_at_a_time_would(compiler):
    grammars = [compiler.new_request_grammar(compiler.compile(StructuredOutputsParams(choice=["yes", "no"]))),
                compiler.new_request_grammar(compiler.compile(StructuredOutputsParams(regex="[0-9]{3}")))]
    words = -(-compiler.vocab_size // 32)
    together, alone = np.full((4, words), -1, np.int32), np.full((4, words), -1, np.int32)
    fill_bitmasks([(grammars[0], 1), (grammars[1], 3)], together)
    grammars[0].fill_bitmask(alone, 1)
    grammars[1].fill_bitmask(alone, 3)
    assert np.array_equal(together, alone) and not np.array_equal(together[1], together[3])
    assert (together[0] == -1).all() and (together[2] == -1).all()  # rows without a grammar stay all-allowed
