"""Per-request failure isolation: an exception in one request's host work fails that request alone.

A step's per-row host work is: building the row's sampling parameters, penalty arrays and grammar bitmask
(TokenSampler, which reports the rows that raised in StepResult.failed_requests), then accepting the token into the
grammar, recording logprobs, detokenizing, checking stops and building the output (OutputProcessor). Each is
isolated per request: a request whose work raised is finished through the scheduler's normal finish path
(FINISHED_ERROR frees its KV blocks), its last output carries the error, and the step goes on for every other one.

NOTE: the device step itself (the model's forward pass and the sampler's compiled program) is not wrapped per row.
It is one program over the whole padded batch, with the KV cache donated to it: a failure there (a device error, an
out-of-memory, a compile) cannot be pinned on one row and leaves the cache in an unknown state, so it ends the loop
and the server's fail-stop restarts the process. What it reads per row (token ids, positions, block tables) comes
from scheduler state checked when the request was added.

A fault on every row of a step (two requests or more, one exception type) says the loop is broken, not one request:
it is raised as SystemicFaultError, and the loop stops as for any other step failure.
"""

import logging
import time
from collections.abc import Mapping, Sequence

from jaxpaged.core.request import RequestStatus
from jaxpaged.core.scheduler import Scheduler
from jaxpaged.engine.request_table import RequestTable
from jaxpaged.engine.requests import RequestGroup
from jaxpaged.outputs import CompletionOutput, RequestOutput

logger = logging.getLogger(__name__)

MIN_REQUESTS_FOR_SYSTEMIC_FAULT = 2
"""A step whose every request failed, with one exception type, is a broken loop only from this many requests: one
request failing alone is that request's fault (a hostile or unforeseen input), and the engine must outlive it."""

_MAX_REASON_CHARS = 500


class SystemicFaultError(RuntimeError):
    """The same fault on every request of a step: the loop itself is broken, not one request."""


def describe(error: BaseException) -> str:
    """An exception as "Type: message", capped in length (it ends up in a client's error body)."""
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= _MAX_REASON_CHARS else text[:_MAX_REASON_CHARS] + "..."


def check_not_systemic(failures: Mapping[str, Exception], step_sample_ids: Sequence[str], table: RequestTable) -> None:
    """Raises SystemicFaultError when every request of the step (at least two: requests, not samples, as the n
    samples of one request share its input) failed with one exception type. `failures`: by sample id."""
    request_of = {sample_id: table.samples[sample_id][0].request_id for sample_id in step_sample_ids
                  if sample_id in table.samples}
    num_requests = len(set(request_of.values()))
    failed = {request_of[sample_id]: error for sample_id, error in failures.items() if sample_id in request_of}
    if num_requests < MIN_REQUESTS_FOR_SYSTEMIC_FAULT or len(failed) < num_requests:
        return
    if len({type(error) for error in failed.values()}) != 1:
        return
    first = next(iter(failed.values()))
    raise SystemicFaultError(f"the same fault on every one of the step's {num_requests} requests: "
                             f"{describe(first)}") from first


def fail_requests(failures: Mapping[str, Exception], scheduler: Scheduler, table: RequestTable) -> list[RequestOutput]:
    """Finishes the group of every failed sample id (all its samples: FINISHED_ERROR in the scheduler, which frees
    their blocks) and forgets it; the groups' final outputs, each carrying its error. Ids no longer tracked (failed
    or finished already) are skipped."""
    failed_groups: dict[str, tuple[RequestGroup, Exception]] = {}
    for sample_id, error in failures.items():
        owner = table.samples.get(sample_id)
        if owner is not None and owner[0].request_id not in failed_groups:
            failed_groups[owner[0].request_id] = (owner[0], error)
    outputs = []
    for request_id, (group, error) in failed_groups.items():
        logger.warning("request %s failed alone (the engine goes on): %s", request_id, describe(error),
                       exc_info=error)
        scheduler.finish_requests([sample.request.request_id for sample in group.samples],
                                  RequestStatus.FINISHED_ERROR)
        for sample in group.samples:
            if sample.finish_reason is None:
                sample.finish_reason, sample.stop_reason = "error", None
        if group.metrics.finish_time is None:
            group.metrics.finish_time = time.time()
        table.forget(request_id)
        outputs.append(_error_output(group, describe(error)))
    return outputs


def _error_output(group: RequestGroup, reason: str) -> RequestOutput:
    """The failed group's last output, built without its detokenizers (one of them may be what raised): no text,
    the tokens generated so far."""
    completions = [CompletionOutput(index=sample.index, text="", token_ids=list(sample.request.output_token_ids),
                                    cumulative_logprob=None, logprobs=None, finish_reason=sample.finish_reason,
                                    stop_reason=sample.stop_reason)
                   for sample in group.samples]
    return RequestOutput(request_id=group.request_id, prompt=group.prompt.text, prompt_token_ids=group.prompt.token_ids,
                         num_cached_tokens=group.samples[0].request.num_cached_tokens, outputs=completions,
                         finished=True, metrics=group.metrics, error=reason)
