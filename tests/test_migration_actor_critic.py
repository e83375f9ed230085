"""Code written against comlrl 1.4.3's IAC and MAAC, run here: each test is written from 1.4.3's
call shape and asserts that it means what it meant there, or stops with an error that names
what to write instead. 1.4.3-layout folders are written by hand (its save_model: agent_{i}/,
the critics' models under agent_{i}/critic/ or critic/ without a tokenizer, value heads as
torch-saved value_head.pt state dicts of pre_projection.0 and value_projection)."""

import dataclasses
import warnings

import pytest
import torch

import comlrl.utils.caller as trainer_config
from comlrl.models.value import last_token_hidden
from comlrl.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer
from comlrl.trainers.actor_critic.critics import joint_critic_text

from .helpers import DATA, MIXED, char_tokenizer, length_sum, tiny_gpt2, tiny_llama

JOINT_TOKENIZER = char_tokenizer(MIXED + "[]\n")  # encodes MAAC's joint critic input "[Agent 0] ..."
WIDTH = 32  # hidden size of the tiny models


@pytest.fixture(autouse=True)
def fresh_rename_warnings(monkeypatch):
    """Renamed fields warn once per process; each test sees its own first time."""
    monkeypatch.setattr(trainer_config, "_WARNED", set())


def config(config_class=IACConfig, tmp_path=None, **overrides):
    values = dict(num_train_epochs=1, per_device_train_batch_size=2, num_generations=2, max_new_tokens=4)
    if tmp_path is not None:
        values["output_dir"] = str(tmp_path / "run")
    return config_class(**{**values, **overrides})


def build(trainer_class=IACTrainer, tokenizer=None, args=None, **kwargs):
    """Two tiny agents; a 1.4.3 trainer's other arguments as given (critic instances read with
    the agents' tokenizer unless told otherwise)."""
    tok = tokenizer or char_tokenizer()
    if not isinstance(kwargs.get("critic_model", ""), str) or any(
        not isinstance(c, str) for c in kwargs.get("critics", ())
    ):
        kwargs.setdefault("critic_tokenizer", tok)
    config_class = IACConfig if trainer_class is IACTrainer else MAACConfig
    return trainer_class(
        agents=[tiny_llama(tok, seed=i) for i in range(2)],
        tokenizer=tok,
        train_dataset=DATA,
        reward_func=length_sum,
        args=args or config(config_class),
        **kwargs,
    )


def original_head(hidden_dim=None, seed=0, dtype=torch.float32):
    """A value head's state dict as comlrl 1.4.3's ``torch.save(value_head.state_dict())`` wrote it."""
    generator = torch.Generator().manual_seed(seed)
    state = {}
    if hidden_dim:
        state["pre_projection.0.weight"] = torch.randn(hidden_dim, WIDTH, generator=generator)
        state["pre_projection.0.bias"] = torch.randn(hidden_dim, generator=generator)
    state["value_projection.weight"] = torch.randn(1, hidden_dim or WIDTH, generator=generator)
    state["value_projection.bias"] = torch.randn(1, generator=generator)
    return {k: v.to(dtype) for k, v in state.items()}


def write_original_critic(folder, model, head):
    """A critic as 1.4.3's save_model wrote it: the model, value_head.pt, no tokenizer."""
    model.save_pretrained(folder)
    torch.save(head, folder / "value_head.pt")


def original_values(backbone, head, inputs):
    """What 1.4.3's critic computed: value_projection(tanh(pre_projection(h))) at the last token."""
    hidden = last_token_hidden(backbone, inputs.input_ids, inputs.attention_mask).float()
    head = {k: v.float() for k, v in head.items()}
    if "pre_projection.0.weight" in head:
        hidden = torch.tanh(hidden @ head["pre_projection.0.weight"].T + head["pre_projection.0.bias"])
    return hidden @ head["value_projection.weight"].T + head["value_projection.bias"]


# ---------------------------------------------------------------------------------------- config fields
@pytest.mark.parametrize("config_class", [IACConfig, MAACConfig])
def test_discount_is_gamma_with_a_one_time_warning(config_class):
    with pytest.warns(FutureWarning, match="discount is comlrl 1.4.3's name for gamma; write gamma=0.9"):
        args = config_class(discount=0.9)
    assert args.gamma == 0.9 and args.discount is None
    with pytest.raises(ValueError, match="discount=0.9 .* and gamma=0.5 disagree: set only gamma"):
        config_class(discount=0.9, gamma=0.5)


@pytest.mark.parametrize("config_class", [IACConfig, MAACConfig])
def test_the_discount_warning_says_the_original_one_step_target_is_gae_lambda_0(config_class):
    # 1.4.3 (iac.py/maac.py _collect_rollouts_multi_turn): target = r + discount * V(next turn),
    # the advantage target - V: TD(0), which is gae_lambda=0 here, not the default 0.95.
    with pytest.warns(FutureWarning) as caught:
        config_class(discount=0.9, num_turns=2)
    message = str(caught[0].message)
    assert "write gamma=0.9 and gae_lambda=0" in message and "r + discount * V(next turn)" in message
    assert "gae_lambda=0.95 mixes in the Monte-Carlo return" in message
    trainer_config._WARNED.clear()
    with pytest.warns(FutureWarning) as caught:  # gae_lambda=0 already: nothing more to say
        config_class(discount=0.9, gae_lambda=0.0)
    assert str(caught[0].message).endswith("discount is comlrl 1.4.3's name for gamma; write gamma=0.9")


# 1.4.3's actor-critic buffer held rollout_buffer_size samples per agent, and each dataset row
# added num_generations x num_turns of them (ac_base.py _run_batch): with a buffer of 2, G=2
# updated after every row, and so did T=2 (one sample per turn), as its trainer shows when run.
@pytest.mark.parametrize(
    "overrides,advice",
    [
        (dict(num_generations=2), "write per_device_train_batch_size=4 (rollout_buffer_size // 2"),
        (dict(num_turns=2), "write per_device_train_batch_size=4 (rollout_buffer_size // 2"),
        (dict(num_generations=4, num_turns=2), "write per_device_train_batch_size=1 (rollout_buffer_size // 8"),
        (dict(num_generations=16), "write per_device_train_batch_size=1 (rollout_buffer_size // 16"),
    ],
)
def test_the_rollout_buffer_size_warning_states_its_unit_and_the_rows_it_means(overrides, advice):
    with pytest.warns(FutureWarning) as caught:
        args = IACConfig(rollout_buffer_size=8, **overrides)
    message = str(caught[0].message)
    per_row = overrides.get("num_generations", 1) * overrides.get("num_turns", 1)
    assert (
        "rollout_buffer_size is comlrl 1.4.3's name for per_device_train_batch_size; 1.4.3 counted samples" in message
    )
    assert f"taken as 8 rows ({8 * per_row} samples per agent and step)" in message and advice in message
    assert args.per_device_train_batch_size == 8  # moved as it is; the warning says what 1.4.3's buffer was
    assert "minibatches" not in message  # train_batch_size unset: nothing to convert


def test_the_rollout_buffer_size_warning_converts_train_batch_size_too():
    # 1.4.3's train_batch_size counted the samples of one turn (minibatches of a turn group):
    # with G=4, 4 samples were one row's.
    with pytest.warns(FutureWarning) as caught:
        MAACConfig(rollout_buffer_size=8, train_batch_size=4, num_generations=4)
    assert "for 1.4.3's minibatches write train_batch_size=1" in str(caught[0].message)


@pytest.mark.parametrize("config_class", [IACConfig, MAACConfig])
def test_the_rollout_buffer_size_warning_is_the_plain_rename_when_a_row_is_one_sample(config_class):
    with pytest.warns(FutureWarning) as caught:
        config_class(rollout_buffer_size=8, train_batch_size=4)
    name = config_class.__name__
    assert str(caught[0].message) == (
        f"{name}: rollout_buffer_size is comlrl 1.4.3's name for per_device_train_batch_size; "
        "write per_device_train_batch_size=8"
    )


@pytest.mark.parametrize("config_class", [IACConfig, MAACConfig])
@pytest.mark.parametrize("spelling,meaning", [("Q", "q"), ("V", "v"), ("q", "q"), (None, "v")])
def test_critic_type_is_read_as_the_original_read_it(config_class, spelling, meaning):
    # 1.4.3: critic_type = (critic_type or "v").lower()
    assert config_class(critic_type=spelling).critic_type == meaning


def test_a_critic_type_the_original_refused_is_refused():
    with pytest.raises(ValueError, match=r"critic_type='qv'; expected one of \['q', 'v'\]"):
        IACConfig(critic_type="qv")


@pytest.mark.parametrize(
    "config_class,original",
    [
        (
            IACConfig,
            dict(use_separate_critic=True, critic_value_head_hidden_dim=None, value_head_hidden_dim=None),
        ),
        (MAACConfig, {}),
    ],
)
def test_every_field_of_an_original_config_is_accepted_with_its_meaning(config_class, original):
    """1.4.3's IACConfig/MAACConfig fields, each set to its 1.4.3 default, as a saved YAML of it would."""
    shared = dict(
        agent_learning_rate=5e-6,
        critic_learning_rate=5e-6,
        rollout_buffer_size=8,
        train_batch_size=None,
        value_loss_coef=0.6,
        advantage_normalization=True,
        max_new_tokens=256,
        temperature=0.6,
        top_p=0.6,
        num_train_epochs=40,
        critic_type="v",
        num_agents=2,
        num_turns=2,
        parallel_training="none",
        agent_devices=None,
        critic_devices=None,
        external_prompt_passthrough=False,
        discount=1.0,
        num_generations=1,
        eval_interval=16,
        eval_num_samples=4,
        eval_batch_size=1,
        early_termination_threshold=-0.2,
        logging_steps=1,
        reference_kl_enabled=False,
        reference_kl_coef=0.1,
        reference_devices=None,
    )
    values = {**shared, **original}
    if config_class is IACConfig:
        values["value_clip_range"] = 0.2
    with pytest.warns(FutureWarning, match="comlrl 1.4.3's name"):  # rollout_buffer_size, discount
        args = config_class(**values)
    renamed = {"rollout_buffer_size": "per_device_train_batch_size", "discount": "gamma"}
    for name, value in values.items():
        assert getattr(args, renamed.get(name, name)) == value, name


@pytest.mark.parametrize("config_class", [IACConfig, MAACConfig])
def test_defaults_are_the_original_actor_critic_ones_where_they_were_sound(config_class):
    args = config_class()
    assert (args.num_train_epochs, args.logging_steps) == (40, 1)
    assert (args.critic_learning_rate, args.value_loss_coef) == (5e-6, 0.6)
    assert (args.per_device_train_batch_size, args.num_generations, args.gamma) == (8, 1, 1.0)


def test_critic_learning_rate_none_is_the_agents_rate():
    assert IACConfig(agent_learning_rate=3e-6, critic_learning_rate=None).critic_learning_rate == 3e-6
    with pytest.raises(ValueError, match="critic_learning_rate=None takes agent_learning_rate, which is a list"):
        IACConfig(agent_learning_rate=[1e-6, 2e-6], critic_learning_rate=None, use_separate_critic=True)
    args = config(agent_learning_rate=[1e-6, 2e-6], critic_learning_rate=None)
    with pytest.raises(ValueError, match="give critic_learning_rate a number for the separate critics"):
        build(args=args, critics=[tiny_gpt2(char_tokenizer(), seed=c) for c in range(2)])
    trainer = build(args=args)  # value heads on the agents: each at its agent's rate
    assert trainer.learners.learning_rates() == [1e-6, 2e-6, 1e-6, 2e-6]


def learning_rates_per_step(trainer, steps):
    """Every learner's learning rate after each of ``steps`` training steps."""
    rates = []
    for step in range(steps):
        trainer.training_step([step % 2])
        rates.append(dict(zip(trainer.learners.names, trainer.learners.learning_rates())))
    return rates


@pytest.mark.parametrize("critic_learning_rate", [5e-6, None])
def test_value_heads_on_the_agents_train_at_their_agents_rate_and_schedule(tmp_path, critic_learning_rate):
    """1.4.3 (iac.py): with use_separate_critic=False each agent was a CausalLMWithValueHead and
    one AdamW over agent_model.parameters() at agent_learning_rate trained the head too;
    critic_learning_rate was not used."""
    args = config(
        IACConfig,
        tmp_path,
        use_separate_critic=False,
        agent_learning_rate=[1e-4, 2e-4],
        critic_learning_rate=critic_learning_rate,
        lr_scheduler_type="linear",
        warmup_ratio=0.5,
        ppo_epochs=1,
        per_device_train_batch_size=1,
        num_train_epochs=2,  # 6 steps: 3 warming up, 3 decaying
    )
    trainer = build(args=args)
    assert trainer.learners.names == ["agent 0", "agent 1", "critic 0", "critic 1"]
    assert trainer.learners.learning_rates() == [0.0] * 4  # warming up from 0
    for rates in learning_rates_per_step(trainer, 4):
        assert rates["critic 0"] == rates["agent 0"] and rates["critic 1"] == rates["agent 1"]
        assert rates["agent 1"] == pytest.approx(2 * rates["agent 0"]) and rates["agent 0"] > 0


@pytest.mark.parametrize("use_separate_critic", [False, None])
def test_a_critic_learning_rate_value_heads_ignore_warns_in_the_original_layout_else_is_refused(use_separate_critic):
    """1.4.3 ignored critic_learning_rate for heads on the agents (use_separate_critic=False):
    that script runs, with a warning that it has no effect. Heads on the agents because no critic
    is given is this library's layout (1.4.3 required a critic there): a no-op there is an error."""
    match = (
        r"critic_learning_rate=0.001 has no effect with value heads on the agents \({}\): the heads train with "
        r"their agent at agent_learning_rate, as in comlrl 1.4.3; drop critic_learning_rate"
    )
    if use_separate_critic is False:
        with pytest.warns(UserWarning, match=match.format("use_separate_critic=False")):
            trainer = build(args=config(use_separate_critic=False, critic_learning_rate=1e-3))
        assert trainer.learners.learning_rates() == [5e-6] * 4  # the heads at their agent's rate, as in 1.4.3
    else:
        with pytest.raises(ValueError, match=match.format("no critic_model/critics given")):
            build(args=config(use_separate_critic=use_separate_critic, critic_learning_rate=1e-3))
    # The default, None and the agents' own rate mean what the heads do anyway.
    for rate in (5e-6, None, 1e-3):
        build(args=config(use_separate_critic=use_separate_critic, critic_learning_rate=rate, agent_learning_rate=1e-3))


def test_separate_critics_train_at_critic_learning_rate():
    args = config(agent_learning_rate=1e-4, critic_learning_rate=1e-3)
    trainer = build(args=args, critics=[tiny_gpt2(char_tokenizer(), seed=c) for c in range(2)])
    assert trainer.learners.learning_rates() == [1e-4, 1e-4, 1e-3, 1e-3]


def test_a_single_sample_step_keeps_its_unwhitened_advantage_as_in_the_original(tmp_path):
    """1.4.3 (ac_base.py _prepare_advantages) whitened only more than one advantage: a buffer of
    one sample per agent trained on r - V. Here a step of one row and one generation does too."""
    args = config(IACConfig, tmp_path, per_device_train_batch_size=1, num_generations=1)
    assert args.advantage_normalization
    trainer = build(args=args)
    with torch.no_grad():
        for critic in trainer.critics:
            critic.head.layers[-1].bias.fill_(0.25)  # V = 0.25 for every input
    tree = trainer.rollout(trainer.train_prompts, [0])
    estimate = trainer.objective.estimate(tree)
    rewards = tree.turns[0].rewards  # (1, 1, N)
    for i in range(2):
        assert estimate.advantages[i][0].tolist() == pytest.approx([rewards[0, 0, i].item() - 0.25])


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("use_separate_critic", "yes", "use_separate_critic must be True or False"),
        ("critic_value_head_hidden_dim", 0, "critic_value_head_hidden_dim must be an integer >= 1 or None"),
        ("critic_devices", 0, "critic_devices must be None, 'auto', a device name or a list of device names"),
        ("critic_devices", [], "critic_devices must be None, 'auto', a device name or a list of device names"),
    ],
)
def test_bad_original_critic_fields_are_named(field, value, match):
    with pytest.raises(ValueError, match=match):
        IACConfig(**{field: value})


@pytest.mark.parametrize(
    "overrides,separate,width",
    [
        ({"critic_value_head_hidden_dim": 16}, True, 16),
        ({"value_head_hidden_dim": 8}, False, 8),
        ({"value_head_hidden_dim": 8, "critic_value_head_hidden_dim": 8}, True, 8),
        ({"value_head_hidden_dim": 8, "critic_value_head_hidden_dim": 8}, False, 8),
        ({}, True, None),
    ],
)
def test_each_head_width_sizes_the_heads_of_its_layout(overrides, separate, width):
    assert IACConfig(**overrides).value_head_width(separate) == width


@pytest.mark.parametrize(
    "overrides,separate,match,width",
    [
        (
            {"value_head_hidden_dim": 8},
            True,
            r"value_head_hidden_dim=8 has no effect: the critics are separate models, sized by "
            r"critic_value_head_hidden_dim=None; write critic_value_head_hidden_dim=8, or drop value_head_hidden_dim",
            None,
        ),
        (
            {"critic_value_head_hidden_dim": 16, "use_separate_critic": False},
            False,
            r"critic_value_head_hidden_dim=16 has no effect: the value heads sit on the agents' models",
            None,
        ),
        (
            {"value_head_hidden_dim": 8, "critic_value_head_hidden_dim": 16},
            True,
            r"value_head_hidden_dim=8 has no effect: .* critic_value_head_hidden_dim=16; drop value_head_hidden_dim",
            16,
        ),
    ],
)
def test_a_head_width_the_original_ignored_warns_and_sizes_nothing(overrides, separate, match, width):
    """1.4.3's IAC ignored the width of the layout not in use: the script runs, with a warning,
    and the heads are sized as 1.4.3 sized them."""
    critics = {"critics": [tiny_gpt2(char_tokenizer(), seed=c) for c in range(2)]} if separate else {}
    with pytest.warns(UserWarning, match=match):
        trainer = build(args=config(**overrides), **critics)
    assert all(critic.head.hidden_dim == width for critic in trainer.critics)


@pytest.mark.parametrize(
    "overrides,separate,match",
    [
        (
            {"value_head_hidden_dim": 8},
            True,
            r"value_head_hidden_dim=8 would be ignored: the critics are separate models, sized by "
            r"critic_value_head_hidden_dim=None; write critic_value_head_hidden_dim=8, or drop value_head_hidden_dim",
        ),
        (
            {"critic_value_head_hidden_dim": 16},
            False,
            r"critic_value_head_hidden_dim=16 would be ignored: the value heads sit on the agents' models",
        ),
    ],
)
def test_a_head_width_that_would_be_ignored_outside_the_original_layouts_is_refused(overrides, separate, match):
    """Where 1.4.3 had no such field (MAAC) or no such layout (heads on the agents because no
    critic is given), a width that does nothing is an error, not a silent no-op."""
    with pytest.raises(ValueError, match=match):
        IACConfig(**overrides).value_head_width(separate)
    if not separate:
        with pytest.raises(ValueError, match=match):
            build(args=config(**overrides))
    else:
        with pytest.raises(ValueError, match=match):
            build(
                MAACTrainer, JOINT_TOKENIZER, config(MAACConfig, **overrides), critic_model=tiny_gpt2(JOINT_TOKENIZER)
            )


# ---------------------------------------------------------------------------------------- use_separate_critic
def test_use_separate_critic_without_a_critic_is_refused_naming_critic_model():
    with pytest.raises(
        ValueError, match=r"use_separate_critic=True needs the critics: critic_model=<folder or hub id>"
    ):
        build(args=config(use_separate_critic=True))


def test_use_separate_critic_false_with_a_critic_warns_and_puts_the_heads_on_the_agents():
    """1.4.3 loaded no critic with use_separate_critic=False, whatever critic_model/critics said."""
    match = "critic_model/critics has no effect with use_separate_critic=False: the value heads sit on the agents'"
    with pytest.warns(UserWarning, match=match):
        trainer = build(
            args=config(use_separate_critic=False), critics=[tiny_gpt2(char_tokenizer(), seed=c) for c in range(2)]
        )
    assert [critic.agent for critic in trainer.critics] == [0, 1]
    assert all(critic.backbone is agent for critic, agent in zip(trainer.critics, trainer.agents))


def test_use_separate_critic_false_puts_sized_value_heads_on_the_agents():
    trainer = build(args=config(use_separate_critic=False, value_head_hidden_dim=8))
    assert [critic.agent for critic in trainer.critics] == [0, 1]
    assert all(critic.backbone is agent for critic, agent in zip(trainer.critics, trainer.agents))
    assert all(critic.head.hidden_dim == 8 for critic in trainer.critics)


def test_use_separate_critic_true_uses_the_given_critics_sized_by_their_width():
    tok = char_tokenizer()
    args = config(use_separate_critic=True, critic_value_head_hidden_dim=16)
    trainer = build(args=args, critics=[tiny_gpt2(tok, seed=c) for c in range(2)], critic_tokenizer=tok)
    assert all(critic.agent is None and critic.head.hidden_dim == 16 for critic in trainer.critics)


def test_maac_refuses_use_separate_critic_false_and_accepts_true():
    critic = tiny_gpt2(JOINT_TOKENIZER, seed=5)
    with pytest.raises(ValueError, match="MAAC's centralized critic is always a separate model"):
        build(MAACTrainer, JOINT_TOKENIZER, config(MAACConfig, use_separate_critic=False), critic_model=critic)
    trainer = build(MAACTrainer, JOINT_TOKENIZER, config(MAACConfig, use_separate_critic=True), critic_model=critic)
    assert trainer.critics[0].backbone is critic


# ---------------------------------------------------------------------------------------- model_config keys
def test_maac_critic_value_head_hidden_dim_in_model_config_sizes_its_critic():
    """1.4.3's MAAC read its critic's head width from model_config."""
    critic = tiny_gpt2(JOINT_TOKENIZER, seed=5)
    model_config = {"critic_value_head_hidden_dim": 16}
    trainer = build(MAACTrainer, JOINT_TOKENIZER, critic_model=critic, model_config=model_config)
    assert trainer.critics[0].head.hidden_dim == 16
    with pytest.raises(ValueError, match=r"model_config\['critic_value_head_hidden_dim'\]=16 and "):
        build(
            MAACTrainer,
            JOINT_TOKENIZER,
            config(MAACConfig, critic_value_head_hidden_dim=8),
            critic_model=tiny_gpt2(JOINT_TOKENIZER, seed=5),
            model_config=model_config,
        )


def test_iac_warns_that_the_model_config_head_width_it_ignored_has_no_effect():
    tok = char_tokenizer()
    match = r"has no effect: it was comlrl 1.4.3 MAAC's setting; write IACConfig\(critic_value_head_hidden_dim=...\)"
    with pytest.warns(UserWarning, match=match):
        trainer = build(
            critics=[tiny_gpt2(tok, seed=c) for c in range(2)], model_config={"critic_value_head_hidden_dim": 16}
        )
    assert all(critic.head.hidden_dim is None for critic in trainer.critics)


def test_critic_model_kwargs_load_the_critics_only(tmp_path):
    tok = char_tokenizer()
    tiny_gpt2(tok, seed=3).save_pretrained(tmp_path / "critic")
    tok.save_pretrained(tmp_path / "critic")
    model_config = {"critic_model_kwargs": {"dtype": torch.bfloat16}}
    trainer = build(critic_model=str(tmp_path / "critic"), model_config=model_config)
    assert all(next(c.backbone.parameters()).dtype == torch.bfloat16 for c in trainer.critics)
    assert all(next(agent.parameters()).dtype == torch.float32 for agent in trainer.agents)


# ---------------------------------------------------------------------------------------- critic arguments
def test_critics_as_folders_load_one_separate_critic_each(tmp_path):
    tok = char_tokenizer()
    saved = [tiny_gpt2(tok, seed=10 + c) for c in range(2)]
    for c, model in enumerate(saved):
        model.save_pretrained(tmp_path / f"c{c}")
        tok.save_pretrained(tmp_path / f"c{c}")
    trainer = build(critics=[str(tmp_path / "c0"), str(tmp_path / "c1")])
    assert trainer.critics[0].backbone is not trainer.critics[1].backbone
    for critic, model in zip(trainer.critics, saved):
        assert critic.agent is None and len(critic.tokenizer) == len(tok)
        for key, tensor in model.state_dict().items():
            assert torch.equal(critic.backbone.state_dict()[key], tensor), key


def test_critic_model_with_critics_naming_the_same_model_uses_critics(tmp_path):
    """1.4.3's resolve_model_sources: both given is a consistency check, and critics is used."""
    tok = char_tokenizer()
    folder = str(tmp_path / "critic")
    tiny_gpt2(tok, seed=3).save_pretrained(folder)
    tok.save_pretrained(folder)
    instance = tiny_gpt2(tok, seed=4)
    instance.config._name_or_path = folder
    trainer = build(critic_model=folder, critics=[folder, instance])
    assert trainer.critics[1].backbone is instance
    with pytest.raises(ValueError, match=r"critic_model='elsewhere' and critics=\[.*\] name different models"):
        build(critic_model="elsewhere", critics=[folder, folder])


def test_critics_as_one_name_is_refused_naming_critic_model(tmp_path):
    with pytest.raises(
        TypeError, match=r"critics='x' is one name; pass critics=\[one per critic\], or critic_model='x'"
    ):
        build(critics="x")


# ---------------------------------------------------------------------------------------- saved layouts
@pytest.mark.parametrize("hidden_dim", [None, 16])
def test_an_iac_run_saved_by_the_original_library_loads_the_same_critics(tmp_path, hidden_dim):
    tok = char_tokenizer()
    critics = [tiny_gpt2(tok, seed=20 + c) for c in range(2)]
    heads = [original_head(hidden_dim, seed=c, dtype=torch.bfloat16) for c in range(2)]
    for c in range(2):
        tiny_llama(tok, seed=c).save_pretrained(tmp_path / f"agent_{c}")
        tok.save_pretrained(tmp_path / f"agent_{c}")
        write_original_critic(tmp_path / f"agent_{c}" / "critic", critics[c], heads[c])
    args = config(critic_value_head_hidden_dim=hidden_dim)
    with pytest.warns(
        UserWarning, match=r"critic \d starts from comlrl 1.4.3's value head .*agent_\d/critic/value_head.pt"
    ):
        trainer = build(args=args, critics=[str(tmp_path / f"agent_{c}" / "critic") for c in range(2)])
    for c, critic in enumerate(trainer.critics):
        assert critic.tokenizer is trainer.agents.tokenizers[c]  # the folder holds none: its agent's, as 1.4.3
        for key, tensor in critics[c].state_dict().items():
            assert torch.equal(critic.backbone.state_dict()[key], tensor), key
        inputs = critic.encode(["a cat", "tell me, why?"], str)
        with torch.no_grad():
            torch.testing.assert_close(
                critic.values(inputs, slice(None)), original_values(critic.backbone, heads[c], inputs)
            )


def test_an_original_head_of_another_width_names_the_setting(tmp_path):
    tok = char_tokenizer()
    write_original_critic(tmp_path / "critic", tiny_gpt2(tok, seed=1), original_head(16))
    with pytest.raises(
        ValueError,
        match=r"holds a value head with hidden width 16, this one has None: set critic_value_head_hidden_dim=16",
    ):
        build(critic_model=str(tmp_path / "critic"))


def test_a_maac_critic_saved_by_the_original_library_gives_every_agent_its_one_value(tmp_path):
    """1.4.3's MAAC critic had one output shared by the agents; here each agent has an output,
    and each starts as that one."""
    model, head = tiny_gpt2(JOINT_TOKENIZER, seed=7), original_head(16, seed=3)
    write_original_critic(tmp_path / "critic", model, head)
    with pytest.warns(UserWarning, match="starts from comlrl 1.4.3's value head"):
        trainer = build(
            MAACTrainer,
            JOINT_TOKENIZER,
            critic_model=str(tmp_path / "critic"),
            model_config={"critic_value_head_hidden_dim": 16},
        )
    critic = trainer.critics[0]
    assert critic.tokenizer is trainer.agents.tokenizers[0]
    inputs = critic.encode([joint_critic_text(["a cat", "a cat"])], str)
    with torch.no_grad():
        expected = original_values(critic.backbone, head, inputs).expand(-1, 2)
        torch.testing.assert_close(critic.values(inputs, slice(None)), expected)


def test_a_saved_critic_folder_of_ours_continues_with_its_head(tmp_path):
    tok = char_tokenizer()
    trainer = build(critics=[tiny_gpt2(tok, seed=c) for c in range(2)], critic_tokenizer=tok)
    for critic in trainer.critics:
        torch.nn.init.normal_(critic.head.layers[-1].weight)
    trainer.save_model(str(tmp_path / "saved"))
    again = build(critics=[str(tmp_path / "saved" / f"critic_{c}") for c in range(2)])
    for before, after in zip(trainer.critics, again.critics):
        assert torch.equal(before.head.layers[-1].weight, after.head.layers[-1].weight)


def test_a_folder_with_both_head_files_is_refused(tmp_path):
    tok = char_tokenizer()
    trainer = build(critics=[tiny_gpt2(tok, seed=c) for c in range(2)], critic_tokenizer=tok)
    trainer.save_model(str(tmp_path / "saved"))
    torch.save(original_head(), tmp_path / "saved" / "critic_0" / "value_head.pt")
    with pytest.raises(
        ValueError, match=r"critic_0 holds two value heads \(value_head.safetensors and value_head.pt\)"
    ):
        build(critic_model=str(tmp_path / "saved" / "critic_0"))


def test_maacs_joint_critic_input_is_laid_out_as_the_original_one():
    """A MAAC critic trained by 1.4.3 reads the text it learnt on."""
    assert joint_critic_text(["p0", "p1"]) == "[Agent 0] p0\n\n[Agent 1] p1"
    assert joint_critic_text(["p0", "p1"], ["c0", "c1"]) == (
        "[Agent 0] p0\n\n[Agent 1] p1\n\n[Joint Action]\n\n[Agent 0 action]\nc0\n\n[Agent 1 action]\nc1"
    )


# ---------------------------------------------------------------------------------------- critic_devices
@pytest.mark.parametrize("critic_devices", ["cpu", ["cpu"], ["cpu", "cpu"]])
def test_critic_devices_equal_to_the_agents_placement_are_accepted(critic_devices):
    tok = char_tokenizer()
    args = config(agent_devices="cpu", critic_devices=critic_devices)
    trainer = build(args=args, critics=[tiny_gpt2(tok, seed=c) for c in range(2)], critic_tokenizer=tok)
    assert all(next(c.backbone.parameters()).device.type == "cpu" for c in trainer.critics)


def test_critic_devices_elsewhere_than_the_agents_are_refused():
    tok = char_tokenizer()
    args = config(agent_devices="cpu", critic_devices=["cpu", "cuda:1"])
    with pytest.raises(
        ValueError, match=r"critic_devices=\['cpu', 'cuda:1'\] puts critic 1 on cuda:1, but it is on cpu"
    ):
        build(args=args, critics=[tiny_gpt2(tok, seed=c) for c in range(2)], critic_tokenizer=tok)


def test_critic_devices_of_value_heads_must_be_their_agents():
    build(args=config(critic_devices="cpu"))
    with pytest.raises(ValueError, match="a critic lives with its agent"):
        build(args=config(critic_devices="cuda:0"))


def test_critic_devices_with_use_separate_critic_false_warn_that_they_have_no_effect():
    """1.4.3 placed value heads with their agents and ignored critic_devices there."""
    with pytest.warns(UserWarning, match=r"critic_devices='cuda:0' has no effect with value heads on the agents"):
        trainer = build(args=config(use_separate_critic=False, critic_devices="cuda:0"))
    assert all(next(c.head.parameters()).device.type == "cpu" for c in trainer.critics)


def test_critic_models_that_name_no_source_read_with_their_agents_tokenizers():
    """1.4.3's IAC had no critic_tokenizer: it fed each critic its agent's token ids. A critic
    model built in the script (no folder or hub id to take a tokenizer from) reads so here."""
    tokenizers = [char_tokenizer(), char_tokenizer()]
    trainer = IACTrainer(
        agents=[tiny_llama(tokenizers[i], seed=i) for i in range(2)],
        tokenizer=tokenizers,
        critics=[tiny_gpt2(tokenizers[c], seed=c) for c in range(2)],
        train_dataset=DATA,
        reward_func=length_sum,
        args=config(),
    )
    assert [critic.tokenizer for critic in trainer.critics] == list(trainer.agents.tokenizers)
    assert trainer.critics[0].tokenizer is not trainer.critics[1].tokenizer


def test_maac_critic_devices_name_one_device():
    args = config(MAACConfig, agent_devices="cpu", critic_devices=["cpu", "cpu"])
    with pytest.raises(ValueError, match="critic_devices lists 2 devices for 1 critics; give one, or one per critic"):
        build(MAACTrainer, JOINT_TOKENIZER, args, critic_model=tiny_gpt2(JOINT_TOKENIZER, seed=5))


def test_original_field_names_are_all_declared():
    """Every field 1.4.3's IACConfig/MAACConfig declared exists here (renamed ones included)."""
    original = {
        "use_separate_critic",
        "critic_value_head_hidden_dim",
        "value_head_hidden_dim",
        "critic_devices",
        "discount",
        "value_clip_range",
        "value_loss_coef",
        "critic_learning_rate",
        "critic_type",
        "rollout_buffer_size",
    }
    for config_class in (IACConfig, MAACConfig):
        assert original <= {f.name for f in dataclasses.fields(config_class)}


def test_a_positional_call_in_the_originals_order_keeps_its_meaning(tmp_path):
    # 1.4.3: IACTrainer(agent_model, critic_model, tokenizer, reward_func, reward_processor,
    # formatters, args, train_dataset, ...)
    tok = char_tokenizer()
    agents = [tiny_llama(tok, i) for i in range(2)]
    trainer = IACTrainer(None, None, tok, length_sum, None, None, config(IACConfig, tmp_path), DATA, agents=agents)
    assert trainer.num_agents == 2 and trainer.reward.funcs == (length_sum,)
    assert trainer.train_prompts.rows == DATA and all(critic.agent is not None for critic in trainer.critics)


def test_train_batch_size_steps_actors_and_critics_once_per_minibatch(tmp_path):
    # 1.4.3's IAC: a buffer of rollout_buffer_size rows, minibatches of train_batch_size, one step each
    trainer = build(args=config(IACConfig, tmp_path, per_device_train_batch_size=2, train_batch_size=1, ppo_epochs=1))
    metrics = trainer.training_step([0, 1])
    steps = [int(opt.state[next(iter(opt.state))]["step"]) for opt in trainer.learners.optimizers]
    assert trainer.learners.names == ["agent 0", "agent 1", "critic 0", "critic 1"] and steps == [2, 2, 2, 2]
    assert metrics["critic0/value_loss"] >= 0


def iac_per_joint_action(tmp_path, reward, reward_call="per_joint_action", **kwargs):
    """IAC with two tiny agents, one sample per prompt (1.4.3's default) and ``reward``."""
    tok = char_tokenizer()
    return IACTrainer(
        agents=[tiny_llama(tok, seed=i) for i in range(2)],
        tokenizer=tok,
        train_dataset=DATA,
        reward_func=reward,
        args=config(IACConfig, tmp_path, num_generations=1, reward_call=reward_call),
        **kwargs,
    )


@pytest.mark.parametrize("reward_call", ["per_joint_action", "auto"])
def test_a_per_joint_action_reward_of_n_values_is_per_agent_as_in_the_original(tmp_path, reward_call):
    # 1.4.3's IAC called the reward per row (G=1: one joint action) and read N values as per
    # agent; "auto" sees 2 values for 2 joint actions of 2 agents, and tells the meanings apart
    def per_agent(completions1, completions2):
        return [float(len(completions1[0])), -float(len(completions2[0]))]

    trainer = iac_per_joint_action(tmp_path, per_agent, reward_call)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        turn = trainer.rollout(trainer.train_prompts, [0, 1]).turns[0]
    assert any("which called one at a time give other rewards" in str(w.message) for w in caught) == (
        reward_call == "auto"
    )
    lengths = [[len(text) for text in agent.texts] for agent in turn.agents]
    assert turn.rewards.reshape(-1, 2).tolist() == [[float(a), -float(b)] for a, b in zip(*lengths)]


def test_a_per_joint_action_reward_gets_every_agents_prompt_as_in_the_original(tmp_path):
    # 1.4.3's IAC passed prompts= (or the first positional) as the N agents' prompts of the turn
    seen = []

    def reward(completions1, completions2, prompts=None):
        seen.append(prompts)
        return [1.0]

    trainer = iac_per_joint_action(
        tmp_path, reward, formatters=[lambda row: "a: " + row["prompt"], lambda row: "b: " + row["prompt"]]
    )
    trainer.rollout(trainer.train_prompts, [0, 1])
    assert seen == [["a: " + DATA[r]["prompt"], "b: " + DATA[r]["prompt"]] for r in (0, 1)]


def test_agents_saved_with_their_value_heads_continue_from_them(tmp_path):
    trainer = build(args=config(IACConfig, tmp_path))
    with torch.no_grad():
        for critic in trainer.critics:
            for p in critic.head.parameters():
                p.add_(1.0)
    folders = trainer.save_model(str(tmp_path / "saved"))
    again = IACTrainer(
        agents=folders, train_dataset=DATA, reward_func=length_sum, args=config(IACConfig, tmp_path / "again")
    )
    for before, after in zip(trainer.critics, again.critics):
        for p, q in zip(before.head.parameters(), after.head.parameters()):
            torch.testing.assert_close(p, q)
