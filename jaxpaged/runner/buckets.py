"""Bucket ladders: the few (num_tokens, num_seqs) shapes the jitted step is compiled for.

num_tokens runs over powers of two from 16 up to max_num_batched_tokens (which is always a bucket).
num_seqs is tied to the token bucket, min(num_tokens, max_num_seqs): a step never has more sequences than
tokens, so one ladder covers both and warm-up compiles len(ladder) programs, not a grid of them. The price
is a few extra logits rows in prefill-heavy steps, which is small next to the prefill itself.
"""

import bisect
import dataclasses

MIN_TOKEN_BUCKET = 16


@dataclasses.dataclass(frozen=True, order=True)
class Bucket:
    """One compiled shape."""

    num_tokens: int
    num_seqs: int


def token_ladder(max_num_batched_tokens: int) -> list[int]:
    """16, 32, 64, ... below max_num_batched_tokens, then max_num_batched_tokens itself."""
    ladder = []
    size = MIN_TOKEN_BUCKET
    while size < max_num_batched_tokens:
        ladder.append(size)
        size *= 2
    ladder.append(max_num_batched_tokens)
    return ladder


class BucketLadder:
    """Maps a step's real sizes to its padded bucket."""

    def __init__(self, max_num_batched_tokens: int, max_num_seqs: int):
        self.token_sizes = token_ladder(max_num_batched_tokens)
        self.max_num_seqs = max_num_seqs

    def buckets(self) -> list[Bucket]:
        """Every bucket a step can land in: the list warm-up compiles."""
        return [self._bucket(size) for size in self.token_sizes]

    def pick(self, num_tokens: int, num_seqs: int) -> Bucket:
        """The smallest bucket that holds the step; ValueError if none does."""
        index = bisect.bisect_left(self.token_sizes, num_tokens)
        if index == len(self.token_sizes) or num_seqs > self.max_num_seqs:
            raise ValueError(f"step of {num_tokens} tokens / {num_seqs} sequences exceeds the largest bucket "
                             f"({self.token_sizes[-1]} tokens / {self.max_num_seqs} sequences)")
        bucket = self._bucket(self.token_sizes[index])
        assert num_seqs <= bucket.num_seqs, (num_tokens, num_seqs, bucket)
        return bucket

    def _bucket(self, num_tokens: int) -> Bucket:
        return Bucket(num_tokens, min(num_tokens, self.max_num_seqs))
