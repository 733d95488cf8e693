"""Multi-LoRA generation: a batch mixing base rows and rows of three PEFT adapters gives, row by row, HF
transformers' greedy tokens on the merged weights W + scaling * B @ A; adapters never share prefix-cache blocks; and
loading adapters after warm-up compiles nothing."""

from typing import Any, Optional

import pytest
import torch
import transformers

from jaxpaged import LLM, SamplingParams
from jaxpaged.lora.request import LoRARequest
from jaxpaged.runner import compile_counter
from tests.conftest import TINY_ENGINE_OPTIONS, TINY_LLAMA
from tests.lazy_compile import warmed_up_as_served
from tests.lora.peft_files import merged_model, write_peft_adapter
from tests.models.test_hf_parity import hf_greedy

NUM_NEW_TOKENS = 6
ADAPTERS = {  # name: (rank, alpha, targets, rsLoRA)
    "attn-r4": (4, 8.0, ["q_proj", "k_proj", "v_proj", "o_proj"], False),
    "mlp-r8": (8, 16.0, ["gate_proj", "up_proj", "down_proj"], False),
    "all-r8-rs": (8, 4.0, ["q_proj", "v_proj", "o_proj", "gate_proj", "down_proj"], True),
}
PROMPTS = [[1, 400, 401, 402, 403, 404, 405, 406, 407, 408, 409], [1, 77, 78, 79, 80, 81], [1, 5, 6, 7, 8, 9, 10, 11],
           [1, 900, 901, 902, 903, 904, 905, 906, 907, 908, 909, 910, 911, 912, 913, 914, 915, 916, 917]]


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory):
    """The three adapters: (LoRARequest, tensors) by name."""
    root = tmp_path_factory.mktemp("adapters")
    made = {}
    for index, (name, (rank, alpha, targets, rslora)) in enumerate(ADAPTERS.items()):
        tensors = write_peft_adapter(root / name, TINY_LLAMA, rank=rank, alpha=alpha, targets=targets, seed=index,
                                     use_rslora=rslora)
        made[name] = (LoRARequest(name, index + 1, str(root / name)), tensors)
    return made


@pytest.fixture(scope="module")
def lora_llm(tiny_model_dir):
    with warmed_up_as_served():  # a test counts compiles while serving
        llm = LLM(str(tiny_model_dir), enable_lora=True, max_loras=3, max_lora_rank=8, max_cpu_loras=3,
                  **TINY_ENGINE_OPTIONS)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def hf_base(tiny_model_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32).eval()


def greedy(max_tokens: int = NUM_NEW_TOKENS) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def test_mixed_batch_matches_hf_on_merged_weights(lora_llm, adapters, hf_base):
    """Base rows and rows of three adapters (ranks 4 and 8 in rank-8 slots, alphas 8, 16 and rsLoRA's 4) in one
    batch: each row's greedy tokens are HF's on W + scaling * B @ A, and each adapter changes the base's tokens."""
    names = [None, *ADAPTERS, None, *ADAPTERS]
    prompts = [PROMPTS[index % len(PROMPTS)] for index in range(len(names))]
    requests = [None if name is None else adapters[name][0] for name in names]
    outputs = lora_llm.generate([{"prompt_token_ids": p} for p in prompts], greedy(), use_tqdm=False,
                                lora_request=requests)
    got = [output.outputs[0].token_ids for output in outputs]
    references: dict[Optional[str], Any] = {None: hf_base}
    for name, (rank, alpha, _, rslora) in ADAPTERS.items():
        references[name] = merged_model(hf_base, adapters[name][1], rank, alpha, rslora)
    expected = [hf_greedy(references[name], [prompt], NUM_NEW_TOKENS)[0] for name, prompt in zip(names, prompts)]
    assert got == expected
    base_of = {tuple(p): tokens for name, p, tokens in zip(names, prompts, expected) if name is None}
    for name, prompt, tokens in zip(names, prompts, expected):
        if name is not None and tuple(prompt) in base_of:
            assert tokens != base_of[tuple(prompt)], f"{name} left the base model's tokens unchanged"


def test_prefix_cache_never_shared_across_adapters(lora_llm, adapters):
    """A prompt cached by the base model or by one adapter is no hit for another adapter; the same adapter hits."""
    prompt = {"prompt_token_ids": list(range(1000, 1040))}
    first = adapters["attn-r4"][0]
    second = adapters["mlp-r8"][0]
    cached = [lora_llm.generate([prompt], greedy(2), use_tqdm=False, lora_request=lora)[0].num_cached_tokens
              for lora in (None, first, second, first)]
    assert cached[:3] == [0, 0, 0]
    assert cached[3] >= 32


def test_salted_prompt_of_an_adapter_is_no_hit_for_another_salt(lora_llm, adapters):
    """cache_salt still applies with an adapter: the same adapter and prompt under another salt computes anew."""
    lora = adapters["all-r8-rs"][0]
    tokens = list(range(2000, 2040))
    cached = [lora_llm.generate([{"prompt_token_ids": tokens, "cache_salt": salt}], greedy(2), use_tqdm=False,
                                lora_request=lora)[0].num_cached_tokens for salt in ("a", "b", "a")]
    assert cached[:2] == [0, 0] and cached[2] >= 32


def test_swapping_adapters_through_the_slots_never_compiles(lora_llm, adapters, tmp_path):
    """Four more adapters than slots, each run in turn (every slot rewritten), compile nothing after warm-up, and
    an adapter evicted from its slot and brought back gives the same tokens as before."""
    extra = []
    for index in range(4):
        tensors_dir = tmp_path / f"extra{index}"
        write_peft_adapter(tensors_dir, TINY_LLAMA, rank=2 + index, alpha=4.0, targets=["q_proj", "down_proj"],
                           seed=100 + index)
        extra.append(LoRARequest(f"extra{index}", 10 + index, str(tensors_dir)))
    prompt = [{"prompt_token_ids": PROMPTS[0]}]
    before = lora_llm.generate(prompt, greedy(), use_tqdm=False, lora_request=adapters["attn-r4"][0])
    compiles = compile_counter.num_compilations()
    writes = lora_llm.engine.runner.lora.num_writes
    for lora in extra:
        lora_llm.generate(prompt, greedy(), use_tqdm=False, lora_request=lora)
    after = lora_llm.generate(prompt, greedy(), use_tqdm=False, lora_request=adapters["attn-r4"][0])
    assert compile_counter.num_compilations() == compiles
    assert lora_llm.engine.runner.lora.num_writes >= writes + 5
    assert after[0].outputs[0].token_ids == before[0].outputs[0].token_ids


def _bad_adapters(root, adapters) -> dict:
    """Broken adapters by the field their error must name."""
    def written(name: str, rank: int = 4, targets: tuple[str, ...] = ("q_proj",), **kwargs: Any) -> str:
        write_peft_adapter(root / name, TINY_LLAMA, rank=rank, alpha=4.0, targets=list(targets), seed=50, **kwargs)
        return str(root / name)

    no_weights = written("no-weights")
    (root / "no-weights" / "adapter_model.safetensors").unlink()
    return {
        "lora_path: not a directory": str(root / "does-not-exist"),
        "lora_path: no adapter_model.safetensors": no_weights,
        "r: 16 is above max_lora_rank (8)": written("rank-16", rank=16),
        "target_modules: ['lm_head'] cannot be adapted": written(
            "lm-head", config_overrides={"target_modules": ["q_proj", "lm_head"]}),
        "adapts 'v_proj', which is not in target_modules": written(
            "stray-tensor", targets=("q_proj", "v_proj"), config_overrides={"target_modules": ["q_proj"]}),
        "has shape (4, 32), expected (4, 64)": _wrong_width(root / "wrong-width"),
    }


def _wrong_width(directory) -> str:
    write_peft_adapter(directory, TINY_LLAMA | dict(hidden_size=32), rank=4, alpha=4.0, targets=["q_proj"], seed=51)
    return str(directory)


def test_bad_adapters_are_refused_naming_them_and_the_field(lora_llm, adapters, tmp_path):
    """A missing directory or weights file, a rank above max_lora_rank, an unknown target module, a tensor of a
    module outside target_modules and a shape mismatch: ValueError naming the adapter and the field, nothing queued,
    and the engine still serves base and adapter rows."""
    for index, (field, path) in enumerate(_bad_adapters(tmp_path, adapters).items()):
        bad = LoRARequest(f"bad{index}", 100 + index, path)
        with pytest.raises(ValueError) as error:
            lora_llm.generate([{"prompt_token_ids": PROMPTS[0]}], greedy(), use_tqdm=False, lora_request=bad)
        assert f"LoRA adapter 'bad{index}'" in str(error.value) and field in str(error.value), str(error.value)
    assert not lora_llm.engine.has_unfinished_requests()
    outputs = lora_llm.generate([{"prompt_token_ids": PROMPTS[1]}] * 2, greedy(2), use_tqdm=False,
                                lora_request=[None, adapters["mlp-r8"][0]])
    assert all(len(output.outputs[0].token_ids) == 2 for output in outputs)


def test_lora_request_needs_enable_lora_and_one_per_prompt(lora_llm, adapters):
    """A list of lora requests must match the prompts; LoRARequest checks its own fields by name."""
    with pytest.raises(ValueError, match="lora_request: got 1 for 2 prompts"):
        lora_llm.generate([{"prompt_token_ids": PROMPTS[0]}] * 2, greedy(), use_tqdm=False,
                          lora_request=[adapters["attn-r4"][0]])
    with pytest.raises(ValueError, match="lora_int_id"):
        LoRARequest("x", 0, "/tmp")
