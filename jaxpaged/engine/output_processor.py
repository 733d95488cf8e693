"""OutputProcessor: a step's sampled tokens -> scheduler state, stops, text, logprobs -> RequestOutputs.

The update phase of the engine loop. For every sample the step advanced it accepts the token into its grammar,
records logprobs, detokenizes (stop strings and the UTF-8 hold-back live in the detokenizer), decides whether the
sample finished, and builds the cumulative RequestOutput of each group that progressed. That work is isolated per
request: one that raises fails its request alone (request_failures.py), and the others go on.
"""

import time
from collections.abc import Callable, Sequence
from typing import Optional

from jaxpaged.core.request import Request, RequestStatus
from jaxpaged.core.scheduler import Scheduler
from jaxpaged.core.scheduler_output import SchedulerOutput
from jaxpaged.engine.request_failures import check_not_systemic, fail_requests
from jaxpaged.engine.request_table import RequestTable
from jaxpaged.engine.requests import RequestGroup, Sample
from jaxpaged.engine.step_timings import StepTimings
from jaxpaged.outputs import Logprob, RequestOutput
from jaxpaged.sampling.grammar import prefetch_bitmasks
from jaxpaged.sampling.prompt_logprobs import PromptLogprobEntry
from jaxpaged.sampling.step_result import StepResult

_RUNNING = RequestStatus.RUNNING


class OutputProcessor:
    """Applies each rank's step results to the requests of a RequestTable."""

    def __init__(self, table: RequestTable, tokenizer, timings: StepTimings) -> None:
        self.table = table
        self.tokenizer = tokenizer
        self.timings = timings
        """The engine's current step timings: update() adds the scheduler's share."""
        self.num_generated_tokens = 0
        """Sampled tokens applied so far (cumulative)."""
        self._token_texts: dict[int, str] = {}
        """Token id -> its text decoded alone: each logprob entry names its token, and a tokenizer call per entry
        was most of a step's host time with top logprobs asked for (bounded by the vocabulary)."""

    def token_text(self, token_id: int) -> str:
        """The token's text decoded on its own (a logprob entry's decoded_token), memoized."""
        text = self._token_texts.get(token_id)
        if text is None:
            text = self._token_texts[token_id] = self.tokenizer.decode([token_id])
        return text

    def update(self, scheduler: Scheduler, output: SchedulerOutput, result: StepResult,
               final_only: bool = False, tokens_applied: Optional[Callable[[], None]] = None) -> list[RequestOutput]:
        """Apply one rank's step: scheduler state, stop checks, text and logprobs; the RequestOutputs of the groups
        that progressed (with `final_only`, of the finished ones only: vLLM's FINAL_ONLY output kind).
        `tokens_applied` is called once the tokens are in the scheduler's requests and their grammars, before the
        text and outputs (the engine dispatches a deferred sampler there)."""
        start = time.perf_counter()
        updated = scheduler.update_from_output(output, result.token_ids)
        self.timings.scheduler_update_s += time.perf_counter() - start
        # Sample id -> what its own host work raised this step (the sampler's rows, then ours): request_failures.py.
        failed: dict[str, Exception] = dict(result.failed_requests)
        self._accept_into_grammars(updated, failed)
        if tokens_applied is not None:
            tokens_applied()
        self._record_prompt_logprobs(result.prompt_logprobs, failed)
        row_of = None
        if result.logprobs is not None:  # the first row of each sampled request in the step's results
            row_of = _first_rows(output)
        touched: dict[str, RequestGroup] = {}
        sample_finished: dict[str, RequestGroup] = {}
        stopped_here = []
        samples = self.table.samples
        num_tokens = 0
        # NOTE: this loop runs for every running request, every step: what it reads is what a step's host time is.
        for request in updated:
            if failed and request.request_id in failed:
                continue
            group, sample = samples[request.request_id]
            row = None if row_of is None else row_of[request.request_id]
            try:  # one request's detokenizing, logprobs or stop check raising fails that request alone
                if request.num_step_tokens == 1:
                    self._record_token(group, sample, request, request.output_token_ids[-1], result, row, True)
                else:
                    self._record_tokens(group, sample, request, result, row)
            except Exception as error:
                failed[request.request_id] = error
                continue
            num_tokens += request.num_step_tokens
            if sample.finish_reason is not None:
                if not request.is_finished():
                    stopped_here.append(request.request_id)  # a stop string, or its grammar completed
                sample_finished[group.request_id] = group
            if not final_only and group.params.output_kind == "cumulative":
                touched[group.request_id] = group
        self.num_generated_tokens += num_tokens
        outputs = []
        if failed:
            check_not_systemic(failed, [request.request_id for request in updated], self.table)
            outputs += fail_requests(failed, scheduler, self.table)
            stopped_here = [request_id for request_id in stopped_here if request_id in samples]
            touched = {request_id: group for request_id, group in touched.items() if request_id in self.table}
            sample_finished = {request_id: group for request_id, group in sample_finished.items()
                               if request_id in self.table}
        if stopped_here:
            scheduler.finish_requests(stopped_here, RequestStatus.FINISHED_STOPPED)
        # A group finishes only in a step where one of its samples does: a final-only output is one of those.
        if not final_only:
            sample_finished = {request_id: group for request_id, group in sample_finished.items()
                               if request_id not in touched}
        outputs += self._to_outputs(scheduler, [*touched.values(),
                                                *(group for group in sample_finished.values() if group.finished())])
        for out in outputs:
            if out.finished:
                self.table.forget(out.request_id)
        return outputs

    def _accept_into_grammars(self, updated: Sequence[Request], failed: dict[str, Exception]) -> None:
        """The step's tokens into their requests' grammars, whose next masks are then computed in the background; a
        grammar that raises fails its request alone."""
        grammars = []
        for request in updated:
            if request.grammar is not None and not request.is_finished() and request.request_id not in failed:
                try:
                    for token_id in request.output_token_ids[-request.num_step_tokens:]:
                        request.grammar.accept(token_id)
                except Exception as error:
                    failed[request.request_id] = error
                    continue
                grammars.append(request.grammar)
        if grammars:  # their next masks take shape on another core while this thread goes on
            prefetch_bitmasks(grammars)

    def _to_outputs(self, scheduler: Scheduler, groups: Sequence[RequestGroup]) -> list[RequestOutput]:
        """Each group's RequestOutput (its text is decoded here when it was deferred); a group whose output cannot
        be built fails alone (the per-group loop runs only after building them all at once raised)."""
        try:
            return [group.to_output() for group in groups]
        except Exception:
            pass
        outputs = []
        for group in groups:
            try:
                outputs.append(group.to_output())
            except Exception as error:
                outputs += fail_requests({group.samples[0].request.request_id: error}, scheduler, self.table)
        return outputs

    def _record_tokens(self, group: RequestGroup, sample: Sample, request: Request, result: StepResult,
                       first_row: Optional[int]) -> None:
        """Account several tokens of one sample from one step (speculative decoding accepted proposals), in order. A
        stop string among them ends the sample there: the tokens after it are dropped from the request, as if
        they had never been generated."""
        num_tokens = request.num_step_tokens
        new_tokens = request.output_token_ids[-num_tokens:]
        for index, token_id in enumerate(new_tokens):
            row = None if first_row is None else first_row + index
            last = index == num_tokens - 1
            self._record_token(group, sample, request, token_id, result, row, last)
            if sample.finish_reason is not None and not last:
                request.drop_output_tokens(num_tokens - 1 - index)
                return

    def _record_token(self, group: RequestGroup, sample: Sample, request: Request, token_id: int,
                      result: StepResult, row: Optional[int], last: bool) -> None:
        """Account one token of one sample: logprobs (`row` of the step's results), text, finish state. `last`: the
        sample's newest token (its request's status applies to it)."""
        if not group.has_first_token:
            group.has_first_token = True
            group.metrics.first_token_time = time.time()
        if row is not None and result.logprobs is not None:
            logprob, top, token_rank = result.logprobs.row(row, group.params.logprobs or 0)
            self._record_logprobs(group, sample, token_id, logprob, top, token_rank)
        # update() has already given the token to the request's grammar.
        grammar_complete = request.grammar is not None and not request.is_finished() and request.grammar.is_finished
        finish_reason = None if request.status is _RUNNING or not last else request.finish_reason
        detokenizer = sample.detokenizer
        if finish_reason is None and not grammar_complete:
            detokenizer.append_token(token_id)
            if detokenizer.stop_string is None:
                return  # the common case, kept short: it runs for every running request, every step
        else:
            detokenizer.append_tokens((token_id,), stop_terminated=finish_reason == "stop")
            # Before reading stop_string: text held back behind a partial character is only decided here,
            # and a stop string inside it must still cut the text and name the stop.
            detokenizer.finish()
        if detokenizer.stop_string is not None:
            sample.finish_reason, sample.stop_reason = "stop", detokenizer.stop_string
        elif finish_reason is not None:
            sample.finish_reason, sample.stop_reason = finish_reason, request.stop_reason
        else:
            sample.finish_reason, sample.stop_reason = "stop", None  # its grammar completed
        if group.metrics.finish_time is None and group.finished():
            group.metrics.finish_time = time.time()

    def _record_logprobs(self, group: RequestGroup, sample: Sample, token_id: int, sampled_logprob: float,
                         top: Optional[list[tuple[int, float]]], sampled_rank: Optional[int]) -> None:
        """The sampled token's logprob and the top ones asked for, each with its token rank (1 = most likely; the
        sampled token's exact rank from the sampler when it is outside the top ones)."""
        if group.params.logprobs is None:
            return
        decode = self.token_text
        entry = {top_id: Logprob(top_logprob, token_rank, decode(top_id))
                 for token_rank, (top_id, top_logprob) in enumerate(top or [], start=1)}
        if token_id not in entry:  # outside the top-k asked for: the sampler counted its exact rank
            token_rank = sampled_rank if sampled_rank is not None else len(entry) + 1
            entry[token_id] = Logprob(sampled_logprob, token_rank, decode(token_id))
        if sample.logprobs is None:
            sample.logprobs = []
        sample.logprobs.append(entry)  # to_output() copies the list: an output never changes once made
        sample.cumulative_logprob = (sample.cumulative_logprob or 0.0) + sampled_logprob

    def _record_prompt_logprobs(self, entries: Sequence[PromptLogprobEntry], failed: dict[str, Exception]) -> None:
        """Prompt tokens' logprobs; a recomputed position (after preemption) keeps its first value. An entry that
        raises fails its request alone."""
        decode = self.token_text
        for entry in entries:
            owner = self.table.samples.get(entry.request_id)
            if owner is None or entry.request_id in failed:
                continue
            group = owner[0]
            if group.prompt_logprobs is None or group.prompt_logprobs[entry.position] is not None:
                continue
            try:
                token_id = group.prompt.token_ids[entry.position]
                top = {top_id: Logprob(top_logprob, k, decode(top_id)) for k, (top_id, top_logprob)
                       in enumerate(entry.top[:group.params.prompt_logprobs or 0], start=1)}
                top[token_id] = Logprob(entry.logprob, entry.rank, decode(token_id))
            except Exception as error:
                failed[entry.request_id] = error
                continue
            group.prompt_logprobs[entry.position] = top


def _first_rows(output: SchedulerOutput) -> dict[str, int]:
    """Each sampling request's first row in the step's results (a speculative row takes one per proposal more)."""
    rows, row = {}, 0
    for item in output.scheduled:
        if item.sample:
            rows[item.request.request_id] = row
            row += 1 + item.num_spec_tokens
    return rows
