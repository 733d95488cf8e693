"""The prefix-miss advisor as an engine feature: every queued prompt is assessed against the content seen
before (core/prefix_advisor.py), and the tokens the prefix cache missed only because the prompt diverged
earlier are counted in the engine's stats."""

from jaxpaged.core.prefix_advisor import PrefixAdvisor
from jaxpaged.engine.ranks import DataParallelRanks
from jaxpaged.engine.requests import RequestGroup
from jaxpaged.engine.stats import EngineStats
from jaxpaged.features.base import EngineFeature


class PrefixAdvisorFeature(EngineFeature):
    """Feeds the advisor each request's prompt and the prefix-cache hit it found on its rank."""

    def __init__(self, tokenizer, log_text: bool) -> None:
        self.advisor = PrefixAdvisor()
        self._decode = tokenizer.decode if log_text else None

    def on_add(self, group: RequestGroup, dp_rank: int, ranks: DataParallelRanks) -> None:
        first = group.samples[0].request
        hit_tokens = ranks.schedulers[dp_rank].kv_cache_manager.find_prefix_hit(first).num_tokens
        self.advisor.admit(group.prompt.token_ids, group.prompt.cache_salt, hit_tokens, self._decode)

    def on_reset(self) -> None:
        self.advisor.forget()  # what it remembers is what the cache held

    def add_stats(self, stats: EngineStats, ranks: DataParallelRanks) -> None:
        stats.prefix_cache_missed_reusable_tokens = self.advisor.missed_reusable_tokens
