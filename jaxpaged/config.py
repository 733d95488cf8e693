"""Engine configuration: small frozen dataclasses, validated at construction.

Every user-facing knob lives here once. A YAML preset or sweep is only data that fills these in.
"""

import dataclasses
import os
from collections.abc import Mapping
from typing import Literal, Optional, get_args

from jaxpaged.checks import is_int, is_number, parse_byte_size
from jaxpaged.checks import require as _require
from jaxpaged.kv_events_config import parse_kv_events_config
from jaxpaged.speculative_config import SpeculativeConfig, flat_speculative_config

SchedulingPolicy = Literal["fcfs", "priority"]
AttentionBackendName = Literal["auto", "xla", "pallas_tpu", "pallas_gpu"]
PrefixCachingGranularity = Literal["token", "block"]
DTypeName = Literal["auto", "float32", "bfloat16", "float16"]
CpuMatmulKernel = Literal["native", "xla"]
CpuAttentionKernel = Literal["native", "jnp"]
QuantizationName = Literal["int8", "tpu_int8", "w8a8", "w8a8_int8", "compressed-tensors"]
KVCacheDTypeName = Literal["auto", "int8", "fp8", "fp8_e4m3"]
# The annotations are the one list of choices: the checks below and the CLI's --flag choices both read them.
_POLICIES = get_args(SchedulingPolicy)
_GRANULARITIES = get_args(PrefixCachingGranularity)
_BACKENDS = get_args(AttentionBackendName)
_DTYPES = get_args(DTypeName)
_CPU_MATMULS = get_args(CpuMatmulKernel)
_CPU_ATTENTIONS = get_args(CpuAttentionKernel)
_QUANTIZATIONS = get_args(QuantizationName)
_KV_CACHE_DTYPES = get_args(KVCacheDTypeName)
_QUANTIZATION_ALIASES = {"tpu_int8": "int8", "w8a8_int8": "w8a8"}
"""Other engines' names of schemes jaxpaged runs under its own name: vLLM's tpu_int8 is the same weight-only
per-channel int8, SGLang's w8a8_int8 the same dynamic per-token int8 activations x per-channel int8 weights."""


@dataclasses.dataclass(frozen=True)
class CacheConfig:
    """How the paged KV cache is laid out and sized."""

    block_size: int = 16
    """Tokens per KV block (the kernels call it a page)."""
    num_kv_blocks: Optional[int] = None
    """Blocks in the pool, the null block 0 included. None: derive from kv_cache_memory."""
    kv_cache_memory: Optional[int] = None
    """KV pool size in bytes (an int, or a string like "4GiB"). None: a fraction of free device memory (a fixed
    default on CPU)."""
    gpu_memory_utilization: Optional[float] = None
    """vLLM's: on an accelerator, the share of each device's memory the engine may fill; the KV pool gets what the
    weights and the buffers in use leave of it (XLA's step buffers come out of the rest). None: 60% of the memory
    free after the weights. Not used on a CPU, nor with num_kv_blocks or kv_cache_memory."""
    kv_cache_dtype: KVCacheDTypeName = "auto"
    """How K and V are stored (vLLM's --kv-cache-dtype): "auto" in the model dtype; "int8" or "fp8" / "fp8_e4m3"
    as 8-bit codes with one bfloat16 scale per token per KV head, quantized on write and dequantized inside attention
    (pallas_kernels/kv_quantization.py): about twice the tokens of bfloat16 in the same kv_cache_memory. "fp8" is stored
    as "fp8_e4m3". Every attention backend: "xla" and "pallas_gpu" in the "quantized" layout, "pallas_tpu" in its own
    (pallas_kernels/ragged_paged_attention/kv_layout_quantized.py)."""
    enable_prefix_caching: bool = True
    """Reuse computed full blocks across requests by their chain hash."""
    prefix_caching_granularity: PrefixCachingGranularity = "token"
    """"token": after the full-block hits, also reuse the longest matching run of a partly matching cached block
    (copied on device); "block": full blocks only, as vLLM."""
    kv_offload_memory: int = 0
    """Host-memory KV tier in bytes (an int, or a string like "8GiB"): blocks the device pool evicts live on
    there. 0: off."""
    kv_offload_dir: Optional[str] = None
    """Local-disk KV tier directory: blocks the host tier evicts (or the device's, without one) are written there,
    and a restarted engine with the same model, dtype, block size and layout hits them. None: off."""
    kv_offload_dir_max_bytes: int = 16 * 2**30
    """Bound of the disk tier in bytes (an int or a string like "100GiB")."""
    kv_offload_key: Optional[str] = dataclasses.field(default=None, repr=False)
    """The secret that signs every disk-tier file (HMAC-SHA256), so one planted or rewritten by anyone without it is
    never read. None: a key generated once and kept in <kv_offload_dir>/.hmac-key (mode 0600). Better set through
    JAXPAGED_KV_OFFLOAD_KEY than on a command line others can read (docs/kv-tiers.md)."""
    kv_offload_min_load_blocks: Optional[int] = None
    """Lower-tier hits shorter than this many blocks are recomputed instead of loaded. None: measured at start-up
    (the shortest run whose load beats recomputing it)."""
    disable_hybrid_kv_cache_manager: bool = False
    """vLLM's --disable-hybrid-kv-cache-manager: keep every token of every layer in one KV cache group, instead of
    grouping sliding-window layers apart so they keep only their window (runner/kv_spec.py)."""

    def __post_init__(self) -> None:
        _require(is_int(self.block_size) and self.block_size >= 1, "block_size",
                 f"must be a positive int, got {self.block_size!r}")
        if self.num_kv_blocks is not None:
            _require(is_int(self.num_kv_blocks) and self.num_kv_blocks >= 2, "num_kv_blocks",
                     f"must be an int >= 2 (block 0 is the null block), got {self.num_kv_blocks!r}")
        if self.kv_cache_memory is not None:
            size = parse_byte_size(self.kv_cache_memory, "kv_cache_memory")
            _require(size > 0, "kv_cache_memory", f"must be a positive number of bytes, got {self.kv_cache_memory!r}")
            object.__setattr__(self, "kv_cache_memory", size)
        if self.gpu_memory_utilization is not None:
            _require(is_number(self.gpu_memory_utilization) and 0 < self.gpu_memory_utilization <= 1,
                     "gpu_memory_utilization", f"must be a number in (0, 1], got {self.gpu_memory_utilization!r}")
        _require(self.kv_cache_dtype in _KV_CACHE_DTYPES, "kv_cache_dtype",
                 f"must be one of {_KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}")
        if self.kv_cache_dtype == "fp8":
            object.__setattr__(self, "kv_cache_dtype", "fp8_e4m3")
        _require(isinstance(self.enable_prefix_caching, bool), "enable_prefix_caching",
                 f"must be a bool, got {self.enable_prefix_caching!r}")
        _require(isinstance(self.disable_hybrid_kv_cache_manager, bool), "disable_hybrid_kv_cache_manager",
                 f"must be a bool, got {self.disable_hybrid_kv_cache_manager!r}")
        _require(self.prefix_caching_granularity in _GRANULARITIES, "prefix_caching_granularity",
                 f"must be one of {_GRANULARITIES}, got {self.prefix_caching_granularity!r}")
        for name in ("kv_offload_memory", "kv_offload_dir_max_bytes"):
            size = parse_byte_size(getattr(self, name), name)
            _require(size >= 0, name, f"must be >= 0 bytes, got {getattr(self, name)!r}")
            object.__setattr__(self, name, size)
        _require(self.kv_offload_dir is None or (isinstance(self.kv_offload_dir, str) and self.kv_offload_dir != ""),
                 "kv_offload_dir", f"must be a directory path or None, got {self.kv_offload_dir!r}")
        _require(self.enable_prefix_caching or (self.kv_offload_memory == 0 and self.kv_offload_dir is None),
                 "kv_offload_memory", "the KV tiers (kv_offload_memory, kv_offload_dir) extend the prefix cache: "
                 "they need enable_prefix_caching")
        _require(self.kv_offload_key is None or (isinstance(self.kv_offload_key, str) and self.kv_offload_key != ""),
                 "kv_offload_key", "must be a non-empty string or None")  # never echo a secret
        if self.kv_offload_min_load_blocks is not None:
            minimum = self.kv_offload_min_load_blocks
            _require(is_int(minimum) and minimum >= 1, "kv_offload_min_load_blocks",
                     f"must be an int >= 1 or None, got {minimum!r}")

    @property
    def kv_offload_enabled(self) -> bool:
        """Whether any KV tier below the device is on."""
        return self.kv_offload_memory > 0 or self.kv_offload_dir is not None


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
    """Limits of one engine step and of one request."""

    max_num_seqs: int = 64
    """Most requests running at once (and sequences in one step)."""
    max_num_batched_tokens: int = 512
    """Token budget of one step: prefill chunks and decodes together."""
    max_model_len: Optional[int] = None
    """Longest prompt + output, in tokens. None: the model's context length (max_position_embeddings), lowered
    with a logged reason when the KV pool cannot hold one sequence of it (as vLLM)."""
    long_prefill_token_threshold: int = 0
    """If > 0, caps how many prompt tokens one request may take in one step."""
    scheduling_policy: SchedulingPolicy = "fcfs"
    """"fcfs" or "priority" (lower value first, then arrival)."""

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            value = getattr(self, name)
            if name == "max_model_len" and value is None:
                continue
            _require(is_int(value) and value >= 1, name, f"must be a positive int, got {value!r}")
        _require(is_int(self.long_prefill_token_threshold) and self.long_prefill_token_threshold >= 0,
                 "long_prefill_token_threshold",
                 f"must be an int >= 0, got {self.long_prefill_token_threshold!r}")
        _require(self.scheduling_policy in _POLICIES, "scheduling_policy",
                 f"must be one of {_POLICIES}, got {self.scheduling_policy!r}")
        _require(self.max_num_batched_tokens >= self.max_num_seqs, "max_num_batched_tokens",
                 f"must be >= max_num_seqs ({self.max_num_seqs}), got {self.max_num_batched_tokens}")


DEFAULT_DISTRIBUTED_TIMEOUT_S = 30.0
"""Default bound on any wait for another process of a multi-host job (a step, a heartbeat, the next plan)."""


@dataclasses.dataclass(frozen=True)
class MultiHostConfig:
    """How this process joins a multi-host job (docs/multihost.md): one process per host, process 0 schedules, the
    others follow. Everything unset (and distributed False) is a single process, or a job the caller joined itself
    with jax.distributed.initialize()."""

    coordinator_address: Optional[str] = None
    """Multi-host: HOST:PORT of process 0's coordination service, the same on every host (jax.distributed's name);
    with num_processes and process_id. None: a single process, unless distributed."""
    num_processes: Optional[int] = None
    """Multi-host: processes in the job, one per host."""
    process_id: Optional[int] = None
    """Multi-host: this process's index; 0 leads (schedules, serves HTTP, returns LLM.generate's outputs)."""
    distributed: bool = False
    """Multi-host: join with jax.distributed.initialize()'s auto-detection (a TPU pod slice fills in the rest)."""
    distributed_timeout: float = DEFAULT_DISTRIBUTED_TIMEOUT_S
    """Multi-host: seconds to wait for another process (a step, the next plan) before giving up on the job."""

    def __post_init__(self) -> None:
        given = [self.coordinator_address, self.num_processes, self.process_id]
        _require(all(value is None for value in given) or all(value is not None for value in given),
                 "coordinator_address", f"--coordinator-address, --num-processes and --process-id go together (got "
                 f"{self.coordinator_address!r}, {self.num_processes!r}, {self.process_id!r}); or use --distributed "
                 "alone to auto-detect them")
        if self.num_processes is not None:
            _require(is_int(self.num_processes) and self.num_processes >= 1, "num_processes",
                     f"must be a positive int, got {self.num_processes!r}")
            _require(is_int(self.process_id) and 0 <= self.process_id < self.num_processes, "process_id",
                     f"must be in [0, num_processes={self.num_processes}), got {self.process_id!r}")
        _require(isinstance(self.distributed, bool), "distributed", f"must be a bool, got {self.distributed!r}")
        _require(is_number(self.distributed_timeout) and self.distributed_timeout > 0, "distributed_timeout",
                 f"must be a positive number of seconds, got {self.distributed_timeout!r}")

    @property
    def joins_job(self) -> bool:
        """Whether this process is asked to join a multi-host job (jax.distributed.initialize)."""
        return self.distributed or self.coordinator_address is not None


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs besides the model: cache, scheduler and device choices."""

    cache: CacheConfig = dataclasses.field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = dataclasses.field(default_factory=SchedulerConfig)
    speculative: SpeculativeConfig = dataclasses.field(default_factory=SpeculativeConfig)
    multihost: MultiHostConfig = dataclasses.field(default_factory=MultiHostConfig)
    dtype: DTypeName = "auto"
    """Parameter, activation and KV dtype (matmuls sum in float32; norms, softmax and sampling run in float32):
    "auto" is bfloat16 on TPU/GPU and, on a CPU, the faster of float32 and bfloat16 by a start-up probe
    (runner/dtype_probe.py)."""
    attention_backend: AttentionBackendName = "auto"
    """"auto" picks pallas_tpu on TPU, pallas_gpu on GPU and the pure-jnp "xla" on CPU."""
    seed: int = 0
    """Base seed of the sampler for requests that set none."""
    compilation_cache_dir: Optional[str] = None
    """JAX persistent compilation cache; None: ~/.cache/jaxpaged/xla. "" turns it off."""
    tensor_parallel_size: int = 1
    """Devices each model replica is split over (the mesh's "model" axis; vLLM's name)."""
    data_parallel_size: int = 1
    """Model replicas, each with its own block pool and scheduler (the "data" axis; vLLM's name)."""
    enable_expert_parallel: bool = False
    """Mixture-of-experts models under tensor parallelism: place whole experts on each device of the "model" axis
    (num_experts / tp each), tokens replicated and the expert outputs summed across devices; off: every expert's
    intermediate axis is split as the dense MLP's (vLLM's --enable-expert-parallel). No effect on dense models. With
    data_parallel_size > 1 the experts span dp x tp devices and the ranks step in lock step, one program over a
    (dp, tp) mesh (runner/lock_step.py; num_experts must divide by dp x tp)."""
    tokenizer: Optional[str] = None
    """A tokenizer other than the model's: a directory of Hugging Face tokenizer files, or a Hub repo id already in
    the local cache (read offline). None: the model's own (vLLM's --tokenizer)."""
    advisor_log_text: bool = False
    """Let the prefix-cache advisor's log line quote a few decoded prompt tokens (off: prompts can be private)."""
    async_scheduling: Optional[bool] = None
    """Plan and launch each step before the previous one's sampled tokens reach the host, so scheduling, batch
    filling and output processing run while the device computes (vLLM's --async-scheduling). Requests with a
    grammar or output-dependent penalties make steps wait for their tokens while they are unfinished. Not with
    multi-host serving or the KV tiers. None (the default): on, on every platform, unless one of those is on
    (engine/loops.py resolve_async_scheduling); True insists (an error with the tiers or multi-host), False turns it
    off."""
    cpu_matmul: CpuMatmulKernel = "native"
    """CPU matmuls: "native" packs the weights at load for the native C++ kernel where it builds (float32; bfloat16
    with AVX512-BF16 and no AMX), "xla" keeps XLA's dot on unpacked weights."""
    cpu_attention: CpuAttentionKernel = "native"
    """CPU attention (the "xla" backend): "native" reads decode KV in place with the native C++ kernel where it
    builds, "jnp" keeps every row on the jnp path."""
    quantization: Optional[QuantizationName] = None
    """Weight quantization (vLLM's --quantization). "int8": weight-only int8 of the attention and MLP projections,
    symmetric, one float32 scale per output channel, applied on the fly while a float checkpoint loads (vLLM's
    "tpu_int8" is accepted as the same); embeddings, lm_head and norms stay in dtype. "w8a8" (SGLang's "w8a8_int8"):
    those int8 weights, and each matmul's input rows quantized to int8 per token on the fly, int32 accumulation
    (XLA's int8 dot on every backend). A pre-quantized checkpoint
    (compressed-tensors int8, a GGUF of Q8_0 projections) runs in its own scheme: None or "compressed-tensors"
    take it as it is, another scheme than the checkpoint's is an error. None on a float checkpoint: off."""
    kv_events_config: Optional[str] = None
    """KV cache events as vLLM publishes them (blocks stored, removed, cleared; ZeroMQ + msgpack), for a KV-aware
    router: a JSON object such as '{"enable_kv_cache_events": true, "publisher": "zmq", "topic": "kv-events"}'
    (vLLM's --kv-events-config; no "endpoint": port 5557 on the HTTP --host; CURVE keys and "redact" restrict who
    reads what, docs/server.md; features/kv_events.py). None: off."""

    enable_lora: bool = False
    """Serve LoRA adapters (PEFT) beside the base model, rows of several adapters in one step (jaxpaged/lora)."""
    max_loras: int = 1
    """With enable_lora: adapters one step may hold (device slots; a step's base rows need none)."""
    max_lora_rank: int = 16
    """With enable_lora: the slots' rank; an adapter of a higher r is refused, a lower one padded."""
    max_cpu_loras: Optional[int] = None
    """With enable_lora: adapters kept read in host memory (an LRU; others are read again when needed); None:
    max_loras."""

    def __post_init__(self) -> None:
        _require(self.dtype in _DTYPES, "dtype", f"must be one of {_DTYPES}, got {self.dtype!r}")
        _require(isinstance(self.enable_lora, bool), "enable_lora", f"must be a bool, got {self.enable_lora!r}")
        for name in ("max_loras", "max_lora_rank"):
            value = getattr(self, name)
            _require(is_int(value) and value >= 1, name, f"must be a positive int, got {value!r}")
        _require(self.max_cpu_loras is None or (is_int(self.max_cpu_loras) and self.max_cpu_loras >= self.max_loras),
                 "max_cpu_loras", f"must be an int >= max_loras ({self.max_loras}) or None, got {self.max_cpu_loras!r}")
        _require(not (self.enable_lora and self.multihost.joins_job), "enable_lora",
                 "LoRA adapters are served on one host: not with a multi-host job")
        _require(self.attention_backend in _BACKENDS, "attention_backend",
                 f"must be one of {_BACKENDS}, got {self.attention_backend!r}")
        _require(is_int(self.seed), "seed", f"must be an int, got {self.seed!r}")
        for name in ("tensor_parallel_size", "data_parallel_size"):
            value = getattr(self, name)
            _require(is_int(value) and value >= 1, name, f"must be a positive int, got {value!r}")
        _require(isinstance(self.enable_expert_parallel, bool), "enable_expert_parallel",
                 f"must be a bool, got {self.enable_expert_parallel!r}")
        _require(self.tokenizer is None or (isinstance(self.tokenizer, str) and self.tokenizer != ""), "tokenizer",
                 f"must be a directory, a Hugging Face repo id or None, got {self.tokenizer!r}")
        _require(isinstance(self.advisor_log_text, bool), "advisor_log_text",
                 f"must be a bool, got {self.advisor_log_text!r}")
        _require(self.cpu_matmul in _CPU_MATMULS, "cpu_matmul",
                 f"must be one of {_CPU_MATMULS}, got {self.cpu_matmul!r}")
        _require(self.cpu_attention in _CPU_ATTENTIONS, "cpu_attention",
                 f"must be one of {_CPU_ATTENTIONS}, got {self.cpu_attention!r}")
        _require(self.async_scheduling is None or isinstance(self.async_scheduling, bool), "async_scheduling",
                 f"must be a bool or None (on where supported), got {self.async_scheduling!r}")
        _require(self.quantization is None or self.quantization in _QUANTIZATIONS, "quantization",
                 f"must be one of {_QUANTIZATIONS} or None (pre-quantized AWQ, GPTQ or fp8 checkpoints are not "
                 f"supported yet), got {self.quantization!r}")
        if self.quantization in _QUANTIZATION_ALIASES:
            object.__setattr__(self, "quantization", _QUANTIZATION_ALIASES[self.quantization])
        if self.kv_events_config is not None:
            _require(isinstance(self.kv_events_config, str), "kv_events_config",
                     f"must be a JSON object as a string, got {self.kv_events_config!r}")
            parse_kv_events_config(self.kv_events_config)  # ValueError naming kv_events_config
        if self.speculative.enabled:  # a decode row and its proposals must fit one step's budget
            budget = self.scheduler.max_num_batched_tokens
            _require(self.speculative.num_speculative_tokens < budget, "num_speculative_tokens",
                     f"must be < max_num_batched_tokens ({budget}), got {self.speculative.num_speculative_tokens}")
        if self.speculative.speculative_method == "draft_model":
            _require(self.data_parallel_size == 1, "speculative_method",
                     f"\"draft_model\" runs beside one model replica, not data_parallel_size "
                     f"{self.data_parallel_size}")
            _require(not self.multihost.joins_job, "speculative_method",
                     "\"draft_model\" runs on one host: not with a multi-host job")

    @classmethod
    def from_options(cls, **options) -> "EngineConfig":
        """Build from flat keyword options (block_size=..., max_num_seqs=..., dtype=...)."""
        groups = {CacheConfig: {}, SchedulerConfig: {}, SpeculativeConfig: {}, MultiHostConfig: {}, cls: {}}
        speculative_config = options.pop("speculative_config", None)
        options = {**options, **flat_speculative_config(speculative_config)}
        for key, value in options.items():
            for group_cls, group in groups.items():
                if key in {f.name for f in dataclasses.fields(group_cls)} and key not in _GROUP_FIELDS:
                    group[key] = value
                    break
            else:
                raise ValueError(f"{key}: unknown engine option")
        return cls(cache=CacheConfig(**groups[CacheConfig]), scheduler=SchedulerConfig(**groups[SchedulerConfig]),
                   speculative=SpeculativeConfig(**groups[SpeculativeConfig]),
                   multihost=MultiHostConfig(**groups[MultiHostConfig]), **groups[cls])


_GROUP_FIELDS = ("cache", "scheduler", "speculative", "multihost")
ENV_PREFIX = "JAXPAGED_"
"""An engine option's environment variable is this prefix + its field name in upper case (JAXPAGED_MAX_MODEL_LEN)."""
KERNEL_FIELDS = ("cpu_matmul", "cpu_attention")
"""Fields whose variables (JAXPAGED_CPU_MATMUL, JAXPAGED_CPU_ATTENTION) scripts set before they were config fields."""


def kernel_options_from_environment(given: Mapping[str, object],
                                    environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The kernel fields that `given` (flat engine options) leaves unset, from their environment variables, for the
    Python API (the command line reads every JAXPAGED_<OPTION> itself, below its flags); EngineConfig validates
    them."""
    return {field: environ[ENV_PREFIX + field.upper()] for field in KERNEL_FIELDS
            if field not in given and environ.get(ENV_PREFIX + field.upper())}
