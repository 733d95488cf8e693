"""Speculative decoding: proposers, and the engine-side policy that decides who proposes how many tokens.

The scheduler verifies (core/scheduler.py _apply_verified_row); the runner samples each verification row
(runner/model_runner.py, sampling/token_sampler.py); this package only proposes."""

from typing import Any, Optional

from jaxpaged.config import EngineConfig
from jaxpaged.speculative.draft_model import DraftModelProposer
from jaxpaged.speculative.ngram import NgramProposer
from jaxpaged.speculative.proposal import ProposalBatch, Proposer
from jaxpaged.speculative.speculator import Speculator
from jaxpaged.speculative.step_cost import StepCostMeter

__all__ = ["DraftModelProposer", "NgramProposer", "ProposalBatch", "Proposer", "Speculator", "StepCostMeter",
           "build_speculator"]


def build_speculator(config: EngineConfig, target: Any = None, tokenizer: Any = None, max_model_len: int = 0,
                     dtype: str = "float32") -> Optional[Speculator]:
    """The speculator config.speculative.speculative_method names, or None when speculative decoding is off.
    "draft_model" loads and checks the draft against `target` (the LoadedModel) and `tokenizer`, and builds its
    runner for the engine's max_model_len and resolved dtype (not compiled yet: Speculator.warmup)."""
    spec = config.speculative
    if spec.speculative_method is None:
        return None
    if spec.speculative_method == "ngram":
        return Speculator(spec, NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max))
    assert spec.speculative_method == "draft_model"  # SpeculativeConfig checked the name
    from jaxpaged.runner.draft_runner import DraftRunner, draft_shape, load_draft_model

    draft = load_draft_model(config, target, tokenizer, max_model_len)
    shape = draft_shape(config, max_model_len)
    runner = DraftRunner(draft, config, shape, dtype)
    proposer = DraftModelProposer(runner, shape.num_kv_blocks, shape.block_size, shape.max_num_seqs,
                                  shape.max_num_batched_tokens, shape.max_model_len)
    # A draft's steps cost about a target step's at larger batches: the meter keeps it to the sizes where it pays.
    return Speculator(spec, proposer, StepCostMeter() if spec.speculative_measure_cost else None)
