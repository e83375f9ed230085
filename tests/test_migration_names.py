"""comlrl 1.4.3's exported names that this library gives a meaning again: each test runs code
written as a 1.4.3 user wrote it (from 1.4.3's source and documentation), unchanged, or checks
that a name that cannot keep its meaning stops with an error that names what to write instead."""

import importlib
import os
import warnings

import pytest
import torch

from comlrl.trainers.actor_critic import ActorCriticTrainer

from .helpers import DATA, char_tokenizer, length_sum, lora, tiny_gpt2, tiny_llama


def iac_config(tmp_path, **overrides):
    from comlrl.trainers.actor_critic import IACConfig

    values = dict(num_train_epochs=1, per_device_train_batch_size=2, num_generations=2, max_new_tokens=4)
    return IACConfig(**{**values, "output_dir": str(tmp_path / "run"), **overrides})


# ------------------------------------------------------------------------------- module paths of the docs
def test_the_older_docs_trainer_paths_import_the_trainers():
    import comlrl.trainers as trainers
    from comlrl.trainers.iac import IACConfig, IACTrainer
    from comlrl.trainers.maac import MAACConfig, MAACTrainer
    from comlrl.trainers.magrpo import MAGRPOConfig, MAGRPOTrainer

    assert (MAGRPOConfig, MAGRPOTrainer) == (trainers.MAGRPOConfig, trainers.MAGRPOTrainer)
    assert (IACConfig, IACTrainer, MAACConfig, MAACTrainer) == (
        trainers.IACConfig,
        trainers.IACTrainer,
        trainers.MAACConfig,
        trainers.MAACTrainer,
    )


# ------------------------------------------------------------------------------- CausalLMWithValueHead
def test_a_value_head_wrapper_as_iac_agents_trains_saves_and_resumes_its_head(tmp_path):
    from comlrl.models import CausalLMWithValueHead
    from comlrl.trainers import IACTrainer

    tok = char_tokenizer()
    agents = [CausalLMWithValueHead(tiny_llama(tok, seed=i), value_head_hidden_dim=8) for i in range(2)]
    heads = [agent.value_head for agent in agents]
    before = [head.layers[-1].weight.detach().clone() for head in heads]
    trainer = IACTrainer(
        agents=agents,
        tokenizer=tok,
        train_dataset=DATA[:2],
        reward_func=length_sum,
        args=iac_config(tmp_path, use_separate_critic=False),
    )
    # the wrapper's model is the agent, its head the critic's: the very modules
    assert [critic.head for critic in trainer.critics] == heads
    assert list(trainer.agents) == [agent.model for agent in agents]
    trainer.train(checkpoint_dir=str(tmp_path / "ckpt"))
    assert any(not torch.equal(b, h.layers[-1].weight) for b, h in zip(before, heads))
    trainer.save_model(str(tmp_path / "out"))
    assert os.path.isfile(tmp_path / "out" / "agent_0" / "value_head.safetensors")

    again = [CausalLMWithValueHead(tiny_llama(tok, seed=9 + i), value_head_hidden_dim=8) for i in range(2)]
    resumed = IACTrainer(
        agents=again,
        tokenizer=tok,
        train_dataset=DATA[:2],
        reward_func=length_sum,
        args=iac_config(tmp_path, use_separate_critic=False, num_train_epochs=2),
    )
    checkpoint = sorted((tmp_path / "ckpt").iterdir())[-1]
    resumed.train(resume_from_checkpoint=str(checkpoint), checkpoint_dir=str(tmp_path / "ckpt"))
    assert resumed.critics[0].head is again[0].value_head


def test_a_value_head_wrapper_with_lora_adapters_trains_its_head(tmp_path):
    from comlrl.models.actor_critic import CausalLMWithValueHead
    from comlrl.trainers.actor_critic import IACTrainer

    tok = char_tokenizer()
    agents = [CausalLMWithValueHead(tiny_llama(tok, seed=i)) for i in range(2)]
    trainer = IACTrainer(
        agents=agents,
        tokenizer=tok,
        train_dataset=DATA[:2],
        reward_func=length_sum,
        peft_config=lora(),
        args=iac_config(tmp_path, use_separate_critic=False),
    )
    assert trainer.critics[1].head is agents[1].value_head
    trainer.train()
    trainer.save_model(str(tmp_path / "out"))
    assert os.path.isfile(tmp_path / "out" / "agent_1" / "adapter_config.json")


def test_value_head_wrappers_as_critics(tmp_path):
    from comlrl.models.actor_critic import CausalLMWithValueHead
    from comlrl.trainers.actor_critic import IACTrainer, MAACConfig, MAACTrainer

    tok = char_tokenizer()
    critics = [CausalLMWithValueHead(tiny_gpt2(tok, seed=c)) for c in range(2)]
    iac = IACTrainer(
        agents=[tiny_llama(tok, seed=i) for i in range(2)],
        critics=critics,
        tokenizer=tok,
        critic_tokenizer=tok,
        train_dataset=DATA[:2],
        reward_func=length_sum,
        args=iac_config(tmp_path, use_separate_critic=True),
    )
    assert [c.head for c in iac.critics] == [c.value_head for c in critics]
    assert [c.backbone for c in iac.critics] == [c.model for c in critics]
    # MAAC's one critic gives a value per agent: a one-value head cannot be that one
    maac_args = MAACConfig(num_train_epochs=1, num_generations=2, max_new_tokens=4, output_dir=str(tmp_path / "m"))
    maac = dict(agents=[tiny_llama(tok, seed=i) for i in range(2)], tokenizer=tok, critic_tokenizer=tok)
    with pytest.raises(ValueError, match=r"critic_model's value head gives one value.*critic_model.model"):
        MAACTrainer(
            **maac,
            critic_model=CausalLMWithValueHead(tiny_gpt2(tok)),
            train_dataset=DATA[:2],
            reward_func=length_sum,
            args=maac_args,
        )


def test_a_wrapper_head_of_another_width_than_the_config_is_refused(tmp_path):
    from comlrl.models.actor_critic import CausalLMWithValueHead
    from comlrl.trainers.actor_critic import IACTrainer

    tok = char_tokenizer()
    with pytest.raises(
        ValueError, match=r"agents\[0\]'s value head has hidden width None, but value_head_hidden_dim=8"
    ):
        IACTrainer(
            agents=[CausalLMWithValueHead(tiny_llama(tok, seed=i)) for i in range(2)],
            tokenizer=tok,
            train_dataset=DATA[:2],
            reward_func=length_sum,
            args=iac_config(tmp_path, use_separate_critic=False, value_head_hidden_dim=8),
        )


def test_a_value_head_wrapper_as_a_magrpo_agent_trains_its_model_and_says_its_head_is_unused(tmp_path):
    from comlrl.models import CausalLMWithValueHead
    from comlrl.trainers import MAGRPOConfig, MAGRPOTrainer

    tok = char_tokenizer()
    agents = [CausalLMWithValueHead(tiny_llama(tok, seed=i)) for i in range(2)]
    config = MAGRPOConfig(num_train_epochs=1, num_generations=2, max_new_tokens=4, output_dir=str(tmp_path / "run"))
    with pytest.warns(
        UserWarning, match=r"agents\[\d\] is a CausalLMWithValueHead: its .model is used, its value head"
    ):
        trainer = MAGRPOTrainer(agents=agents, tokenizer=tok, train_dataset=DATA, reward_func=length_sum, args=config)
    assert list(trainer.agents) == [agent.model for agent in agents]
    trainer.train()
    trainer.save_model(str(tmp_path / "out"))
    # without a head, nothing to say
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bare = [CausalLMWithValueHead(tiny_llama(tok, seed=i), attach_value_head=False) for i in range(2)]
        MAGRPOTrainer(agents=bare, tokenizer=tok, train_dataset=DATA, reward_func=length_sum, args=config)


def test_the_wrapper_computes_logits_and_values_as_in_the_original():
    from comlrl.models.actor_critic import ActorCriticOutput, CausalLMWithValueHead

    tok = char_tokenizer()
    model = CausalLMWithValueHead(tiny_llama(tok))
    ids = tok(["a cat"], return_tensors="pt")["input_ids"]
    out = model(input_ids=ids)
    assert isinstance(out, ActorCriticOutput) and out.values.shape == ids.shape
    assert torch.equal(out.logits, model.model(input_ids=ids).logits)
    assert model(input_ids=ids, output_values=False).values is None


# ------------------------------------------------------------------------------- metrics_callback's samples
def test_an_iac_metrics_callback_sees_the_original_sample_shape(tmp_path):
    from comlrl.trainers.actor_critic import IACTrainer, RolloutSample

    seen = []

    def metrics_callback(rollouts):
        seen.append(rollouts)
        return {"response_len": sum(s.response_len for s in rollouts) / len(rollouts)}

    tok = char_tokenizer()
    trainer = IACTrainer(
        agents=[tiny_llama(tok, seed=i) for i in range(2)],
        tokenizer=tok,
        train_dataset=DATA[:2],
        eval_dataset=DATA[:1],
        reward_func=length_sum,
        metrics_callback=metrics_callback,
        args=iac_config(tmp_path, num_train_epochs=1, logging_steps=1),
    )
    trainer.train()
    samples = next(rollouts for rollouts in seen if not torch.isnan(rollouts[0].old_value))  # the training step's
    assert len(samples) == 2 * 2 * 2 and all(isinstance(s, RolloutSample) for s in samples)
    for s in samples:
        assert s.full_input_ids.shape == s.attention_mask.shape == (s.prompt_len + s.response_len,)
        assert tok.decode(s.full_input_ids[s.prompt_len :], skip_special_tokens=True) == s.completion
        assert torch.allclose(s.advantage, s.returns - s.old_value)
        assert s.old_logprob.shape == (1,) and s.old_logprob.item() < 0
        assert s.normalized_advantage is not None and torch.isfinite(s.normalized_advantage).all()
    # whitened per agent over the step
    normalized = torch.cat([s.normalized_advantage for s in samples if s.agent_idx == 0])
    assert normalized.mean().abs() < 1e-4
    metrics = trainer.evaluate()
    assert "eval/response_len" in metrics and all(torch.isnan(s.old_value) for s in seen[-1])


# ------------------------------------------------------------------------------- ActorCriticTrainerBase
def test_actor_critic_trainer_base_answers_isinstance_and_refuses_to_be_used(tmp_path):
    from comlrl.trainers import ActorCriticTrainerBase, IACTrainer
    from comlrl.trainers.actor_critic.ac_base import ActorCriticTrainerBase as same

    tok = char_tokenizer()
    trainer = IACTrainer(
        agents=[tiny_llama(tok, seed=i) for i in range(2)],
        tokenizer=tok,
        train_dataset=DATA,
        reward_func=length_sum,
        args=iac_config(tmp_path),
    )
    assert same is ActorCriticTrainerBase and isinstance(trainer, ActorCriticTrainerBase)
    assert issubclass(ActorCriticTrainer, ActorCriticTrainerBase)
    with pytest.raises(
        TypeError, match="class MyTrainer subclasses ActorCriticTrainerBase: .*subclass ActorCriticTrainer"
    ):

        class MyTrainer(ActorCriticTrainerBase):
            pass

    with pytest.raises(TypeError, match="use IACTrainer or MAACTrainer"):
        ActorCriticTrainerBase()


# ------------------------------------------------------------------------------- schedulers
def test_device_scheduler_chooses_as_the_original():
    from comlrl.schedulers import DeviceScheduler
    from comlrl.schedulers.device_scheduler import normalize_parallel_training

    cpu = torch.device("cpu")
    assert normalize_parallel_training(" NULL ") == "none" and normalize_parallel_training("MP") == "mp"
    with pytest.raises(ValueError, match="parallel_training only supports: none, mp."):
        normalize_parallel_training("ddp")
    agents, critics = DeviceScheduler.assign_devices(2, ["cpu"], "cpu", use_separate_critic=True)
    assert agents == critics == [cpu, cpu]
    assert DeviceScheduler.assign_shared_critic_device(agents, None) == cpu
    assert DeviceScheduler.resolve_single_device(None, ["cpu", "cuda:1"]) == cpu
    with pytest.raises(ValueError, match=r"agent_devices length \(3\) must be 1 or 2."):
        DeviceScheduler.resolve_devices(["cpu"] * 3, 2, kind="agent_devices")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    auto = DeviceScheduler.resolve_devices("auto", 2)
    expected = (
        [cpu] * 2
        if not gpus
        else [torch.device("cuda:0")] * 2
        if gpus < 2
        else [torch.device(f"cuda:{i}") for i in range(2)]
    )
    assert auto == expected


# ------------------------------------------------------------------------------- comlrl.utils helpers
def test_build_formatters_as_the_original():
    from comlrl.utils import build_formatters

    default = build_formatters(None, 2)
    assert default[0]({"prompt": "p"}) == "p" and default[1]({"prompt": "p"}, external_prompts="e") == "e"

    def with_external(item, external_prompts=None):
        return external_prompts or item["q"].upper()

    one = build_formatters(with_external, 2)
    assert len(one) == 2 and one[1]({"q": "x"}) == "X" and one[0]({"q": "x"}, external_prompts="y") == "y"
    plain = build_formatters([lambda item: item["q"], lambda item: item["q"] * 2], 2)
    assert plain[1]({"q": "a"}, external_prompts="ignored") == "aa"
    with pytest.raises(ValueError):
        build_formatters([str.upper], 2)
    with pytest.raises(ValueError, match="formatters must be None, a callable, or a sequence of callables."):
        build_formatters(3, 2)


def test_call_reward_function_as_the_original():
    from comlrl.utils import call_reward_function

    def with_prompts(prompts, a, b, batch_items=None):
        return [len(prompts[0]) + len(a[0]) + len(b[0]) + len(batch_items)]

    assert call_reward_function(with_prompts, ["pp"], [["a"], ["bb"]], num_agents=2, batch_items=[{}]) == [6.0]
    assert call_reward_function(length_sum, ["p"], [["a"], ["bb"]], num_agents=2) == [3.0]
    per_agent = call_reward_function(lambda a, b: torch.tensor([1, 2]), ["p"], [["a"], ["b"]], num_agents=2)
    assert per_agent == [1.0, 2.0]
    assert call_reward_function(lambda c, **kwargs: 0.5 + len(kwargs["prompts"]), ["p"], [["a"]], num_agents=1) == [1.5]


def test_resolve_tokenizers_as_the_original():
    from comlrl.utils import resolve_tokenizers

    tok, other = char_tokenizer(), char_tokenizer(pad=False)
    assert resolve_tokenizers(None, tok, None) is tok
    with pytest.warns(UserWarning, match="no pad token"):
        pair = resolve_tokenizers(None, [tok, other], [tiny_llama(tok), tiny_llama(tok)])
    assert pair == [tok, other] and other.pad_token == other.eos_token
    assert resolve_tokenizers(None, tok, ["a", "b"]) is tok
    with pytest.raises(ValueError, match="Tokenizer\\(s\\) must be provided when agents are model objects."):
        resolve_tokenizers(None, None, [tiny_llama(tok)])
    with pytest.raises(ValueError, match="tokenizers length must match agents."):
        resolve_tokenizers(None, [tok], ["a", "b"])


def test_read_checkpoint_metadata_reads_our_checkpoints(tmp_path):
    from comlrl.trainers import IACTrainer
    from comlrl.utils import read_checkpoint_metadata

    tok = char_tokenizer()
    trainer = IACTrainer(
        agents=[tiny_llama(tok, seed=i) for i in range(2)],
        tokenizer=tok,
        train_dataset=DATA[:2],
        reward_func=length_sum,
        args=iac_config(tmp_path),
    )
    trainer.train(checkpoint_dir=str(tmp_path / "ckpt"))
    checkpoint = sorted((tmp_path / "ckpt").iterdir())[-1]
    metadata = read_checkpoint_metadata(checkpoint)
    assert metadata == {"version": None, "trainer_class": "IACTrainer", "sequence": 1, "run_id": None, "wandb": None}
    assert read_checkpoint_metadata(checkpoint / "trainer_state.json") == metadata
    original = tmp_path / "checkpoint-3"
    original.mkdir()
    torch.save({"__kind__": "dict", "items": []}, original / "training_state.pt")
    with pytest.raises(ValueError, match="is a comlrl 1.4.3 checkpoint"):
        read_checkpoint_metadata(original / "training_state.pt")


# ------------------------------------------------------------------------------- what stays refused
@pytest.mark.parametrize("module, name", [("comlrl.models", "ValueHead"), ("comlrl.models.actor_critic", "ValueHead")])
def test_the_original_value_head_class_is_refused_naming_the_wrappers_head(module, name):
    with pytest.raises(ImportError, match="CausalLMWithValueHead\\(model, value_head_hidden_dim=...\\).value_head"):
        exec(f"from {module} import {name}", {})
    assert not hasattr(importlib.import_module(module), name)
