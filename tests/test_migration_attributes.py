"""comlrl 1.4.3's public trainer attributes, read as its users' scripts read them after
building or training a trainer (their names and meanings from 1.4.3's trainers' source:
``self.tokenizers``, ``self.optimizers``, ...). Each must hold what it held there, or say,
by an AttributeError, what to read instead (:mod:`comlrl.compat.trainer_attributes`)."""

import pytest
import torch
from datasets import Dataset

from comlrl.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer
from comlrl.trainers.dpo import MADPOConfig, MADPOIterConfig, MADPOIterTrainer, MADPOTrainer
from comlrl.trainers.reinforce import (
    CentralizedMAGRPOConfig,
    CentralizedMAGRPOTrainer,
    MAGRPOConfig,
    MAGRPOTrainer,
    MAREINFORCEConfig,
    MAREINFORCETrainer,
)
from comlrl.trainers.rlhf import MARLHFConfig, MARLHFTrainer

from .helpers import MIXED, SplitInHalves, char_tokenizer, reward_backbone, tiny_llama

ROWS = {"prompt": ["hello there:", "a cat", "tell me, why?"]}
ROWS_ROW = {"prompt": "a cat"}
SMALL = dict(num_train_epochs=1, num_generations=2, max_new_tokens=4, logging_steps=1)
CPU = torch.device("cpu")


def reward(completions1, completions2):
    return [float(len(b) - len(a)) for a, b in zip(completions1, completions2)]


def model_folder(tmp_path):
    """A tiny model saved as a hub folder, as 1.4.3's scripts named models by ``agent_model``."""
    tok = char_tokenizer()
    folder = str(tmp_path / "tiny")
    tiny_llama(tok).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def eval_logger(agent_completions_turns, **kwargs):
    return {"length": float(len(agent_completions_turns[0][0][0]))}


def test_magrpo_after_training_keeps_1_4_3s_attributes(tmp_path):
    folder = model_folder(tmp_path)
    train_dataset, eval_dataset = Dataset.from_dict(ROWS), Dataset.from_dict(ROWS)
    model_config = {"special_tokens": {"additional_special_tokens": ["<sep>"]}}
    args = MAGRPOConfig(output_dir=str(tmp_path / "run"), **SMALL)
    trainer = MAGRPOTrainer(
        agent_model=folder,
        num_agents=2,
        model_config=model_config,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        reward_func=reward,
        eval_logger=eval_logger,
        args=args,
    )
    trainer.train()

    # The script's check that the special token it added is there, in every agent's tokenizer.
    assert isinstance(trainer.tokenizers, list) and len(trainer.tokenizers) == 2
    for tok in trainer.tokenizers:
        assert "<sep>" in tok.all_special_tokens and tok.tokenize("a<sep>b") == ["a", "<sep>", "b"]
        assert tok.convert_tokens_to_ids("<sep>") not in (None, tok.unk_token_id)
    assert trainer.tokenizer is trainer.tokenizers[0]
    assert trainer.num_agents == 2 and len(trainer.agents) == 2
    assert trainer.args is args
    assert trainer.model_name == folder
    assert trainer.model_config is model_config
    assert trainer.train_dataset is train_dataset and trainer.eval_dataset is eval_dataset
    assert trainer.reward_func is reward
    assert trainer.reward_processor(2.5) == 2.5  # 1.4.3: the identity when none was given
    assert trainer.eval_logger is eval_logger and trainer.eval_aggregator is None
    assert trainer.external_transition is None and trainer.wandb_config is None
    assert len(trainer.formatters) == 2 and trainer.formatters[1](ROWS_ROW) == ROWS_ROW["prompt"]
    assert trainer.device == CPU and trainer.agent_devices == [CPU, CPU]
    assert trainer.reference_models == [] and trainer.reference_devices == []
    assert trainer.parallel_training == "none" and trainer.advantage_mode == "mean"
    assert trainer.centralized_collaboration is None
    assert MAGRPOTrainer.default_config_cls is MAGRPOConfig and trainer.default_config_cls is MAGRPOConfig
    assert MAREINFORCETrainer.default_config_cls is MAREINFORCEConfig

    # One AdamW per agent, over that agent's weights.
    assert len(trainer.optimizers) == 2
    for agent, optimizer in zip(trainer.agents, trainer.optimizers):
        assert isinstance(optimizer, torch.optim.AdamW)
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        assert held == {id(p) for p in agent.parameters()}
        assert optimizer.param_groups[0]["lr"] > 0

    # The agents, as a list of models: indexed, iterated, saved.
    assert all(isinstance(agent, torch.nn.Module) for agent in trainer.agents)
    trainer.agents[0].save_pretrained(tmp_path / "saved")
    trainer.tokenizers[0].save_pretrained(tmp_path / "saved")
    assert (tmp_path / "saved" / "config.json").exists()


def test_tokenizers_given_keep_their_identity(tmp_path):
    tok = char_tokenizer()
    agents = [tiny_llama(tok, seed=i) for i in range(2)]
    args = MAGRPOConfig(output_dir=str(tmp_path / "run"), **SMALL)
    one = MAGRPOTrainer(
        agents=agents, tokenizer=tok, train_dataset=Dataset.from_dict(ROWS), reward_func=reward, args=args
    )
    assert one.tokenizers == [tok, tok] and one.tokenizer is tok
    assert one.model_name == "llama"  # 1.4.3: a model object's model type
    toks = [char_tokenizer(), char_tokenizer()]
    two = MAGRPOTrainer(
        agents=agents, tokenizer=toks, train_dataset=Dataset.from_dict(ROWS), reward_func=reward, args=args
    )
    assert two.tokenizers[0] is toks[0] and two.tokenizers[1] is toks[1] and two.tokenizer is toks[0]
    formatters = [lambda row: "A: " + row["prompt"], lambda row: "B: " + row["prompt"]]
    three = MAGRPOTrainer(
        agents=agents,
        tokenizer=tok,
        train_dataset=Dataset.from_dict(ROWS),
        reward_func=reward,
        reward_processor=abs,
        formatters=formatters,
        args=args,
    )
    assert three.formatters == formatters and three.reward_processor is abs
    assert three.model_config == {}


def test_reference_models_with_the_kl_term(tmp_path):
    tok = char_tokenizer()
    agents = [tiny_llama(tok, seed=i) for i in range(2)]
    args = MAGRPOConfig(output_dir=str(tmp_path / "run"), reference_kl_enabled=True, **SMALL)
    trainer = MAGRPOTrainer(
        agents=agents, tokenizer=tok, train_dataset=Dataset.from_dict(ROWS), reward_func=reward, args=args
    )
    assert len(trainer.reference_models) == 2 and trainer.reference_devices == [CPU, CPU]
    for agent, reference in zip(trainer.agents, trainer.reference_models):
        assert reference is not agent
        assert not any(p.requires_grad for p in reference.parameters())


@pytest.mark.parametrize(
    "name,instead",
    [
        ("env_step", "trainer.global_step"),
        ("dist_env", "trainer.parallel"),
        ("rollout_buffers", "metrics_callback"),
        ("wandb_initialized", "wandb.run"),
        ("verbose", "progress bar"),
    ],
)
def test_attributes_whose_meaning_is_gone_say_what_to_read(tmp_path, name, instead):
    tok = char_tokenizer()
    args = MAGRPOConfig(output_dir=str(tmp_path / "run"), **SMALL)
    trainer = MAGRPOTrainer(
        agents=[tiny_llama(tok, seed=i) for i in range(2)],
        tokenizer=tok,
        train_dataset=Dataset.from_dict(ROWS),
        reward_func=reward,
        args=args,
    )
    assert not hasattr(trainer, name) and getattr(trainer, name, None) is None
    with pytest.raises(AttributeError, match=f"MAGRPOTrainer.{name} was comlrl 1.4.3's;.*{instead}"):
        getattr(trainer, name)


def test_iac_keeps_1_4_3s_attributes(tmp_path):
    tok = char_tokenizer()
    agents = [tiny_llama(tok, seed=i) for i in range(2)]
    critics = [tiny_llama(tok, seed=5 + i) for i in range(2)]
    args = IACConfig(output_dir=str(tmp_path / "run"), critic_type="Q", **SMALL)
    trainer = IACTrainer(
        agents=agents,
        critics=critics,
        tokenizer=tok,
        train_dataset=Dataset.from_dict(ROWS),
        reward_func=reward,
        args=args,
    )
    trainer.train()
    assert trainer.tokenizers == [tok, tok] and trainer.tokenizer is tok and trainer.num_agents == 2
    assert trainer.args is args and trainer.critic_type == "q"
    assert [trainer.agents[i] for i in range(2)] == agents
    assert len(trainer.agent_optimizers) == 2 and len(trainer.critic_optimizers) == 2
    for agent, optimizer in zip(agents, trainer.agent_optimizers):
        assert {id(p) for g in optimizer.param_groups for p in g["params"]} == {id(p) for p in agent.parameters()}
    for critic, optimizer in zip(critics, trainer.critic_optimizers):
        held = {id(p) for g in optimizer.param_groups for p in g["params"]}
        assert {id(p) for p in critic.parameters()} <= held  # the critic model, and its value head
    assert trainer.critic_devices == [CPU, CPU] and trainer.agent_devices == [CPU, CPU]
    assert len(trainer.critics) == 2
    assert not hasattr(trainer, "critic_optimizer") and not hasattr(trainer, "critic_device")  # MAAC's
    assert IACTrainer.default_config_cls is IACConfig


def test_maac_keeps_1_4_3s_attributes(tmp_path):
    tok = char_tokenizer(MIXED + "[]|\n")  # the critic reads "[Agent 0] ..." joint inputs
    agents = [tiny_llama(tok, seed=i) for i in range(2)]
    critic = tiny_llama(tok, seed=7)
    args = MAACConfig(output_dir=str(tmp_path / "run"), **SMALL)
    trainer = MAACTrainer(
        agents=agents,
        critics=[critic],
        tokenizer=tok,
        train_dataset=Dataset.from_dict(ROWS),
        reward_func=reward,
        args=args,
    )
    trainer.train()
    assert trainer.tokenizers == [tok, tok] and trainer.args is args and len(trainer.agents) == 2
    assert len(trainer.agent_optimizers) == 2 and trainer.critic_device == CPU
    held = {id(p) for g in trainer.critic_optimizer.param_groups for p in g["params"]}
    assert {id(p) for p in critic.parameters()} <= held
    assert not hasattr(trainer, "critic_optimizers") and not hasattr(trainer, "critic_devices")  # IAC's


def test_madpo_optimizers_and_adapter(tmp_path):
    tok = char_tokenizer()
    args = MADPOConfig(
        output_dir=str(tmp_path / "run"),
        num_train_epochs=1,
        max_new_tokens=4,
        preference_num_candidates=2,
        preference_pairs_per_sample=1,
    )
    trainer = MADPOTrainer(
        agents=[tiny_llama(tok, seed=i) for i in range(2)],
        tokenizer=tok,
        train_dataset=Dataset.from_dict(ROWS),
        reward_func=reward,
        args=args,
    )
    assert trainer.centralized_comparator_adapter is None and trainer.centralized_collaboration is None
    # MADPO's optimizers wait for its pairs (their schedule's length): made by train().
    with pytest.raises(AttributeError, match=r"made when train\(\) starts"):
        _ = trainer.optimizers
    assert not hasattr(trainer, "advantage_mode")  # DPO has no group baseline
    trainer.train()
    assert len(trainer.optimizers) == 2 and all(isinstance(o, torch.optim.AdamW) for o in trainer.optimizers)


def test_centralized_trainers_keep_the_collaboration_and_adapter(tmp_path):
    tok = char_tokenizer()
    adapter = SplitInHalves()
    args = CentralizedMAGRPOConfig(output_dir=str(tmp_path / "run"), num_agents=2, **SMALL)
    trainer = CentralizedMAGRPOTrainer(
        agents=[tiny_llama(tok)],
        tokenizer=tok,
        train_dataset=Dataset.from_dict(ROWS),
        reward_func=reward,
        args=args,
        centralized_adapter=adapter,
    )
    assert trainer.num_agents == 1 and trainer.tokenizers == [tok] and len(trainer.optimizers) == 1
    assert trainer.centralized_collaboration is trainer.collaboration
    assert trainer.centralized_collaboration.num_roles == 2
    madpo = MADPOTrainer(
        agents=[tiny_llama(tok)],
        tokenizer=tok,
        train_dataset=Dataset.from_dict(ROWS),
        reward_func=reward,
        args=MADPOConfig(
            output_dir=str(tmp_path / "dpo"), collaboration_mode="centralized", num_agents=2, max_new_tokens=4
        ),
        centralized_comparator_adapter=adapter,
    )
    assert madpo.centralized_comparator_adapter is adapter


def test_marlhf_and_iterative_attributes(tmp_path):
    tok = char_tokenizer()
    backbone = reward_backbone(tmp_path / "rm", seed=3)
    args = MARLHFConfig(output_dir=str(tmp_path / "run"), reward_model_name=backbone, **SMALL)
    trainer = MARLHFTrainer(
        agents=[tiny_llama(tok, seed=i) for i in range(2)],
        tokenizer=tok,
        train_dataset=Dataset.from_dict(ROWS),
        reward_func=reward,
        args=args,
    )
    assert trainer.reward_model is None and trainer.reward_tokenizer is None  # fitted by train()
    assert trainer.reward_device == CPU
    assert trainer.critic_model_source is None and trainer.critic_sources is None
    assert trainer.advantage_mode == "mean" and trainer.default_config_cls is MARLHFConfig
    with pytest.raises(AttributeError, match="reward_optimizer was comlrl 1.4.3's;.*reward_learning_rate"):
        _ = trainer.reward_optimizer
    iterative = MADPOIterTrainer(
        agents=[tiny_llama(tok, seed=i) for i in range(2)],
        tokenizer=tok,
        train_dataset=Dataset.from_dict(ROWS),
        reward_func=reward,
        args=MADPOIterConfig(output_dir=str(tmp_path / "iter"), max_new_tokens=4),
    )
    for name in ("target_seed", "comparator_seed"):
        with pytest.raises(AttributeError, match=f"{name} was comlrl 1.4.3's;.*args.seed"):
            getattr(iterative, name)
