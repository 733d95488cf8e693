"""AsyncLLMEngine: one loop thread owns the synchronous LLMEngine; asyncio callers stream from their own slots.

The engine is not thread-safe, so every call into it (add, abort, step, get_stats) happens on the loop thread.
Callers talk to that thread through a command queue; the thread leaves each request's newest output in its slot
and wakes the caller's event loop with `call_soon_threadsafe`. Several event loops (several apps) may share one
AsyncLLMEngine.
"""

import asyncio
import concurrent.futures
import dataclasses
import logging
import queue
import threading
import time
from typing import Optional

from jaxpaged.engine import LLMEngine
from jaxpaged.engine.stats import EngineStats
from jaxpaged.inputs import PromptInput
from jaxpaged.lora.request import LoRARequest
from jaxpaged.outputs import RequestFailedError, RequestOutput
from jaxpaged.request_stream import OutputSink, RequestStream
from jaxpaged.sampling.params import SamplingParams

logger = logging.getLogger(__name__)

CLOSE_MARGIN_S = 2.0
"""Of shutdown's timeout, the part kept back from the engine's close: one last batch of persisted KV blocks may
still be in flight when the close's deadline passes."""

class EngineDeadError(RuntimeError):
    """The engine loop has stopped (shut down, or an engine step raised); no request can progress. One request's
    own failure is not this: its stream ends with RequestFailedError, and the loop goes on."""


@dataclasses.dataclass
class _AddCommand:
    request_id: str
    prompt: PromptInput
    sampling_params: SamplingParams
    sink: OutputSink
    added: concurrent.futures.Future
    grammar: Optional[concurrent.futures.Future] = None  # its grammar compiling off the loop: queued once done
    lora_request: Optional[LoRARequest] = None


@dataclasses.dataclass
class _AbortCommand:
    request_id: str


class AsyncLLMEngine:
    """Runs an LLMEngine on its own thread and lets asyncio code add, stream and abort requests."""

    def __init__(self, engine: LLMEngine, *, idle_wait_s: float = 0.5) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.model_name: str = engine.model_name
        self.vocab_size: int = engine.vocab_size
        self.max_model_len: int = engine.max_model_len
        self.max_num_seqs: int = engine.max_num_seqs
        self.sampling_defaults: dict = engine.sampling_defaults
        self._idle_wait_s = idle_wait_s
        self._commands: queue.Queue = queue.Queue()
        self._sinks: dict[str, OutputSink] = {}  # touched only on the loop thread
        self._grammar_pending: dict[str, _AddCommand] = {}  # guarded by _lock: adds waiting for their grammar
        self._lock = threading.RLock()
        self._accepting = True
        self._num_unfinished_seqs = 0
        self._stats: Optional[EngineStats] = None
        self._num_left_waiting = 0
        self._error: Optional[BaseException] = None
        self._stopping = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._close_deadline: Optional[float] = None
        self._last_progress = time.monotonic()  # written by the loop thread only

    # ----------------------------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Starts the loop thread (once)."""
        if self._thread is not None:
            raise RuntimeError("AsyncLLMEngine.start: already started")
        self._stats = self.engine.get_stats()
        self._last_progress = time.monotonic()
        self._thread = threading.Thread(target=self._run_loop, name="jaxpaged-engine-loop", daemon=True)
        self._thread.start()

    def shutdown(self, timeout_s: Optional[float] = 30.0) -> bool:
        """Stops the loop thread; requests still in flight end with EngineDeadError. Returns whether it stopped
        within timeout_s (None: waits for good); if not, an error is logged.

        The engine's close (persisting the KV cache to the disk tier) gets the timeout less CLOSE_MARGIN_S as its
        deadline, so it stops and logs what it did not write rather than being cut off unseen when the process
        exits under it.
        """
        if timeout_s is not None and self._close_deadline is None:
            self._close_deadline = time.monotonic() + max(timeout_s - CLOSE_MARGIN_S, 0.0)
        self._stopping.set()
        self._commands.put(None)  # wakes the loop if it sleeps on the queue
        if self._thread is None:
            return True
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            logger.error("the engine loop did not stop within %g s (a step or the KV cache persist is stuck); "
                         "leaving it behind", timeout_s)
            return False
        return True

    def abandon(self, error: BaseException) -> None:
        """Ends every request in flight with `error`, from another thread, when the loop thread is stuck for good
        (a collective waiting on a hung host). The engine must not be used again; the caller exits soon."""
        # NOTE: _fail_all touches state the loop thread owns; it is safe here only because that thread is
        # blocked inside the engine and the process exits before it could return.
        self._error = error
        self._fail_all(EngineDeadError(str(error)))

    @property
    def error(self) -> Optional[BaseException]:
        """What stopped the loop (None while it runs, and after a clean shutdown)."""
        return self._error

    @property
    def is_alive(self) -> bool:
        """True while the loop thread runs and no engine step has failed."""
        return (self._thread is not None and self._thread.is_alive() and self._error is None
                and not self._stopping.is_set())

    # ----------------------------------------------------------------------------------------------- requests

    def add_request(self, request_id: str, prompt: PromptInput, sampling_params: SamplingParams,
                    lora_request: Optional[LoRARequest] = None) -> RequestStream:
        """Queues a request for the engine and returns its stream at once (await stream.wait_added() next);
        `lora_request`: the LoRA adapter it runs with.

        Counting the request's sequences happens here, synchronously, so an admission check followed by
        add_request calls with no await between them is atomic on the caller's event loop.
        """
        sink = OutputSink(asyncio.get_running_loop(), sampling_params.n)
        added: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:  # NOTE: the loop's final drain takes this lock too, so no add is ever left unanswered
            if not self._accepting or not self.is_alive:
                raise EngineDeadError("the engine loop is not running")
            self._num_unfinished_seqs += sink.num_seqs
            command = _AddCommand(request_id, prompt, sampling_params, sink, added, lora_request=lora_request)
            if request_id in self._grammar_pending:  # the engine cannot refuse it: the first is not there yet
                self._release(sink)
                added.set_exception(ValueError(f"request_id: {request_id!r} is already in use"))
            elif sampling_params.structured_outputs is None:
                self._commands.put(command)
            else:
                self._grammar_pending[request_id] = command
                command.grammar = self.engine.grammars.submit(sampling_params.structured_outputs)
        if command.grammar is not None:
            command.grammar.add_done_callback(lambda _: self._grammar_ready(command))
        return RequestStream(self.abort, request_id, sink, added)

    def _grammar_ready(self, command: _AddCommand) -> None:
        """The command's grammar is compiled (or refused): it goes to the loop, unless aborted or the loop is gone."""
        with self._lock:
            if self._grammar_pending.get(command.request_id) is command:  # else aborted or failed meanwhile
                self._commands.put(self._grammar_pending.pop(command.request_id))

    def abort(self, request_id: str) -> None:
        """Asks the loop to abort a request (a no-op for unknown or finished ids); its KV blocks are freed."""
        with self._lock:
            pending = self._grammar_pending.pop(request_id, None)
            if pending is not None:  # never reached the engine: nothing to free there
                self._release(pending.sink)
                return
        self._commands.put(_AbortCommand(request_id))

    @property
    def seconds_without_progress(self) -> float:
        """While sequences are unfinished, the seconds since the loop last finished a step or an idle wait (how
        long a hung step has held the engine); 0 when nothing is pending."""
        if self._num_unfinished_seqs == 0:
            return 0.0
        return time.monotonic() - self._last_progress

    @property
    def num_unfinished_seqs(self) -> int:
        """Sequences (n per request) added and not yet finished or aborted: exact, updated at once."""
        return self._num_unfinished_seqs

    def get_stats(self) -> Optional[EngineStats]:
        """The engine's stats as of the loop's latest step or command (a snapshot; safe from any thread)."""
        return self._stats

    @property
    def num_left_waiting(self) -> int:
        """Requests the scheduler left waiting at its latest step (less any aborted since): the real queue.

        Requests added since that step are not counted: they are waiting only until the next step looks at them.
        """
        return self._num_left_waiting

    # ----------------------------------------------------------------------------------------------- loop thread

    def _run_loop(self) -> None:
        try:
            while not self._stopping.is_set():
                self._handle_commands(block=not self.engine.has_unfinished_requests())
                if self._stopping.is_set():
                    break
                if self.engine.has_unfinished_requests():
                    outputs = self.engine.step()
                    self._stats = self.engine.get_stats()
                    self._num_left_waiting = self._stats.num_waiting
                    self._dispatch(outputs)
                else:
                    self.engine.heartbeat()
                self._last_progress = time.monotonic()
            self.engine.close(self._close_deadline)
        except BaseException as error:  # an engine failure must not hang the clients: fail them all
            logger.exception("engine loop failed; failing every request in flight")
            self._error = error
        finally:
            self._fail_all(EngineDeadError("the engine loop stopped") if self._error is None
                           else EngineDeadError(f"the engine failed: {type(self._error).__name__}"))

    def _handle_commands(self, block: bool) -> None:
        """Runs every queued command; when idle, sleeps until one arrives."""
        try:
            command = self._commands.get(timeout=self._idle_wait_s) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            if isinstance(command, _AddCommand):
                self._add(command)
            elif isinstance(command, _AbortCommand):
                self._abort(command.request_id)
            # anything else (None) only woke the loop up
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
        self._stats = self.engine.get_stats()
        self._num_left_waiting = min(self._num_left_waiting, self._stats.num_waiting)

    def _add(self, command: _AddCommand) -> None:
        if not command.added.set_running_or_notify_cancel():
            self._release(command.sink)
            return
        try:
            grammar = command.grammar.result() if command.grammar is not None else None
            self.engine.add_request(command.request_id, command.prompt, command.sampling_params, grammar=grammar,
                                    lora_request=command.lora_request)
        except Exception as error:  # ValueError on bad input; the engine stays as it was
            self._release(command.sink)
            command.added.set_exception(error)
            return
        self._sinks[command.request_id] = command.sink
        command.added.set_result(None)

    def _abort(self, request_id: str) -> None:
        sink = self._sinks.pop(request_id, None)
        if sink is None:
            return  # finished already, or refused at add time
        self.engine.abort_request(request_id)
        self._release(sink)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        """Each output into its stream's slot, then one wake-up call per caller event loop for all its readers
        that need one (a call_soon_threadsafe per stream per step was most of this loop's hand-over time)."""
        to_wake: dict[asyncio.AbstractEventLoop, list[tuple[str, OutputSink]]] = {}
        for output in outputs:
            sink = self._sinks.get(output.request_id)
            if sink is None:
                continue
            if output.finished:
                del self._sinks[output.request_id]
                self._release(sink)
            # A request the engine failed alone ends its stream with the error; the loop and the others go on.
            item = output if output.error is None else RequestFailedError(output.request_id, output.error)
            if sink.put(item):
                to_wake.setdefault(sink.loop, []).append((output.request_id, sink))
        for loop, woken in to_wake.items():
            try:
                loop.call_soon_threadsafe(_wake_all, [sink for _, sink in woken])
            except RuntimeError:  # that event loop was closed: nobody reads these streams any more
                for request_id, _ in woken:
                    self._abort(request_id)  # a no-op for the finished ones (no longer in _sinks)

    def _release(self, sink: OutputSink) -> None:
        with self._lock:
            if not sink.released:
                sink.released = True
                self._num_unfinished_seqs -= sink.num_seqs

    def _fail_all(self, error: EngineDeadError) -> None:
        for sink in self._sinks.values():
            self._release(sink)
            sink.deliver(error)
        self._sinks.clear()
        with self._lock:
            self._accepting = False
            for command in self._grammar_pending.values():  # adds still waiting for their grammar: failed below
                self._commands.put(command)
            self._grammar_pending.clear()
            while True:  # adds that never reached the engine
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    return
                if isinstance(command, _AddCommand):
                    self._release(command.sink)
                    if command.added.set_running_or_notify_cancel():
                        command.added.set_exception(error)


def _wake_all(sinks: list[OutputSink]) -> None:
    for sink in sinks:
        sink.wake()
