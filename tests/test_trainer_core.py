"""The trainer core's contracts: every forward of a step computes one function (dropout),
one frozen sampling specification, checkpoints whatever the config holds, metrics reduced
the way they were formed, evaluation's generators, the multi-turn weighting, the console line."""

import dataclasses
import json
import math

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from comlrl.metrics.rollout import format_metrics
from comlrl.models.modes import disable_dropout, frozen
from comlrl.rollout.sampling import SamplingSpec
from comlrl.utils import stats
from comlrl.utils.run_control import seeded_cuda_devices

from .helpers import (
    char_tokenizer,
    content_score,
    make_trainer,
    multi_turn_trainer,
    small_config,
    tiny_gpt2,
    tiny_llama,
)


# ------------------------------------------------------------------------------ dropout
def dropout_trainer(tmp_path, **overrides):
    tok = char_tokenizer()
    agents = [tiny_gpt2(tok, seed=i) for i in range(2)]  # GPT-2's dropout, 0.1
    assert all(m.p == 0.1 for a in agents for m in a.modules() if isinstance(m, torch.nn.Dropout))
    values = dict(num_iterations=2, agent_learning_rate=1e-12, epsilon=0.01, beta=0.1, num_generations=4)
    values.update(overrides)
    return make_trainer(
        tmp_path, agents=agents, tokenizer=tok, reward_func=content_score, args=small_config(tmp_path, **values)
    )


def test_with_dropout_models_the_first_pass_ratio_is_one_and_the_kl_zero(tmp_path):
    trainer = dropout_trainer(tmp_path)
    metrics = trainer.training_step([0, 1])
    for i in range(2):
        # a step of 1e-12 moves no float32 weight: both passes see the sampling policy itself
        assert metrics[f"agent{i}/clip_fraction"] == 0.0 and metrics[f"agent{i}/kl"] == 0.0
    rollout = trainer.rollout(trainer.train_prompts, [2]).turns[0].agents[0]
    with trainer.agents.frozen(0) as model:
        sampling_time = trainer.objective.update.logprobs(model, rollout, slice(None))
    in_the_loss = trainer.objective.update.logprobs(trainer.agents.trainable(0), rollout, slice(None))
    assert in_the_loss.requires_grad and torch.equal(in_the_loss.detach(), sampling_time)


def test_dropout_stays_in_the_loss_when_asked(tmp_path):
    trainer = dropout_trainer(tmp_path, disable_dropout=False)
    metrics = trainer.training_step([0, 1])
    assert metrics["agent0/clip_fraction"] > 0 and metrics["agent0/kl"] > 0  # dropout noise, not learning


def test_disable_dropout_zeroes_modules_and_attention_rates_but_not_the_config():
    tok = char_tokenizer()
    gpt2 = tiny_gpt2(tok)
    assert disable_dropout(gpt2) == 2 * 3 + 1  # per block: attention, its residual, the MLP's; embeddings
    assert all(m.p == 0.0 for m in gpt2.modules() if isinstance(m, torch.nn.Dropout))
    assert gpt2.config.resid_pdrop == 0.1
    llama = tiny_llama(tok, attention_dropout=0.25)
    assert [layer.self_attn.attention_dropout for layer in llama.model.layers] == [0.25, 0.25]
    assert disable_dropout(llama) == 2
    assert [layer.self_attn.attention_dropout for layer in llama.model.layers] == [0.0, 0.0]
    assert llama.config.attention_dropout == 0.25


def test_frozen_puts_the_mode_back_even_after_an_error():
    model = tiny_gpt2(char_tokenizer()).train()
    with pytest.raises(RuntimeError, match="inside"), frozen(model):
        assert not model.training and not torch.is_grad_enabled()
        raise RuntimeError("inside")
    assert model.training and torch.is_grad_enabled()


# ------------------------------------------------------------------------------ sampling specification
def test_one_frozen_sampling_spec_drives_generation_logprobs_and_loss(tmp_path):
    args = small_config(tmp_path, temperature=0.7, max_new_tokens=5, loss_type="dr_grpo",
                        generation_kwargs={"min_new_tokens": 2})  # fmt: skip
    trainer = make_trainer(tmp_path, args=args)
    spec = trainer.sampling
    assert trainer.objective.update.sampling is spec
    assert spec.generate_kwargs() == {"do_sample": True, "max_new_tokens": 5, "temperature": 0.7, "top_p": 0.6,
                                      "top_k": 50, "min_new_tokens": 2}  # fmt: skip
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.temperature = 1.0
    with pytest.raises(TypeError):
        spec.extra["temperature"] = 1.0
    args.generation_kwargs["max_new_tokens"] = 512  # after the trainer was built: ignored by it
    tree = trainer.rollout(trainer.train_prompts, [0])
    assert tree.turns[0].agents[0].completion_ids.shape[1] <= 5
    weights = trainer.objective.update.token_weights(tree, 0)[0]
    assert torch.allclose(weights, torch.full_like(weights, 1 / (2 * 5)))  # dr_grpo: 1 / (sequences x 5)


def test_greedy_evaluation_keeps_the_extra_settings():
    spec = SamplingSpec(0.6, 0.6, 50, 8, extra={"min_new_tokens": 3})
    assert spec.greedy().generate_kwargs() == {"do_sample": False, "max_new_tokens": 8, "min_new_tokens": 3}
    with pytest.raises(ValueError, match=r"generation_kwargs\['top_p'\] shadows"):
        SamplingSpec(0.6, 0.6, 50, 8, extra={"top_p": 0.9})


# ------------------------------------------------------------------------------ checkpoints of any config
class HalveLogits(LogitsProcessor):
    def __call__(self, input_ids, scores):
        return scores / 2


def processor_config(tmp_path, processor=True):
    kwargs = {"logits_processor": LogitsProcessorList([HalveLogits()])} if processor else {}
    return small_config(tmp_path, save_steps=1, generation_kwargs=kwargs)


def test_a_config_value_json_cannot_hold_is_described_and_asked_for_on_resume(tmp_path, capsys):
    trainer = make_trainer(tmp_path, args=processor_config(tmp_path))
    assert trainer.train().global_step == 2
    run = tmp_path / "run"
    assert sorted(p.name for p in run.iterdir() if p.name.startswith("checkpoint")) == ["checkpoint-1", "checkpoint-2"]
    stored = json.loads((run / "checkpoint-1" / "trainer_state.json").read_text())["config"]
    marker = stored["generation_kwargs"]["logits_processor"]["__not_json__"]
    assert marker["type"] == "transformers.generation.logits_process.LogitsProcessorList"

    with pytest.raises(ValueError, match=r"generation_kwargs\['logits_processor'\].*pass it again"):
        make_trainer(tmp_path, args=processor_config(tmp_path, processor=False)).train(
            resume_from_checkpoint=str(run / "checkpoint-1")
        )
    capsys.readouterr()
    resumed = make_trainer(tmp_path, args=processor_config(tmp_path))
    assert resumed.train(resume_from_checkpoint=str(run / "checkpoint-1")).global_step == 2
    assert "generation_kwargs['logits_processor']" in capsys.readouterr().out


# ------------------------------------------------------------------------------ metrics over ranks
def test_metrics_combined_over_ranks_equal_one_process_over_the_union():
    a, b = torch.tensor([1.0, 4.0, 2.0]), torch.tensor([7.0, -1.0])
    both = torch.cat([a, b])
    pred_a, pred_b = a * 0.5, b + 1
    per_rank = [
        {"mean": stats.mean_of(x), "std": stats.std_of(x), "min": stats.minimum(x), "max": stats.maximum(x),
         "ev": stats.explained_variance(p, x), "loss": stats.total(s), "lr": stats.same(0.1)}
        for x, p, s in ((a, pred_a, -1.5), (b, pred_b, -2.75))
    ]  # fmt: skip
    combined = stats.finish(stats.combine(per_rank))
    assert combined["mean"] == pytest.approx(both.mean().item())
    assert combined["std"] == pytest.approx(both.std().item())
    assert (combined["min"], combined["max"]) == (-1.0, 7.0)
    predictions = torch.cat([pred_a, pred_b])
    assert combined["ev"] == pytest.approx(1 - (both - predictions).var().item() / both.var().item())
    assert combined["loss"] == -4.25 and combined["lr"] == pytest.approx(0.1)
    # averaging each rank's finished mean would weigh the two-element rank like the three-element one
    assert combined["mean"] != pytest.approx((a.mean() + b.mean()).item() / 2)


def test_undefined_metrics_are_left_out_and_passes_are_averaged():
    constant = torch.ones(3)
    assert stats.finish({"ev": stats.explained_variance(constant, constant), "none": stats.mean(0.0, 0)}) == {}
    averaged = stats.average([{"loss": stats.total(1.0), "clip": stats.mean(1, 4)}, {"loss": stats.total(3.0)}])
    assert stats.finish(averaged) == {"loss": 2.0, "clip": 0.25}


# ------------------------------------------------------------------------------ evaluation's generators
def test_evaluation_forks_the_generator_of_every_gpu(monkeypatch):
    assert seeded_cuda_devices() == ([] if not torch.cuda.is_available() else list(range(torch.cuda.device_count())))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert seeded_cuda_devices() == [0, 1]  # torch.manual_seed reseeds both


def test_evaluation_leaves_the_training_generators_untouched(tmp_path):
    args = small_config(tmp_path, eval_num_samples=2)
    trainer = make_trainer(tmp_path, args=args, eval_dataset=[{"prompt": "ab"}, {"prompt": "cd"}])
    torch.manual_seed(5)
    before = torch.get_rng_state()
    first = trainer.evaluate()
    assert torch.equal(torch.get_rng_state(), before) and trainer.evaluate() == first


# ------------------------------------------------------------------------------ multi-turn weighting
@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_each_turn_of_an_episode_weighs_the_same_whatever_its_width(tmp_path, loss_type):
    trainer = multi_turn_trainer(tmp_path, loss_type=loss_type, num_generations=3)
    tree = trainer.rollout(trainer.train_prompts, [0])
    assert [turn.agents[0].lengths.numel() for turn in tree.turns] == [3, 9]  # G and G*G sequences
    weights = trainer.objective.update.token_weights(tree, 0)
    totals = [(w * turn.agents[0].lengths).sum().item() for w, turn in zip(weights, tree.turns)]
    assert totals == pytest.approx([0.5, 0.5])  # turn 1's decisions no longer get 1/(G+1) of the weight
    trainer.objective.update.args = dataclasses.replace(trainer.args, turn_weighting="sequence")
    pooled = [
        (w * turn.agents[0].lengths).sum().item()
        for w, turn in zip(trainer.objective.update.token_weights(tree, 0), tree.turns)
    ]
    assert sum(pooled) == pytest.approx(1.0) and pooled[1] > 2 * pooled[0]


# ------------------------------------------------------------------------------ console
def test_console_line_is_compact_and_the_log_keeps_everything(tmp_path, capsys):
    trainer = make_trainer(tmp_path, args=small_config(tmp_path))
    trainer.train()
    announced, line = capsys.readouterr().out.splitlines()[:2]
    assert announced == f"MAGRPO: this run writes to {tmp_path / 'run'}"
    assert line.startswith("step 1 | reward ") and "agent0 loss " in line and "agent1 loss " in line
    assert line.endswith(" s/step") and "advantage" not in line and len(line) < 120
    logged = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert "agent0/advantage_std" in logged and "time/generated_tokens_per_s" in logged
    assert format_metrics(3, {"eval/reward_mean": 0.5, "eval/turn_1/reward_mean": 0.25}) == (
        "step 3 | eval/reward_mean 0.5 | eval/turn_1/reward_mean 0.25"
    )
    assert math.isfinite(logged["agent0/loss"])


# ------------------------------------------------------------------------------ public surface
def test_the_public_surface_is_flat_and_the_tutorials_paths_keep_working():
    import comlrl
    import comlrl.trainers
    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
    from comlrl.utils.reward_processor import RewardProcessors

    assert comlrl.MAGRPOTrainer is MAGRPOTrainer and comlrl.MAGRPOConfig is MAGRPOConfig
    assert comlrl.RewardProcessors is RewardProcessors
    for name in ("IACTrainer", "IACConfig", "MAACTrainer", "MAACConfig", "MARLOOTrainer", "TrainResult"):
        assert getattr(comlrl, name) is getattr(comlrl.trainers, name) and name in comlrl.__all__
    with pytest.raises(AttributeError, match="no attribute 'Trainer'"):
        comlrl.Trainer  # noqa: B018
