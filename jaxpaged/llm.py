"""The offline batch API, shaped like vLLM's: LLM(...).generate(prompts) and jaxpaged.generate(...).

Multi-host (coordinator_address=... or distributed=True, or a job the script joined itself): every process runs
the same script; process 0 schedules and returns the outputs, the others follow it (multihost/batch.py).
"""

import atexit
import contextlib
import itertools
import logging
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, Optional, Union

from tqdm.auto import tqdm

from jaxpaged.checks import is_int
from jaxpaged.engine import LLMEngine
from jaxpaged.features.wiring import followers_of
from jaxpaged.inputs import ParsedPrompt, PromptInput
from jaxpaged.lora.request import LoRARequest
from jaxpaged.multihost.batch import FollowerBatches, join_job_of
from jaxpaged.multihost.leader import follower_lost
from jaxpaged.multihost.runtime import is_leader, is_multi_process
from jaxpaged.outputs import RequestFailedError, RequestOutput
from jaxpaged.sampling.params import SamplingParams
from jaxpaged.vllm_llm_options import engine_options_from_vllm

logger = logging.getLogger(__name__)
Prompts = Union[PromptInput, Sequence[PromptInput]]
Conversation = list[dict]
_request_counter = itertools.count()


def next_request_id() -> str:
    """A process-unique id for the requests LLM.generate queues (the server names its own)."""
    return f"req-{next(_request_counter)}"


class LLM:
    """A loaded model with its engine; model=None is the embedded SmolLM2-135M-Instruct."""

    def __init__(self, model: Optional[str] = None, **engine_options):
        """`model`: a local path or a Hugging Face repo id; `revision=` (a branch, tag or commit of the repo) and the
        engine options go to LLMEngine.from_options. The multi-host ones (coordinator_address, num_processes,
        process_id or distributed) join the job first; a follower process then builds no engine of its own."""
        revision = engine_options.pop("revision", None)
        engine_options = engine_options_from_vllm(engine_options)
        config = join_job_of(engine_options)
        self._engine: Optional[LLMEngine] = None
        self._follower: Optional[FollowerBatches] = None
        if is_multi_process() and not is_leader():
            self._follower = FollowerBatches(model, revision, config)
        else:
            self._engine = LLMEngine.from_options(model, revision=revision, **engine_options)
            if self._engine.config.cache.kv_offload_dir is not None:
                _persist_when_dropped(self)
        if is_multi_process():  # a script that never closes still lets every process exit (0)
            atexit.register(self.close)

    @property
    def engine(self) -> LLMEngine:
        """The engine (process 0 only: a follower process of a multi-host job runs process 0's plans instead)."""
        if self._engine is None:
            raise RuntimeError("engine: this process follows process 0 of a multi-host job and has no engine; "
                               "LLM.generate runs process 0's plans here and returns []")
        return self._engine

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix block (vLLM's name); False while requests are still running."""
        return True if self._follower is not None else self.engine.reset_prefix_cache()

    def close(self) -> None:
        """Persist the KV cache to the disk tier (kv_offload_dir), if one is on, so the next engine on the
        directory starts warm. The LLM stays usable; call it again before the next shutdown. Also `with LLM(...)`.
        Without it, the persist happens when the LLM is garbage-collected or the interpreter exits. Multi-host it
        ends the job instead: process 0 tells the followers to exit, and the followers' close
        returns then; generate cannot run again."""
        if self._follower is not None:
            self._follower.close()
            return
        try:
            self.engine.close()
        except Exception as error:
            if not is_multi_process():
                raise
            follower_lost(f"{type(error).__name__}: {error}")  # telling the followers to exit failed

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def get_tokenizer(self):
        """The model's HF tokenizer."""
        return self._follower.tokenizer if self._follower is not None else self.engine.tokenizer

    def generate(self, prompts: Prompts, sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
                 use_tqdm: bool = True,
                 lora_request: Union[LoRARequest, Sequence[Optional[LoRARequest]], None] = None,
                 ) -> list[RequestOutput]:
        """Run every prompt to completion; one RequestOutput per prompt, in input order.

        Every prompt is validated before any is queued, so a bad one raises ValueError and runs nothing. Without
        sampling_params, the model's generation_config.json settings apply (LLMEngine.default_sampling_params).
        A request the engine fails alone (its own host work raised) raises RequestFailedError naming it; the batch's
        other requests are aborted, and the engine stays usable.
        Multi-host, every process calls it with the same inputs: process 0 returns the outputs, a follower process
        runs process 0's steps and returns [] once process 0's call has returned.
        `lora_request`: the LoRA adapter every prompt runs with, or a list with one (or None) per prompt
        (enable_lora).
        """
        if self._follower is not None:
            self._follower.follow_batch()
            return []
        with self._batch():
            prompt_list = _as_prompt_list(prompts)
            params_list = _as_params_list(sampling_params, len(prompt_list), self.engine.default_sampling_params())
            lora_list = _as_lora_list(lora_request, len(prompt_list))
            request_ids = [next_request_id() for _ in prompt_list]
            added = []
            try:
                for request_id, prompt, params, lora in zip(request_ids, prompt_list, params_list, lora_list):
                    self.engine.add_request(request_id, prompt, params, lora_request=lora)
                    added.append(request_id)
            except ValueError as error:
                self.engine.abort_request(added)
                raise ValueError(f"prompt {len(added)}: {error}") from error
            return self._run_to_completion(request_ids, use_tqdm)

    def stream(self, prompt: PromptInput, sampling_params: Optional[SamplingParams] = None
               ) -> Iterator[RequestOutput]:
        """One prompt's output, yielded each time it grows (the `jaxpaged generate` CLI's stream). A follower
        process of a multi-host job yields nothing, once process 0's matching call has finished."""
        if self._follower is not None:
            self._follower.follow_batch()
            return
        with self._batch():
            self.engine.add_request(next_request_id(), prompt, sampling_params)
            while self.engine.has_unfinished_requests():
                for output in self.engine.step():
                    if output.error is not None:
                        raise RequestFailedError(output.request_id, output.error)
                    yield output

    @contextlib.contextmanager
    def _batch(self) -> Iterator[None]:
        """Multi-host, on process 0: the followers' matching call returns with this one; a failed step (a lost
        follower) ends the process with EXIT_FOLLOWER_LOST at once, as the server does (the job cannot go on)."""
        followers = followers_of(self.engine.features)
        if followers is None:
            yield
            return
        if followers.closed:
            raise RuntimeError("generate: this LLM was closed, which ended the multi-host job's followers")
        try:
            yield
        except (ValueError, RequestFailedError):  # a refused prompt, or one request failed alone: the job goes on
            raise
        except Exception as error:
            follower_lost(f"{type(error).__name__}: {error}")
        finally:
            followers.end_batch()

    def chat(self, messages: Union[Conversation, Sequence[Conversation]],
             sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
             use_tqdm: bool = True, add_generation_prompt: bool = True) -> list[RequestOutput]:
        """Apply the model's chat template to one conversation or a list of them, then generate."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        tokenizer = self.engine.tokenizer
        prompts = [{"prompt_token_ids": list(tokenizer.apply_chat_template(
            conversation, tokenize=True, add_generation_prompt=add_generation_prompt, return_dict=False))}
            for conversation in conversations]
        return self.generate(prompts, sampling_params, use_tqdm)

    def _run_to_completion(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(request_ids), desc="Generating", unit="req", disable=not use_tqdm,
                   dynamic_ncols=True)
        num_output_tokens = 0
        with bar:
            while self.engine.has_unfinished_requests():
                for output in self.engine.step(final_only=True):
                    if output.error is not None:  # the engine went on; the batch's other requests are dropped
                        self.engine.abort_request(request_ids)
                        raise RequestFailedError(output.request_id, f"prompt {request_ids.index(output.request_id)} "
                                                                    f"of the batch: {output.error}")
                    if output.finished:
                        finished[output.request_id] = output
                        num_output_tokens += sum(len(c.token_ids) for c in output.outputs)
                        bar.update(1)
                        elapsed = bar.format_dict["elapsed"] or 1e-9
                        bar.set_postfix_str(f"{num_output_tokens / elapsed:.1f} out tok/s", refresh=False)
        return [finished[request_id] for request_id in request_ids]


def _persist_when_dropped(llm: LLM) -> None:
    """Persist the LLM's KV cache to its disk tier when the LLM is collected or the interpreter exits, whichever
    comes first: a script that never calls close() still leaves the next process on the directory warm (the
    device's cached blocks would otherwise be lost, only the evicted ones being on disk)."""
    finalizer = weakref.finalize(llm, _close_engine, llm.engine)
    # NOTE: at exit it runs from its own atexit hook, registered now, after JAX's clean-up hook (registered when
    # jax was imported; hooks run last-registered first), which drops the device buffers the persist reads.
    # weakref.finalize's shared hook may have been registered before jax was imported, and run too late.
    finalizer.atexit = False
    atexit.register(finalizer)


def _close_engine(engine: LLMEngine) -> None:
    """LLMEngine.close() from a finalizer: a failure is logged, never raised into garbage collection or exit."""
    try:
        engine.close()
    except Exception:
        logger.exception("KV tiers: persisting the KV cache to disk failed (the LLM was dropped without close())")


def generate(prompts: Prompts, sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
             model: Optional[str] = None, **engine_options) -> list[RequestOutput]:
    """One call: load the model, generate, return the outputs."""
    use_tqdm = engine_options.pop("use_tqdm", True)
    with LLM(model, **engine_options) as llm:  # closing ends a multi-host job on every process
        return llm.generate(prompts, sampling_params, use_tqdm=use_tqdm)


def _as_prompt_list(prompts: Prompts) -> list[PromptInput]:
    if isinstance(prompts, (str, dict, ParsedPrompt)):
        return [prompts]
    items: list[Any] = list(prompts)  # token ids of one prompt, or prompts
    if items and all(is_int(p) for p in items):
        return [items]  # one prompt given as token ids
    if not items:
        raise ValueError("prompts: at least one prompt is needed")
    return items


def _as_lora_list(lora_request, num_prompts: int) -> list[Optional[LoRARequest]]:
    if lora_request is None or isinstance(lora_request, LoRARequest):
        return [lora_request] * num_prompts
    lora_list = list(lora_request)
    if len(lora_list) != num_prompts:
        raise ValueError(f"lora_request: got {len(lora_list)} for {num_prompts} prompts")
    return lora_list


def _as_params_list(sampling_params, num_prompts: int, default: SamplingParams) -> list[SamplingParams]:
    if sampling_params is None or isinstance(sampling_params, SamplingParams):
        return [sampling_params or default] * num_prompts
    params_list = list(sampling_params)
    if len(params_list) != num_prompts:
        raise ValueError(f"sampling_params: got {len(params_list)} for {num_prompts} prompts")
    for index, params in enumerate(params_list):
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params[{index}]: expected SamplingParams, got {type(params).__name__}")
    return params_list
