"""The YAML of a benchmark sweep, parsed into frozen dataclasses and validated before anything runs.

    name: w1_offline
    model: null                     # null: the embedded SmolLM2-135M-Instruct
    engine: {max_num_seqs: 64}      # any EngineConfig option
    workload: {kind: random, num_requests: 64, min_prompt_len: 32, max_prompt_len: 256}
    sampling: {temperature: 0.0, ignore_eos: true}
    mode: {kind: offline, repeats: 3}
    sweep: {engine.block_size: [16, 32]}        # cartesian product of every axis
    sweep: {engine.(data_parallel_size, tensor_parallel_size): [[1, 1], [1, 2], [2, 1]]}  # a joint axis
    sweep: {(engine.kv_offload_memory, mode.fresh_engine): [[0, false], [8GiB, true]]}  # one across sections
    cpu_devices: 2                  # forced CPU devices (set before JAX starts), for layouts on one CPU
    peers: [{kind: hf_batched, batch_size: 16}, {kind: hf_continuous}, {kind: llama_cpp}]
    targets: [{name: ..., metric: output_tokens_per_s, numerator: {system: jaxpaged},
               denominator: {system: hf_batched}, min: 4.0}]
    targets: [{name: ..., metric: ..., numerator: {system: jaxpaged}, numerator_best: true,   # the faster row
               denominator: {system: hf_batched}, pair_by: [dtype], min: 2.5}]            # in its own dtype
    warmup_probe: true              # cold and warm-cache process starts
    roofline: true                  # the machine's dot and copy rates, and each row's fraction of the lower bound

The YAML is only data: engine options go through EngineConfig.from_options, so the engine's own validation
is the one that applies.
"""

import dataclasses
import math
import pathlib
from collections.abc import Sequence
from typing import Any, NoReturn, Optional

import yaml

from jaxpaged.bench.workloads import make_workload_spec
from jaxpaged.checks import is_int, is_number
from jaxpaged.config import EngineConfig

SECTIONS = ("engine", "workload", "sampling", "mode")
"""Sections whose parameters may be sweep axes, spelled "section.parameter"."""

PEER_KINDS = ("hf_batched", "hf_continuous", "llama_cpp", "vllm_cpu")
ONLINE_PEER_KINDS = ("vllm_cpu",)
"""Peers with a server of their own, driven by the same client as `jaxpaged serve`."""
_TOP_LEVEL = {"name", "description", "model", "engine", "workload", "sampling", "mode", "sweep", "peers",
              "targets", "warmup_probe", "plot_x", "cpu_devices", "roofline"}


def _fail(field: str, message: str, value: Any) -> NoReturn:
    raise ValueError(f"{field}: {message}, got {value!r}")


def _require(ok: object, field: str, message: str, value: Any) -> None:
    """Raises ValueError naming the field unless `ok` is truthy."""
    if not ok:
        _fail(field, message, value)


def _is_number(value) -> bool:
    return is_number(value)


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How every request of the workload samples (max_tokens comes from the workload)."""

    temperature: float = 0.0
    """0 is greedy, the default: peers then produce comparable work."""
    ignore_eos: bool = True
    """Keep generating past EOS so every request makes exactly its max_tokens."""

    def __post_init__(self) -> None:
        _require(_is_number(self.temperature) and 0 <= self.temperature < math.inf, "sampling.temperature",
                 "must be a number >= 0", self.temperature)
        _require(isinstance(self.ignore_eos, bool), "sampling.ignore_eos", "must be a bool", self.ignore_eos)


@dataclasses.dataclass(frozen=True)
class ModeConfig:
    """Offline throughput through LLM.generate, or online serving against a `jaxpaged serve` subprocess."""

    kind: str = "offline"
    """"offline" or "online"."""
    repeats: int = 1
    """Measured runs per sweep point; metrics are the median over them."""
    request_rate: float = math.inf
    """Online: requests per second with Poisson arrivals (inf: all at once)."""
    max_concurrency: Optional[int] = None
    """Online: most requests in flight at once (None: no cap)."""
    warmup_requests: int = 2
    """Unmeasured requests sent first to a fresh engine or server."""
    track_kv_utilization: bool = False
    """Offline: record live tokens / allocated block capacity every step (adds a little host time)."""
    arrival_seed: int = 0
    """Seed of the Poisson arrival times."""
    server_start_timeout_s: float = 900.0
    """Online: how long the server may take to compile and answer /health."""
    fresh_engine: bool = False
    """Build this point an engine of its own, after the engines of the points before it were closed (a restart:
    what they persisted to a disk KV tier is still there)."""

    def __post_init__(self) -> None:
        _require(self.kind in ("offline", "online"), "mode.kind", "must be 'offline' or 'online'", self.kind)
        _require(is_int(self.repeats) and self.repeats >= 1, "mode.repeats", "must be an int >= 1", self.repeats)
        rate = self.request_rate
        if isinstance(rate, str) and rate.lower() in ("inf", "infinity"):
            object.__setattr__(self, "request_rate", math.inf)
        _require(_is_number(self.request_rate) and self.request_rate > 0, "mode.request_rate",
                 "must be a positive number or 'inf'", rate)
        _require(self.max_concurrency is None or (is_int(self.max_concurrency) and self.max_concurrency >= 1),
                 "mode.max_concurrency", "must be null or an int >= 1", self.max_concurrency)
        _require(is_int(self.warmup_requests) and self.warmup_requests >= 0, "mode.warmup_requests",
                 "must be an int >= 0", self.warmup_requests)
        _require(isinstance(self.track_kv_utilization, bool), "mode.track_kv_utilization", "must be a bool",
                 self.track_kv_utilization)
        _require(is_int(self.arrival_seed), "mode.arrival_seed", "must be an int", self.arrival_seed)
        _require(_is_number(self.server_start_timeout_s) and self.server_start_timeout_s > 0,
                 "mode.server_start_timeout_s", "must be a positive number", self.server_start_timeout_s)
        _require(isinstance(self.fresh_engine, bool), "mode.fresh_engine", "must be a bool", self.fresh_engine)


@dataclasses.dataclass(frozen=True)
class PeerConfig:
    """Another system run on the same workload in the same run (online: only peers with a server, vllm_cpu)."""

    kind: str
    """hf_batched | hf_continuous | llama_cpp | vllm_cpu."""
    batch_size: int = 16
    """hf_batched: prompts per generate() call."""
    repeats: int = 1
    """Measured runs; the median is reported (a vllm_cpu peer alternating with jaxpaged runs mode.repeats)."""
    options: dict = dataclasses.field(default_factory=dict)
    """HF peers: num_threads (torch intra-op threads), dtype ("float32", the default, or "bfloat16"); llama_cpp:
    Llama() keyword arguments (n_ctx, n_threads); vllm_cpu: dtype, engine_args (vllm.LLM keyword arguments, or
    `vllm serve` flags online: {max_num_seqs: 64}), env (environment variables of the vLLM process), python (the
    bench environment's python; default $JAXPAGED_VLLM_PYTHON, else .venv-vllm/bin/python)."""

    def __post_init__(self) -> None:
        _require(self.kind in PEER_KINDS, "peers[].kind", f"must be one of {PEER_KINDS}", self.kind)
        _require(is_int(self.batch_size) and self.batch_size >= 1, "peers[].batch_size", "must be an int >= 1",
                 self.batch_size)
        _require(is_int(self.repeats) and self.repeats >= 1, "peers[].repeats", "must be an int >= 1",
                 self.repeats)
        _require(isinstance(self.options, dict), "peers[].options", "must be a mapping", self.options)
        if self.kind == "vllm_cpu":
            self._check_vllm_options()
        elif self.kind != "llama_cpp":
            for key, value in self.options.items():
                _require((key == "num_threads" and is_int(value) and value >= 1)
                         or (key == "dtype" and value in ("float32", "bfloat16")), f"peers[].options.{key}",
                         "HF peers take num_threads (an int >= 1) and dtype ('float32' or 'bfloat16')", value)

    def _check_vllm_options(self) -> None:
        checks = {"dtype": (lambda v: v in ("float32", "bfloat16"), "'float32' or 'bfloat16'"),
                  "python": (lambda v: isinstance(v, str) and v, "a path to the bench environment's python"),
                  "engine_args": (lambda v: isinstance(v, dict) and all(isinstance(k, str) for k in v),
                                  "a mapping of vllm.LLM keyword arguments"),
                  "env": (lambda v: isinstance(v, dict) and all(isinstance(k, str) for k in v),
                          "a mapping of environment variables")}
        for key, value in self.options.items():
            _require(key in checks, f"peers[].options.{key}", f"vllm_cpu takes {sorted(checks)}", key)
            _require(checks[key][0](value), f"peers[].options.{key}", f"must be {checks[key][1]}", value)

    @property
    def dtype(self) -> str:
        """The precision the peer runs in (its dtype option; float32 otherwise)."""
        return self.options.get("dtype", "float32")

    @property
    def name(self) -> str:
        """The system name in tables and plots."""
        settings = [f"bs={self.batch_size}"] if self.kind == "hf_batched" else []
        if self.kind == "vllm_cpu":  # where python lives and the environment do not make it another system
            settings += [f"dtype={self.dtype}"]
            settings += [f"{key}={value}" for key, value in sorted(self.options.get("engine_args", {}).items())]
        else:
            settings += [f"{key}={value}" for key, value in sorted(self.options.items())]
        return f"{self.kind}({', '.join(settings)})" if settings else self.kind


@dataclasses.dataclass(frozen=True)
class TargetConfig:
    """A figure the sweep must show: every selected row within bounds, or a ratio of two selections."""

    name: str
    metric: str
    select: dict = dataclasses.field(default_factory=dict)
    """Bound form: the rows checked ({"system": "jaxpaged", "engine.block_size": 16, ...})."""
    numerator: Optional[dict] = None
    """Ratio form: rows on top of the ratio."""
    denominator: Optional[dict] = None
    """Ratio form: rows below; with several matching rows the least favourable ratio counts."""
    numerator_best: bool = False
    """Ratio form: only the numerator row with the highest metric counts (e.g. the faster of jaxpaged's dtypes,
    which depends on the machine)."""
    pair_by: Sequence[str] = ()
    """Ratio form: keys a numerator row and a denominator row must agree on ("dtype": the precision they ran in,
    or a sweep parameter), so no ratio compares, say, different precisions."""
    min: Optional[float] = None
    max: Optional[float] = None

    def __post_init__(self) -> None:
        _require(isinstance(self.name, str) and self.name, "targets[].name", "must be a non-empty string", self.name)
        _require(isinstance(self.metric, str) and self.metric, "targets[].metric", "must be a metric name",
                 self.metric)
        _require((self.numerator is None) == (self.denominator is None), "targets[].denominator",
                 "numerator and denominator come together", self.denominator)
        _require(self.min is not None or self.max is not None, "targets[].min", "give min or max", self.min)
        _require(isinstance(self.numerator_best, bool), "targets[].numerator_best", "must be true or false",
                 self.numerator_best)
        _require(isinstance(self.pair_by, (list, tuple)) and all(isinstance(k, str) for k in self.pair_by),
                 "targets[].pair_by", "must be a list of keys", self.pair_by)
        _require(self.is_ratio or not (self.numerator_best or self.pair_by), "targets[].numerator_best",
                 "numerator_best and pair_by need a numerator and a denominator", self.numerator_best)
        object.__setattr__(self, "pair_by", tuple(self.pair_by))
        for bound in (self.min, self.max):
            _require(bound is None or _is_number(bound), "targets[].min", "must be a number", bound)

    @property
    def is_ratio(self) -> bool:
        """Whether the target compares two selections."""
        return self.numerator is not None


@dataclasses.dataclass(frozen=True)
class SweepPoint:
    """One point of the cartesian product: the axis values and the sections they produce."""

    values: dict
    """Axis name -> value at this point ({} when the config has no sweep)."""
    engine_options: dict
    workload: Any
    """A WorkloadSpec."""
    sampling: SamplingConfig
    mode: ModeConfig


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """A parsed, validated sweep config."""

    name: str
    description: str
    model: Optional[str]
    """Model path; None is the embedded SmolLM2-135M-Instruct."""
    engine: dict
    workload: dict
    sampling: dict
    mode: dict
    sweep: dict
    """Axis "section.parameter" -> list of values, in YAML order."""
    peers: tuple
    """PeerConfig per peer."""
    targets: tuple
    """TargetConfig per target."""
    warmup_probe: bool
    roofline: bool
    """Measure the machine's rates in the run and give every row its fraction of the workload's lower bound."""
    plot_x: Optional[str]
    """The axis on the x of the plots (default: the first sweep axis)."""
    cpu_devices: Optional[int]
    """Forced host devices on CPU (JAX_NUM_CPU_DEVICES) for sweeps over parallel layouts; None: JAX's default."""
    raw: dict
    """The YAML as read, for the results file."""

    def points(self) -> list[SweepPoint]:
        """Every sweep point, the last axis varying fastest."""
        axes = list(self.sweep)
        points = []
        for combo in _product([self.sweep[axis] for axis in axes]):
            values = dict(zip(axes, combo))
            sections = {name: dict(getattr(self, name)) for name in SECTIONS}
            for axis, value in values.items():
                parameters = axis_parameters(axis)
                for (section, key), item in zip(parameters, value if len(parameters) > 1 else [value]):
                    sections[section][key] = item
            points.append(_make_point(values, sections))
        return points


def _product(lists: list[list]) -> list[tuple]:
    combos: list[tuple] = [()]
    for values in lists:
        combos = [combo + (value,) for combo in combos for value in values]
    return combos


def _make_point(values: dict, sections: dict) -> SweepPoint:
    where = f" (at sweep point {values})" if values else ""
    try:
        EngineConfig.from_options(**sections["engine"])
        workload = make_workload_spec(sections["workload"])
        sampling = _build(SamplingConfig, sections["sampling"], "sampling")
        mode = _build(ModeConfig, sections["mode"], "mode")
    except (ValueError, TypeError) as error:
        raise ValueError(f"{error}{where}") from error
    return SweepPoint(values, sections["engine"], workload, sampling, mode)


def _build(cls, params: dict, section: str):
    known = {field.name for field in dataclasses.fields(cls)}
    for key in params:
        if key not in known:
            raise ValueError(f"{section}.{key}: unknown parameter (known: {sorted(known)})")
    return cls(**params)


def _mapping(raw: dict, key: str) -> dict:
    value = raw.get(key) or {}
    _require(isinstance(value, dict), key, "must be a mapping", value)
    return dict(value)


def axis_parameters(axis: str) -> list[tuple[str, str]]:
    """(section, parameter) of each parameter an axis sets: "engine.block_size" -> [("engine", "block_size")];
    a joint axis "engine.(a, b)" -> [("engine", "a"), ("engine", "b")]; one across sections
    "(engine.a, mode.b)" -> [("engine", "a"), ("mode", "b")]. ValueError naming the axis when malformed."""
    if axis.startswith("(") and axis.endswith(")"):
        names = [name.strip() for name in axis[1:-1].split(",")]
    else:
        section, rest = axis.split(".", 1) if "." in axis else ("", axis)
        names = ([f"{section}.{name.strip()}" for name in rest[1:-1].split(",")]
                 if rest.startswith("(") and rest.endswith(")") else [axis])
    parameters = []
    for name in names:
        section, _, parameter = name.partition(".")
        _require(section in SECTIONS and parameter, f"sweep.{axis}",
                 f"an axis is 'section.parameter', 'section.(p1, p2)' or '(section.p1, section.p2)' with section in "
                 f"{SECTIONS}", axis)
        parameters.append((section, parameter))
    return parameters


def _parse_sweep(raw_sweep: dict) -> dict:
    sweep = {}
    for axis, values in raw_sweep.items():
        _require(isinstance(axis, str), f"sweep.{axis}", "an axis name is a string", axis)
        parameters = axis_parameters(axis)
        _require(all(key != "kind" or section not in ("workload", "mode") for section, key in parameters),
                 f"sweep.{axis}", "the workload and mode kinds are fixed per config", axis)
        _require(isinstance(values, list) and len(values) >= 1, f"sweep.{axis}", "must be a non-empty list", values)
        if len(parameters) > 1:  # a joint axis: every value sets all its parameters together
            for value in values:
                _require(isinstance(value, list) and len(value) == len(parameters), f"sweep.{axis}",
                         f"each value must be a list of {len(parameters)} items, one per parameter", value)
        sweep[axis] = list(values)
    return sweep


def parse_config(raw: dict) -> BenchConfig:
    """Validate a config mapping (the YAML's content); ValueError naming the field and what it got."""
    _require(isinstance(raw, dict), "config", "must be a YAML mapping", raw)
    for key in raw:
        _require(key in _TOP_LEVEL, str(key), f"unknown section (known: {sorted(_TOP_LEVEL)})", key)
    name = raw.get("name")
    if not (isinstance(name, str) and name.replace("_", "").replace("-", "").isalnum()):
        _fail("name", "must be a file-name-safe string", name)
    model = raw.get("model")
    _require(model is None or isinstance(model, str), "model", "must be null, a path or random:NAME", model)
    sweep = _parse_sweep(_mapping(raw, "sweep"))
    peers = tuple(_build(PeerConfig, dict(peer), "peers[]") if isinstance(peer, dict) else
                  _fail("peers[]", "must be a mapping", peer) for peer in raw.get("peers") or [])
    _require(len({peer.name for peer in peers}) == len(peers), "peers", "names must be distinct",
             [peer.name for peer in peers])
    targets = tuple(_build(TargetConfig, dict(target), "targets[]") if isinstance(target, dict) else
                    _fail("targets[]", "must be a mapping", target) for target in raw.get("targets") or [])
    plot_x = raw.get("plot_x")
    _require(plot_x is None or plot_x in sweep, "plot_x", f"must be one of the sweep axes {list(sweep)}", plot_x)
    warmup_probe = raw.get("warmup_probe", False)
    _require(isinstance(warmup_probe, bool), "warmup_probe", "must be a bool", warmup_probe)
    roofline = raw.get("roofline", False)
    _require(isinstance(roofline, bool), "roofline", "must be a bool", roofline)
    cpu_devices = raw.get("cpu_devices")
    _require(cpu_devices is None or (is_int(cpu_devices) and cpu_devices >= 1), "cpu_devices",
             "must be a positive int or absent", cpu_devices)
    description = raw.get("description", "")
    _require(isinstance(description, str), "description", "must be a string", description)
    config = BenchConfig(name=name, description=description.strip(), model=model,
                         engine=_mapping(raw, "engine"), workload=_mapping(raw, "workload"),
                         sampling=_mapping(raw, "sampling"), mode=_mapping(raw, "mode"), sweep=sweep, peers=peers,
                         targets=targets, warmup_probe=warmup_probe, roofline=roofline, plot_x=plot_x,
                         cpu_devices=cpu_devices, raw=raw)
    points = config.points()  # validates every point before anything runs
    offline_only = [peer.kind for peer in peers if peer.kind not in ONLINE_PEER_KINDS]
    if offline_only and any(point.mode.kind == "online" for point in points):
        raise ValueError(f"peers: {offline_only} run offline only (online peers: {list(ONLINE_PEER_KINDS)}); give them "
                         f"in an offline config")
    return config


def load_config(path: str) -> BenchConfig:
    """Read and validate a YAML sweep config."""
    file = pathlib.Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"config: no such file {path!r}")
    with file.open() as handle:
        try:
            raw = yaml.safe_load(handle)
        except yaml.YAMLError as error:
            raise ValueError(f"config: {path} is not valid YAML: {error}") from error
    return parse_config(raw)
