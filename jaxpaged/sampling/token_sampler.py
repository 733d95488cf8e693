"""TokenSampler: the host side of sampling. Sampling rows in, the compiled sampler, ids and logprobs out.

The model runner calls it with the step's logits (still on the device) and the requests that sample; only the
sampled ids, and logprobs when a request asked for them, cross back to the host.
"""

import dataclasses
import functools
import typing
from collections.abc import Callable, Iterable, Sequence
from typing import Optional

import jax
import numpy as np
from jaxtyping import Array, Float, Int

from jaxpaged.core.request import Request
from jaxpaged.sampling.batch import penalizes_output_tokens
from jaxpaged.sampling.bitmask import (
    apply_token_bitmask,
    bitmask_words,
    constrained_row_buckets,
    fill_step_bitmask,
)
from jaxpaged.sampling.params import SamplingParams
from jaxpaged.sampling.prompt_logprobs import PromptLogprobEntry
from jaxpaged.sampling.sampler import (
    SamplerFlags,
    SamplerOutput,
    SamplingRow,
    all_sampler_flag_variants,
    build_sampling_batch,
    min_tokens_suppress_ids,
    sample,
    sampler_static_flags,
    warmup_sampling_batch,
)
from jaxpaged.sampling.step_result import NOTHING_SAMPLED, SampledLogprobs, StepResult


class TokenSampler:
    """Samples one token per sampling request with the jitted sampler; compiles every variant at warm-up."""

    def __init__(self, vocab_size: int, eos_token_ids: Sequence[int], placement: jax.sharding.Sharding):
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        """The model's EOS ids: held back while a request is below its min_tokens."""
        self.placement = placement
        """Where the logits live (replicated over the rank's devices); the sampling batch goes there too."""

    def warmup_tasks(self, row_buckets: Iterable[int]) -> list[Callable[[], None]]:
        """Every sampler variant and the bitmask's constrained-row buckets, per distinct row count, as independent
        compiles for the model runner's warm-up to run side by side."""
        tasks: list[Callable[[], None]] = []
        variants = all_sampler_flag_variants()
        for num_rows in sorted(set(row_buckets)):
            # One zero logits array per row count, read by all its compiles (device arrays are immutable).
            logits = jax.device_put(np.zeros((num_rows, self.vocab_size), np.float32), self.placement)
            tasks += [functools.partial(self._compile_variant, logits, flags) for flags in variants]
            tasks += [functools.partial(self._compile_bitmask, logits, num_constrained)
                      for num_constrained in constrained_row_buckets(num_rows)]
        return tasks

    def _compile_variant(self, logits: Float[Array, "num_rows vocab"], flags: SamplerFlags) -> None:
        batch = warmup_sampling_batch(flags, logits.shape[0], self.vocab_size)
        jax.block_until_ready(sample(logits, batch, flags).token_ids)  # numpy, as launch() passes it

    def _compile_bitmask(self, logits: Float[Array, "num_rows vocab"], num_constrained: int) -> None:
        all_allowed = np.full((num_constrained, bitmask_words(self.vocab_size)), -1, np.int32)
        padding_rows = np.full(num_constrained, logits.shape[0], np.int32)
        jax.block_until_ready(apply_token_bitmask(logits, all_allowed, padding_rows))

    def sample(self, logits: Float[Array, "num_rows_padded vocab"], requests: Sequence[Request]) -> StepResult:
        """Row j of logits belongs to requests[j]; each request carries its params and resolved seed."""
        return self.launch(logits, requests).result()

    def launch(self, logits: Float[Array, "num_rows_padded vocab"], requests: Sequence[Request],
               row_drafts: Optional[Sequence[Sequence[int]]] = None) -> "PendingSample":
        """Like sample(), but returns at once: the device works while the host goes on (other ranks' steps).
        row_drafts (speculative decoding): per row, the proposals its draw follows; row j then samples as the
        request would after output_token_ids + row_drafts[j] (its seed's step, penalties and min_tokens)."""
        if not requests:
            return PendingSample(None, 0, wants_logprobs=False)
        # NOTE: each row's host work (its parameters, penalty arrays, grammar mask) is isolated: a row that raises
        # is recorded in row_errors and sampled as a padded row, and the engine fails that request alone.
        row_errors: dict[int, Exception] = {}
        drafts = [()] * len(requests) if row_drafts is None else row_drafts
        rows = self._rows(requests, drafts, row_errors)
        batch = build_sampling_batch(rows, logits.shape[0], self.vocab_size, row_errors)
        # Structured outputs: the grammars fill their rows on the host while the device still runs the step (last:
        # masks prefetched when the tokens were accepted may still be computing).
        constrained = fill_step_bitmask(requests, logits.shape[0], self.vocab_size, row_errors)
        if constrained is not None:
            logits = apply_token_bitmask(logits, *constrained)
        flags = sampler_static_flags(batch)
        # The numpy batch goes to the jitted sampler as it is: jit's own transfer of its arguments is several
        # times cheaper than jax.device_put of the ten-array pytree (which walks it in Python), and lands on the
        # logits' devices (the sampler's placement is a single device or replicated over this process's devices).
        result = sample(logits, batch, flags)
        failed = {requests[row].request_id: error for row, error in row_errors.items()}
        return PendingSample(result, len(rows), wants_logprobs=flags.return_logprobs, failed=failed)

    def _rows(self, requests: Sequence[Request], row_drafts: Sequence[Sequence[int]],
              row_errors: dict[int, Exception]) -> list[SamplingRow]:
        """Each request's SamplingRow; one whose row cannot be made is recorded in row_errors and replaced by a
        greedy placeholder (the per-row loop runs only after the batch-wide one raised)."""
        try:
            return [self._row(request, drafts) for request, drafts in zip(requests, row_drafts, strict=True)]
        except Exception:
            pass
        rows = []
        for index, (request, drafts) in enumerate(zip(requests, row_drafts, strict=True)):
            try:
                rows.append(self._row(request, drafts))
            except Exception as error:
                row_errors[index] = error
                rows.append(_PLACEHOLDER_ROW)
        return rows

    def _row(self, request: Request, drafts: Sequence[int] = ()) -> SamplingRow:
        params = request.sampling_params
        if request.sampling_seed is None:
            raise ValueError(f"sampling_seed: request {request.request_id!r} has no resolved seed")
        # num_pending_tokens counts this step's own token too (the scheduler adds it); any beyond it are in flight.
        in_flight = max(0, request.num_pending_tokens - 1)
        output_token_ids: Sequence[int] = request.output_token_ids
        if drafts:  # the draw after proposals: as if they were generated (only penalties read the ids themselves)
            output_token_ids = [*output_token_ids, *drafts] if penalizes_output_tokens(params) else output_token_ids
            in_flight += 0 if penalizes_output_tokens(params) else len(drafts)
        num_output = len(output_token_ids) + in_flight
        suppress = min_tokens_suppress_ids(params, self.eos_token_ids, num_output) if params.min_tokens else ()
        return SamplingRow(params, request.sampling_seed, request.prompt_token_ids, output_token_ids, suppress,
                           in_flight)


_PLACEHOLDER_ROW = SamplingRow(SamplingParams(temperature=0.0), seed=0, prompt_token_ids=(), output_token_ids=())
"""The row of a request whose own row could not be made: greedy, every option off (its token is dropped)."""


class PendingSample:
    """A step's sampled ids (and logprobs) still on the device; result() waits for them and pulls them over."""

    def __init__(self, output: Optional[SamplerOutput], num_rows: int, wants_logprobs: bool,
                 failed: Optional[dict[str, Exception]] = None) -> None:
        self._output = output
        self._num_rows = num_rows
        self._wants_logprobs = wants_logprobs
        self._failed = failed or {}
        """Sample id -> the exception its row's host work raised (StepResult.failed_requests)."""
        self.prompt_logprobs: Optional[Callable[[], list[PromptLogprobEntry]]] = None
        """Set by the runner when the step computed prompt logprobs: pulls them to the host."""

    @property
    def device_token_ids(self) -> Optional[Int[Array, " num_rows_padded"]]:
        """The sampled ids still on the device (async scheduling feeds them to the next step); None if none."""
        return None if self._output is None else typing.cast(jax.Array, self._output.token_ids)

    def is_running(self) -> bool:
        """True while the step (or its sampler) is still computing on the device."""
        if self._output is None:
            return False
        token_ids: typing.Any = self._output.token_ids  # a jax.Array: its type stub lacks is_ready()
        return not token_ids.is_ready()

    def wait(self) -> None:
        """Blocks until the step and the sampler have run (their results stay on the device)."""
        if self._output is not None:
            jax.block_until_ready(self._output)

    def result(self) -> StepResult:
        result = self._sampled()
        if self._failed:
            result = dataclasses.replace(result, failed_requests=self._failed)
        if self.prompt_logprobs is None:
            return result
        return dataclasses.replace(result, prompt_logprobs=self.prompt_logprobs())

    def _sampled(self) -> StepResult:
        output = self._output
        if output is None:
            return NOTHING_SAMPLED
        token_ids = np.asarray(output.token_ids)[:self._num_rows].tolist()
        if not self._wants_logprobs:
            return StepResult(token_ids)
        top_ids = None if output.top_logprob_ids is None else np.asarray(output.top_logprob_ids)
        top_values = None if output.top_logprobs is None else np.asarray(output.top_logprobs)
        ranks = None if output.sampled_ranks is None else np.asarray(output.sampled_ranks)
        return StepResult(token_ids, SampledLogprobs(np.asarray(output.logprobs), top_ids, top_values, ranks))
