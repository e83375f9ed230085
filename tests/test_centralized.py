"""Centralized MAGRPO: the tagged adapter by hand, the split of joint responses into roles for
the reward, the metrics callback and eval_logger, parse failures, the errors, a training step
and saving, comlrl 1.4.3's import paths, and the example's adapter and a short run."""

import importlib
import json
import sys
from dataclasses import dataclass

import pytest
import torch
from transformers import AutoModelForCausalLM

from comlrl.engine.centralized import CentralizedComparatorParseError, TaggedCentralizedComparatorAdapter
from comlrl.trainers.reinforce import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer, MAGRPOConfig

from .helpers import (
    DATA,
    TUTORIAL_FLAGS,
    assert_every_field_documented,
    char_tokenizer,
    content_score,
    help_text,
    load_example,
    snapshot,
    tiny_llama,
    unchanged,
)

TAGGED = TaggedCentralizedComparatorAdapter()


@dataclass(frozen=True)
class ByComma:
    """A short joint prompt (keeps the tiny models fast); a response splits at its commas,
    and one without a comma cannot be split."""

    def build_prompt(self, row, agent_prompts):
        return " | ".join(agent_prompts)

    def parse_completion(self, completion, row, num_agents):
        if "," not in completion:
            raise CentralizedComparatorParseError("no comma")
        parts = completion.split(",")
        return [(parts[i] if i < len(parts) else "") for i in range(num_agents)]


@dataclass(frozen=True)
class AfterTwo(ByComma):
    """For sampled responses: splits one after its second character; one that is empty or
    starts with a letter from a to m cannot be split (about half of a random tiny model's)."""

    def parse_completion(self, completion, row, num_agents):
        if unsplittable(completion):
            raise CentralizedComparatorParseError("starts with a to m")
        return [completion[:2], completion[2:]]


def unsplittable(text):
    return not text or text[0] in "abcdefghijklm"


def config(tmp_path, **overrides):
    values = dict(
        num_train_epochs=1,
        num_generations=4,
        max_new_tokens=6,
        logging_steps=1,
        agent_learning_rate=1e-3,
        output_dir=str(tmp_path / "run"),
    )
    values.update(overrides)
    return CentralizedMAGRPOConfig(**values)


def centralized(tmp_path, reward_func=content_score, agents=None, args=None, **kwargs):
    tok = char_tokenizer()
    kwargs.setdefault("centralized_adapter", ByComma())
    return CentralizedMAGRPOTrainer(
        agents=agents or [tiny_llama(tok)],
        tokenizer=tok,
        train_dataset=DATA,
        reward_func=reward_func,
        args=args or config(tmp_path),
        **kwargs,
    )


def score(trainer, joint_texts, rows):
    """The trainer's reward on given joint responses (one joint action each)."""
    return trainer.reward(
        [trainer.collaboration.joint_prompt(row) for row in rows],
        [joint_texts],
        list(range(len(rows))),
        {"turn": 1},
        rows,
    )


# ------------------------------------------------------------------------------ the tagged adapter
def test_tagged_prompt_lists_each_roles_prompt_then_its_tags_in_order():
    prompt = TAGGED.build_prompt({"prompt": "unused"}, ["write a poem", "write a title", "write a moral"])
    assert "3 agents" in prompt and "unused" not in prompt
    order = ["Task of agent 0:\nwrite a poem", "Task of agent 1:\nwrite a title", "Task of agent 2:\nwrite a moral"]
    order += ["<agent_0>", "</agent_0>", "<agent_1>", "</agent_1>", "<agent_2>", "</agent_2>"]
    positions = [prompt.index(piece) for piece in order]
    assert positions == sorted(positions)
    assert "<agent_3>" not in prompt


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("<agent_0>a poem</agent_0><agent_1>a title</agent_1>", ["a poem", "a title"]),
        ("<AGENT_0>\n  Mixed Case \n</Agent_0>\n<agent_1>x</AGENT_1>", ["Mixed Case", "x"]),  # case, stripped
        ("< agent_0 >spaced</ agent_0 ><agent_1 >y< / agent_1>", ["spaced", "y"]),  # spaces in the brackets
        ("intro <agent_1>only the second</agent_1> outro", ["", "only the second"]),  # a missing role is ""
        ("<agent_0>unclosed <agent_1>b</agent_1>", ["", "b"]),  # an unclosed section is missing
        ("<agent_0>first</agent_0><agent_0>second</agent_0>", ["first", ""]),  # duplicates: the first
        ("<agent_0>a <agent_0>inner</agent_0> b</agent_0>", ["a <agent_0>inner", ""]),  # nested: to the first close
        ("<agent_0>multi\nline\ntext</agent_0>", ["multi\nline\ntext", ""]),  # dot-all
        ("<agent_10>ten</agent_10><agent_1>one</agent_1>", ["", "one"]),  # agent_1 is not agent_10
    ],
)
def test_tagged_parse_by_hand(completion, expected):
    assert TAGGED.parse_completion(completion, {}, 2) == expected


@pytest.mark.parametrize("completion", ["no tags at all", "<agent_2>beyond the roles</agent_2>", ""])
def test_tagged_parse_without_any_section_is_a_parse_error(completion):
    with pytest.raises(CentralizedComparatorParseError, match="no <agent_i>"):
        TAGGED.parse_completion(completion, {}, 2)
    assert issubclass(CentralizedComparatorParseError, ValueError)


# ------------------------------------------------------------------------------ the reward sees roles
def test_the_reward_receives_each_roles_text_prompt_row_and_context(tmp_path):
    calls = []

    def reward(prompts, poems, titles, batch_items, prompt_history_per_agent, response_history_per_agent, turn):
        calls.append((prompts, poems, titles, batch_items, prompt_history_per_agent, response_history_per_agent, turn))
        return [float(len(p) + 10 * len(t)) for p, t in zip(poems, titles)]

    trainer = centralized(
        tmp_path,
        reward,
        centralized_adapter=TAGGED,
        formatters=[lambda row: f"poem on {row['prompt']}", lambda row: f"title for {row['prompt']}"],
    )
    rows = [DATA[1], DATA[2]]
    scored = score(trainer, ["<agent_0> roses </agent_0><agent_1>Red</agent_1>", "<agent_1>T</agent_1>"], rows)
    assert scored.raw.tolist() == [[5.0 + 30.0], [0.0 + 10.0]]
    prompts, poems, titles, items, prompt_history, response_history, turn = calls[0]
    assert (poems, titles, items, turn) == (["roses", ""], ["Red", "T"], rows, 1)
    assert prompts == ["poem on a cat", "poem on tell me, why?"]  # role 0's prompt, as MAGRPO gives agent 0's
    assert prompt_history[0] == [["poem on a cat"], ["title for a cat"]]
    assert response_history == [[["roses"], ["Red"]], [[""], ["T"]]]
    # the one model's prompt is the adapter's, from the roles' prompts
    assert "Task of agent 1:\ntitle for a cat" in trainer.train_prompts.prompts[0][1]


def test_a_1_4_3_reward_called_per_joint_action_gets_one_element_role_lists(tmp_path):
    seen = []

    def reward(completions1, completions2):  # comlrl 1.4.3's style: [0] in, [value] out
        seen.append((completions1, completions2))
        return [float(len(completions2[0]))]

    trainer = centralized(tmp_path, reward, args=config(tmp_path, reward_call="per_joint_action"))
    scored = score(trainer, ["a,bb", "ccc,dddd"], [DATA[0], DATA[1]])
    assert scored.raw.flatten().tolist() == [2.0, 4.0]
    assert seen == [(["a"], ["bb"]), (["ccc"], ["dddd"])]


def test_weights_processor_and_names_apply_to_the_role_rewards(tmp_path):
    def first(a, b):
        return [float(len(x)) for x in a]

    def second(a, b):
        return [float(len(y)) for y in b]

    trainer = centralized(
        tmp_path,
        [first, second],
        args=config(tmp_path, reward_weights=[1.0, 10.0]),
        reward_processor=lambda r: r + 0.5,
    )
    scored = score(trainer, ["ab,c"], [DATA[0]])
    assert scored.names == ["first", "second"]  # logged as reward/first/mean, reward/second/mean
    assert scored.per_function.flatten().tolist() == [2.0, 1.0]
    assert scored.raw.item() == 12.0 and scored.processed.item() == 12.5


def test_three_roles_from_num_agents(tmp_path):
    seen = []

    def reward(a, b, c):
        seen.append((a, b, c))
        return [1.0] * len(a)

    trainer = centralized(tmp_path, reward, num_agents=3)
    assert (trainer.num_roles, trainer.num_agents) == (3, 1)
    score(trainer, ["x,y,z,extra"], [DATA[0]])
    assert seen == [(["x"], ["y"], ["z"])]


def test_a_malformed_response_scores_as_empty_roles(tmp_path):
    seen = []

    def reward(a, b):
        seen.append((a, b))
        return [float(len(x) + len(y)) for x, y in zip(a, b)]

    trainer = centralized(tmp_path, reward, centralized_adapter=TAGGED)
    scored = score(trainer, ["no tags here", "<agent_0>ok</agent_0>"], [DATA[0], DATA[1]])
    # one batch call; then, 2 values for 2 joint actions of 2 roles being ambiguous under
    # reward_call="auto", one call per joint action that settles it as a batch function
    assert seen == [(["", "ok"], ["", ""]), ([""], [""]), (["ok"], [""])]
    assert scored.raw.flatten().tolist() == [0.0, 2.0]


def test_different_rewards_for_the_roles_of_one_joint_action_are_an_error(tmp_path):
    trainer = centralized(tmp_path, lambda a, b: [[1.0, 2.0] for _ in a])
    with pytest.raises(RuntimeError, match=r"per-role rewards \[1.0, 2.0\].*return one value shared by the roles"):
        score(trainer, ["a,b"], [DATA[0]])


# ------------------------------------------------------------------------------ a step, saving, evaluation
def test_a_step_trains_the_one_model_on_the_split_responses_and_counts_parse_failures(tmp_path):
    seen = []

    def reward(a, b):
        seen.extend(zip(a, b))
        return content_score(a, b)

    tok = char_tokenizer()
    model = tiny_llama(tok)
    before = snapshot([model])
    trainer = centralized(tmp_path, reward, agents=[model], centralized_adapter=AfterTwo())
    result = trainer.step([0, 1])
    assert not unchanged(before, [model])

    texts = result.tree.turns[0].agents[0].texts
    rows = [DATA[0]] * 4 + [DATA[1]] * 4
    expected = [tuple(trainer.collaboration.split(text, row)) for text, row in zip(texts, rows)]
    assert seen == expected  # the reward scored the adapter's split of every sampled response
    failures = sum(unsplittable(text) for text in texts)
    assert 0 < failures < len(texts)  # both kinds were scored
    assert result.metrics["centralized/parse_failure_frac"] == failures / len(texts)
    assert result.tree.turns[0].rewards.shape == (2, 4, 1)  # one agent

    folders = trainer.save_model(str(tmp_path / "saved"))
    assert [p.rsplit("/", 1)[-1] for p in folders] == ["agent_0"]
    assert sorted(p.name for p in (tmp_path / "saved").iterdir()) == ["agent_0"]
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved" / "agent_0")
    assert torch.equal(reloaded.lm_head.weight, model.lm_head.weight)


def test_train_logs_the_parse_failure_share(tmp_path):
    one_step = config(tmp_path, per_device_train_batch_size=3, num_generations=2, max_new_tokens=3)
    trainer = centralized(tmp_path, centralized_adapter=TAGGED, args=one_step)  # random tiny models write no tags
    trainer.train()
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["centralized/parse_failure_frac"] for line in lines] == [1.0]
    assert trainer.args.num_agents is None and trainer.num_roles == 2  # the config is the caller's


def test_eval_logger_and_metrics_callback_get_one_text_per_role(tmp_path):
    logged, sampled, joint = [], [], []

    def eval_logger(agent_completions_turns, batch_items):
        logged.append((agent_completions_turns, batch_items))
        return {"first_role_chars": sum(len(turns[0]) for turns in agent_completions_turns[0])}

    def metrics_callback(samples):
        sampled.append(samples)
        return {"samples": len(samples)}

    rows = DATA * 3
    trainer = centralized(
        tmp_path,
        eval_dataset=rows,
        eval_logger=eval_logger,
        metrics_callback=metrics_callback,
        centralized_adapter=AfterTwo(),
        args=config(tmp_path, eval_num_samples=None),
    )
    role_hooks = trainer.eval_hooks

    def spy(completions, rows, prompts, num_turns):  # the one model's [agent][row][turn] responses
        joint.append(completions[0])
        return role_hooks(completions, rows, prompts, num_turns)

    object.__setattr__(trainer.run, "eval_hooks", spy)  # the run is frozen: the test swaps its hooks for a spy
    metrics = trainer.evaluate()
    roles, items = logged[0]
    split = [trainer.collaboration.split(turns[0], row) for turns, row in zip(joint[0], rows)]
    assert items == rows
    assert roles == [[[texts[role]] for texts in split] for role in range(2)]  # [role][row][turn]
    assert metrics["eval/first_role_chars"] == sum(len(texts[0]) for texts in split)
    failures = sum(unsplittable(turns[0]) for turns in joint[0])
    assert 0 < failures < len(rows)  # both kinds were split
    assert metrics["eval/centralized/parse_failure_frac"] == pytest.approx(failures / len(rows))

    step = trainer.step([0])
    texts = step.tree.turns[0].agents[0].texts
    samples = sampled[-1]
    assert len(samples) == 2 * len(texts) and step.metrics["samples"] == 2 * len(texts)
    assert [s.agent_idx for s in samples[:2]] == [0, 1]
    assert [s.completion for s in samples[:2]] == trainer.collaboration.split(texts[0], DATA[0])


# ------------------------------------------------------------------------------ errors
def test_two_models_is_an_error_naming_what_to_pass(tmp_path):
    tok = char_tokenizer()
    with pytest.raises(ValueError, match=r"ONE model.*agents holds 2 models: pass agents=\[model\] or agent_model="):
        centralized(tmp_path, agents=[tiny_llama(tok, 0), tiny_llama(tok, 1)])


def test_multi_turn_is_an_error():
    with pytest.raises(ValueError, match="num_turns=2: centralized MAGRPO does not support multi-turn"):
        CentralizedMAGRPOConfig(num_turns=2)


def test_external_transition_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="does not support multi-turn episodes, so it takes no external_transition"):
        centralized(tmp_path, external_transition=lambda **kwargs: None)


def test_another_collaboration_mode_is_an_error_naming_the_allowed_value():
    with pytest.raises(ValueError, match=r"collaboration_mode='decentralized'.*allows only 'centralized'"):
        CentralizedMAGRPOConfig(collaboration_mode="decentralized")


def test_an_adapter_without_both_methods_is_an_error(tmp_path):
    class PromptOnly:
        def build_prompt(self, row, agent_prompts):
            return "x"

    with pytest.raises(TypeError, match=r"centralized_adapter PromptOnly has no parse_completion\(\) method"):
        centralized(tmp_path, centralized_adapter=PromptOnly())


def test_role_counts_that_disagree_are_an_error(tmp_path):
    with pytest.raises(ValueError, match="num_agents=3 but the config's num_agents=2"):
        centralized(tmp_path, num_agents=3, args=config(tmp_path, num_agents=2))


def test_the_config_is_magrpos_plus_its_mode(tmp_path):
    assert_every_field_documented(CentralizedMAGRPOConfig)
    defaults = CentralizedMAGRPOConfig()
    assert (defaults.collaboration_mode, defaults.num_turns, defaults.num_agents) == ("centralized", 1, None)
    with pytest.raises(TypeError, match="args must be a CentralizedMAGRPOConfig"):
        centralized(tmp_path, args=MAGRPOConfig())


# ------------------------------------------------------------------------------ import paths
@pytest.mark.parametrize(
    "module",
    ["comlrl", "comlrl.trainers", "comlrl.trainers.reinforce", "comlrl.trainers.reinforce.centralized_magrpo"],
)
def test_the_import_paths(module):
    imported = importlib.import_module(module)
    assert imported.CentralizedMAGRPOTrainer is CentralizedMAGRPOTrainer
    assert imported.CentralizedMAGRPOConfig is CentralizedMAGRPOConfig


# ------------------------------------------------------------------------------ the example
@pytest.fixture(scope="module")
def example():
    return load_example("centralized-story-len-ratio.py")


def test_example_flags_match_the_tutorials(example, capsys):
    text = help_text(example, capsys)
    for flag in TUTORIAL_FLAGS:
        assert flag in text
    assert example.parse_args([]).wandb is False


def test_example_adapter_by_hand(example):
    adapter = example.NumberedListAdapter()
    prompt = adapter.build_prompt({}, ["Tell a joke:", "Tell a joke:"])
    assert prompt.startswith("Tell a joke:\n") and prompt.endswith("\n\n1.")
    assert adapter.parse_completion(" short\n2. a longer one\n3. extra\n2) again", {}, 2) == ["short", "a longer one"]
    assert adapter.parse_completion(" only one", {}, 2) == ["only one", ""]
    with pytest.raises(CentralizedComparatorParseError):
        adapter.parse_completion("", {}, 2)


@pytest.mark.e2e
def test_example_short_run_on_a_tiny_model_saves_one_model(example, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # any `import wandb` would now fail: W&B stays off
    tok = char_tokenizer("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ :.,0123456789\n")
    tiny_llama(tok).save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    out = tmp_path / "out"
    example.main(["--model", str(tmp_path / "tiny"), "--output-dir", str(out), "--epochs", "1",
                  "--num-generations", "2", "--max-new-tokens", "4"])  # fmt: skip
    assert "first epoch" in capsys.readouterr().out
    assert sorted(p.name for p in (out / "models").iterdir()) == ["agent_0"]
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(0 <= line["centralized/parse_failure_frac"] <= 1 for line in lines)
