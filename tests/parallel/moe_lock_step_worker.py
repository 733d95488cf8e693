"""Runs in a subprocess with forced CPU devices: a MoE model's greedy tokens with its experts over dp x tp devices
(data-parallel ranks in lock step) against one device's.

Usage: JAX_NUM_CPU_DEVICES=4 python -m tests.parallel.moe_lock_step_worker JOBS_JSON
JOBS_JSON lists [model_dir, [[dp, tp], ...], prompts, engine options] jobs, every one in this process. Prints one JSON
line: per job and layout, whether every prompt's greedy tokens (all prompts at once, then the first alone, so one
rank is idle) equal one device's, the ranks the requests went to, the steps that ran with an idle rank, one device's
shard of the first layer's gate experts and the plan's expert line.
"""

import json
import sys

from jaxpaged.llm import LLM
from tests.parallel.moe_worker import ENGINE_OPTIONS, expert_shard_shape, greedy


def run_layout(model_dir: str, dp: int, tp: int, prompts: list[list[int]], expected: list[list[int]],
               options: dict) -> dict:
    llm = LLM(model_dir, **ENGINE_OPTIONS, **options, tensor_parallel_size=tp, data_parallel_size=dp,
              enable_expert_parallel=True)
    engine = llm.engine
    group = engine.ranks.lock_step
    assert group is not None, "experts over dp x tp devices step the ranks together"
    routed: list[int] = []
    route = engine.ranks.route
    engine.ranks.route = lambda request: routed.append(route(request)) or routed[-1]  # type: ignore[method-assign]
    steps_with_idle_rank = [0]
    forward = group.forward

    def counting_forward(outputs):
        busy = [bool(output.scheduled) for output in outputs]
        steps_with_idle_rank[0] += any(busy) and not all(busy)
        return forward(outputs)

    group.forward = counting_forward  # type: ignore[method-assign]
    together = greedy(llm, prompts)
    alone = greedy(llm, prompts[:1])
    return dict(dp=dp, tp=tp, async_scheduling=engine.config.async_scheduling,
                identical=together == expected and alone == expected[:1], tokens=together,
                alone=alone, expected=expected, routed=routed, steps_with_idle_rank=steps_with_idle_rank[0],
                expert_shard=expert_shard_shape(llm), plan_experts=engine.runner.plan.experts,
                plan=engine.runner.plan.describe())


def main() -> None:
    results = []
    for model_dir, layouts, prompts, options in json.loads(sys.argv[1]):
        expected = greedy(LLM(model_dir, **ENGINE_OPTIONS), prompts)
        results.append([run_layout(model_dir, dp, tp, prompts, expected, options) for dp, tp in layouts])
    print(json.dumps(results))


if __name__ == "__main__":
    main()
