"""precision="bf16": sampling from a bf16 copy of each agent, updating fp32 weights under
autocast, and the truncated importance-sampling correction of the sampler/learner gap."""

import math

import pytest
import torch

from comlrl.algorithms import policy_gradient_loss
from comlrl.algorithms.sampler_correction import sampler_logprob_gap, truncated_importance_weights
from comlrl.models.forward import completion_logprobs
from comlrl.models.rollout_copy import RolloutCopies, low_precision_copy
from comlrl.rollout.decoding import DecodingSettings, decode

from .helpers import (
    char_tokenizer,
    content_score,
    lora,
    make_trainer,
    small_config,
    tiny_gpt2,
    tiny_llama,
)


# ---------------------------------------------------------------- the formulas, by hand
def test_truncated_importance_weights_by_hand():
    learner = torch.tensor([[-1.0, -2.0, -0.5]])
    sampler = torch.tensor([[-1.5, -1.0, -0.5]])
    weights = truncated_importance_weights(learner, sampler, cap=1.5)
    torch.testing.assert_close(weights, torch.tensor([[1.5, math.exp(-1.0), 1.0]]))  # exp(0.5) = 1.65 is capped
    assert not weights.requires_grad


def test_weights_are_exactly_one_when_sampler_and_learner_agree():
    logps = torch.randn(3, 5, requires_grad=True)
    assert torch.equal(truncated_importance_weights(logps, logps.detach().clone(), cap=2.0), torch.ones(3, 5))


def test_logprob_gap_by_hand():
    learner = torch.tensor([[-1.0, -2.0, -7.0], [-0.5, -0.25, -3.0]])
    sampler = torch.tensor([[-1.5, -1.0, 0.0], [-0.5, -0.75, 0.0]])
    mask = torch.tensor([[True, True, False], [True, True, False]])
    total, count = sampler_logprob_gap(learner, sampler, mask)
    assert total.item() == pytest.approx(0.5 + 1.0 + 0.0 + 0.5) and count.item() == 4


def test_sampler_weights_scale_each_tokens_policy_gradient_term():
    logps = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    mask = torch.ones(1, 2, dtype=torch.bool)
    advantages = torch.tensor([2.0])
    weights = torch.tensor([[0.5, 1.5]])
    out = policy_gradient_loss(logps, advantages, mask, loss_type="dapo", sampler_weights=weights)
    out.loss.backward()
    # dapo: mean over the 2 tokens of -w_t * A * logp_t -> d/dlogp_t = -w_t * A / 2
    torch.testing.assert_close(logps.grad, torch.tensor([[-0.5, -1.5]]))
    plain = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    policy_gradient_loss(plain, advantages, mask, loss_type="dapo", sampler_weights=torch.ones(1, 2)).loss.backward()
    torch.testing.assert_close(plain.grad, torch.tensor([[-1.0, -1.0]]))


# ---------------------------------------------------------------- the sampler's log-probs
@pytest.mark.parametrize("build", [tiny_llama, tiny_gpt2])
def test_decoded_logprobs_are_the_learners_when_the_sampler_is_the_learner(build):
    tok = char_tokenizer()
    model = build(tok).eval()
    encoded = tok(["hello there", "a cat"], return_tensors="pt", padding=True, padding_side="left")
    settings = DecodingSettings(max_new_tokens=6, do_sample=True, temperature=0.7, top_k=5, top_p=0.9)
    with torch.inference_mode():
        decoded = decode(
            model,
            encoded["input_ids"],
            encoded["attention_mask"],
            settings,
            [tok.eos_token_id],
            tok.pad_token_id,
            torch.Generator().manual_seed(0),
            with_logprobs=True,
        )
    ids, sampled = decoded.ids.clone(), decoded.logprobs.clone()
    mask = torch.ones_like(ids, dtype=torch.bool)
    for r in range(ids.shape[0]):  # tokens after an EOS are not the row's
        hits = (ids[r] == tok.eos_token_id).nonzero()
        if len(hits):
            mask[r, hits[0, 0] + 1 :] = False
    with torch.no_grad():
        learner = completion_logprobs(model, encoded["input_ids"], encoded["attention_mask"], ids, mask, 0.7)
    torch.testing.assert_close(sampled * mask, learner * mask, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- the rollout copy
def test_copy_has_bf16_parameters_and_keeps_its_buffers_dtype():
    tok = char_tokenizer()
    model = tiny_llama(tok)
    clone = low_precision_copy(model, torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in clone.parameters())
    assert all(b.dtype == a.dtype for a, b in zip(model.buffers(), clone.buffers()))  # rotary frequencies stay fp32
    assert not clone.training and all(p.dtype == torch.float32 for p in model.parameters())


def test_copy_follows_every_change_of_the_learner():
    tok = char_tokenizer()
    models = [tiny_llama(tok, seed=i) for i in range(2)]
    copies = RolloutCopies(models, [list(m.parameters()) for m in models], [None, None])
    with torch.no_grad():
        next(models[1].parameters()).add_(1.0)
    clone = copies.model(1)
    for p, c in zip(models[1].parameters(), clone.parameters()):
        assert torch.equal(c, p.to(torch.bfloat16))


def test_agents_sharing_a_base_share_one_copy_and_refresh_only_their_adapter(tmp_path):
    base = tiny_llama(char_tokenizer())
    args = small_config(tmp_path, precision="bf16")
    trainer = make_trainer(tmp_path, agents=[base, base], args=args, peft_config=lora())
    copies = trainer.backend.copies
    assert copies.copies[0] is copies.copies[1]
    trained = {id(p) for p in trainer.agents.parameters[0]}
    assert len(copies.pairs[0]) == len(trainer.agents.parameters[0]) > 0
    assert all(id(p) in trained for p, _ in copies.pairs[0])
    assert len(copies.pairs[0]) < sum(1 for _ in trainer.agents[0].parameters())  # the base is not copied again


# ---------------------------------------------------------------- training in bf16
def test_bf16_training_samples_from_the_copy_and_keeps_fp32_weights(tmp_path):
    trainer = make_trainer(tmp_path, reward_func=content_score, args=small_config(tmp_path, precision="bf16"))
    rollout = trainer.rollout(trainer.train_prompts, [0]).turns[0].agents[0]
    assert rollout.sampler_logprobs is not None and rollout.sampler_logprobs.dtype == torch.float32
    metrics = trainer.training_step([0, 1])
    assert all(p.dtype == torch.float32 for p in trainer.agents[0].parameters())
    assert math.isfinite(metrics["agent0/loss"]) and metrics["agent0/grad_norm"] > 0
    assert 0 < metrics["agent0/sampler_logprob_gap"] < 0.5  # bf16 against fp32: small, not zero
    assert 0 <= metrics["agent0/sampler_ratio_capped"] <= 1
    clone = trainer.backend.copies.model(0)  # after the update, sampling uses the new weights
    for p, c in zip(trainer.agents[0].parameters(), clone.parameters()):
        assert torch.equal(c, p.detach().to(torch.bfloat16))


def test_without_a_cap_the_gap_is_still_logged(tmp_path):
    args = small_config(tmp_path, precision="bf16", sampler_ratio_cap=None)
    metrics = make_trainer(tmp_path, args=args).training_step([0, 1])
    assert "agent0/sampler_logprob_gap" in metrics and "agent0/sampler_ratio_capped" not in metrics


def test_fp32_training_keeps_no_copy_and_logs_no_gap(tmp_path):
    trainer = make_trainer(tmp_path)
    assert trainer.backend.copies is None
    assert "agent0/sampler_logprob_gap" not in trainer.training_step([0, 1])


def test_the_correction_changes_nothing_when_sampler_and_learner_agree(tmp_path):
    trainer = make_trainer(tmp_path, reward_func=content_score)
    rollout = trainer.rollout(trainer.train_prompts, [0, 1]).turns[0].agents[0]
    advantages = torch.linspace(-1, 1, len(rollout.texts))
    weights = torch.ones(len(rollout.texts)) / rollout.completion_mask.sum()
    grads = []
    for sampler in (None, trainer.objective.update.logprobs(trainer.agents[0], rollout, slice(None)).detach()):
        rollout.sampler_logprobs = sampler
        trainer.learners.zero_grad()
        metrics = trainer.objective.update.agent_backward(0, [rollout], [advantages], [weights], None, None)
        grads.append(torch.cat([p.grad.reshape(-1) for p in trainer.agents[0].parameters()]))
    assert metrics["agent0/sampler_logprob_gap"].value() == 0.0
    assert torch.equal(grads[0], grads[1])


@pytest.mark.parametrize(
    "values,match",
    [
        ({"precision": "fp16"}, r"precision='fp16'; expected one of \['bf16', 'fp32'\]"),
        ({"mixed_precision": "bf16"}, r"mixed_precision='bf16' was replaced by precision: write precision='bf16'"),
        ({"sampler_ratio_cap": 0.5}, r"sampler_ratio_cap must be a finite number in \[1, 1000\] or None"),
    ],
)
def test_bad_precision_settings_are_named(tmp_path, values, match):
    with pytest.raises(ValueError, match=match):
        small_config(tmp_path, **values)


@pytest.mark.parametrize("has_units,warns", [(False, True), (True, False), (None, False)])
def test_bf16_on_a_cpu_without_bf16_units_is_warned(tmp_path, monkeypatch, recwarn, has_units, warns):
    monkeypatch.setattr("comlrl.models.hardware.cpu_has_bf16_units", lambda: has_units)
    make_trainer(tmp_path, args=small_config(tmp_path, precision="bf16"))
    messages = [str(w.message) for w in recwarn if "bf16 matrix units" in str(w.message)]
    assert bool(messages) == warns
    if warns:
        assert "precision='fp32' is the fast choice" in messages[0]
