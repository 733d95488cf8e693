"""The offline API on the tiny model: inputs, ordering, sampling guarantees, stop strings, logprobs, errors."""

import numpy as np
import pytest
import torch
import transformers

from jaxpaged.sampling.params import SamplingParams

# One worker builds the shared tiny engine (it compiles) for every test that uses it.
pytestmark = pytest.mark.xdist_group("tiny_llm")

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def test_accepts_every_prompt_form_and_keeps_input_order(tiny_llm):
    tokenizer = tiny_llm.get_tokenizer()
    prompts = ["Hello there", tokenizer.encode("A longer prompt about paged attention"),
               {"prompt": "Salted", "cache_salt": "tenant-a"}, {"prompt_token_ids": [5, 6, 7], "priority": 2}]
    outputs = tiny_llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.prompt for o in outputs] == ["Hello there", None, "Salted", None]
    assert outputs[1].prompt_token_ids == prompts[1]
    assert outputs[3].prompt_token_ids == [5, 6, 7]
    for output in outputs:
        completion = output.outputs[0]
        assert output.finished and completion.finish_reason == "length" and len(completion.token_ids) == 12
        assert completion.text == tokenizer.decode(completion.token_ids, skip_special_tokens=True)
        m = output.metrics
        assert m.arrival_time <= m.first_token_time <= m.finish_time
    single = tiny_llm.generate("Hello there", GREEDY, use_tqdm=False)
    assert single[0].outputs[0].token_ids == outputs[0].outputs[0].token_ids


def test_top_k_1_equals_greedy(tiny_llm):
    prompts = ["The quick brown fox", "Once upon a time"]
    greedy = tiny_llm.generate(prompts, GREEDY, use_tqdm=False)
    top1 = tiny_llm.generate(prompts, SamplingParams(temperature=1.3, top_k=1, max_tokens=12, ignore_eos=True, seed=3),
                             use_tqdm=False)
    assert [o.outputs[0].token_ids for o in top1] == [o.outputs[0].token_ids for o in greedy]


def test_seeded_sampling_is_the_same_alone_and_in_a_batch(tiny_llm):
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=1234, max_tokens=16, ignore_eos=True)
    alone = tiny_llm.generate("Tell me a story", params, use_tqdm=False)[0].outputs[0].token_ids
    others = [f"unrelated prompt number {i} " * (1 + i % 4) for i in range(16)]
    other_params = [SamplingParams(temperature=0.9, max_tokens=8 + i, ignore_eos=True) for i in range(16)]
    batch = tiny_llm.generate(others[:7] + ["Tell me a story"] + others[7:],
                              other_params[:7] + [params] + other_params[7:], use_tqdm=False)
    assert batch[7].outputs[0].token_ids == alone
    unseeded = tiny_llm.generate(["Tell me a story"] * 2,
                                 SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True),
                                 use_tqdm=False)
    assert unseeded[0].outputs[0].token_ids != unseeded[1].outputs[0].token_ids


def test_n_samples_share_the_prompt_blocks(tiny_llm):
    engine = tiny_llm.engine
    prompt = list(range(100, 100 + 70))  # 4 full blocks of 16 + 6 tokens
    before = engine.get_stats().prefix_cache_hits
    out = tiny_llm.generate({"prompt_token_ids": prompt, "cache_salt": "n-test"},
                            SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=5, ignore_eos=True), use_tqdm=False)
    assert [c.index for c in out[0].outputs] == [0, 1, 2]
    # Samples 2 and 3 find sample 1's four full prompt blocks instead of prefilling again.
    assert engine.get_stats().prefix_cache_hits - before == 2 * 64
    assert len({tuple(c.token_ids) for c in out[0].outputs}) > 1


def test_stop_string_across_token_boundaries(tiny_llm):
    tokenizer = tiny_llm.get_tokenizer()
    free = tiny_llm.generate("Stop here", SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
                             use_tqdm=False)[0].outputs[0]
    pieces = [tokenizer.decode(free.token_ids[:i], skip_special_tokens=True) for i in range(len(free.token_ids) + 1)]
    # A stop string that begins inside token 3's text and ends inside token 5's text.
    start, end = len(pieces[3]) - 1, len(pieces[5]) + 1
    assert 0 < start and end <= len(free.text)
    stop = free.text[start:end]
    stopped = tiny_llm.generate("Stop here", SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop=[stop]),
                                use_tqdm=False)[0].outputs[0]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == stop
    assert stopped.text == free.text[:free.text.index(stop)]
    kept = tiny_llm.generate("Stop here", SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop=[stop],
                                                         include_stop_str_in_output=True), use_tqdm=False)[0].outputs[0]
    assert kept.text == free.text[:free.text.index(stop) + len(stop)]


def test_sampled_token_rank_is_exact_against_the_reference(tiny_llm, tiny_model_dir):
    """A hot sample with logprobs=1 lands outside the top-1 on most steps; its rank is its exact position in
    HF's distribution (vLLM's rule), not 2."""
    prompt = tiny_llm.get_tokenizer().encode("Ranks of a hot sample")
    params = SamplingParams(temperature=3.0, seed=5, max_tokens=8, logprobs=1, ignore_eos=True)
    out = tiny_llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0].outputs[0]
    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + out.token_ids])).logits[0]
    reference = torch.log_softmax(logits, dim=-1).numpy()[len(prompt) - 1:-1]
    assert out.logprobs is not None
    ranks = [entry[token_id].rank for token_id, entry in zip(out.token_ids, out.logprobs)]
    for step, (token_id, rank) in enumerate(zip(out.token_ids, ranks)):
        # Two float32 implementations may order near-ties differently: the rank must fall inside the band of
        # tokens within 1e-5 of the sampled one.
        distances = reference[step] - reference[step, token_id]
        assert int((distances > 1e-5).sum()) + 1 <= rank <= int((distances >= -1e-5).sum()), step
    assert max(ranks) > 2


def test_logprobs_equal_log_softmax_of_reference_logits(tiny_llm, tiny_model_dir):
    prompt = tiny_llm.get_tokenizer().encode("Logprobs of a greedy continuation")
    out = tiny_llm.generate({"prompt_token_ids": prompt}, SamplingParams(temperature=0, max_tokens=6, logprobs=3,
                                                                         ignore_eos=True), use_tqdm=False)[0].outputs[0]
    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + out.token_ids])).logits[0]
    reference = torch.log_softmax(logits, dim=-1).numpy()[len(prompt) - 1:-1]
    assert len(out.logprobs) == 6
    total = 0.0
    for step, (token_id, entry) in enumerate(zip(out.token_ids, out.logprobs)):
        np.testing.assert_allclose(entry[token_id].logprob, reference[step, token_id], atol=1e-4)
        assert entry[token_id].rank == 1  # greedy picks the most likely token
        top3 = np.argsort(-reference[step])[:3].tolist()
        assert sorted(entry) == sorted(top3)
        total += reference[step, token_id]
    assert out.cumulative_logprob == pytest.approx(total, abs=1e-3)


def test_chat_applies_the_template(tiny_llm):
    messages = [{"role": "user", "content": "hi"}]
    out = tiny_llm.chat(messages, GREEDY, use_tqdm=False)[0]
    expected = tiny_llm.get_tokenizer().apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                                            return_dict=False)
    assert out.prompt_token_ids == list(expected)
    assert len(tiny_llm.chat([messages, messages], GREEDY, use_tqdm=False)) == 2


@pytest.mark.parametrize("prompt, params, field", [
    ("", GREEDY, "prompt"),
    ([], GREEDY, "prompt"),
    ([49152], GREEDY, "prompt_token_ids"),
    ([-1], GREEDY, "prompt_token_ids"),
    ("x " * 300, GREEDY, "max_tokens"),
    ("hello", SamplingParams(max_tokens=256), "max_tokens"),
    ("hello", SamplingParams(stop_token_ids=[10**6]), "stop_token_ids"),
    ({"prompt": "hi", "cache_salt": 3}, GREEDY, "cache_salt"),
])
def test_bad_input_is_rejected_by_name_and_the_engine_keeps_serving(tiny_llm, prompt, params, field):
    with pytest.raises(ValueError, match=field):
        tiny_llm.generate(["fine prompt", prompt], params, use_tqdm=False)
    assert not tiny_llm.engine.has_unfinished_requests(), "the valid prompt of the batch must not be left queued"
    assert tiny_llm.generate("still works", GREEDY, use_tqdm=False)[0].outputs[0].finish_reason == "length"


def test_final_only_steps_return_just_the_finished_outputs(tiny_llm):
    """step(final_only=True), what LLM.generate uses: no output for a request still running, and each finished
    output equal to the one step() builds; the engine still counts every request's tokens so far."""
    engine = tiny_llm.engine
    lengths = {"short": 1, "mid": 5, "long": 9}

    def run(final_only: bool) -> tuple[dict, list[dict]]:
        for request_id, max_tokens in lengths.items():
            engine.add_request(f"{request_id}-{final_only}", "Paged attention",
                               SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
        finals, counts = {}, []
        while engine.has_unfinished_requests():
            for output in engine.step(final_only=final_only):
                assert output.finished or not final_only
                if output.finished:
                    finals[output.request_id.rsplit("-", 1)[0]] = output.outputs[0].token_ids
            counts.append(engine.output_token_counts())
        return finals, counts

    streamed, _ = run(False)
    final, counts = run(True)
    assert final == streamed and {k: len(v) for k, v in final.items()} == lengths
    assert counts[0] == {"mid-True": 1, "long-True": 1}  # "short" finished in the first step
    assert counts[-1] == {}
