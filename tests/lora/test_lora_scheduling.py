"""Host-only LoRA keys and admission: block hashes and token-granular roots differ by adapter (and still by salt),
KV events name the adapter, and admission keeps the running requests' adapters within max_loras."""

from jaxpaged.config import CacheConfig, SchedulerConfig
from jaxpaged.core import Request, Scheduler
from jaxpaged.core.hashing import lora_of_extra_keys, request_block_hash, request_parent_key
from jaxpaged.core.kv_events import BlockStored
from jaxpaged.features.kv_events import named_fields

TOKENS = list(range(100, 116))


def _request(request_id: str, lora_id: int = 0, salt=None, tokens=TOKENS, max_tokens: int = 4,
             fingerprint: str = "w") -> Request:
    return Request(request_id, tokens, max_tokens=max_tokens, lora_id=lora_id,
                   lora_name=f"adapter{lora_id}" if lora_id else None, cache_salt=salt,
                   lora_fingerprint=fingerprint if lora_id else None)


def test_block_hashes_and_roots_differ_by_adapter_and_salt():
    """Every full block's hash and the first block's token-granular root differ between the base model, two
    adapters, one adapter under two salts and one id and name with other weights (a persisted block after a restart);
    the same adapter and salt hash alike."""
    keys = [(0, None, "w"), (1, None, "w"), (2, None, "w"), (1, "s", "w"), (1, "t", "w"), (1, None, "other")]
    hashes = [[request_block_hash(_request(f"r{i}", lora, salt, fingerprint=weights), block, 4) for block in range(4)]
              for i, (lora, salt, weights) in enumerate(keys)]
    roots = [request_parent_key(_request(f"p{i}", lora, salt, fingerprint=weights), 0, 4)
             for i, (lora, salt, weights) in enumerate(keys)]
    for block in range(4):
        assert len({row[block] for row in hashes}) == len(keys)
    assert len(set(roots)) == len(keys)
    assert request_block_hash(_request("again", 1, "s"), 3, 4) == hashes[3][3]


def test_kv_events_name_the_adapter():
    """A stored block of an adapter's request carries lora_id and lora_name; a base block carries None."""
    adapter_keys = ("cache_salt", "s", "lora", 3, "sql")
    assert lora_of_extra_keys(adapter_keys) == (3, "sql")
    stored = BlockStored((b"h" * 32,), None, tuple(TOKENS[:4]), 4, "GPU", (adapter_keys,))
    fields = named_fields(stored)
    assert (fields["lora_id"], fields["lora_name"]) == (3, "sql")
    base = named_fields(BlockStored((b"h" * 32,), None, tuple(TOKENS[:4]), 4, "GPU", (None,)))
    assert (base["lora_id"], base["lora_name"]) == (None, None)


def test_admission_keeps_running_adapters_within_max_loras():
    """With max_loras 1: base requests and one adapter's run together; a second adapter's request waits (and the
    queue behind it) until the first adapter's requests finish, then runs."""
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=128, max_model_len=64),
                          CacheConfig(block_size=4), 64, max_loras=1)
    for request in (_request("base", 0, tokens=[1, 2, 3]), _request("a1", 1, tokens=[4, 5, 6]),
                    _request("a1-again", 1, tokens=[7, 8]), _request("a2", 2, tokens=[9, 10]),
                    _request("base-late", 0, tokens=[11, 12])):
        scheduler.add_request(request)
    seen_together = []
    while scheduler.has_unfinished_requests():
        output = scheduler.schedule()
        running = {item.request.lora_id for item in output.scheduled if item.request.lora_id}
        assert len(running) <= 1
        seen_together.append({item.request.request_id for item in output.scheduled})
        scheduler.update_from_output(output, [7] * output.num_sampled_requests)
    assert seen_together[0] == {"base", "a1", "a1-again"}
    assert any("a2" in step for step in seen_together)
