"""The jitted batched sampler and its host-side batch builder, against argmax, numpy and known distributions."""

import jax
import numpy as np
import pytest

from jaxpaged.sampling.params import SamplingParams
from jaxpaged.sampling.sampler import (
    SamplerFlags,
    SamplingRow,
    all_sampler_flag_variants,
    apply_logit_adjustments,
    build_sampling_batch,
    min_tokens_suppress_ids,
    sample,
    sampler_static_flags,
    split_seed,
    warmup_sampling_batch,
)
from tests.sampling.sampling_helpers import NUM_ROWS, VOCAB_SIZE, random_logits, row, row_with_unchecked_seed, run


def test_temperature_zero_is_argmax_alone_and_among_sampling_rows():
    """Greedy rows take the argmax, whether the batch is all greedy or mixed with sampling rows."""
    logits = random_logits(NUM_ROWS)
    expected = logits.argmax(axis=1)
    greedy, flags = run([row(temperature=0.0, seed=i) for i in range(NUM_ROWS)], logits)
    assert flags.mode == "greedy"
    np.testing.assert_array_equal(greedy.token_ids, expected)
    mixed_rows = [row(temperature=0.0 if i % 2 else 1.0, seed=i) for i in range(NUM_ROWS)]
    mixed, flags = run(mixed_rows, logits)
    assert flags.mode == "random"
    np.testing.assert_array_equal(mixed.token_ids[1::2], expected[1::2])


def test_temperatures_below_greedy_temperature_are_greedy():
    """A temperature of 1e-6 would overflow logits / T in float32: it samples greedily, like 0."""
    logits = random_logits(NUM_ROWS, seed=12, scale=30.0)
    output, flags = run([row(seed=i, temperature=1e-6) for i in range(NUM_ROWS)], logits)
    assert flags.mode == "greedy"
    np.testing.assert_array_equal(output.token_ids, logits.argmax(axis=1))


def test_uniform_noise_stays_strictly_inside_zero_one_at_the_extreme_bits():
    """The extreme hash outputs map inside (0, 1), so the Gumbel noise is finite for every token."""
    from jaxpaged.sampling.sampler import _uniform_from_bits

    uniform = np.asarray(_uniform_from_bits(np.array([0, 511, 512, 2**32 - 1], np.uint32)))
    assert np.all((uniform > 0) & (uniform < 1)), uniform
    assert np.all(np.isfinite(-np.log(-np.log(uniform))))


@pytest.mark.parametrize("params", [dict(top_k=1), dict(top_p=1e-6), dict(min_p=1.0)],
                         ids=["top_k=1", "tiny top_p", "min_p=1"])
def test_filters_that_keep_one_token_equal_greedy(params):
    """top_k=1, a tiny top_p and min_p=1 leave only the argmax, at any temperature and seed."""
    logits = random_logits(NUM_ROWS, seed=1, scale=0.5)
    rows = [row(seed=100 + i, temperature=[0.5, 1.0, 3.0, 50.0][i % 4], **params) for i in range(NUM_ROWS)]
    output, flags = run(rows, logits)
    assert flags.mode == ("random" if "min_p" in params else "top_k_top_p")
    np.testing.assert_array_equal(output.token_ids, logits.argmax(axis=1))


def test_top_k_off_values_and_top_k_past_the_vocabulary_do_not_filter():
    """top_k 0, -1 and >= vocab_size are all "off": the batch needs no sort and samples alike."""
    logits = random_logits(NUM_ROWS, seed=2)
    outputs = []
    for top_k in (0, -1, VOCAB_SIZE, VOCAB_SIZE + 5):
        output, flags = run([row(seed=i, top_k=top_k) for i in range(NUM_ROWS)], logits)
        assert flags.mode == "random"
        outputs.append(output.token_ids)
    for token_ids in outputs[1:]:
        np.testing.assert_array_equal(token_ids, outputs[0])


def _crowd(num_rows: int, target_position: int, target: SamplingRow):
    """A batch of unrelated rows with every option in use, with `target` at target_position."""
    crowd = [row(seed=7 * i, temperature=0.0) if i % 5 == 0 else
             row(seed=7 * i, temperature=1.3, top_p=0.9, logprobs=5) if i % 5 == 1 else
             row(seed=7 * i, top_k=5, repetition_penalty=1.3, output=[i, i + 1]) if i % 5 == 2 else
             row(seed=7 * i, min_p=0.1, frequency_penalty=0.5, output=[3, 3]) if i % 5 == 3 else
             row(seed=7 * i, logit_bias={1: 5.0}, temperature=0.7) for i in range(num_rows - 1)]
    crowd.insert(target_position, target)
    return crowd


@pytest.mark.parametrize("target_position", [0, 11])
def test_seeded_row_samples_the_same_whatever_the_batch_and_position(target_position):
    """Same seed and logits give the same token alone (random variant) and in a crowded batch of 16."""
    target_logits = random_logits(1, seed=3, scale=0.7)[0]
    output_token_ids = []
    for _ in range(6):
        target = row(seed=1234, temperature=0.8, output=list(output_token_ids))
        alone_logits = random_logits(NUM_ROWS, seed=4)
        alone_logits[0] = target_logits
        alone, alone_flags = run([target], alone_logits)
        crowd_logits = random_logits(16, seed=5)
        crowd_logits[target_position] = target_logits
        crowded, crowd_flags = run(_crowd(16, target_position, target), crowd_logits, num_rows_padded=16)
        assert alone_flags == SamplerFlags("random", False, False)
        assert crowd_flags == SamplerFlags("top_k_top_p", True, True)
        assert crowded.token_ids[target_position] == alone.token_ids[0]
        output_token_ids.append(int(alone.token_ids[0]))
    # The key moves with the number of output tokens, so a flat-ish distribution gives varied tokens.
    assert len(set(output_token_ids)) > 1


def test_different_seeds_and_steps_draw_differently():
    """On uniform logits, eight seeds do not all agree, and one seed's steps do not all agree."""
    logits = np.zeros((NUM_ROWS, VOCAB_SIZE), np.float32)
    by_seed, _ = run([row(seed=i) for i in range(NUM_ROWS)], logits)
    by_step, _ = run([row(seed=9, output=[0] * i) for i in range(NUM_ROWS)], logits)
    assert len(set(by_seed.token_ids.tolist())) > 1
    assert len(set(by_step.token_ids.tolist())) > 1


def test_penalties_and_logit_bias_match_a_hand_worked_case():
    """Bias first, then repetition (prompt + output), frequency and presence: vLLM V1's order, by hand."""
    logits = np.array([[2.0, -1.0, 0.5, 3.0, -2.0, 1.0], [2.0, -1.0, 0.5, 3.0, -2.0, 1.0]], np.float32)
    penalized = row(prompt=[0, 1], output=[3, 3, 2], repetition_penalty=2.0, presence_penalty=0.5,
                    frequency_penalty=0.25, logit_bias={5: 1.5, 4: -100.0, 0: 1.0})
    neutral = row(prompt=[0, 1], output=[3, 3, 2])
    batch = build_sampling_batch([penalized, neutral], 2, 6)
    adjusted = np.asarray(apply_logit_adjustments(logits, batch))
    # token 0: (2 + 1) / 2 = 1.5      prompt, positive: divided (after its bias)
    # token 1: -1 * 2 = -2            prompt, negative: multiplied
    # token 2: 0.5 / 2 - 0.25 * 1 - 0.5 = -0.5      output once
    # token 3: 3 / 2 - 0.25 * 2 - 0.5 = 0.5         output twice
    # token 4: -2 - 100 = -102        bias only (not seen)
    # token 5: 1 + 1.5 = 2.5          bias only
    np.testing.assert_allclose(adjusted[0], [1.5, -2.0, -0.5, 0.5, -102.0, 2.5], rtol=1e-6)
    np.testing.assert_array_equal(adjusted[1], logits[1])


def test_penalties_and_bias_steer_greedy_sampling():
    """Through sample(): a repetition penalty moves greedy off a repeated token; a bias pushes one in."""
    logits = np.tile(np.array([[0.0, 3.0, 2.9, 0.0, 0.0, 1.0]], np.float32), (4, 1))
    rows = [row(temperature=0.0, prompt=[4], output=[1], repetition_penalty=1.2),
            row(temperature=0.0, prompt=[4], output=[1], frequency_penalty=0.2),
            row(temperature=0.0, prompt=[4], logit_bias={5: 2.5}),
            row(temperature=0.0, prompt=[4], output=[1])]
    output, flags = run(rows, logits, num_rows_padded=4)
    assert flags == SamplerFlags("greedy", True, False)
    np.testing.assert_array_equal(output.token_ids, [2, 2, 5, 1])


def test_suppressed_ids_are_never_sampled():
    """suppress_token_ids (min_tokens) excludes a token greedy would take and that sampling favours."""
    logits = np.tile(np.array([[8.0, 0.0, 0.0, 1.0]], np.float32), (512, 1))
    rows = [row(seed=i, suppress=[0], temperature=0.0 if i == 0 else 1.0) for i in range(512)]
    output, flags = run(rows, logits, num_rows_padded=512)
    assert flags.apply_penalties
    assert 0 not in output.token_ids.tolist()
    assert output.token_ids[0] == 3
    assert set(output.token_ids.tolist()) == {1, 2, 3}


def test_min_tokens_suppress_ids():
    """Stop ids and EOS are suppressed until min_tokens, EOS even with ignore_eos (vLLM's rule)."""
    params = SamplingParams(min_tokens=2, stop_token_ids=[7])
    assert sorted(min_tokens_suppress_ids(params, [2], 0)) == [2, 7]
    assert sorted(min_tokens_suppress_ids(params, [2], 1)) == [2, 7]
    assert min_tokens_suppress_ids(params, [2], 2) == []
    ignoring_eos = SamplingParams(min_tokens=2, stop_token_ids=[7], ignore_eos=True)
    assert sorted(min_tokens_suppress_ids(ignoring_eos, [2], 0)) == [2, 7]
    assert min_tokens_suppress_ids(SamplingParams(), [2], 0) == []


def test_logprobs_are_log_softmax_of_the_raw_logits():
    """Sampled and top-20 logprobs equal jax.nn.log_softmax of the logits before penalties or temperature."""
    logits = random_logits(NUM_ROWS, seed=6)
    rows = [row(seed=i, temperature=[0.0, 0.6, 1.5][i % 3], top_p=0.8, repetition_penalty=1.5,
                output=[int(logits[i].argmax())], logprobs=[None, 0, 5, 20][i % 4]) for i in range(6)]
    output, flags = run(rows, logits)
    assert flags == SamplerFlags("top_k_top_p", True, True)
    reference = np.asarray(jax.nn.log_softmax(logits, axis=-1))
    sampled = reference[np.arange(NUM_ROWS), output.token_ids]
    np.testing.assert_allclose(output.logprobs, sampled, rtol=1e-6, atol=1e-6)
    expected_ids = np.argsort(-reference, axis=1)[:, :20]
    np.testing.assert_array_equal(output.top_logprob_ids, expected_ids)
    np.testing.assert_allclose(output.top_logprobs, np.take_along_axis(reference, expected_ids, axis=1),
                               rtol=1e-6, atol=1e-6)


def test_sampled_rank_is_exact_outside_the_top_k():
    """A temperature-2 draw often lands far down the vocabulary; its rank is counted over the whole vocabulary
    (tokens at least as likely, itself included), with or without top logprobs in the same call."""
    logits = random_logits(NUM_ROWS, seed=8)
    reference = np.asarray(jax.nn.log_softmax(logits, axis=-1))
    for logprobs in (0, 2):
        rows = [row(seed=100 + i, temperature=2.0, logprobs=logprobs) for i in range(NUM_ROWS)]
        output, _ = run(rows, logits)
        sampled = reference[np.arange(NUM_ROWS), output.token_ids]
        expected = (reference >= sampled[:, None]).sum(axis=1)
        np.testing.assert_array_equal(output.sampled_ranks, expected)
        assert expected.max() > 20  # some draws really are outside any returned top-k


def test_logprobs_are_absent_unless_asked_and_top_logprobs_capped_by_a_small_vocabulary():
    """Without logprobs only the ids come back (the same ids); logprobs=0 brings the sampled logprob and rank; with a
    4-token vocabulary only 4 top logprobs do."""
    logits = random_logits(4, vocab_size=4, seed=7)
    plain, flags = run([row(seed=3)], logits, num_rows_padded=4)
    assert not flags.return_logprobs
    assert plain.logprobs is None and plain.sampled_ranks is None and plain.top_logprobs is None
    sampled_only, flags = run([row(seed=3, logprobs=0)], logits, num_rows_padded=4)
    assert flags.return_logprobs and sampled_only.logprobs is not None and sampled_only.sampled_ranks is not None
    np.testing.assert_array_equal(plain.token_ids, sampled_only.token_ids)
    asked, flags = run([row(logprobs=20)], logits, num_rows_padded=4)
    assert flags.return_logprobs and asked.top_logprobs.shape == (4, 4)


def test_padded_rows_are_harmless():
    """Padding gets neutral greedy parameters, and NaN logits there do not change the real rows."""
    rows = [row(seed=1, top_p=0.9), row(seed=2, repetition_penalty=1.5, output=[4]), row(seed=3, logprobs=3)]
    batch = build_sampling_batch(rows, NUM_ROWS, VOCAB_SIZE)
    assert np.all(batch.temperatures[3:] == 0) and np.all(batch.top_ks[3:] == 0)
    assert np.all(batch.top_ps[3:] == 1) and np.all(batch.min_ps[3:] == 0)
    assert np.all(batch.repetition_penalties[3:] == 1) and np.all(batch.num_top_logprobs[3:] == -1)
    assert batch.output_token_counts is not None and batch.logit_bias is not None  # a row has penalties
    assert not batch.output_token_counts[3:].any() and not batch.logit_bias[3:].any()
    logits = random_logits(NUM_ROWS, seed=8)
    clean, _ = run(rows, logits)
    logits[3:] = np.nan
    dirty, _ = run(rows, logits)
    np.testing.assert_array_equal(dirty.token_ids[:3], clean.token_ids[:3])
    np.testing.assert_array_equal(dirty.logprobs[:3], clean.logprobs[:3])
    assert np.all((0 <= dirty.token_ids) & (dirty.token_ids < VOCAB_SIZE))


def test_flags_pick_the_least_work_and_are_all_listed():
    """Each batch gets the cheapest exact variant, and every variant is in all_sampler_flag_variants()."""
    cases = [([row(temperature=0.0)], SamplerFlags("greedy", False, False)),
             ([row(temperature=0.0, top_k=3)], SamplerFlags("greedy", False, False)),
             ([row(), row(temperature=0.0)], SamplerFlags("random", False, False)),
             ([row(), row(temperature=0.0, top_p=0.5)], SamplerFlags("random", False, False)),
             ([row(min_p=0.2)], SamplerFlags("random", False, False)),
             ([row(top_k=3)] * NUM_ROWS, SamplerFlags("top_k_top_p", False, False)),
             ([row(top_p=0.5)], SamplerFlags("top_k_top_p", False, False)),
             ([row(temperature=0.0, presence_penalty=0.1)], SamplerFlags("greedy", True, False)),
             ([row(logit_bias={0: 1.0})], SamplerFlags("random", True, False)),
             ([row(suppress=[0])], SamplerFlags("random", True, False)),
             ([row(logprobs=0)], SamplerFlags("random", False, True)),
             ([row(logprobs=1)], SamplerFlags("random", False, True))]
    variants = all_sampler_flag_variants()
    assert len(variants) == len(set(variants)) == 12
    for rows, expected in cases:
        flags = sampler_static_flags(build_sampling_batch(rows, NUM_ROWS, VOCAB_SIZE))
        assert flags == expected, rows
        assert flags in variants


def test_every_variant_has_a_warmup_batch_and_runs():
    """warmup_sampling_batch yields a batch of exactly the asked variant, and each variant runs."""
    logits = random_logits(2, vocab_size=32, seed=9)
    for flags in all_sampler_flag_variants():
        batch = warmup_sampling_batch(flags, 2, 32)
        assert sampler_static_flags(batch) == flags
        output = jax.device_get(sample(logits, batch, flags))
        assert output.token_ids.shape == (2,) and (output.logprobs is not None) == flags.return_logprobs


def test_new_parameter_values_do_not_recompile():
    """Only the row bucket, vocabulary size and flags are static: new values reuse the compiled sampler."""
    logits = random_logits(NUM_ROWS, seed=10)
    run([row(seed=1, top_p=0.5, temperature=0.3)], logits)
    num_compiled = sample._cache_size()  # pyright: ignore[reportAttributeAccessIssue]  (private jax API)
    run([row(seed=2**40 + 5, top_k=7, temperature=2.0, min_p=0.1, output=[1, 2])] * 5, logits)
    assert sample._cache_size() == num_compiled  # pyright: ignore[reportAttributeAccessIssue]


def test_split_seed_takes_the_seed_modulo_2_64():
    """Seeds become (high, low) 32-bit words; negative and huge seeds wrap modulo 2**64."""
    assert split_seed(0) == (0, 0) and split_seed(2**32 - 1) == (0, 2**32 - 1)
    assert split_seed(2**32 + 7) == (1, 7)
    assert split_seed(-1) == (2**32 - 1, 2**32 - 1)
    assert split_seed(2**64 + 3) == split_seed(3)


@pytest.mark.parametrize("field,rows,num_rows_padded", [
    ("num_rows_padded", [row()] * 3, 2),
    ("seed", [row_with_unchecked_seed(None)], 4),
    ("seed", [row_with_unchecked_seed(True)], 4),
    ("prompt_token_ids", [row(prompt=[1, VOCAB_SIZE], repetition_penalty=1.2)], 4),
    ("output_token_ids", [row(output=[-1], frequency_penalty=0.1)], 4),
    ("logit_bias", [row(logit_bias={VOCAB_SIZE: 1.0})], 4),
    ("suppress_token_ids", [row(suppress=[VOCAB_SIZE + 3])], 4),
])
def test_builder_rejects_bad_rows_naming_the_field(field, rows, num_rows_padded):
    """Too many rows, unresolved seeds and out-of-vocabulary ids fail on the host, naming the field."""
    with pytest.raises(ValueError, match=f"^{field}"):
        build_sampling_batch(rows, num_rows_padded, VOCAB_SIZE)
