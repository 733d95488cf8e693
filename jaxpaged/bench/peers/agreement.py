"""Greedy agreement between two systems' outputs on the same prompts, position by position.

Under greedy sampling two correct engines on the same weights differ only where their numerics tip an argmax; after
the first difference a request's continuation diverges, so both the fraction of positions and the fraction of whole
prompts identical are reported.
"""

from collections.abc import Sequence


def greedy_agreement(reference: Sequence[Sequence[int]], other: Sequence[Sequence[int]]) -> dict[str, float]:
    """{greedy_positions_identical, greedy_prompts_identical}: the fraction of output positions (per prompt, the
    longer output's length) where both have the same token, and the fraction of prompts whose outputs are identical
    in full. ValueError when the two do not answer the same number of prompts."""
    if len(reference) != len(other):
        raise ValueError(f"other: {len(other)} outputs against {len(reference)} reference outputs")
    positions = sum(max(len(ours), len(theirs)) for ours, theirs in zip(reference, other))
    same = sum(a == b for ours, theirs in zip(reference, other) for a, b in zip(ours, theirs))
    prompts_same = sum(list(ours) == list(theirs) for ours, theirs in zip(reference, other))
    return {"greedy_positions_identical": same / positions if positions else 1.0,
            "greedy_prompts_identical": prompts_same / len(reference) if reference else 1.0}
