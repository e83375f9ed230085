"""precision="bf16": bf16 agents that sample and learn, fp32 master weights that the
optimizer steps, and the truncated importance-sampling correction of the sampler/learner gap."""

import math

import pytest
import torch

from comlrl.algorithms import SAMPLER_CORRECTIONS, policy_gradient_loss, token_weights
from comlrl.algorithms.sampler_correction import SamplerCorrection, sampler_importance_weights, sampler_logprob_gap
from comlrl.engine.master_weights import MasterWeights
from comlrl.models.forward import completion_logprobs
from comlrl.models.precision import cast_parameters
from comlrl.rollout.decoding import DecodingSettings, decode

from .helpers import (
    char_tokenizer,
    content_score,
    interrupting_reward,
    log_lines,
    lora,
    make_trainer,
    small_config,
    tiny_gpt2,
    tiny_llama,
)


# ---------------------------------------------------------------- the formulas, by hand
def test_token_truncate_weights_by_hand():
    learner = torch.tensor([[-1.0, -2.0, -0.5]])
    sampler = torch.tensor([[-1.5, -1.0, -0.5]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    weights, capped = sampler_importance_weights(learner, sampler, mask, SamplerCorrection(cap=1.5))
    torch.testing.assert_close(weights, torch.tensor([[1.5, math.exp(-1.0), 1.0]]))  # exp(0.5) = 1.65 is capped
    assert capped.tolist() == [[True, False, False]] and not weights.requires_grad


def test_weights_are_exactly_one_when_sampler_and_learner_agree():
    logps = torch.randn(3, 5, requires_grad=True)
    mask = torch.ones(3, 5, dtype=torch.bool)
    for mode in SAMPLER_CORRECTIONS:
        correction = SamplerCorrection(mode, cap=2.0, floor=0.5)
        weights, corrected = sampler_importance_weights(logps, logps.detach().clone(), mask, correction)
        assert torch.equal(weights, torch.ones(3, 5)) and not corrected.any(), mode


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
    dapo = token_weights(mask.sum(dim=1), "dapo", 2)  # 1 / 2 tokens
    out = policy_gradient_loss(logps, advantages, mask, dapo, pg_weights=weights)
    out.loss.backward()
    # dapo: mean over the 2 tokens of -w_t * A * logp_t -> d/dlogp_t = -w_t * A / 2
    torch.testing.assert_close(logps.grad, torch.tensor([[-0.5, -1.5]]))
    plain = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    policy_gradient_loss(plain, advantages, mask, dapo, pg_weights=torch.ones(1, 2)).loss.backward()
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


# ---------------------------------------------------------------- bf16 parameters, fp32 masters
def test_cast_keeps_the_parameters_and_the_buffers_dtype():
    model = tiny_llama(char_tokenizer())
    before = list(model.parameters())
    cast_parameters(model, torch.bfloat16)
    assert all(p is q for p, q in zip(before, model.parameters()))  # optimizers and hooks still see them
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert all(b.dtype == torch.float32 for b in model.buffers() if b.is_floating_point())  # rotary frequencies


def test_gradients_accumulate_in_the_fp32_master_and_the_bf16_gradient_is_freed():
    weight = torch.nn.Parameter(torch.tensor([1.0, 2.0], dtype=torch.bfloat16))
    masters = MasterWeights([weight])
    (master,) = masters.masters
    assert master.dtype == torch.float32 and master is not weight
    # Two micro-batches: 1e-3 * 257 each. In bf16, 0.257 + 0.257 is 0.5137 (8 bits of mantissa
    # round it); in fp32 the sum keeps more digits than either half had.
    for _ in range(2):
        (weight * torch.tensor([0.2571, 3.0], dtype=torch.bfloat16)).sum().backward()
        assert weight.grad is None
    expected = 2 * torch.tensor([0.2571, 3.0], dtype=torch.bfloat16).float()
    assert torch.equal(master.grad, expected)


def test_updates_below_bf16_spacing_add_up_in_the_master():
    """1 + 1e-3 rounds back to 1 in bf16 (spacing 2**-7 at 1): without a master, a hundred
    such steps change nothing; with one, they move the weight by 0.1 (rounded to bf16)."""
    plain = torch.nn.Parameter(torch.ones(1, dtype=torch.bfloat16))
    held = torch.nn.Parameter(torch.ones(1, dtype=torch.bfloat16))
    masters = MasterWeights([held])
    for _ in range(100):
        with torch.no_grad():
            plain.sub_(-1e-3)
            masters.masters[0].sub_(-1e-3)
        masters.write_back()
    assert plain.item() == 1.0
    assert held.item() == pytest.approx(1.1, abs=2**-6) and held.dtype == torch.bfloat16


def test_fp32_parameters_are_their_own_masters():
    weight = torch.nn.Parameter(torch.ones(2))
    masters = MasterWeights([weight])
    assert masters.masters == [weight] and masters.pairs == []


def test_a_second_learner_of_the_same_parameter_takes_its_gradient_alone():
    weight = torch.nn.Parameter(torch.ones(2, dtype=torch.bfloat16))
    first = MasterWeights([weight])
    second = MasterWeights([weight])
    weight.sum().backward()
    assert first.masters[0].grad is None and torch.equal(second.masters[0].grad, torch.ones(2))
    MasterWeights([weight], enabled=False)  # a later fp32 learner: the bf16 parameter keeps its own gradient
    weight.sum().backward()
    assert torch.equal(weight.grad, torch.ones(2, dtype=torch.bfloat16)) and second.masters[0].grad.sum() == 2


def test_masters_round_trip_and_a_mismatch_is_named():
    weight = torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))
    masters = MasterWeights([weight])
    masters.load_state([torch.tensor([1.0001, 2.0, 3.0])], "checkpoint x")
    assert masters.masters[0][0].item() == pytest.approx(1.0001) and weight[0].item() == 1.0  # rounded
    assert torch.equal(masters.state()[0], torch.tensor([1.0001, 2.0, 3.0]))
    with pytest.raises(ValueError, match="checkpoint x holds 0 fp32 master weights for a learner with 1"):
        masters.load_state([], "checkpoint x")


# ---------------------------------------------------------------- training in bf16
def test_bf16_training_samples_from_the_learner_itself_and_steps_fp32_masters(tmp_path):
    trainer = make_trainer(tmp_path, reward_func=content_score, args=small_config(tmp_path, precision="bf16"))
    assert all(p.dtype == torch.bfloat16 for p in trainer.agents[0].parameters())
    rollout = trainer.rollout(trainer.train_prompts, [0]).turns[0].agents[0]
    assert rollout.sampler_logprobs is not None and rollout.sampler_logprobs.dtype == torch.float32
    masters = trainer.learners.parameters[0]
    assert all(m.dtype == torch.float32 for m in masters)
    before = [m.detach().clone() for m in masters]
    metrics = trainer.training_step([0, 1])
    assert math.isfinite(metrics["agent0/loss"]) and metrics["agent0/grad_norm"] > 0
    assert 0 <= metrics["agent0/sampler_logprob_gap"] < 0.5  # one-token steps and whole sequences round apart
    assert 0 <= metrics["agent0/sampler_ratio_capped"] <= 1
    assert any(not torch.equal(a, b) for a, b in zip(before, masters))
    for parameter, master in zip(trainer.agents.parameters[0], masters):  # sampling uses the new weights
        assert torch.equal(parameter.detach(), master.detach().to(torch.bfloat16))


def test_agents_sharing_a_base_train_their_adapters_through_masters(tmp_path):
    base = tiny_llama(char_tokenizer())
    args = small_config(tmp_path, precision="bf16")
    trainer = make_trainer(tmp_path, agents=[base, base], args=args, peft_config=lora())
    assert all(p.dtype == torch.bfloat16 for p in base.parameters())
    for agent in range(2):
        pairs = trainer.learners.masters[agent].pairs
        assert len(pairs) == len(trainer.agents.parameters[agent]) > 0  # the adapter's, not the base's
    trainer.training_step([0, 1])
    adapter = trainer.agents.parameters[1]
    assert all(torch.equal(p.detach(), m.detach().bfloat16()) for p, m in trainer.learners.masters[1].pairs)
    assert len(adapter) < sum(1 for _ in base.parameters())


def test_a_bf16_run_resumes_exactly_with_its_masters(tmp_path):
    """The bf16 weights alone round the masters: a resume that rebuilt the masters from them
    would continue from other numbers (and its later metrics would differ)."""

    def config(folder):
        return small_config(folder, precision="bf16", num_train_epochs=2, per_device_train_batch_size=2)

    straight = make_trainer(tmp_path / "a", reward_func=content_score, args=config(tmp_path / "a"))
    straight.train()
    interrupting = interrupting_reward(2, content_score)
    first = make_trainer(tmp_path / "b", reward_func=interrupting, args=config(tmp_path / "b"))
    assert first.train().interrupted
    second = make_trainer(tmp_path / "b", reward_func=content_score, args=config(tmp_path / "b"))
    second.train(resume_from_checkpoint=True)
    masters, bf16 = second.learners.parameters[0], second.agents[0].parameters()
    assert any(not torch.equal(m, p.float()) for m, p in zip(masters, bf16))
    for a, b in zip(straight.learners.parameters[0], second.learners.parameters[0]):
        assert torch.equal(a, b)
    assert log_lines(tmp_path / "b" / "run", "metrics.jsonl") == log_lines(tmp_path / "a" / "run", "metrics.jsonl")


def test_without_a_cap_the_gap_is_still_logged(tmp_path):
    args = small_config(tmp_path, precision="bf16", sampler_ratio_cap=None)
    metrics = make_trainer(tmp_path, args=args).training_step([0, 1])
    assert "agent0/sampler_logprob_gap" in metrics and "agent0/sampler_ratio_capped" not in metrics


def test_fp32_training_keeps_no_masters_and_logs_no_gap(tmp_path):
    trainer = make_trainer(tmp_path)
    assert trainer.learners.parameters[0] == trainer.agents.parameters[0]
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
