"""Speculative decoding's options: vLLM's speculative_config mapping, and bad values named at start-up."""

import pytest

from jaxpaged.config import EngineConfig
from jaxpaged.engine import resolve_async_scheduling


def test_vllm_speculative_config_maps_to_the_flat_options():
    config = EngineConfig.from_options(speculative_config={"method": "ngram", "num_speculative_tokens": 6,
                                                           "prompt_lookup_min": 1, "disable_by_batch_size": 4})
    spec = config.speculative
    assert (spec.speculative_method, spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max,
            spec.speculative_disable_by_batch_size) == ("ngram", 6, 1, 4, 4)
    assert not EngineConfig().speculative.enabled


def test_a_draft_model_is_named_by_vllms_model_key_and_implies_the_method():
    for given in ({"method": "draft_model", "model": "/models/draft"}, {"model": "/models/draft"}):
        spec = EngineConfig.from_options(speculative_config={**given, "num_speculative_tokens": 5}).speculative
        assert (spec.speculative_method, spec.speculative_model, spec.num_speculative_tokens) == \
            ("draft_model", "/models/draft", 5)


@pytest.mark.parametrize("options, field", [
    (dict(speculative_method="eagle"), "speculative_method"),
    (dict(speculative_method="ngram", num_speculative_tokens=0), "num_speculative_tokens"),
    (dict(speculative_method="ngram", num_speculative_tokens=-2), "num_speculative_tokens"),
    (dict(speculative_method="ngram", prompt_lookup_min=4, prompt_lookup_max=3), "prompt_lookup_min"),
    (dict(speculative_method="ngram", speculative_disable_by_batch_size=0), "speculative_disable_by_batch_size"),
    # Beyond the bucket: a decode row and its proposals must fit one step.
    (dict(speculative_method="ngram", num_speculative_tokens=64, max_num_batched_tokens=64, max_num_seqs=8),
     "num_speculative_tokens"),
    (dict(speculative_config={"method": "ngram", "k": 3}), "speculative_config"),
    (dict(speculative_config="ngram"), "speculative_config"),
    (dict(speculative_method="draft_model"), "speculative_model"),
    (dict(speculative_method="draft_model", speculative_model=""), "speculative_model"),
    (dict(speculative_method="ngram", speculative_model="/models/draft"), "speculative_model"),
    (dict(speculative_model="/models/draft", num_speculative_tokens=0), "num_speculative_tokens"),
    (dict(speculative_model="/models/draft", num_speculative_tokens=64, max_num_batched_tokens=64, max_num_seqs=8),
     "num_speculative_tokens"),
    (dict(speculative_model="/models/draft", data_parallel_size=2), "speculative_method"),
    (dict(speculative_model="/models/draft", distributed=True), "speculative_method"),
])
def test_bad_values_are_refused_naming_the_field(options, field):
    with pytest.raises(ValueError, match=f"^{field}: "):
        EngineConfig.from_options(**options)


def test_async_scheduling_stays_on_with_speculation():
    # The overlapped loop plans ahead only while nobody proposes (tests/engine/test_speculative_decoding.py).
    assert resolve_async_scheduling(EngineConfig.from_options(speculative_method="ngram"), "cpu") is True
