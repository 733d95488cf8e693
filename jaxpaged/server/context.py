"""ServerSettings (the serve flags that shape HTTP behaviour) and ServerContext (what every route reaches)."""

import dataclasses
from typing import Optional, Union

from jaxpaged.async_engine import AsyncLLMEngine
from jaxpaged.checks import is_int
from jaxpaged.lora.host_cache import LoRAAdapterCache
from jaxpaged.lora.request import LoRARequest
from jaxpaged.server.http.body_deadline import DEFAULT_REQUEST_BODY_TIMEOUT_S
from jaxpaged.server.http.host_guard import check_host_patterns
from jaxpaged.server.metrics import ServerMetrics
from jaxpaged.server.parsers.reasoning import ReasoningParser, make_reasoning_parser
from jaxpaged.server.parsers.tool import ToolParser, make_tool_parser
from jaxpaged.server.vllm.lora_modules import LoRAModule
from jaxpaged.server.watchdog import DEFAULT_ENGINE_STEP_TIMEOUT_S

DEFAULT_MAX_REQUEST_BODY_BYTES = 2 * 1024 * 1024
DEFAULT_MAX_PROMPTS_PER_REQUEST = 1024


@dataclasses.dataclass(frozen=True)
class ServerSettings:
    """HTTP-side limits and auth of one app; engine options live in EngineConfig."""

    api_key: Union[str, tuple[str, ...], None] = None
    """When set, /v1/*, /tokenize, /detokenize and /metrics need `Authorization: Bearer <api_key>` (with several
    keys, as vLLM's --api-key k1 k2, any of them)."""
    metrics_key: Optional[str] = None
    """When set, /metrics needs `Authorization: Bearer <metrics_key>` (and no longer takes the API key): a scraper's
    own token, kept from the tenants that share the API key. /metrics is an oracle of other clients' prompts."""
    metrics_open: bool = False
    """Serve /metrics without a key even when api_key is set (an explicit opt-in: its prefix-cache counters tell
    a client what others prompted; see docs/server.md)."""
    max_queued_requests: Optional[int] = None
    """429 when more than this many sequences would wait for a free engine slot. None: no limit (as vLLM's
    --max-num-queued-reqs: a benchmark's burst queues rather than fails)."""
    max_n: int = 16
    """Largest n (choices per prompt) one request may ask for."""
    max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES
    """Larger bodies get 413 before they are parsed."""
    max_prompts_per_request: int = DEFAULT_MAX_PROMPTS_PER_REQUEST
    """Most sequences (prompts in a completion batch × n) one request may start; 400 naming `prompt` beyond it."""
    enable_prompt_tokens_details: bool = False
    """vLLM's --enable-prompt-tokens-details: usage carries prompt_tokens_details.cached_tokens. Off by default: the
    count of a token-granular prefix hit tells a client how much of its prompt another client already sent."""
    request_body_timeout_s: float = DEFAULT_REQUEST_BODY_TIMEOUT_S
    """Seconds a request body may take to arrive after its headers; 408 and the connection closed beyond it."""
    engine_step_timeout_s: float = DEFAULT_ENGINE_STEP_TIMEOUT_S
    """/health answers 503 when no engine step has finished for this long while requests are pending (a hang)."""
    retry_after_s: int = 1
    """The Retry-After header of a 429."""
    tool_call_parser: Optional[str] = None
    """Parser of the model's tool-call syntax (server/parsers/tool/) that tool_choice "auto" needs."""
    enable_auto_tool_choice: bool = False
    structured_outputs_in_reasoning: bool = False
    """vLLM's --structured-outputs-config enable_in_reasoning: a schema holds from the first token, reasoning too
    (default: with a reasoning parser it starts after the reasoning ends)."""
    return_tokens_as_token_ids: bool = False
    """vLLM's --return-tokens-as-token-ids: logprobs spell every token "token_id:<id>" (a request may ask alone)."""
    exclude_tools_when_tool_choice_none: bool = False
    """vLLM's --exclude-tools-when-tool-choice-none: tool_choice "none" renders the prompt without the tools (by
    default they stay in it, as in vLLM)."""
    """vLLM's --enable-auto-tool-choice: accepted with a tool_call_parser (which alone already enables "auto")."""
    reasoning_parser: Optional[str] = None
    """Splits `<think>` reasoning into `reasoning` (server/parsers/reasoning.py)."""
    lora_modules: tuple[LoRAModule, ...] = ()
    """LoRA adapters served from start-up (--lora-modules; needs the engine's enable_lora)."""
    served_model_names: tuple[str, ...] = ()
    """The names requests may use for the model; the first is the one responses and /metrics carry. Empty: the
    engine's model name."""
    chat_template: Optional[str] = None
    """A Jinja chat template used instead of the model's own."""
    allowed_origins: tuple[str, ...] = ()
    """CORS: origins allowed to call the API from a browser ("*": any). Empty: no CORS headers at all."""
    allowed_methods: tuple[str, ...] = ("*",)
    """CORS: methods allowed (with allowed_origins)."""
    allowed_headers: tuple[str, ...] = ("*",)
    """CORS: request headers allowed (with allowed_origins)."""
    allow_credentials: bool = False
    """CORS: allow cookies and Authorization on cross-origin requests (with allowed_origins)."""
    log_requests: bool = False
    """Log one line per engine request: id, prompt length, sampling parameters (vLLM's --enable-log-requests)."""
    default_chat_template_kwargs: Optional[dict] = None
    """chat_template_kwargs every chat request starts from (vLLM's --default-chat-template-kwargs); the request's
    own keys win."""
    allowed_hosts: tuple[str, ...] = ()
    """Host header allow-list against DNS rebinding (names, addresses, "*.example.com"). Empty: any host."""

    def spells_token_ids(self, requested: Optional[bool]) -> bool:
        """Whether a request's logprobs spell tokens as "token_id:<id>": its own return_tokens_as_token_ids, else
        the server's flag."""
        return self.return_tokens_as_token_ids if requested is None else requested

    def chat_template_kwargs_for(self, requested: Optional[dict], reasoning_effort: Optional[str] = None,
                                 ) -> Optional[dict]:
        """A chat request's template kwargs: default_chat_template_kwargs under the request's own, which the
        request's reasoning_effort (OpenAI's field; gpt-oss's template reads it) joins unless they set it."""
        kwargs = {**(self.default_chat_template_kwargs or {}), **(requested or {})}
        if reasoning_effort is not None:
            kwargs.setdefault("reasoning_effort", reasoning_effort)
        return kwargs or requested

    def __post_init__(self) -> None:
        keys = self.api_key if isinstance(self.api_key, tuple) else (self.api_key,)
        if self.api_key is not None and (not keys or not all(isinstance(key, str) and key for key in keys)):
            # never echo the key itself
            raise ValueError("api_key: must be a non-empty str, a tuple of them (any is accepted) or None")
        if self.metrics_key is not None and (not isinstance(self.metrics_key, str) or not self.metrics_key):
            raise ValueError("metrics_key: must be a non-empty str or None")
        if self.metrics_open and self.metrics_key is not None:
            raise ValueError("metrics_open: --metrics-open and --metrics-key contradict each other; give one")
        for name, minimum in (*((("max_queued_requests", 0),) if self.max_queued_requests is not None else ()),
                              ("max_n", 1), ("max_request_body_bytes", 1),
                              ("max_prompts_per_request", 1), ("retry_after_s", 0)):
            value = getattr(self, name)
            if not is_int(value) or value < minimum:
                raise ValueError(f"{name}: must be an int >= {minimum}, got {value!r}")
        for name in ("request_body_timeout_s", "engine_step_timeout_s"):
            timeout_s = getattr(self, name)
            if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
                raise ValueError(f"{name}: must be a number of seconds > 0, got {timeout_s!r}")
        make_tool_parser(self.tool_call_parser)  # ValueError naming the flag for an unknown parser
        make_reasoning_parser(self.reasoning_parser)
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("enable_auto_tool_choice: --enable-auto-tool-choice needs --tool-call-parser NAME")
        for name in ("served_model_names", "allowed_origins", "allowed_methods", "allowed_headers", "allowed_hosts"):
            value = getattr(self, name)
            if not isinstance(value, tuple) or not all(isinstance(item, str) and item for item in value):
                raise ValueError(f"{name}: must be a tuple of non-empty strings, got {value!r}")
        check_host_patterns(self.allowed_hosts)

    def __repr__(self) -> str:
        # NOTE: a repr that shows the key would leak it into any log line that prints the settings.
        hidden = ("api_key", "metrics_key")
        shown = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in hidden}
        keys = "".join(f"{name}={'<set>' if getattr(self, name) else None}, " for name in hidden)
        return "ServerSettings(" + keys + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")"


@dataclasses.dataclass
class ServerContext:
    """The state one app's routes share."""

    engine: AsyncLLMEngine
    """The engine loop, possibly shared with other apps."""
    settings: ServerSettings
    """Limits and auth."""
    metrics: ServerMetrics
    """This app's Prometheus registry."""
    draining: bool = False
    """Set on SIGTERM: new work gets 503 while requests in flight finish."""
    tool_parser: Optional[ToolParser] = dataclasses.field(init=False, default=None)
    """The --tool-call-parser, built once."""
    reasoning_parser: Optional[ReasoningParser] = dataclasses.field(init=False, default=None)
    """The --reasoning-parser, built once."""

    def __post_init__(self) -> None:
        self.tool_parser = make_tool_parser(self.settings.tool_call_parser)
        self.reasoning_parser = make_reasoning_parser(self.settings.reasoning_parser)

    @property
    def model_names(self) -> tuple[str, ...]:
        """Every name a request may give in `model` (--served-model-name, else the engine's model name)."""
        return self.settings.served_model_names or (self.engine.model_name,)

    @property
    def lora_adapters(self) -> Optional[LoRAAdapterCache]:
        """The engine's LoRA adapters, with --enable-lora."""
        return getattr(getattr(self.engine, "engine", None), "lora_adapters", None)

    @property
    def request_model_names(self) -> tuple[str, ...]:
        """Every name a request may give in `model`: the model's names and the served LoRA adapters'."""
        adapters = self.lora_adapters
        if adapters is None:
            return self.model_names
        return self.model_names + tuple(lora.lora_name for lora in adapters.served())

    def lora_request_for(self, model: Optional[str]) -> Optional[LoRARequest]:
        """The LoRA adapter a request's `model` names, or None for the base model."""
        adapters = self.lora_adapters
        if adapters is None or model is None or model in self.model_names:
            return None
        return adapters.by_name(model)

    @property
    def model_name(self) -> str:
        """The name responses and /metrics carry: the first served name."""
        return self.model_names[0]

    @property
    def ready(self) -> bool:
        """Whether new requests are accepted: the engine loop is alive and the server is not draining."""
        return self.engine.is_alive and not self.draining
