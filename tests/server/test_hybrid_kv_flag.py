"""vLLM's --disable-hybrid-kv-cache-manager (flag, LLM key, config field) turns the KV cache groups off; the KV tiers
and KV events keep them on (they work per group), and so does multi-host serving."""

import logging

from jaxpaged.cli import build_parser
from jaxpaged.cli_options import engine_options_from_args
from jaxpaged.config import EngineConfig
from jaxpaged.runner.startup import hybrid_kv_groups
from jaxpaged.server.config_file import parse_command_line
from jaxpaged.vllm_llm_options import engine_options_from_vllm
from tests.core.test_kv_cache_groups import shaped

GEMMA = shaped(4, 16, (True, False, True, False))


def test_the_vllm_flag_and_llm_key_set_the_config_field():
    """`serve --disable-hybrid-kv-cache-manager` and LLM(disable_hybrid_kv_cache_manager=True) set the field."""
    args = parse_command_line(build_parser(), ["serve", "m", "--disable-hybrid-kv-cache-manager"])
    options = engine_options_from_args(args, environ={})
    assert options == {"disable_hybrid_kv_cache_manager": True}
    assert engine_options_from_vllm({"disable_hybrid_kv_cache_manager": True}) == options
    assert EngineConfig.from_options(**options).cache.disable_hybrid_kv_cache_manager


def test_groups_are_on_for_windows_unless_turned_off():
    """A model with windows gets groups by default; the flag, or a model without windows, has none."""
    assert hybrid_kv_groups(GEMMA, EngineConfig.from_options())
    assert not hybrid_kv_groups(GEMMA, EngineConfig.from_options(disable_hybrid_kv_cache_manager=True))
    assert not hybrid_kv_groups(shaped(4, None, ()), EngineConfig.from_options())


def test_tiers_and_events_keep_the_groups_on(caplog):
    """The KV tiers and KV events work per group: the groups stay on, with no warning."""
    with caplog.at_level(logging.WARNING, logger="jaxpaged.runner.startup"):
        assert hybrid_kv_groups(GEMMA, EngineConfig.from_options(kv_offload_memory=2**20))
        events = EngineConfig.from_options(kv_events_config='{"enable_kv_cache_events": true}')
        assert hybrid_kv_groups(GEMMA, events)
    assert not caplog.records


def test_multi_host_serving_keeps_the_groups_on(caplog, monkeypatch):
    """Several processes: process 0 plans every group's tables and broadcasts them, so the groups stay on, with no
    warning (tests/parallel/test_multihost_batch.py serves a Gemma 3 so)."""
    import jax

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with caplog.at_level(logging.WARNING, logger="jaxpaged.runner.startup"):
        assert hybrid_kv_groups(GEMMA, EngineConfig.from_options())
        assert not hybrid_kv_groups(GEMMA, EngineConfig.from_options(disable_hybrid_kv_cache_manager=True))
    assert not caplog.records
