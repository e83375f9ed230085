"""``model_config["special_tokens"]``: comlrl 1.4.3 added them to the tokenizers without
resizing the models. Models the trainer loads by name are resized to their tokenizers
(their references, LoRA bases and critics reading an agent's tokenizer too); models passed
in, and one tokenizer shared over different vocabularies, are refused by name."""

from pathlib import Path

import pytest
import torch
from peft import LoraConfig
from transformers import LlamaForCausalLM

from comlrl.models.vocabulary import resize_embeddings
from comlrl.trainers.actor_critic import IACConfig, IACTrainer
from comlrl.trainers.reinforce import MAGRPOTrainer
from tests.helpers import MIXED, char_tokenizer, length_sum, lora, small_config, tiny_gpt2, tiny_llama

TOOL = {"special_tokens": {"additional_special_tokens": ["<tool>"]}}
PLAIN_ROWS = [{"prompt": "hello there:"}, {"prompt": "a cat"}]
TOOL_ROWS = [{"prompt": "call <tool> now:"}, {"prompt": "a cat <tool>"}]


def tied_llama(tokenizer) -> LlamaForCausalLM:
    """A tiny Llama whose output head is its input embeddings, as SmolLM2's and Llama 3.2 1B's are."""
    config = tiny_llama(tokenizer).config
    config.tie_word_embeddings = True
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


BUILDERS = {"untied llama": tiny_llama, "tied llama": tied_llama, "gpt2 (tied)": tiny_gpt2}


def save_model(folder: Path, build, tokenizer=None) -> str:
    """``build(char_tokenizer())`` saved into ``folder``, with that tokenizer unless one is given."""
    tok = tokenizer or char_tokenizer()
    build(tok).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def favour(model: torch.nn.Module, token_id: int, bonus: float = 5.0) -> None:
    """Adds ``bonus`` to ``token_id``'s logit in every forward, so sampled completions hold the
    token (a head without that column cannot take the bonus)."""

    def hook(module, inputs, logits):
        return logits + bonus * torch.nn.functional.one_hot(torch.tensor(token_id), logits.shape[-1]).to(logits)

    model.get_output_embeddings().register_forward_hook(hook)


def record_ids(model: torch.nn.Module, seen: list[torch.Tensor]) -> None:
    """Appends to ``seen`` every batch of token ids ``model``'s input embeddings look up from now on."""
    model.get_input_embeddings().register_forward_pre_hook(lambda module, inputs: seen.append(inputs[0].detach()))


def rows_of(model: torch.nn.Module) -> tuple[int, int]:
    return model.get_input_embeddings().weight.shape[0], model.get_output_embeddings().weight.shape[0]


def tied(model: torch.nn.Module) -> bool:
    return model.get_output_embeddings().weight is model.get_input_embeddings().weight


@pytest.mark.parametrize("kind", BUILDERS)
def test_agents_loaded_by_name_are_resized_and_train_on_completions_holding_the_token(tmp_path, kind):
    folder = save_model(tmp_path / "model", BUILDERS[kind])
    trainer = MAGRPOTrainer(
        agent_model=folder,
        model_config=TOOL,
        train_dataset=PLAIN_ROWS,
        reward_func=length_sum,
        args=small_config(tmp_path, beta=0.1),
    )
    tok = trainer.agents.tokenizers[0]
    token = tok.convert_tokens_to_ids("<tool>")
    assert token == len(tok) - 1 == len(char_tokenizer())  # a new token, one past the saved vocabulary
    was_tied = kind != "untied llama"
    for model in [*trainer.agents, *trainer.agents.references]:
        assert rows_of(model) == (len(tok), len(tok)) and model.config.vocab_size == len(tok)
        assert tied(model) == was_tied  # the tiny models tie as the real ones do, and stay so
    seen = []
    for agent in trainer.agents:
        favour(agent, token)
        record_ids(agent, seen)
    heads = [agent.get_output_embeddings().weight[token].detach().clone() for agent in trainer.agents]
    trainer.training_step([0, 1])
    assert any((ids == token).any() for ids in seen), "the prompts lack the token: completions must hold it"
    for agent, before in zip(trainer.agents, heads):  # the new row of the output head is trained
        assert not torch.equal(agent.get_output_embeddings().weight[token], before)


def test_the_new_rows_do_not_depend_on_the_random_state_and_leave_it_alone():
    """Every data-parallel rank must add the same rows: frozen ones (a LoRA base's, a
    reference's) are never broadcast. transformers draws them at random."""
    tok = char_tokenizer()
    rows = []
    for seed in (1, 2):
        model = tiny_llama(tok)
        torch.manual_seed(seed)
        state = torch.random.get_rng_state()
        resize_embeddings(model, len(tok) + 1)
        assert torch.equal(torch.random.get_rng_state(), state)
        rows.append(model.get_input_embeddings().weight[-1].detach())
    assert torch.equal(rows[0], rows[1])


def test_prompts_holding_the_token_reach_every_agent_and_reference(tmp_path, model_folder):
    trainer = MAGRPOTrainer(
        agent_model=model_folder,
        agents=[model_folder] * 2,
        model_config=TOOL,
        train_dataset=TOOL_ROWS,
        reward_func=length_sum,
        args=small_config(tmp_path, beta=0.1),
    )
    token = trainer.agents.tokenizers[0].convert_tokens_to_ids("<tool>")
    rows = [agent.get_input_embeddings().weight[token].detach().clone() for agent in trainer.agents]
    metrics = trainer.training_step([0, 1])
    assert all(f"agent{i}/kl" in metrics for i in range(2))  # the references read the token too
    for agent, before in zip(trainer.agents, rows):  # the prompts' token trains its input row
        assert not torch.equal(agent.get_input_embeddings().weight[token], before)


def test_agents_with_their_own_tokenizers_are_resized_each_to_its_own(tmp_path, model_folder):
    wide = char_tokenizer(MIXED)
    other = save_model(tmp_path / "wide", tiny_llama, wide)
    trainer = MAGRPOTrainer(
        agents=[model_folder, other],
        model_config=TOOL,
        train_dataset=PLAIN_ROWS,
        reward_func=length_sum,
        args=small_config(tmp_path),
    )
    sizes = [len(tok) for tok in trainer.agents.tokenizers]
    assert sizes == [len(char_tokenizer()) + 1, len(wide) + 1]
    assert [rows_of(agent) for agent in trainer.agents] == [(n, n) for n in sizes]


def adapters_on_the_tool_model(model_folder, peft_config, args):
    """Two agents as LoRA adapters on one base loaded from ``model_folder``, with the ``<tool>`` token."""
    return MAGRPOTrainer(
        agent_model=model_folder,
        num_agents=2,
        model_config=TOOL,
        train_dataset=TOOL_ROWS,
        reward_func=length_sum,
        peft_config=peft_config,
        args=args,
    )


def test_a_shared_base_under_adapters_is_resized_and_keeps_the_new_rows_frozen(tmp_path, model_folder):
    """The adapters' base is frozen: the new rows keep their starting values (the mean of the
    old ones) unless the LoRA config trains the embeddings (modules_to_save)."""
    trainer = adapters_on_the_tool_model(model_folder, lora(), small_config(tmp_path, beta=0.1))
    shared = trainer.agents[0]
    tok = trainer.agents.tokenizers[0]
    assert shared is trainer.agents[1] and rows_of(shared) == (len(tok), len(tok))
    token = tok.convert_tokens_to_ids("<tool>")
    before = shared.get_input_embeddings().weight[token].detach().clone()
    trainer.training_step([0, 1])
    assert torch.equal(shared.get_input_embeddings().weight[token], before)


def test_adapters_that_save_the_embeddings_train_the_new_rows(tmp_path, model_folder):
    """The base is resized before the adapters are attached, so their copies of the
    embeddings and head (modules_to_save) have the new rows too."""
    config = LoraConfig(
        r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["embed_tokens", "lm_head"], task_type="CAUSAL_LM"
    )
    trainer = adapters_on_the_tool_model(model_folder, config, small_config(tmp_path))
    tok = trainer.agents.tokenizers[0]
    token = tok.convert_tokens_to_ids("<tool>")
    trainer.agents.activate(0)
    before = trainer.agents[0].get_input_embeddings().weight[token].detach().clone()
    assert rows_of(trainer.agents[0]) == (len(tok), len(tok))
    trainer.training_step([0, 1])
    trainer.agents.activate(0)
    assert not torch.equal(trainer.agents[0].get_input_embeddings().weight[token], before)


def test_models_passed_in_are_refused_by_name(tmp_path, model_folder):
    tok = char_tokenizer()
    given = {
        "agent 0": [tiny_llama(tok, 0), tiny_llama(tok, 1)],
        "agent 1": [model_folder, tiny_llama(tok, 1)],  # one tokenizer: no agent is resized
    }
    for name, agents in given.items():
        with pytest.raises(ValueError, match=rf"{name}'s tokenizer holds 36 tokens .* beyond its model's 35 embedding"):
            MAGRPOTrainer(
                agents=agents,
                tokenizer=tok,
                model_config=TOOL,
                train_dataset=PLAIN_ROWS,
                reward_func=length_sum,
                args=small_config(tmp_path),
            )


def test_one_tokenizer_over_different_vocabularies_names_the_agents(tmp_path, model_folder):
    wide = save_model(tmp_path / "wide", tiny_llama, char_tokenizer(MIXED))
    rows = len(char_tokenizer(MIXED))
    with pytest.raises(ValueError, match=rf"agents 0 and 2 share a tokenizer but have 35 and {rows} embedding rows"):
        MAGRPOTrainer(
            agents=[model_folder, model_folder, wide],
            tokenizer=char_tokenizer(),
            model_config=TOOL,
            train_dataset=PLAIN_ROWS,
            reward_func=length_sum,
            args=small_config(tmp_path),
        )


def iac(tmp_path, agent_folder, rows=TOOL_ROWS, **kwargs) -> IACTrainer:
    args = IACConfig(
        num_train_epochs=1,
        per_device_train_batch_size=2,
        num_generations=2,
        max_new_tokens=4,
        output_dir=str(tmp_path / "run"),
    )
    return IACTrainer(
        agent_model=agent_folder,
        model_config=TOOL,
        train_dataset=rows,
        reward_func=length_sum,
        args=args,
        **kwargs,
    )


def test_a_critic_reading_with_an_agents_tokenizer_is_resized_when_loaded_by_name(tmp_path, model_folder):
    tiny_gpt2(char_tokenizer(), seed=3).save_pretrained(tmp_path / "critic")  # 1.4.3 saved no tokenizer
    trainer = iac(tmp_path, model_folder, critic_model=str(tmp_path / "critic"))
    for c, critic in enumerate(trainer.critics):
        assert critic.tokenizer is trainer.agents.tokenizers[c]
        assert rows_of(critic.backbone) == (len(critic.tokenizer), len(critic.tokenizer))
    trainer.training_step([0, 1])


def test_a_critic_with_its_own_tokenizer_is_left_as_it_is(tmp_path, model_folder):
    critic = save_model(tmp_path / "critic", tiny_gpt2)
    trainer = iac(tmp_path, model_folder, PLAIN_ROWS, critic_model=critic)  # its tokenizer cannot spell "<tool>"
    assert all(len(c.tokenizer) == rows_of(c.backbone)[0] == len(char_tokenizer()) for c in trainer.critics)


def test_a_critic_passed_in_reading_with_an_agents_tokenizer_is_refused(tmp_path, model_folder):
    tok = char_tokenizer()
    with pytest.raises(ValueError, match=r"critic 0's tokenizer holds 36 tokens .* passed in as an object"):
        iac(
            tmp_path,
            model_folder,
            tokenizer=tok,
            critics=[tiny_gpt2(tok, seed=c) for c in range(2)],
            critic_tokenizer=tok,
        )
