"""The compiled decoding loop against the eager one: the same tokens for the same generator
(greedy and sampled, left padding, rows finishing early, min_new_tokens), log-probs equal up to
float rounding, one compile per bucket, one static cache kept per (model, bucket) (the least
recently used dropped past ``HELD_CACHES``), and the eager loop for models it cannot serve.

Every call here lands in one bucket per model (3 or 4 rows -> 4, prompt + new tokens <= 64),
so the file compiles the step three times (Llama, GPT-2, Llama under LoRA): both classes are built before the first
compile (see :func:`both_model_classes_built`)."""

import gc
import logging
import weakref
from unittest import mock

import pytest
import torch
from peft import PrefixTuningConfig, get_peft_model

from comlrl.rollout import compiled_decoding, generate_group, generation
from comlrl.rollout.compiled_decoding import (
    Bucket,
    bucket_size,
    compile_seconds,
    decode_compiled,
    supports_compiled,
    why_not_compiled,
)
from comlrl.rollout.decoding import DecodingSettings, decode

from .helpers import (
    MIXED,
    char_tokenizer,
    left_padded,
    make_trainer,
    position_sensitive,
    small_config,
    tiny_gpt2,
    tiny_llama,
    with_lora,
)

PROMPTS = ["Hi", "a much longer prompt:", "xyz"]

LOGPROB_TOLERANCE = 1e-4
"""fp32 log-probs of the two loops: inductor fuses and orders the float sums differently."""

SETTINGS = {
    "greedy": DecodingSettings(max_new_tokens=12),
    "greedy, min_new_tokens": DecodingSettings(max_new_tokens=12, min_new_tokens=5),
    "top-k, top-p, temperature": DecodingSettings(
        max_new_tokens=12, do_sample=True, temperature=0.7, top_k=10, top_p=0.9
    ),
    "full vocabulary, min_new_tokens": DecodingSettings(max_new_tokens=12, do_sample=True, top_k=0, min_new_tokens=3),
}


@pytest.fixture(autouse=True, scope="module")
def both_model_classes_built():
    """Building a model of a class transformers has not seen grows a registry that compiled
    forwards read, so it makes the graphs compiled before recompile once (as a trainer that
    builds its models first would not): build both classes of the file first."""
    tiny_llama(char_tokenizer(MIXED)), tiny_gpt2(char_tokenizer(MIXED))


def both_loops(model, ids, mask, settings, eos, pad_id, seed=0):
    """(eager, compiled) :class:`Decoded` of the same call, each with a generator seeded alike."""
    with torch.inference_mode():
        return tuple(
            loop(model, ids, mask, settings, eos, pad_id, torch.Generator().manual_seed(seed), with_logprobs=True)
            for loop in (decode, decode_compiled)
        )


def early_eos(model, ids, mask, settings, seed=0):
    """An "EOS" that row 0 draws at its third token without one: rows finish at different steps."""
    with torch.inference_mode():
        free = decode(model, ids, mask, settings, [], 0, torch.Generator().manual_seed(seed)).ids
    return [int(free[0, 2])]


def sharp(build):
    """``build``'s tiny model made position-sensitive: a wrong position changes its tokens."""
    return lambda tok: position_sensitive(build, tok)


MODELS = {"llama": sharp(tiny_llama), "gpt2": sharp(tiny_gpt2), "llama+lora": with_lora(sharp(tiny_llama))}
CASES = [(model, name) for name in SETTINGS for model in ("llama", "gpt2")] + [
    ("llama+lora", "top-k, top-p, temperature")
]


@pytest.mark.parametrize("model_name, name", CASES, ids=[f"{name}-{model}" for model, name in CASES])
def test_compiled_loop_draws_the_eager_loops_tokens(model_name, name):
    tok = char_tokenizer(MIXED)
    model = MODELS[model_name](tok)
    assert supports_compiled(model)
    ids, mask = left_padded(tok, PROMPTS)
    settings = SETTINGS[name]
    eos = early_eos(model, ids, mask, settings)
    eager, compiled = both_loops(model, ids, mask, settings, eos, tok.pad_token_id)
    assert (mask == 0).any(), "the test needs left padding"
    assert settings.min_new_tokens or (eager.ids == tok.pad_token_id).any(), "the test needs a row finished early"
    assert torch.equal(compiled.ids, eager.ids)
    torch.testing.assert_close(compiled.logprobs, eager.logprobs, atol=LOGPROB_TOLERANCE, rtol=0)


def test_a_second_call_of_a_bucket_does_not_compile_again():
    tok = char_tokenizer(MIXED)
    model = position_sensitive(tiny_llama, tok)
    settings = SETTINGS["top-k, top-p, temperature"]
    ids, mask = left_padded(tok, PROMPTS)
    both_loops(model, ids, mask, settings, [], tok.pad_token_id)  # compiles, unless an earlier test did
    bucket = Bucket("LlamaForCausalLM()", "torch.float32", "cpu", rows=4, length=64)
    compiles = compile_seconds()[bucket]
    assert len(compiles) >= 1
    # Other prompts, rows, length, tokens and a newly built model of the same config: one bucket.
    other = position_sensitive(tiny_llama, tok)
    ids, mask = left_padded(tok, ["four", "prompts of", "other", "lengths, in all"])
    settings = DecodingSettings(max_new_tokens=30, do_sample=True, top_k=5)
    with torch.compiler.set_stance("fail_on_recompile"):
        eager, compiled = both_loops(other, ids, mask, settings, [], tok.pad_token_id, seed=3)
    assert torch.equal(compiled.ids, eager.ids)
    assert compile_seconds()[bucket] == compiles


def eager_step(monkeypatch):
    """The compiled loop with its step run eagerly (no compile): for tests of its caches."""
    monkeypatch.setattr(compiled_decoding, "compiled_step", lambda device_type: compiled_decoding._forward_step)


def test_alternating_two_buckets_reuses_each_buckets_cache(monkeypatch):
    eager_step(monkeypatch)
    tok = char_tokenizer(MIXED)
    model = tiny_llama(tok)
    taken, take = [], compiled_decoding._take_cache
    monkeypatch.setattr(compiled_decoding, "_take_cache", lambda *args: taken.append(take(*args)) or taken[-1])
    # Two rounds of two buckets (3 rows -> 4, 1 row -> 1), other prompts in the second round.
    rounds = [[PROMPTS, PROMPTS[:1]], [["four", "other", "prompts, in all"], ["xyz"]]]
    settings = DecodingSettings(max_new_tokens=6)
    with torch.inference_mode():
        for prompts in (prompts for groups in rounds for prompts in groups):
            ids, mask = left_padded(tok, prompts)
            compiled = decode_compiled(model, ids, mask, settings, [], tok.pad_token_id)
            # A cache taken again was emptied: the same tokens as the eager loop.
            assert torch.equal(compiled.ids, decode(model, ids, mask, settings, [], tok.pad_token_id).ids)
    assert len(taken) == 4 and taken[0] is not taken[1]
    assert taken[2] is taken[0] and taken[3] is taken[1]  # the second alternation allocated nothing


def used(model, shape):
    """The cache a call of ``shape`` decodes with, given back after it."""
    cache = compiled_decoding._take_cache(model, shape)
    compiled_decoding._give_back(model, shape, cache)
    return cache


def test_held_caches_per_model_are_bounded_dropping_the_least_recently_used():
    model = tiny_llama(char_tokenizer(MIXED))
    shapes = [(rows, 64, torch.float32, torch.device("cpu")) for rows in (1, 2, 4, 8, 16, 32)]
    shapes = shapes[: compiled_decoding.HELD_CACHES + 1]
    first = {shape: used(model, shape) for shape in shapes[:-1]}  # as many as are kept
    assert used(model, shapes[0]) is first[shapes[0]]  # the oldest, used again: now the most recent
    used(model, shapes[-1])  # one bucket too many: shapes[1], now the least recently used, is dropped
    held = compiled_decoding._HELD[model]
    assert list(held) == [*shapes[2:-1], shapes[0], shapes[-1]]
    assert all(held[shape] is first[shape] for shape in [*shapes[2:-1], shapes[0]])
    assert used(model, shapes[1]) is not first[shapes[1]]
    # The caches do not keep their model alive.
    model_ref = weakref.ref(model)
    del model, held
    gc.collect()
    assert model_ref() is None


def test_two_takes_at_once_on_one_model_get_their_own_caches():
    model, other = (tiny_llama(char_tokenizer(MIXED)) for _ in range(2))
    shape = (4, 64, torch.float32, torch.device("cpu"))
    held = used(model, shape)
    # A second thread decoding the same model and bucket while the first one is: a cache of its own.
    first, second = (compiled_decoding._take_cache(model, shape) for _ in range(2))
    assert first is held and second is not held
    assert compiled_decoding._take_cache(other, shape) is not held  # another model: not this one's
    compiled_decoding._give_back(model, shape, first)
    compiled_decoding._give_back(model, shape, second)
    assert compiled_decoding._HELD[model][shape] is second  # one held per bucket: the last given back


def test_generate_group_uses_the_compiled_loop_when_asked_and_draws_the_same():
    tok = char_tokenizer(MIXED)
    model = tiny_llama(tok)
    sampling = {"do_sample": True, "temperature": 0.9, "top_k": 20, "max_new_tokens": 10}
    with mock.patch("comlrl.rollout.generation.decode_compiled", side_effect=decode_compiled) as spy:
        rollouts = [
            generate_group(model, tok, PROMPTS[:2], 2, sampling, torch.Generator().manual_seed(5), True, compiled)
            for compiled in (False, True)
        ]
    assert spy.call_count == 1
    assert torch.equal(rollouts[0].completion_ids, rollouts[1].completion_ids)
    assert rollouts[0].texts == rollouts[1].texts
    torch.testing.assert_close(
        rollouts[1].sampler_logprobs, rollouts[0].sampler_logprobs, atol=LOGPROB_TOLERANCE, rtol=0
    )


class NoConfig(torch.nn.Module):
    """A causal LM that is not a transformers model."""


def prefix_tuned(tok):
    """A tiny GPT-2 under a prompt-learning adapter (prefix keys and values)."""
    return get_peft_model(tiny_gpt2(tok), PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=3))


@pytest.mark.parametrize(
    "build, reason",
    [(prefix_tuned, "prompt-learning adapter"), (lambda tok: NoConfig(), "does not declare")],
    ids=["prefix tuning", "no config"],
)
def test_models_it_cannot_serve_are_refused_with_the_reason(build, reason):
    model = build(char_tokenizer(MIXED))
    assert not supports_compiled(model)
    assert reason in why_not_compiled(model)


def test_generate_group_falls_back_to_the_eager_loop_and_says_so_once(caplog, monkeypatch):
    tok = char_tokenizer(MIXED)
    model = prefix_tuned(tok)
    monkeypatch.setattr(compiled_decoding, "_WARNED", set())
    sampling = {"do_sample": True, "max_new_tokens": 6}
    with mock.patch("comlrl.rollout.generation.decode_compiled", side_effect=AssertionError("not for this model")):
        with caplog.at_level(logging.WARNING, logger="comlrl.rollout.compiled_decoding"):
            rollouts = [
                generate_group(model, tok, PROMPTS, 2, sampling, torch.Generator().manual_seed(1), compiled=compiled)
                for compiled in (False, True, True)
            ]
    assert torch.equal(rollouts[0].completion_ids, rollouts[1].completion_ids)
    warnings = [record.getMessage() for record in caplog.records if "eager loop" in record.getMessage()]
    assert len(warnings) == 1 and "PeftModel" in warnings[0] and "prompt-learning adapter" in warnings[0]


@pytest.mark.parametrize(
    "size, smallest, bucket", [(1, 1, 1), (3, 1, 4), (16, 1, 16), (17, 1, 32), (5, 64, 64), (65, 64, 128)]
)
def test_bucket_sizes_are_powers_of_two_from_the_smallest(size, smallest, bucket):
    assert bucket_size(size, smallest) == bucket


@pytest.mark.parametrize("on", [False, True])
def test_the_config_field_reaches_every_sampling_call(tmp_path, monkeypatch, on):
    seen = []
    real = generation.generate_group

    def recording(*args, compiled=False, **kwargs):
        seen.append(compiled)
        return real(*args, compiled=False, **kwargs)  # the eager loop: this test is about the wiring

    monkeypatch.setattr("comlrl.rollout.backends.generate_group", recording)
    trainer = make_trainer(tmp_path, args=small_config(tmp_path, compiled_decoding=on))
    trainer.training_step([0, 1])
    assert seen and all(flag is on for flag in seen)


def test_rows_that_share_a_prompt_prefill_it_once_and_draw_the_eager_loops_tokens():
    tok = char_tokenizer(MIXED)
    model = position_sensitive(tiny_llama, tok)
    ids, mask = left_padded(tok, PROMPTS[:2])
    ids, mask = ids.repeat_interleave(2, 0), mask.repeat_interleave(2, 0)  # 2 prompts x 2 samples: one bucket of 4
    rows = []
    model.get_input_embeddings().register_forward_hook(lambda module, args, out: rows.append(out.shape[0]))
    eager, compiled = both_loops(model, ids, mask, SETTINGS["top-k, top-p, temperature"], [], tok.pad_token_id)
    assert rows.count(2) == 2, "each loop's prefill ran the 2 distinct prompts once"
    assert torch.equal(compiled.ids, eager.ids)
    torch.testing.assert_close(compiled.logprobs, eager.logprobs, atol=LOGPROB_TOLERANCE, rtol=0)
