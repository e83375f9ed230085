"""Options for fitting bigger models: model_config when loading by name, gradient checkpointing."""

import dataclasses
import math

import pytest
import torch

from comlrl.algorithms import token_weights
from comlrl.models.forward import completion_logprobs
from comlrl.models.loading import split_model_config
from comlrl.trainers.reinforce import MAGRPOTrainer

from .helpers import char_tokenizer, content_score, make_trainer, small_config, tiny_llama


@pytest.fixture
def model_folder(tmp_path):
    tok = char_tokenizer()
    tiny_llama(tok, 0).save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    return str(tmp_path / "model")


@pytest.mark.parametrize(
    "model_config",
    [
        {"dtype": torch.float64},
        {"model_kwargs": {"dtype": torch.float64}, "tokenizer_kwargs": {"model_max_length": 77}},
    ],
)
def test_model_config_reaches_from_pretrained(tmp_path, model_folder, model_config):
    trainer = MAGRPOTrainer(
        agent_model=model_folder,
        num_agents=2,
        model_config=model_config,
        train_dataset=[{"prompt": "ab"}],
        reward_func=content_score,
        args=small_config(tmp_path),
    )
    assert all(p.dtype == torch.float64 for agent in trainer.agents for p in agent.parameters())
    if "tokenizer_kwargs" in model_config:
        assert trainer.agents.tokenizers[0].model_max_length == 77


def test_mixed_model_config_is_refused():
    with pytest.raises(ValueError, match=r"mixes model_kwargs/tokenizer_kwargs with other keys \['dtype'\]"):
        split_model_config({"model_kwargs": {}, "dtype": "bfloat16"})


def test_gradient_checkpointing_gives_the_same_gradients(tmp_path):
    grads = []
    for checkpointing in (False, True):
        tok = char_tokenizer()
        trainer = make_trainer(
            tmp_path,
            agents=[tiny_llama(tok, i) for i in range(2)],
            tokenizer=tok,
            args=small_config(tmp_path, gradient_checkpointing=checkpointing),
        )
        checkpointed = [m for m in trainer.agents[0].modules() if getattr(m, "gradient_checkpointing", False)]
        assert bool(checkpointed) == checkpointing
        if not grads:
            rollout = trainer.rollout(trainer.train_prompts, [0, 1]).turns[0].agents[0]
        advantages = torch.linspace(-1, 1, rollout.lengths.numel())
        weights = token_weights(rollout.lengths, "dapo", trainer.args.max_new_tokens)
        trainer.update.args = dataclasses.replace(trainer.args, micro_batch_size=None)
        trainer.learners.zero_grad()
        trainer.update.agent_backward(0, [rollout], [advantages], [weights], None, None)
        grads.append(torch.cat([p.grad.reshape(-1) for p in trainer.agents[0].parameters()]))
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-5)


def test_bf16_autocast_trains_with_float32_logprobs_and_weights(tmp_path):
    trainer = make_trainer(tmp_path, reward_func=content_score, args=small_config(tmp_path, mixed_precision="bf16"))
    rollout = trainer.rollout(trainer.train_prompts, [0]).turns[0].agents[0]
    logps = trainer.update.logprobs(trainer.agents[0], rollout, slice(None))
    plain = completion_logprobs(
        trainer.agents[0], rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids, rollout.completion_mask, 0.6
    )
    assert logps.dtype == torch.float32 and not torch.equal(logps, plain), "bf16 autocast must be on"
    torch.testing.assert_close(logps, plain, atol=0.1, rtol=0.05)
    metrics = trainer.training_step([0, 1])
    assert all(p.dtype == torch.float32 for p in trainer.agents[0].parameters())
    assert math.isfinite(metrics["agent0/loss"]) and metrics["agent0/grad_norm"] > 0


def test_fp16_is_refused_with_what_is_allowed(tmp_path):
    with pytest.raises(ValueError, match=r"mixed_precision='fp16'; expected None or 'bf16'"):
        small_config(tmp_path, mixed_precision="fp16")
