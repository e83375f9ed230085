"""The batched, left-padded log-prob forward against a slow per-sequence reference."""

import pytest
import torch
from transformers import LlamaForCausalLM

from comlrl.models.forward import completion_logprobs, min_saved_prompt_tokens, split_head
from comlrl.models.modes import disable_dropout
from comlrl.rollout import decoding, generate_group
from comlrl.rollout.generation import rollout_from_ids

from .helpers import LOWER, MIXED, char_tokenizer, tiny_gpt2, tiny_llama, with_lora


def reference_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature):
    """One unpadded forward per sequence, a loop over tokens: obviously right, slow."""
    out = torch.zeros(completion_ids.shape)
    for s in range(len(prompt_ids)):
        prompt = prompt_ids[s][prompt_mask[s].bool()]
        n = int(completion_mask[s].sum())
        ids = torch.cat([prompt, completion_ids[s, :n]]).unsqueeze(0)
        logits = model(input_ids=ids).logits[0] / temperature
        for t in range(n):
            out[s, t] = torch.log_softmax(logits[len(prompt) + t - 1], dim=-1)[completion_ids[s, t]]
    return out


@pytest.mark.parametrize(
    "build",
    [tiny_llama, tiny_gpt2, with_lora(tiny_llama), with_lora(tiny_gpt2)],
    ids=["llama", "gpt2", "llama+lora", "gpt2+lora"],
)
def test_batched_logprobs_match_per_sequence_reference(build):
    tok = char_tokenizer(MIXED)
    model = build(tok).eval()
    rollout = generate_group(model, tok, ["Hi", "a much longer prompt:"], 3, {"do_sample": True, "max_new_tokens": 10})
    assert (rollout.prompt_mask == 0).any(), "the test needs left padding"
    with torch.no_grad():
        fast = completion_logprobs(
            model, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids, rollout.completion_mask, 0.7
        )
        slow = reference_logprobs(
            model, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids, rollout.completion_mask, 0.7
        )
    mask = rollout.completion_mask
    torch.testing.assert_close(fast[mask], slow[mask], atol=1e-5, rtol=1e-5)


def test_rollout_texts_are_the_owned_tokens_and_rows_are_prompt_major():
    tok = char_tokenizer()
    model = tiny_llama(tok)
    rollout = generate_group(model, tok, ["ab", "c"], 4, {"do_sample": True, "max_new_tokens": 6})
    assert rollout.completion_ids.shape[0] == 8
    assert rollout.prompt_ids[:4].eq(rollout.prompt_ids[0]).all()  # rows 0-3 share prompt 0
    for ids, n, text in zip(rollout.completion_ids, rollout.lengths, rollout.texts):
        assert text == tok.decode(ids[:n], skip_special_tokens=True)
    assert rollout.truncated.tolist() == [not (ids == tok.eos_token_id).any() for ids in rollout.completion_ids]


def test_eos_token_id_from_generation_kwargs_defines_the_stop():
    # every token counts as EOS: each completion is exactly one token long, and it is owned
    tok = char_tokenizer()
    rollout = generate_group(
        tiny_llama(tok), tok, ["ab"], 3, {"do_sample": True, "max_new_tokens": 6, "eos_token_id": list(range(len(tok)))}
    )
    assert rollout.lengths.tolist() == [1, 1, 1] and not rollout.truncated.any()


def test_stop_strings_end_completions_at_the_token_that_completes_them():
    # generate pads a row after the token that completes a stop string; the pad is no token the
    # model drew, even where it is the EOS id (pad == eos, as in SmolLM2)
    tok = char_tokenizer()
    eos = tok.eos_token_id
    for pad in (tok.pad_token_id, eos):
        rows = [tok(text, add_special_tokens=False)["input_ids"] for text in ("ab. ", "abcdefg", "ab", "a. b. ", "x q")]
        rows[2].append(eos)
        rows = [row + [pad] * (7 - len(row)) for row in rows]
        completion_ids = torch.tensor(rows)
        prompt_ids = torch.full((len(rows), 2), tok.convert_tokens_to_ids("z"))
        rollout = rollout_from_ids(tok, prompt_ids, torch.ones_like(prompt_ids), completion_ids, [eos], [". ", "q"])
        assert rollout.lengths.tolist() == [4, 7, 3, 3, 3], pad
        assert rollout.texts == ["ab. ", "abcdefg", "ab", "a. ", "x q"]
        assert rollout.truncated.tolist() == [False, True, False, False, False]


@pytest.mark.parametrize("extra", [{}, {"repetition_penalty": 1.1}], ids=["lean loop", "generate"])
def test_stop_strings_in_generation_kwargs_stop_sampling_with_the_agents_tokenizer(extra):
    # every character is a stop string: each completion is one token (a character, or an EOS),
    # owned, not truncated; the caller passes no tokenizer, which generate needs for stop strings
    tok = char_tokenizer()
    sampling = {"do_sample": True, "max_new_tokens": 6, "stop_strings": list(LOWER), **extra}
    rollout = generate_group(tiny_llama(tok), tok, ["ab"] * 4, 3, sampling, with_logprobs=True)
    assert (rollout.sampler_logprobs is None) == bool(extra)  # generate keeps no log-probs
    assert rollout.lengths.tolist() == [1] * 12 and not rollout.truncated.any()
    assert all(text in LOWER for text in rollout.texts) and any(rollout.texts)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_the_lean_loop_stops_each_row_where_its_text_first_holds_a_stop_string(compiled):
    # the same draws with and without stop strings (finished rows draw too, then pad): each
    # stopped row is the free row cut after the token that completes its first stop string
    tok = char_tokenizer()
    model = tiny_llama(tok).eval()
    sampling = {"do_sample": True, "max_new_tokens": 12, "top_k": 0}
    free, stopped = (
        generate_group(model, tok, ["ab", "cde"], 4, {**sampling, **extra}, torch.Generator().manual_seed(3),
                       with_logprobs=True, compiled=compiled)
        for extra in ({}, {"stop_strings": ["e", "ab"]})
    )  # fmt: skip
    assert stopped.sampler_logprobs is not None  # the lean loop, not generate
    cuts = 0
    for text, ids, n, cut, cut_n, truncated in zip(
        free.texts, free.completion_ids, free.lengths, stopped.texts, stopped.lengths, stopped.truncated
    ):
        ends = [i + len(stop) for stop in ("e", "ab") if (i := text.find(stop)) >= 0]
        if ends:
            cuts += 1
            assert cut == text[: min(ends)] and not truncated
            assert tok.decode(ids[:cut_n]) == cut
        else:
            assert (cut, cut_n) == (text, n)
    assert 0 < cuts  # the seed gives rows that stop


def test_columns_of_padding_are_dropped_without_changing_the_logprobs():
    tok = char_tokenizer()
    model = tiny_llama(tok).eval()
    rollout = generate_group(model, tok, ["ab", "cde"], 2, {"do_sample": True, "max_new_tokens": 5})
    args = (rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids, rollout.completion_mask)
    # Two extra columns of padding on the left of the prompts and three after the completions.
    padded = (
        torch.nn.functional.pad(rollout.prompt_ids, (2, 0), value=tok.pad_token_id),
        torch.nn.functional.pad(rollout.prompt_mask, (2, 0)),
        torch.nn.functional.pad(rollout.completion_ids, (0, 3), value=tok.pad_token_id),
        torch.nn.functional.pad(rollout.completion_mask, (0, 3)),
    )
    with torch.no_grad():
        plain = completion_logprobs(model, *args, temperature=0.7)
        trimmed = completion_logprobs(model, *padded, temperature=0.7)
    assert trimmed.shape == (4, rollout.completion_ids.shape[1] + 3)
    torch.testing.assert_close(trimmed[:, : plain.shape[1]], plain, atol=1e-5, rtol=1e-5)
    assert (trimmed[:, plain.shape[1] :] == 0).all()


def forward_batch_sizes(model) -> list[int]:
    """The number of rows of each forward ``model``'s decoder runs from now on (the log-probs
    run the decoder alone, and its LM head chunk by chunk: see ``split_head``)."""
    sizes = []
    assert split_head(model) is not None  # its one-time check runs now, not among the counted forwards

    def count(_, args, kwargs):
        sizes.append(len(kwargs["input_ids"] if "input_ids" in kwargs else args[0]))

    model.get_decoder().register_forward_pre_hook(count, with_kwargs=True)
    return sizes


def logprobs_and_gradients(model, rollout, share_prompts):
    """Log-probs, entropies and the gradients of a loss that weighs every one of them."""
    model.zero_grad()
    args = (rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids, rollout.completion_mask)
    logps, entropy = completion_logprobs(model, *args, temperature=0.7, with_entropy=True, share_prompts=share_prompts)
    weights = torch.linspace(-1.0, 2.0, logps.numel()).view_as(logps)
    ((logps * weights).sum() + (entropy * weights.flip(0)).sum()).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return logps, entropy, grads


@pytest.mark.parametrize("build", [tiny_llama, tiny_gpt2, with_lora(tiny_gpt2)], ids=["llama", "gpt2", "gpt2+lora"])
def test_shared_prompts_run_once_with_the_plain_paths_logprobs_and_gradients(build):
    tok = char_tokenizer(MIXED)
    model = build(tok)
    disable_dropout(model)  # as the trainers do: in train mode both paths then compute one function
    torch.manual_seed(0)
    with torch.no_grad():
        rollout = generate_group(
            model,
            tok,
            # "H": a prompt whose cached part (all but its last token) is only padding
            ["H", "Hi", "a much longer prompt:"],
            2,
            # a fifth of the vocabulary ends a completion: rows of different lengths
            {"do_sample": True, "max_new_tokens": 12, "min_new_tokens": 2, "eos_token_id": list(range(15))},
        )
    assert (rollout.prompt_mask == 0).any() and not rollout.completion_mask.all(), "the test needs both paddings"
    sizes = forward_batch_sizes(model)
    shared = logprobs_and_gradients(model, rollout, share_prompts=True)  # even if it saves little
    assert sizes == [3, 6], "three distinct prompts, then six completions"
    plain = logprobs_and_gradients(model, rollout, share_prompts=False)
    assert sizes == [3, 6, 6]
    mask = rollout.completion_mask
    torch.testing.assert_close(shared[0][mask], plain[0][mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shared[1][mask], plain[1][mask], atol=1e-5, rtol=1e-5)
    assert shared[2].keys() == plain[2].keys() and len(plain[2]) > 0
    for name, grad in plain[2].items():
        torch.testing.assert_close(shared[2][name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_prompts_run_with_their_completions_when_sharing_saves_little_or_checkpointing_is_on():
    tok = char_tokenizer(MIXED)
    model = tiny_llama(tok)
    long_prompt = "a prompt of forty-nine characters, so 48 cached: "
    distinct = generate_group(model, tok, ["Hi", long_prompt], 1, {"do_sample": True, "max_new_tokens": 4})
    few = generate_group(model, tok, [long_prompt], 2, {"do_sample": True, "max_new_tokens": 4})  # saves 48
    enough = generate_group(model, tok, [long_prompt], 3, {"do_sample": True, "max_new_tokens": 4})  # saves 96
    assert 48 < min_saved_prompt_tokens(torch.device("cpu")) <= 96
    assert min_saved_prompt_tokens(torch.device("cuda", 0)) == min_saved_prompt_tokens(torch.device("xpu")) == 256
    sizes = forward_batch_sizes(model)
    for rollout in (distinct, few, enough):
        completion_logprobs(
            model, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids, rollout.completion_mask
        )
    assert sizes == [2, 2, 1, 3]
    # no completion token in any row: nothing to run on top of a cache, even when forced
    empty = torch.zeros_like(enough.completion_mask)
    logps = completion_logprobs(
        model, enough.prompt_ids, enough.prompt_mask, enough.completion_ids, empty, share_prompts=True
    )
    assert sizes == [2, 2, 1, 3, 3] and logps.eq(0).all()
    model.gradient_checkpointing_enable()
    model.train()
    completion_logprobs(model, enough.prompt_ids, enough.prompt_mask, enough.completion_ids, enough.completion_mask)
    assert sizes == [2, 2, 1, 3, 3, 3]


class SoftCappedLlama(LlamaForCausalLM):
    """Logits that are not ``hidden @ lm_head.weight.T`` (Gemma 2 soft-caps them so)."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        out.logits = 0.5 * torch.tanh(out.logits / 0.5)
        return out


def test_a_model_whose_logits_are_not_its_heads_product_keeps_the_logits_path():
    tok = char_tokenizer(MIXED)
    plain = tiny_llama(tok)
    capped = SoftCappedLlama(plain.config)
    capped.load_state_dict(plain.state_dict())
    assert split_head(plain) is not None and split_head(capped) is None
    with torch.no_grad():
        rollout = generate_group(capped, tok, ["Hi", "a cat"], 2, {"do_sample": True, "max_new_tokens": 5})
        args = (rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids, rollout.completion_mask)
        got = completion_logprobs(capped, *args, share_prompts=False)
        logits = capped(
            input_ids=torch.cat(args[::2], dim=1),
            attention_mask=torch.cat([args[1], args[3].long()], dim=1),
            position_ids=(torch.cat([args[1], args[3].long()], dim=1).cumsum(1) - 1).clamp(min=0),
        ).logits[:, args[0].shape[1] - 1 : -1]
    expected = torch.log_softmax(logits, dim=-1).gather(-1, args[2].unsqueeze(-1)).squeeze(-1)
    mask = rollout.completion_mask
    torch.testing.assert_close(got[mask], expected[mask], atol=1e-5, rtol=1e-5)


def test_a_prompt_learning_adapter_keeps_the_models_own_forward():
    # Its virtual tokens are prepended in the PEFT wrapper's forward: the decoder alone would
    # skip them. A LoRA-wrapped model of the same class was checked first, on purpose.
    from peft import PromptTuningConfig, get_peft_model

    tok = char_tokenizer(MIXED)
    assert split_head(with_lora(tiny_llama)(tok)) is not None
    prompted = get_peft_model(tiny_llama(tok), PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=3))
    assert split_head(prompted) is None
    assert decoding.chunked_head(prompted) is None
