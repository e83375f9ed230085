"""What comlrl 1.4.3's docs wrote and 1.4.3's code ignored, run here: the names its README and
older pages used (which 1.4.3 itself refused) mean what those pages meant, and the settings
1.4.3 accepted without using them are accepted with a one-time warning that says so, keeping
the meaning they had (nothing). Each test is written from 1.4.3's source and docs."""

import warnings

import pytest

import comlrl.utils.caller as caller
from comlrl.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

from .helpers import DATA, MIXED, char_tokenizer, length_sum, small_config, tiny_gpt2, tiny_llama


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    """These warnings come once per process; each test sees its own first time."""
    monkeypatch.setattr(caller, "_WARNED", set())


def actor_critic(trainer_class=IACTrainer, tokenizer=None, **kwargs):
    tok = tokenizer or char_tokenizer()
    config_class = IACConfig if trainer_class is IACTrainer else MAACConfig
    kwargs.setdefault("args", config_class(num_train_epochs=1, num_generations=2, max_new_tokens=4))
    return trainer_class(
        agents=[tiny_llama(tok, seed=i) for i in range(2)],
        tokenizer=tok,
        train_dataset=DATA,
        reward_func=length_sum,
        **kwargs,
    )


# ------------------------------------------------------------------------------ the docs' names
def test_model_is_the_docs_name_of_agent_model(tmp_path, model_folder):
    """The original's README: MAGRPOTrainer(model="...", ...); 1.4.3 took agent_model=."""
    trainer = MAGRPOTrainer(model=model_folder, reward_func=length_sum, train_dataset=DATA, args=small_config(tmp_path))
    assert trainer.num_agents == 2
    assert all(agent.name_or_path == model_folder for agent in trainer.agents)
    assert trainer.agents[0] is not trainer.agents[1]
    with pytest.raises(TypeError, match="got multiple values for argument 'agent_model'"):
        MAGRPOTrainer(model=model_folder, agent_model=model_folder, reward_func=length_sum, train_dataset=DATA)


def test_termination_threshold_is_the_docs_name_of_early_termination_threshold():
    with pytest.warns(
        FutureWarning, match="termination_threshold is older comlrl docs' name for early_termination_threshold"
    ):
        config = MAGRPOConfig(termination_threshold=-0.2)
    assert config.early_termination_threshold == -0.2 and config.termination_threshold is None
    with pytest.raises(
        ValueError,
        match=r"termination_threshold=0.5 \(older comlrl docs' name .*\) and early_termination_threshold=0.1 disagree",
    ):
        MAGRPOConfig(termination_threshold=0.5, early_termination_threshold=0.1)


def test_critic_model_name_or_path_is_the_docs_config_field_for_critic_model(model_folder):
    """An older page listed critic_model_name_or_path among IACConfig's fields."""
    args = IACConfig(num_train_epochs=1, num_generations=2, max_new_tokens=4, critic_model_name_or_path=model_folder)
    with pytest.warns(FutureWarning, match=rf"write IACTrainer\(critic_model='{model_folder}'\)"):
        trainer = actor_critic(args=args)
    assert [critic.backbone.name_or_path for critic in trainer.critics] == [model_folder] * 2
    assert trainer.critics[0].backbone is not trainer.critics[1].backbone  # a copy per agent, as critic_model=
    with pytest.raises(ValueError, match="name different critics: pass only critic_model="):
        actor_critic(args=args, critic_model="another/model")
    with pytest.raises(ValueError, match="critic_model_name_or_path must be a folder or hub id"):
        IACConfig(critic_model_name_or_path=tiny_gpt2(char_tokenizer()))


# ------------------------------------------------------------------------------ ignored settings
def test_critic_model_kwargs_without_a_critic_to_load_warn_that_they_have_no_effect():
    """1.4.3 read critic_model_kwargs only when it loaded a critic by name."""
    model_config = {"critic_model_kwargs": {"torch_dtype": "float32"}}
    match = r"model_config\['critic_model_kwargs'\] has no effect: no critic model is loaded"
    with pytest.warns(UserWarning, match=match):
        actor_critic(
            args=IACConfig(use_separate_critic=False, num_generations=2, max_new_tokens=4), model_config=model_config
        )
    tok = char_tokenizer(MIXED + "[]\n")
    with pytest.warns(UserWarning, match="has no effect: the critics are given as models, not loaded"):
        actor_critic(MAACTrainer, tok, critic_model=tiny_gpt2(tok, seed=5), model_config=model_config)


def test_discount_below_one_with_several_turns_says_that_1_4_3_ignored_it():
    """1.4.3's MAGRPO declared discount and never read it; here it discounts, and says so."""
    with pytest.warns(UserWarning, match=r"discount=0.9 discounts each next turn's return here; comlrl 1.4.3 ignored"):
        MAGRPOConfig(discount=0.9, num_turns=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        MAGRPOConfig(discount=0.9, num_turns=1)  # one turn: nothing to discount, nothing to say
        MAGRPOConfig(discount=1.0, num_turns=2)
