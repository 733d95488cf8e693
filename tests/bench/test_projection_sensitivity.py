"""The projection-sensitivity bench scores each choice as lm-eval does (the whole string tokenized, the context's
tokens cut off its front) and refuses a projection kind that does not exist before it reads any weight."""

import pytest

from benchmarks.quantization.projection_sensitivity import _pairs, measure


def test_each_choice_is_split_off_the_whole_strings_tokens():
    from transformers import AutoTokenizer

    from jaxpaged.weights.loader import locate_model

    tokenizer = AutoTokenizer.from_pretrained(str(locate_model(None)[0]))
    item = {"question": "The capital of France is", "choices": [" Paris", " Rome", " New Delhi", " Oslo"], "answer": 0}
    pairs = _pairs(tokenizer, [item])
    assert len(pairs) == 4
    for (context, continuation), choice in zip(pairs, item["choices"]):
        assert context == tokenizer(item["question"]).input_ids
        assert context + continuation == tokenizer(item["question"] + choice).input_ids
        assert tokenizer.decode(continuation) == choice  # one space, the word: no lone space token


def test_an_unknown_projection_is_refused(tmp_path):
    with pytest.raises(ValueError, match="leave_out"):
        measure(["lm_head"], tmp_path)
