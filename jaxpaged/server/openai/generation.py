"""GenerationRun: the engine requests behind one HTTP request, from admission to the last output.

One engine request per prompt (n choices each). Admission (503 while draining, 429 when too many sequences
would wait) and the adds happen with no await between them, so the check holds on this event loop.
Latency histograms are observed here, on the outputs as the HTTP side sees them.
"""

import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from typing import Optional

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from jaxpaged.async_engine import EngineDeadError
from jaxpaged.inputs import ParsedPrompt
from jaxpaged.lora.request import LoRARequest
from jaxpaged.outputs import RequestFailedError, RequestOutput
from jaxpaged.request_stream import RequestStream
from jaxpaged.sampling.params import SamplingParams
from jaxpaged.server.context import ServerContext
from jaxpaged.server.http.errors import APIError, error_body, from_value_error, sanitize_message
from jaxpaged.server.openai.merged_outputs import merged_outputs
from jaxpaged.server.openai.protocol import SamplingRequest
from jaxpaged.server.openai.streaming import ClientDisconnected, EventStreamResponse, run_until_disconnect
from jaxpaged.server.stats_log import log_request


def ensure_ready(context: ServerContext) -> None:
    """503 while the server drains (SIGTERM) or the engine loop is dead."""
    if context.draining:
        context.metrics.requests_rejected.labels("draining").inc()
        raise APIError(503, "the server is shutting down", code="server_shutting_down")
    if not context.engine.is_alive:
        context.metrics.requests_rejected.labels("engine_dead").inc()
        raise APIError(503, "the engine is not running", code="engine_unavailable")


def response_id(prefix: str, body: SamplingRequest, run: "GenerationRun") -> str:
    """The response's id: "<prefix>-<request_id>" when the client named one (vLLM's), else the engine's own id.

    The engine keeps its unique id either way: two clients sending the same request_id must not collide there.
    """
    return f"{prefix}-{body.request_id}" if body.request_id is not None else run.request_id


def check_capacity(context: ServerContext, num_new_seqs: int) -> None:
    """429 with Retry-After when admitting num_new_seqs would leave more than max_queued_requests waiting."""
    if context.settings.max_queued_requests is None:
        return
    engine = context.engine
    beyond_slots = engine.num_unfinished_seqs + num_new_seqs - engine.max_num_seqs
    # Requests the scheduler left waiting (KV cache full, say): newcomers queue behind them.
    left_waiting = engine.num_left_waiting + num_new_seqs if engine.num_left_waiting > 0 else 0
    if max(beyond_slots, left_waiting) > context.settings.max_queued_requests:
        context.metrics.requests_rejected.labels("overloaded").inc()
        raise APIError(429, "the server is overloaded: too many requests are waiting; retry later",
                       code="rate_limit_exceeded", headers={"Retry-After": str(context.settings.retry_after_s)})


STREAM_ENDING_ERRORS = (EngineDeadError, RequestFailedError)
"""What ends a stream before its last output: the stream sends stream_error_body's event, then [DONE]."""


def request_failed_error(error: RequestFailedError) -> APIError:
    """The 500 of a request the engine failed alone (the server goes on serving the others)."""
    return APIError(500, sanitize_message(f"the request failed in the engine ({error.reason}); other requests are "
                                          "unaffected"), code="request_failed")


def stream_error_body(error: Exception) -> dict:
    """The error event of a stream ended by one of STREAM_ENDING_ERRORS."""
    if isinstance(error, RequestFailedError):
        failed = request_failed_error(error)
        return error_body(failed.status_code, failed.message, code=failed.code)
    return error_body(503, "the engine stopped before the request finished", code="engine_unavailable")


@dataclasses.dataclass
class _Timing:
    """Latency bookkeeping of one engine request."""

    arrival: float
    last_token: Optional[float] = None
    num_tokens: int = 0


class GenerationRun:
    """The engine requests of one HTTP request; iterate outputs(), and always close() at the end."""

    def __init__(self, context: ServerContext, request_id: str, prompts: list[ParsedPrompt],
                 params: list[SamplingParams], lora_request: Optional[LoRARequest] = None) -> None:
        """`lora_request`: the LoRA adapter every prompt runs with (the request's `model` named it)."""
        self._context = context
        self._lora_request = lora_request
        self.request_id = request_id
        self.prompts = prompts
        self._params = params
        self._streams: list[RequestStream] = []
        self._timings: list[_Timing] = []
        self._closed = False
        self.finals: list[Optional[RequestOutput]] = [None] * len(prompts)
        """The last output of each prompt's engine request, once it finished."""

    def submit(self, stream: bool = True) -> None:
        """Admission checks, then every prompt handed to the engine loop (synchronously). Without `stream` only
        each request's final output comes back (nothing is built or handed over per step)."""
        ensure_ready(self._context)
        check_capacity(self._context, sum(params.n for params in self._params))
        if not stream:
            self._params = [dataclasses.replace(params, output_kind="final_only") for params in self._params]
        for index, (prompt, params) in enumerate(zip(self.prompts, self._params)):
            engine_request_id = self.request_id if len(self.prompts) == 1 else f"{self.request_id}-{index}"
            if self._context.settings.log_requests:
                log_request(engine_request_id, len(prompt.token_ids), params)
            try:
                self._streams.append(self._context.engine.add_request(engine_request_id, prompt, params,
                                                                      lora_request=self._lora_request))
            except EngineDeadError:
                raise APIError(503, "the engine is not running", code="engine_unavailable") from None
            self._timings.append(_Timing(arrival=time.monotonic()))

    async def wait_added(self) -> None:
        """Waits for the engine to accept every request; 400 if it refused one (its ValueError), 503 if dead."""
        for stream in self._streams:
            try:
                await stream.wait_added()
            except ValueError as error:
                raise from_value_error(error) from None
            except EngineDeadError:
                raise APIError(503, "the engine is not running", code="engine_unavailable") from None

    async def outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(prompt index, cumulative output) as the engine produces them, all prompts merged."""
        if len(self._streams) == 1:
            async for output in self._streams[0]:
                self._observe(0, output)
                yield 0, output
            return
        async with contextlib.aclosing(merged_outputs(self._streams)) as merged:  # one pending output per prompt
            async for index, output in merged:
                self._observe(index, output)
                yield index, output

    async def collect(self) -> list[RequestOutput]:
        """Runs every request to the end and returns the final outputs, prompt order."""
        async for _ in self.outputs():
            pass
        return [final for final in self.finals if final is not None]

    def close(self) -> None:
        """Aborts whatever has not finished (a client gone, an error); idempotent."""
        if self._closed:
            return
        self._closed = True
        for stream, params in zip(self._streams, self._params):
            if not stream.finished:
                self._context.metrics.sequences_finished.labels("abort").inc(params.n)
            stream.close()

    def _observe(self, index: int, output: RequestOutput) -> None:
        metrics, timing, now = self._context.metrics, self._timings[index], time.monotonic()
        num_tokens = max((len(sample.token_ids) for sample in output.outputs), default=0)
        num_new = num_tokens - timing.num_tokens
        engine_times = output.metrics
        if num_new > 0 and timing.last_token is None and output.finished \
                and engine_times.first_token_time is not None and engine_times.finish_time is not None:
            # Every token in one (final-only) output: the engine's own clock saw the first and the rest arrive.
            metrics.time_to_first_token.observe(engine_times.first_token_time - engine_times.arrival_time)
            gap = (engine_times.finish_time - engine_times.first_token_time) / max(num_new - 1, 1)
            for _ in range(num_new - 1):
                metrics.inter_token_latency.observe(gap)
        elif num_new > 0:
            if timing.last_token is None:
                metrics.time_to_first_token.observe(now - timing.arrival)
            else:
                gap = (now - timing.last_token) / num_new  # tokens that arrived together share the gap
                for _ in range(num_new):
                    metrics.inter_token_latency.observe(gap)
        if num_new > 0:
            timing.last_token, timing.num_tokens = now, num_tokens
        if output.finished:
            self.finals[index] = output
            metrics.e2e_request_latency.observe(now - timing.arrival)
            metrics.request_prompt_tokens.observe(len(output.prompt_token_ids))
            metrics.request_generation_tokens.observe(sum(len(sample.token_ids) for sample in output.outputs))
            metrics.request_phases.observe_phases(engine_times, num_tokens)
            for sample in output.outputs:
                metrics.sequences_finished.labels(sample.finish_reason or "abort").inc()


async def respond(request: Request, run: GenerationRun, stream: bool,
                  events: Callable[[GenerationRun], AsyncIterator[str]],
                  render: Callable[[list[RequestOutput]], dict]) -> Response:
    """Admits the run, then either streams `events(run)` or waits for the end and returns `render(finals)`.

    A client that goes away, before or during the stream, closes the run, which aborts its requests.
    """
    try:
        run.submit(stream)
        await run.wait_added()
    except BaseException:
        run.close()
        raise
    if stream:
        return EventStreamResponse(events(run), on_close=run.close)
    try:
        finals = await run_until_disconnect(request, run.collect())
    except ClientDisconnected:
        return Response(status_code=499)  # nobody reads it; the requests were aborted by close()
    except EngineDeadError:
        raise APIError(503, "the engine stopped before the request finished", code="engine_unavailable") from None
    except RequestFailedError as error:
        raise request_failed_error(error) from None
    finally:
        run.close()
    return JSONResponse(render(finals))
