"""Host time per engine step of Scheduler.schedule() + update_from_output() at a full decode batch.

256 running requests with 1-2k tokens of context each, prefix caching on, against a fake runner that
samples instantly: what is left is the scheduler's own Python overhead, paid every step on the host.
Then the prefix lookup per admitted request (the helpdesk shape: a 1,000-token shared prompt, a new question,
against a cache holding 64 earlier questions), token-granular and whole-block.

    python -m benchmarks.scheduler_overhead [--num-requests 256] [--num-steps 2000]
                                            [--prefix-caching-granularity token|block]
"""

import argparse
import gc
import random
import statistics
import time

from jaxpaged.config import CacheConfig, SchedulerConfig
from jaxpaged.core import KVCacheManager, Request, Scheduler

TARGET_MEDIAN_MS = 0.5


def build_decode_batch(num_requests: int, num_steps: int, seed: int, granularity: str = "token") -> Scheduler:
    """A scheduler whose num_requests requests have all finished their prefill and are decoding."""
    rng = random.Random(seed)
    block_size = 16
    max_context = 2048
    # Generous limits: the early requests already decode while later ones are still in prefill.
    max_tokens = num_steps + 1024
    max_model_len = max_context + max_tokens
    scheduler_config = SchedulerConfig(max_num_seqs=num_requests, max_num_batched_tokens=8192,
                                       max_model_len=max_model_len)
    num_blocks = num_requests * (-(-max_model_len // block_size)) + 1
    cache_config = CacheConfig(block_size=block_size, prefix_caching_granularity=granularity)  # type: ignore[arg-type]
    scheduler = Scheduler(scheduler_config, cache_config, num_blocks)
    for index in range(num_requests):
        # A shared system prompt, then a distinct body: realistic prefix hits at admission.
        context_len = rng.randint(1024, max_context)
        prompt = list(range(256)) + [rng.randrange(32000) for _ in range(context_len - 256)]
        scheduler.add_request(Request(f"request-{index}", prompt, max_tokens=max_tokens, ignore_eos=True))
    while any(request.num_computed_tokens < request.num_tokens - 1 for request in scheduler.running) \
            or scheduler.num_waiting:
        output = scheduler.schedule()
        scheduler.update_from_output(output, fake_runner(output, rng))
    return scheduler


def fake_runner(output, rng: random.Random) -> list[int]:
    """One sampled token per sampling request, instantly."""
    return [rng.randrange(32000) for _ in range(output.num_sampled_requests)]


def measure(scheduler: Scheduler, num_steps: int, seed: int) -> list[float]:
    """Seconds of schedule() + update_from_output() per step (the fake runner's time excluded)."""
    rng = random.Random(seed)
    num_requests = scheduler.num_running
    step_seconds = []
    gc.collect()
    for _ in range(num_steps):
        sampled_token_ids = [rng.randrange(32000) for _ in range(num_requests)]
        start = time.perf_counter()
        output = scheduler.schedule()
        scheduler.update_from_output(output, sampled_token_ids)
        step_seconds.append(time.perf_counter() - start)
        if output.num_scheduled_tokens != num_requests or output.num_sampled_requests != num_requests:
            raise RuntimeError("the benchmark left the pure-decode regime (a request stopped or was preempted)")
    return step_seconds


def measure_admission_lookups(granularity: str, num_lookups: int, seed: int) -> list[float]:
    """Seconds of find_prefix_hit() for new helpdesk requests (their block hashes not yet computed)."""
    rng = random.Random(seed)
    manager = KVCacheManager(num_kv_blocks=8192, block_size=16, token_granular=granularity == "token")
    system = [rng.randrange(32000) for _ in range(1000)]

    def helpdesk_request(name: str) -> Request:
        return Request(name, system + [rng.randrange(32000) for _ in range(rng.randint(16, 48))])

    for index in range(64):  # earlier questions, computed and finished: their blocks stay cached
        request = helpdesk_request(f"earlier-{index}")
        hit = manager.find_prefix_hit(request)
        manager.allocate_slots(request, request.num_tokens - hit.num_tokens, hit.block_ids, hit.copy_source,
                               hit.num_copied_tokens)
        manager.take_block_copies()
        request.num_computed_tokens = request.num_tokens
        manager.cache_full_blocks(request)
        manager.free(request)
    lookup_seconds = []
    gc.collect()
    for index in range(num_lookups):
        request = helpdesk_request(f"new-{index}")
        start = time.perf_counter()
        hit = manager.find_prefix_hit(request)
        lookup_seconds.append(time.perf_counter() - start)
        expected = 1000 if granularity == "token" else 992
        if hit.num_tokens < expected:
            raise RuntimeError(f"the lookup found {hit.num_tokens} tokens, expected at least {expected}")
    return lookup_seconds


def main() -> None:
    assert __doc__ is not None  # the module docstring
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--num-steps", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prefix-caching-granularity", choices=("token", "block"), default="token")
    args = parser.parse_args()

    scheduler = build_decode_batch(args.num_requests, args.num_steps, args.seed, args.prefix_caching_granularity)
    step_ms = sorted(seconds * 1e3 for seconds in measure(scheduler, args.num_steps, args.seed))
    median_ms = statistics.median(step_ms)
    p90_ms = step_ms[int(0.9 * (len(step_ms) - 1))]
    stats = scheduler.stats()
    print(f"scheduler overhead: {args.num_requests} decoding requests, {args.num_steps} steps, prefix caching on "
          f"({args.prefix_caching_granularity}-granular)")
    print(f"  schedule + update per step: median {median_ms:.3f} ms, p90 {p90_ms:.3f} ms, "
          f"per request {median_ms * 1e3 / args.num_requests:.2f} us")
    print(f"  kv usage {stats.kv_cache_usage:.2f}, prefix hits {stats.prefix_cache_hits}/{stats.prefix_cache_queries} "
          f"tokens, preemptions {stats.num_preemptions}")
    verdict = "meets" if median_ms <= TARGET_MEDIAN_MS else "MISSES"
    print(f"  {verdict} the target of median <= {TARGET_MEDIAN_MS} ms per step")
    for granularity in ("block", "token"):
        lookup_us = sorted(seconds * 1e6 for seconds in measure_admission_lookups(granularity, 500, args.seed))
        print(f"  prefix lookup per admitted helpdesk request ({granularity}-granular): median "
              f"{statistics.median(lookup_us):.1f} us, p90 {lookup_us[int(0.9 * (len(lookup_us) - 1))]:.1f} us")


if __name__ == "__main__":
    main()
