"""The lean sampling loop against Hugging Face ``generate``: the same greedy tokens, the same
filtered distribution, and ``generate`` whenever a setting is outside what the loop does."""

from types import SimpleNamespace

import pytest
import torch
from transformers import (
    LogitsProcessorList,
    MistralConfig,
    MistralForCausalLM,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from comlrl.rollout import decoding, generate_group
from comlrl.rollout.decoding import DecodingSettings, decode, decoding_settings, filtered_distribution, next_tokens

from .helpers import MIXED, char_tokenizer, left_padded, position_sensitive, tiny_gpt2, tiny_llama, with_lora

PROMPTS = ["Hi", "a much longer prompt:", "xyz"]


@pytest.mark.parametrize("build", [tiny_llama, tiny_gpt2, with_lora(tiny_gpt2)], ids=["llama", "gpt2", "gpt2+lora"])
@pytest.mark.parametrize("min_new_tokens", [0, 5])
def test_greedy_tokens_equal_generate_with_early_eos_padding_and_min_new_tokens(build, min_new_tokens):
    tok = char_tokenizer(MIXED)
    model = position_sensitive(build, tok)
    ids, mask = left_padded(tok, PROMPTS)
    with torch.inference_mode():
        free = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=8, eos_token_id=[])
        # An "EOS" that row 0 draws at its third token: rows finish at different steps.
        eos = [int(free[0, ids.shape[1] + 2])]
        expected = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=8,
            min_new_tokens=min_new_tokens,
            eos_token_id=eos,
            pad_token_id=tok.pad_token_id,
        )[:, ids.shape[1] :]
        settings = DecodingSettings(max_new_tokens=8, min_new_tokens=min_new_tokens)
        got = decode(model, ids, mask, settings, eos, tok.pad_token_id).ids
    assert (mask == 0).any(), "the test needs left padding"
    assert min_new_tokens or (got == tok.pad_token_id).any(), "the test needs a row padded after its EOS"
    assert torch.equal(got, expected)


class AlwaysEos(torch.nn.Module):
    """Ranks EOS (id 1) first and id 5 second at every position; no cache."""

    def forward(self, input_ids, attention_mask, use_cache=True, cache=None, logits_to_keep=0):
        logits = torch.zeros(input_ids.shape[0], 1, 8)
        logits[..., 1], logits[..., 5] = 10.0, 9.0
        return SimpleNamespace(logits=logits, cache=cache or ())


@pytest.mark.parametrize("min_new_tokens", [0, 1, 3])
def test_min_new_tokens_holds_eos_back_exactly_that_many_tokens_then_decoding_stops(min_new_tokens):
    ids, mask = torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.long)
    settings = DecodingSettings(max_new_tokens=8, min_new_tokens=min_new_tokens)
    got = decode(AlwaysEos(), ids, mask, settings, eos_ids=[1], pad_id=0).ids
    assert got.tolist() == [[5] * min_new_tokens + [1]] * 2


@pytest.mark.parametrize(
    "temperature, top_k, top_p",
    [(0.6, 50, 0.6), (1.0, 0, 0.9), (0.7, 5, 1.0), (1.3, 20, 0.3), (0.5, 0, 1.0), (1.0, 3, 0.0)],
)
def test_filtered_distribution_equals_generates_warpers(temperature, top_k, top_p):
    torch.manual_seed(0)
    logits = torch.randn(6, 300) * 3
    warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature)])
    if top_k:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(max(top_p, 1e-9)))
    expected = warpers(None, logits.clone()).softmax(dim=-1)
    probabilities, token_ids = filtered_distribution(logits, temperature, top_k, top_p)
    got = torch.zeros_like(logits).scatter(-1, token_ids, probabilities)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


def test_sampled_frequencies_follow_the_filtered_distribution():
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.0, -1.0, -2.0, -3.0]]).repeat(20000, 1)
    settings = DecodingSettings(max_new_tokens=1, do_sample=True, temperature=0.8, top_k=4, top_p=0.9)
    drawn = next_tokens(logits, settings, torch.Generator().manual_seed(0))
    probabilities, token_ids = filtered_distribution(logits[:1], 0.8, 4, 0.9)
    expected = torch.zeros(8).scatter(0, token_ids[0], probabilities[0])
    frequencies = torch.bincount(drawn, minlength=8).float() / len(drawn)
    assert expected[4:].sum() == 0 and frequencies[4:].sum() == 0, "tokens outside the top-k are never drawn"
    torch.testing.assert_close(frequencies, expected, atol=0.015, rtol=0)


def test_settings_come_from_the_arguments_over_the_models_generation_config():
    tok = char_tokenizer(MIXED)
    model = tiny_llama(tok)
    model.generation_config.temperature = 0.3
    settings = decoding_settings(model, {"do_sample": True, "top_p": 0.5, "max_new_tokens": 7})
    # transformers' default top_k (50) applies when nothing sets it, as in generate.
    assert settings == DecodingSettings(max_new_tokens=7, do_sample=True, temperature=0.3, top_k=50, top_p=0.5)


@pytest.mark.parametrize(
    "kwargs, config_field",
    [
        ({"repetition_penalty": 1.2}, None),
        ({"num_beams": 2}, None),
        ({"min_p": 0.1}, None),
        ({"logits_processor": LogitsProcessorList()}, None),
        ({}, ("repetition_penalty", 1.3)),
        ({}, ("no_repeat_ngram_size", 2)),
    ],
)
def test_settings_outside_the_loop_go_to_generate(kwargs, config_field):
    tok = char_tokenizer(MIXED)
    model = tiny_llama(tok)
    if config_field:
        setattr(model.generation_config, *config_field)
    assert decoding_settings(model, {"do_sample": True, "max_new_tokens": 4, **kwargs}) is None
    assert decoding_settings(model, {"do_sample": True}) is None, "no max_new_tokens: generate's max_length rules"
    rollout = generate_group(model, tok, ["ab"], 2, {"do_sample": True, "max_new_tokens": 4, **kwargs})
    assert rollout.completion_ids.shape == (2, 4)


@pytest.mark.parametrize("bad", [{"temperature": 0.0}, {"top_p": -0.5}, {"top_k": -1}])
def test_bad_sampling_values_get_generates_error_naming_them(bad):
    tok = char_tokenizer(MIXED)
    model = tiny_llama(tok)
    assert decoding_settings(model, {"do_sample": True, "max_new_tokens": 4, **bad}) is None
    with pytest.raises(ValueError, match=next(iter(bad))):
        generate_group(model, tok, ["ab"], 2, {"do_sample": True, "max_new_tokens": 4, **bad})


def test_a_generator_makes_sampling_reproducible_without_touching_the_default_generator():
    tok = char_tokenizer(MIXED)
    model = tiny_llama(tok)
    sampling = {"do_sample": True, "temperature": 1.0, "top_k": 0, "max_new_tokens": 12}
    torch.manual_seed(123)
    before = torch.get_rng_state()
    first = generate_group(model, tok, PROMPTS, 4, sampling, torch.Generator().manual_seed(7))
    assert torch.equal(torch.get_rng_state(), before)
    again = generate_group(model, tok, PROMPTS, 4, sampling, torch.Generator().manual_seed(7))
    other = generate_group(model, tok, PROMPTS, 4, sampling, torch.Generator().manual_seed(8))
    assert torch.equal(first.completion_ids, again.completion_ids)
    assert not torch.equal(first.completion_ids, other.completion_ids)
    assert len(set(first.texts)) > 1, "samples of one prompt differ"


@pytest.mark.parametrize("build", [tiny_llama, tiny_gpt2], ids=["llama", "gpt2"])
def test_the_head_in_vocabulary_slices_draws_what_the_models_own_head_draws(monkeypatch, build):
    tok = char_tokenizer(MIXED)
    model = position_sensitive(build, tok)
    ids, mask = left_padded(tok, PROMPTS)
    settings = DecodingSettings(max_new_tokens=8, do_sample=True, temperature=0.7, top_k=5)
    monkeypatch.setattr("comlrl.models.forward.HEAD_VOCABULARY_CHUNK", 7)  # uneven slices

    def run():
        with torch.inference_mode():
            generator = torch.Generator().manual_seed(0)
            return decode(model, ids, mask, settings, [], tok.pad_token_id, generator, with_logprobs=True)

    assert decoding.chunked_head(model) is not None
    assert model.get_output_embeddings().weight.shape[0] % 7, "the test needs a last, shorter slice"
    sliced = run()
    monkeypatch.setattr("comlrl.rollout.decoding.chunked_head", lambda model: None)
    whole = run()
    assert torch.equal(sliced.ids, whole.ids)
    torch.testing.assert_close(sliced.logprobs, whole.logprobs, rtol=1e-6, atol=1e-6)


def test_bf16_weights_keep_the_models_own_head():
    model = tiny_llama(char_tokenizer(MIXED)).to(torch.bfloat16)
    assert decoding.chunked_head(model) is None


def prefill_rows(model):
    """The rows of each forward ``model`` runs (its input embedding's calls), recorded in a list."""
    rows = []
    model.get_input_embeddings().register_forward_hook(lambda module, args, out: rows.append(out.shape[0]))
    return rows


@pytest.mark.parametrize("build", [tiny_llama, tiny_gpt2, with_lora(tiny_gpt2)], ids=["llama", "gpt2", "gpt2+lora"])
def test_rows_that_share_a_prompt_compute_it_once_and_decode_as_if_alone(build):
    tok = char_tokenizer(MIXED)
    model = position_sensitive(build, tok)
    ids, mask = left_padded(tok, PROMPTS)
    repeats = torch.tensor([3, 1, 2])  # prompt-major rows, as G samples (or repeated evaluation rows) lay them out
    settings = DecodingSettings(max_new_tokens=6)
    with torch.inference_mode():
        alone = decode(model, ids, mask, settings, [], tok.pad_token_id, with_logprobs=True)
        rows = prefill_rows(model)
        got = decode(
            model, ids.repeat_interleave(repeats, 0), mask.repeat_interleave(repeats, 0), settings, [], 0, None, True
        )
    assert rows[0] == 3 and rows[1:] == [6] * 5, "the prefill runs the 3 distinct prompts, each step all 6 rows"
    assert torch.equal(got.ids, alone.ids.repeat_interleave(repeats, 0))
    torch.testing.assert_close(got.logprobs, alone.logprobs.repeat_interleave(repeats, 0), atol=1e-5, rtol=1e-5)


def test_a_cache_that_cannot_be_gathered_prefills_every_row():
    tok = char_tokenizer(MIXED)
    torch.manual_seed(0)
    sizes = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    )
    config = MistralConfig(vocab_size=len(tok), sliding_window=4, pad_token_id=tok.pad_token_id, **sizes)
    model = MistralForCausalLM(config).eval()
    ids, mask = left_padded(tok, PROMPTS[1:2] * 2)  # longer than the window: the cache drops positions
    with torch.inference_mode():
        expected = decode(model, ids[:1], mask[:1], DecodingSettings(max_new_tokens=3), [], 0).ids
        rows = prefill_rows(model)
        got = decode(model, ids, mask, DecodingSettings(max_new_tokens=3), [], 0).ids
    assert rows == [1, 2, 2, 2], "the distinct prompt ran, its cache could not be gathered: every row ran, then 2 steps"
    assert torch.equal(got, expected.expand(2, -1))
