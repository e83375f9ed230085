"""Options for fitting bigger models: model_config when loading by name, gradient checkpointing."""

import dataclasses

import pytest
import torch
import transformers

from comlrl.algorithms import token_weights
from comlrl.models.loading import split_model_config
from comlrl.trainers.actor_critic import IACConfig, IACTrainer
from comlrl.trainers.reinforce import MAGRPOTrainer

from .helpers import char_tokenizer, content_score, make_trainer, small_config, tiny_llama


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


def test_model_config_sections_and_flat_keys_combine_as_in_the_original():
    config = split_model_config(
        {"dtype": "bfloat16", "model_kwargs": {"attn_implementation": "eager"}, "special_tokens": {"pad_token": "<p>"}}
    )
    assert config.model_kwargs == {"dtype": "bfloat16", "attn_implementation": "eager"}
    assert config.tokenizer_kwargs == {} and config.special_tokens == {"pad_token": "<p>"}


def test_a_key_given_flat_and_in_model_kwargs_differently_is_refused():
    with pytest.raises(ValueError, match=r"\['dtype'\] both flat and in model_kwargs"):
        split_model_config({"model_kwargs": {"dtype": "float32"}, "dtype": "bfloat16"})


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
        trainer.objective.update.args = dataclasses.replace(trainer.args, micro_batch_size=None)
        trainer.learners.zero_grad()
        trainer.objective.update.agent_backward(0, [rollout], [advantages], [weights], None, None)
        grads.append(torch.cat([p.grad.reshape(-1) for p in trainer.agents[0].parameters()]))
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------- a model path or id that cannot be loaded


def magrpo_with(tmp_path, agent_model):
    return MAGRPOTrainer(
        agent_model=agent_model,
        num_agents=2,
        train_dataset=[{"prompt": "ab"}],
        reward_func=content_score,
        args=small_config(tmp_path),
    )


@pytest.mark.parametrize("agent_model", ["/x/y", "./nowhere", "~/no/such/model", "a/b/c", "bad name"])
def test_missing_folder_is_named_not_read_as_a_hub_id(tmp_path, agent_model):
    with pytest.raises(ValueError) as info:
        magrpo_with(tmp_path, agent_model)
    assert str(info.value).startswith(
        f"agent_model {agent_model!r} is not a folder and not a model id (a hub id is 'name' or 'namespace/name'); "
    )


def test_folder_without_config_is_named(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=rf"^agent_model '{empty}' is a folder without config.json; "):
        magrpo_with(tmp_path, str(empty))


def test_file_instead_of_folder_is_named(tmp_path):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"")
    with pytest.raises(ValueError, match=rf"^agent_model '{weights}' is a file; pass the folder"):
        magrpo_with(tmp_path, str(weights))


def test_hub_id_that_cannot_be_fetched_names_the_argument(tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co'")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", offline)
    with pytest.raises(OSError) as info:
        magrpo_with(tmp_path, "Qwen/Qwen2.5-0.5B")
    assert str(info.value) == (
        "agent_model 'Qwen/Qwen2.5-0.5B' could not be loaded: We couldn't connect to 'https://huggingface.co'"
    )
    assert isinstance(info.value.__cause__, OSError)


def test_home_relative_folder_loads(tmp_path, monkeypatch, model_folder):
    # transformers does not expand "~"; the folder must still be found
    monkeypatch.setenv("HOME", str(tmp_path))
    trainer = magrpo_with(tmp_path, "~/model")
    assert len(trainer.agents) == 2


def test_missing_critic_folder_names_critic_model(tmp_path):
    tok = char_tokenizer()
    with pytest.raises(ValueError, match=r"^critic_model '/x/y' is not a folder and not a model id"):
        IACTrainer(
            agents=[tiny_llama(tok, i) for i in range(2)],
            tokenizer=tok,
            critic_model="/x/y",
            train_dataset=[{"prompt": "ab"}, {"prompt": "cd"}],
            reward_func=content_score,
            args=IACConfig(num_train_epochs=1, output_dir=str(tmp_path / "run")),
        )
