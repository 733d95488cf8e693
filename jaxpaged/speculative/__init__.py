"""Speculative decoding: proposers, and the engine-side policy that decides who proposes how many tokens.

The scheduler verifies (core/scheduler.py _apply_verified_row); the runner samples each verification row
(runner/model_runner.py, sampling/token_sampler.py); this package only proposes."""

from typing import Optional

from jaxpaged.config import SpeculativeConfig
from jaxpaged.speculative.ngram import NgramProposer
from jaxpaged.speculative.proposal import ProposalBatch, Proposer
from jaxpaged.speculative.speculator import Speculator

__all__ = ["NgramProposer", "ProposalBatch", "Proposer", "Speculator", "build_speculator"]


def build_speculator(config: SpeculativeConfig) -> Optional[Speculator]:
    """The speculator config.speculative_method names, or None when speculative decoding is off."""
    if config.speculative_method is None:
        return None
    assert config.speculative_method == "ngram"  # SpeculativeConfig checked the name
    return Speculator(config, NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max))
