"""The one place that imports the optional features and decides which an engine gets."""

from typing import TYPE_CHECKING, Optional

import jax

from jaxpaged.config import EngineConfig
from jaxpaged.features.base import EngineFeature, FeatureSet
from jaxpaged.runner.model_runner import ModelRunner
from jaxpaged.weights.loader import LoadedModel

if TYPE_CHECKING:
    from jaxpaged.multihost.leader import FollowerLink


def build_features(loaded: LoadedModel, config: EngineConfig, runners: list[ModelRunner], tokenizer) -> FeatureSet:
    """The features `config` turns on, before the schedulers exist (the KV tiers' index is theirs to read)."""
    features: list[EngineFeature] = []
    lower_tiers = None
    if config.cache.kv_offload_enabled:
        from jaxpaged.features.kv_tiers import KVTierFeature, build_kv_tiers

        tiers = build_kv_tiers(loaded, config, runners)
        features.append(KVTierFeature(tiers, config.cache.kv_offload_min_load_blocks,
                                      runners[0].max_model_len))
        lower_tiers = tiers
    if config.cache.enable_prefix_caching:
        from jaxpaged.features.prefix_advisor import PrefixAdvisorFeature

        features.append(PrefixAdvisorFeature(tokenizer, config.advisor_log_text))
    if config.kv_events_config is not None:
        from jaxpaged.kv_events_config import parse_kv_events_config

        events_config = parse_kv_events_config(config.kv_events_config)
        if events_config.enable_kv_cache_events:
            from jaxpaged.features.kv_events import KVEventsFeature

            features.append(KVEventsFeature(events_config))
    if jax.process_count() > 1:
        from jaxpaged.features.multihost import MultiHostFeature

        if jax.process_index() != 0:  # a follower runs multihost/follower.py, never an engine of its own
            raise ValueError(f"process_id: an engine schedules on process 0 only, this is process "
                             f"{jax.process_index()}; build LLM(...) on every process, or run `jaxpaged serve`")
        features.append(MultiHostFeature(runners, config.multihost.distributed_timeout))
    return FeatureSet(features, lower_tiers)


def followers_of(features: FeatureSet) -> "Optional[FollowerLink]":
    """Process 0's FollowerLink when multi-host serving is on, else None (the server's fail-stop watches it)."""
    from jaxpaged.features.multihost import MultiHostFeature

    feature = features.find(MultiHostFeature)
    return feature.followers if isinstance(feature, MultiHostFeature) else None
