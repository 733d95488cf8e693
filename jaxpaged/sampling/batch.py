"""The sampler's per-step input: host-side numpy arrays for the rows that sample, padded to a row bucket.

The engine turns each sampling sequence of a step into a SamplingRow; `build_sampling_batch` packs them into
one SamplingBatch pytree, and `sampler_static_flags` names which compiled variant of the sampler the batch
needs. Only the row bucket, the vocabulary size and the flags are static under jit; every parameter value
is a traced array, so changing a temperature or a seed never recompiles.
"""

import dataclasses
from collections.abc import Sequence
from typing import Literal, NamedTuple, Optional

import numpy as np
from jaxtyping import Bool, Float32, Int32, UInt32

from jaxpaged.checks import is_int
from jaxpaged.sampling.params import MAX_LOGPROBS, SamplingParams
from pallas_kernels.pytree import HostOrDeviceArray, register_pytree_dataclass

SamplingMode = Literal["greedy", "random", "top_k_top_p"]
SAMPLING_MODES: tuple[SamplingMode, ...] = ("greedy", "random", "top_k_top_p")
_UINT32_MASK = 0xFFFF_FFFF
_UINT64_MASK = 0xFFFF_FFFF_FFFF_FFFF


class SamplingRow(NamedTuple):
    """One sequence that samples a token this step, as the engine hands it to the batch builder. A NamedTuple:
    one is made per running request per step, and a tuple is several times cheaper to build than a frozen
    dataclass."""

    params: SamplingParams
    """The request's sampling parameters."""
    seed: int
    """Resolved seed: params.seed, or the engine's own per-request seed (never None here)."""
    prompt_token_ids: Sequence[int]
    """The prompt's token ids (repetition_penalty looks at them)."""
    output_token_ids: Sequence[int]
    """Tokens generated so far; their count also picks this step's random key."""
    suppress_token_ids: Sequence[int] = ()
    """Token ids that must not be sampled this step (EOS / stop ids while min_tokens is not reached)."""
    num_tokens_in_flight: int = 0
    """Tokens sampled for the row by a step still in flight (async scheduling): not in output_token_ids yet, but
    counted, so a seeded draw is the same planned ahead or not."""


@dataclasses.dataclass(frozen=True)
class SamplerFlags:
    """The static choices of one compiled sampler variant (hashable, so jit keys on it)."""

    mode: SamplingMode
    """"greedy": every row argmax; "random": temperature and min_p; "top_k_top_p": also those filters."""
    apply_penalties: bool
    """Penalties, logit_bias or suppressed ids: the dense [rows, vocab] arrays are in the batch."""
    return_logprobs: bool
    """Some row asked for logprobs (any number, 0 included): the sampled ids' logprobs and ranks and every row's top
    min(20, vocab) come back. Otherwise only the ids: the log-softmax over the vocabulary and the rank pass, most of
    a greedy sample's time, are skipped."""


@register_pytree_dataclass
@dataclasses.dataclass(frozen=True)
class SamplingBatch:
    """Padded per-row sampling inputs of one step; padded rows are greedy with every option off.

    Built on the host as numpy arrays; jax.Arrays (tracers) inside the jitted sampler.
    """

    temperatures: Float32[HostOrDeviceArray, " num_rows"]
    """Softmax temperature; 0 means greedy."""
    top_ks: Int32[HostOrDeviceArray, " num_rows"]
    """Tokens kept by top-k, in [1, vocab_size); 0 when off (top_k off, or >= vocab_size)."""
    top_ps: Float32[HostOrDeviceArray, " num_rows"]
    """Nucleus mass kept, in (0, 1]; 1 when off."""
    min_ps: Float32[HostOrDeviceArray, " num_rows"]
    """Min-p threshold relative to the most likely token, in [0, 1]; 0 when off."""
    presence_penalties: Float32[HostOrDeviceArray, " num_rows"]
    """Subtracted once from the logit of each token already in the output."""
    frequency_penalties: Float32[HostOrDeviceArray, " num_rows"]
    """Subtracted from a token's logit once per occurrence in the output."""
    repetition_penalties: Float32[HostOrDeviceArray, " num_rows"]
    """HF-style penalty on tokens of prompt or output; 1 when off."""
    seed_words: UInt32[HostOrDeviceArray, "num_rows 2"]
    """The row's seed as two 32-bit words [high, low], taken modulo 2**64."""
    num_output_tokens: Int32[HostOrDeviceArray, " num_rows"]
    """Tokens the row has generated so far; hashed with the seed so each step draws afresh."""
    num_top_logprobs: Int32[HostOrDeviceArray, " num_rows"]
    """Top logprobs the row asked for (0: only the sampled token's), or -1 if it asked for no logprobs (padded rows
    too); the host slices the returned top-20 by the request's own count."""
    output_token_counts: Optional[Int32[HostOrDeviceArray, "num_rows vocab_size"]] = None
    """How often each token is in the row's output; None unless the penalties flag is on."""
    prompt_token_mask: Optional[Bool[HostOrDeviceArray, "num_rows vocab_size"]] = None
    """Whether each token is in the row's prompt; None unless the penalties flag is on."""
    logit_bias: Optional[Float32[HostOrDeviceArray, "num_rows vocab_size"]] = None
    """Added to the logits: logit_bias values, -inf on suppressed ids; None unless the penalties flag is on."""


def split_seed(seed: int) -> tuple[int, int]:
    """A seed's two 32-bit words (high, low), modulo 2**64 (so -1 is (2**32 - 1, 2**32 - 1))."""
    return (seed >> 32) & _UINT32_MASK, seed & _UINT32_MASK


def min_tokens_suppress_ids(params: SamplingParams, eos_token_ids: Sequence[int],
                            num_output_tokens: int) -> list[int]:
    """The ids to put in SamplingRow.suppress_token_ids: stop ids and the model's EOS ids while min_tokens is not
    reached. EOS is held back even with ignore_eos, as vLLM does (it always adds the model's EOS to these ids)."""
    if num_output_tokens >= params.min_tokens:
        return []
    return list(params.stop_token_ids or ()) + list(eos_token_ids)


def penalizes_output_tokens(params: SamplingParams) -> bool:
    """Whether the request's logits depend on the tokens it generated (presence, frequency or repetition
    penalty, or a multi-token bad word): async scheduling cannot plan its next step before the last token is on the
    host."""
    return bool(params.presence_penalty or params.frequency_penalty or params.repetition_penalty != 1.0
                or any(len(word) > 1 for word in params.bad_words_token_ids or ()))


def _needs_penalties(row: SamplingRow) -> bool:
    params = row.params
    return penalizes_output_tokens(params) or bool(params.logit_bias or len(row.suppress_token_ids)
                                                   or params.allowed_token_ids or params.bad_words_token_ids)


def banned_bad_word_ids(bad_words_token_ids: Sequence[Sequence[int]], output_token_ids: Sequence[int]) -> list[int]:
    """The last token of each bad word whose other tokens end the output so far (vLLM's bad_words rule)."""
    banned = []
    for word in bad_words_token_ids:
        prefix = list(word[:-1])
        if not prefix or list(output_token_ids[len(output_token_ids) - len(prefix):]) == prefix:
            banned.append(word[-1])
    return banned


def _token_id_array(field: str, token_ids: Sequence[int], vocab_size: int) -> np.ndarray:
    # NOTE: numpy wraps negative indices and JAX clamps large ones; both would silently penalize the
    # wrong token, so ids are checked here on the host.
    ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        bad = ids[(ids < 0) | (ids >= vocab_size)][0]
        raise ValueError(f"{field}: token ids must be in [0, {vocab_size}), got {int(bad)}")
    return ids


def _dense_penalty_arrays(rows: Sequence[SamplingRow], num_rows_padded: int, vocab_size: int,
                          row_errors: Optional[dict[int, Exception]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # Dense [rows, vocab] arrays keep the compiled shape fixed whatever the prompt and output lengths;
    # they cost O(rows * vocab) host memory and transfer, paid only when some row uses penalties or bias.
    output_token_counts = np.zeros((num_rows_padded, vocab_size), np.int32)
    prompt_token_mask = np.zeros((num_rows_padded, vocab_size), np.bool_)
    logit_bias = np.zeros((num_rows_padded, vocab_size), np.float32)
    for i, row in enumerate(rows):
        if not _needs_penalties(row) or (row_errors is not None and i in row_errors):
            continue
        try:
            output_ids = _token_id_array("output_token_ids", row.output_token_ids, vocab_size)
            output_token_counts[i] = np.bincount(output_ids, minlength=vocab_size)
            prompt_token_mask[i, _token_id_array("prompt_token_ids", row.prompt_token_ids, vocab_size)] = True
            bias_by_id = row.params.logit_bias or {}
            logit_bias[i, _token_id_array("logit_bias", list(bias_by_id), vocab_size)] = list(bias_by_id.values())
            logit_bias[i, _token_id_array("suppress_token_ids", row.suppress_token_ids, vocab_size)] = -np.inf
            if row.params.allowed_token_ids:  # everything else -inf: a mask on top of the bias
                allowed = np.zeros(vocab_size, np.bool_)
                allowed[_token_id_array("allowed_token_ids", row.params.allowed_token_ids, vocab_size)] = True
                logit_bias[i, ~allowed] = -np.inf
            if row.params.bad_words_token_ids:
                banned = banned_bad_word_ids(row.params.bad_words_token_ids, row.output_token_ids)
                logit_bias[i, _token_id_array("bad_words", banned, vocab_size)] = -np.inf
        except Exception as error:
            if row_errors is None:
                raise
            row_errors[i] = error  # the row stays as a padded one: nothing added, nothing penalized
            output_token_counts[i], prompt_token_mask[i], logit_bias[i] = 0, False, 0.0
    return output_token_counts, prompt_token_mask, logit_bias


_PER_ROW_COLUMNS = 8
_PADDING_ROW = (0.0, 0, 1.0, 0.0, 0.0, 0.0, 1.0, -1)
"""A padded row's (temperature, top_k, top_p, min_p, presence, frequency, repetition, logprobs): greedy, all off."""


def _row_values(params: SamplingParams, vocab_size: int) -> tuple:
    """The row's parameters in _PADDING_ROW's order. top_k is clamped to the vocabulary here, in Python: a Python
    int is unbounded, and one past float64's range (10**309) made the whole table's conversion raise."""
    return (0.0 if params.is_greedy else params.temperature, min(params.top_k, vocab_size), params.top_p,
            params.min_p, params.presence_penalty, params.frequency_penalty, params.repetition_penalty,
            -1 if params.logprobs is None else params.logprobs)


def _row_seed(row: SamplingRow, index: int) -> int:
    if not is_int(row.seed):
        raise ValueError(f"seed: row {index} needs a resolved int seed, got {row.seed!r}")
    return row.seed & _UINT64_MASK


def _fill_rows_one_by_one(rows: Sequence[SamplingRow], vocab_size: int, table: np.ndarray, seeds: np.ndarray,
                          num_output_tokens: np.ndarray, row_errors: dict[int, Exception]) -> None:
    """The table filled row by row, each failing row recorded in row_errors and left a padded one: the slow path,
    taken only when filling every row at once raised."""
    for i, row in enumerate(rows):
        try:
            table[i] = _row_values(row.params, vocab_size)
            seeds[i] = _row_seed(row, i)
            num_output_tokens[i] = len(row.output_token_ids) + row.num_tokens_in_flight
        except Exception as error:
            row_errors[i] = error
            table[i], seeds[i], num_output_tokens[i] = _PADDING_ROW, 0, 0


def build_sampling_batch(rows: Sequence[SamplingRow], num_rows_padded: int, vocab_size: int,
                         row_errors: Optional[dict[int, Exception]] = None) -> SamplingBatch:
    """Packs the sampling rows of one step into padded numpy arrays (rows past len(rows) are padding).

    It runs for every running request, every step: each row becomes one tuple, and the arrays are made from the
    table of tuples at once (setting numpy elements one by one cost ~4x as much at 256 rows). With `row_errors`, a
    row whose values cannot be packed does not fail the batch: its index and exception are recorded there and it is
    packed as a padded row (the caller fails that request alone); without it, the exception propagates."""
    if len(rows) > num_rows_padded:
        raise ValueError(f"num_rows_padded: must be >= the number of rows ({len(rows)}), "
                         f"got {num_rows_padded}")
    if vocab_size < 1:
        raise ValueError(f"vocab_size: must be >= 1, got {vocab_size}")
    num_rows = len(rows)
    table = np.empty((num_rows_padded, _PER_ROW_COLUMNS), np.float64)
    table[num_rows:] = _PADDING_ROW
    seeds = np.zeros(num_rows_padded, np.uint64)
    num_output_tokens = np.zeros(num_rows_padded, np.int32)
    if num_rows:
        try:
            table[:num_rows] = [_row_values(row.params, vocab_size) for row in rows]
            seeds[:num_rows] = [_row_seed(row, i) for i, row in enumerate(rows)]
            num_output_tokens[:num_rows] = [len(row.output_token_ids) + row.num_tokens_in_flight for row in rows]
        except Exception:
            if row_errors is None:
                raise
            _fill_rows_one_by_one(rows, vocab_size, table, seeds, num_output_tokens, row_errors)
    top_ks = table[:, 1].astype(np.int32)
    logprobs = table[:, 7].astype(np.int32)
    seed_words = np.stack([seeds >> np.uint64(32), seeds & np.uint64(_UINT32_MASK)], axis=1).astype(np.uint32)
    dense = (None, None, None)
    if any(_needs_penalties(row) for i, row in enumerate(rows) if not row_errors or i not in row_errors):
        dense = _dense_penalty_arrays(rows, num_rows_padded, vocab_size, row_errors)
    return SamplingBatch(
        temperatures=table[:, 0].astype(np.float32),
        top_ks=np.where((top_ks > 0) & (top_ks < vocab_size), top_ks, 0).astype(np.int32),
        top_ps=table[:, 2].astype(np.float32), min_ps=table[:, 3].astype(np.float32),
        presence_penalties=table[:, 4].astype(np.float32), frequency_penalties=table[:, 5].astype(np.float32),
        repetition_penalties=table[:, 6].astype(np.float32), seed_words=seed_words,
        num_output_tokens=num_output_tokens,
        num_top_logprobs=np.where(logprobs >= 0, np.minimum(logprobs, vocab_size), -1).astype(np.int32),
        output_token_counts=dense[0], prompt_token_mask=dense[1], logit_bias=dense[2])


def sampler_static_flags(batch: SamplingBatch) -> SamplerFlags:
    """The compiled variant this (host, numpy) batch needs: the least work that is still exact."""
    sampling = batch.temperatures > 0
    if not np.any(sampling):
        mode = "greedy"
    elif np.any(sampling & ((batch.top_ks > 0) | (batch.top_ps < 1.0))):  # greedy rows need no filter
        mode = "top_k_top_p"
    else:
        mode = "random"
    return SamplerFlags(mode=mode, apply_penalties=batch.output_token_counts is not None,
                        return_logprobs=bool(np.any(batch.num_top_logprobs >= 0)))


def all_sampler_flag_variants() -> list[SamplerFlags]:
    """Every SamplerFlags value the builder can produce; the warm-up compiles each per row bucket."""
    return [SamplerFlags(mode, apply_penalties, return_logprobs)
            for mode in SAMPLING_MODES for apply_penalties in (False, True) for return_logprobs in (False, True)]


def warmup_sampling_batch(flags: SamplerFlags, num_rows_padded: int, vocab_size: int) -> SamplingBatch:
    """A batch of dummy rows whose sampler_static_flags is `flags` (to compile that variant at warm-up)."""
    params = SamplingParams(
        temperature=0.0 if flags.mode == "greedy" else 1.0,
        top_p=0.5 if flags.mode == "top_k_top_p" else 1.0,
        repetition_penalty=1.1 if flags.apply_penalties else 1.0,
        logprobs=min(MAX_LOGPROBS, vocab_size) if flags.return_logprobs else None)
    rows = [SamplingRow(params, seed=0, prompt_token_ids=[0], output_token_ids=[])]
    return build_sampling_batch(rows, num_rows_padded, vocab_size)
