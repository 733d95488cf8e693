"""Runs in a subprocess with two forced CPU devices: a dp=2 engine publishing KV events, and a subscriber that
rebuilds each rank's cached set from them.

Usage: JAX_NUM_CPU_DEVICES=2 python -m tests.engine.kv_events_worker MODEL_DIR
Prints one JSON line: the ranks whose rebuilt set holds blocks, whether each equals its rank's cache, and the
sizes after a reset.
"""

import json
import sys
import time
import uuid

from jaxpaged.config import EngineConfig
from jaxpaged.engine import LLMEngine
from jaxpaged.sampling.params import SamplingParams
from jaxpaged.weights.loader import load_model
from tests.engine.kv_events_subscriber import Subscriber

ENGINE_OPTIONS = dict(max_model_len=128, max_num_seqs=4, max_num_batched_tokens=32, num_kv_blocks=32,
                      dtype="float32", attention_backend="xla", compilation_cache_dir="", data_parallel_size=2)


def main(model_dir: str) -> None:
    endpoint, topic = f"inproc://kv-events-{uuid.uuid4().hex}", "kv"
    config = json.dumps({"enable_kv_cache_events": True, "endpoint": endpoint, "topic": topic,
                         "event_layout": "array"})
    engine = LLMEngine(load_model(model_dir), EngineConfig.from_options(**ENGINE_OPTIONS, kv_events_config=config),
                       warmup=False)
    subscriber = Subscriber(endpoint, topic, block_size=16)
    time.sleep(0.2)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    for index in range(4):  # no shared prefixes: the router spreads them by load
        engine.add_request(f"r{index}", {"prompt_token_ids": list(range(100 * index + 1, 100 * index + 41))}, params)
    while engine.has_unfinished_requests():
        engine.step()
    subscriber.drain()
    engine_sets = [{block_hash for _, block_hash in scheduler.kv_cache_manager.cached_blocks()}
                   for scheduler in engine.ranks.schedulers]
    rebuilt = [subscriber.cached.get(rank, set()) for rank in range(2)]
    result = {"ranks_with_blocks": [rank for rank in range(2) if rebuilt[rank]],
              "rebuilt_equals_engine": [rebuilt[rank] == engine_sets[rank] for rank in range(2)]}
    engine.reset_prefix_cache()
    subscriber.drain()
    result["after_reset"] = [len(subscriber.cached.get(rank, set())) for rank in range(2)]
    engine.close()
    subscriber.close()
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
