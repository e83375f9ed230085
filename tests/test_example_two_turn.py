"""examples/two-turn-revision.py: its flags, its reward and transition by hand, and a short
two-turn run on a tiny model folder."""

import json
import math
import sys

import pytest

from .helpers import TUTORIAL_FLAGS, char_tokenizer, help_text, load_example, tiny_llama
from .test_example import RUN_FLAGS, TWO_AGENTS_SAVED


@pytest.fixture(scope="module")
def example():
    return load_example("two-turn-revision.py")


def test_help_lists_every_flag(example, capsys):
    text = help_text(example, capsys)
    for flag in [*TUTORIAL_FLAGS, *RUN_FLAGS, "--discount", "--learning-rate", "--trainer"]:
        assert flag in text


def test_defaults_are_small(example):
    args = example.parse_args([])
    assert (args.epochs, args.num_generations, args.max_new_tokens, args.discount, args.wandb) == (2, 2, 24, 1.0, False)
    assert set(example.TRAIN_TOPICS).isdisjoint(example.EVAL_TOPICS)


# ------------------------------------------------------------------------------ reward by hand
def test_content_words_and_reuse_by_hand(example):
    # "the", "in", "city" (4 letters: kept), "with" (stopword), "gold" kept, "towers" kept
    assert example.content_words("The city, with GOLD towers in the city!") == {"city", "gold", "towers"}
    assert example.reuse_fraction("Gold City", "The city, with gold towers") == pytest.approx(2 / 3)
    assert example.reuse_fraction("anything", "a an the with") == 0.0  # no content words to reuse
    assert example.reuse_fraction("cityscape", "city") == 0.0  # whole words only


def test_turn_one_reward_is_the_length_ratio(example):
    # ratios 2.5 (inside), 1 (1 below the range), 4 (1 above), empty title
    rewards = example.revision_reward(["ab", "ab", "ab", ""], ["abcde", "ab", "abcdefgh", "x"], turn=1)
    assert rewards == [1.0, pytest.approx(math.exp(-1)), pytest.approx(math.exp(-1)), 0.0]


def test_turn_two_reward_adds_the_partners_words(example):
    title1, paragraph1 = "Sky City", "Floating towers glow above quiet clouds."  # turn 1
    # paragraph1's content words: floating towers glow above quiet clouds (6); title1's: city (1; "sky" is short)
    title2 = "Towers above the clouds"  # reuses towers, above, clouds: 3/6
    paragraph2 = "The city floats on soft white clouds."  # reuses city: 1/1
    history = [[[title1, title2], [paragraph1, paragraph2]]]
    ratio = len(paragraph2) / len(title2)
    assert ratio < 2  # so the length score is exp(-(2 - ratio))
    expected = 0.5 * math.exp(-(2 - ratio)) + 0.5 * (3 / 6 + 1 / 1) / 2
    rewards = example.revision_reward([title2], [paragraph2], turn=2, response_history_per_agent=history)
    assert rewards == [pytest.approx(expected)]
    # ignoring the partner's draft costs the reuse half, even with the length ratio right (11 / 5 = 2.2)
    history = [[[title1, "Night"], [paragraph1, "Rain falls."]]]
    assert example.revision_reward(["Night"], ["Rain falls."], turn=2, response_history_per_agent=history) == [0.5]


def test_turn_two_reward_needs_the_history(example):
    with pytest.raises(ValueError, match="response_history_per_agent"):
        example.revision_reward(["a"], ["b"], turn=2)


# ------------------------------------------------------------------------------ transition by hand
def test_transition_shows_each_agent_both_drafts(example):
    prompts = example.revision_transition(
        prompt="Topic: a city in the clouds",
        agent_completions=[" Sky City\n", " Towers float."],
        num_agents=2,
        prompt_history_per_agent=[["p0"], ["p1"]],
        response_history_per_agent=[[" Sky City\n"], [" Towers float."]],
    )
    assert prompts == [
        "Topic: a city in the clouds\nYour title: Sky City\nYour partner's paragraph: Towers float.\n"
        "Rewrite your title so that it fits the paragraph.",
        "Topic: a city in the clouds\nYour paragraph: Towers float.\nYour partner's title: Sky City\n"
        "Rewrite your paragraph so that it fits the title.",
    ]
    with pytest.raises(ValueError, match="2 agents"):
        example.revision_transition("t", ["a", "b", "c"], 3, [[], [], []], [[], [], []])


def test_formatter_puts_the_role_in_the_system_message(example):
    row = {"prompt": "Topic: a playground on Mars"}
    tok = char_tokenizer()
    assert example.agent_prompt(row, tok, "You write titles.") == "You write titles.\n\nTopic: a playground on Mars\n"
    tok.chat_template = (
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<bot>{% endif %}"
    )
    assert example.agent_prompt(row, tok, "You write titles.") == (
        "<system>You write titles.<user>Topic: a playground on Mars<bot>"
    )


# ------------------------------------------------------------------------------ end to end, tiny model
@pytest.fixture
def tiny_model_args(tmp_path):
    tok = char_tokenizer("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ :'.\n")
    tiny_llama(tok).save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    return ["--model", str(tmp_path / "tiny"), "--output-dir", str(tmp_path / "out"), "--epochs", "1",
            "--num-generations", "2", "--max-new-tokens", "4"]  # fmt: skip


def test_short_run_plays_two_turns_and_evaluates_before_and_after(example, tmp_path, capsys, monkeypatch,
                                                                   tiny_model_args):  # fmt: skip
    monkeypatch.setitem(sys.modules, "wandb", None)  # any `import wandb` would now fail: W&B stays off
    transitions = []
    real_transition = example.revision_transition

    def counting_transition(prompt, agent_completions, num_agents, prompt_history_per_agent,
                            response_history_per_agent):  # fmt: skip
        transitions.append(prompt.removeprefix("Topic: "))
        return real_transition(prompt, agent_completions, num_agents, prompt_history_per_agent,
                               response_history_per_agent)  # fmt: skip

    monkeypatch.setattr(example, "revision_transition", counting_transition)
    out = tmp_path / "out"
    example.main(tiny_model_args)
    summary = capsys.readouterr().out

    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "turn_2/reward_mean" in r]
    evals = [r for r in records if "eval/turn_1/reward_mean" in r]
    # 4 topics, 2 per step, 1 epoch: 2 steps, each with turn-2 nodes (2 rows x 2 joint actions)
    assert [r["step"] for r in train] == [1, 2] and all(r["turn_2/nodes"] == 4 for r in train)
    # evaluated before the first step and after the last, both turns, with the hook's lengths
    assert [r["step"] for r in evals] == [0, 2]
    for r in evals:
        for key in ["eval/turn_2/reward_mean", "eval/turn_1/expected_return", "eval/agent1/turn_2/chars"]:
            assert key in r
        assert 0 <= r["eval/turn_1/reward_mean"] <= 1 and 0 <= r["eval/turn_2/reward_mean"] <= 1
    # one transition per training joint action of turn 1 (2 steps x 4) and per eval row (4 x 2)
    assert len(transitions) == 2 * 4 + 4 * 2 and set(transitions) <= set(example.TRAIN_TOPICS + example.EVAL_TOPICS)
    assert "turn 1: reward" in summary and "turn 2: reward" in summary and "turn 2 paragraph:" in summary
    assert f"run folder {out}: {TWO_AGENTS_SAVED}" in summary
    assert (out / "metrics.png").stat().st_size > 0 and (out / "models" / "agent_1" / "config.json").exists()


def test_a_run_replacing_another_summarises_only_its_own_evaluations(example, tmp_path, capsys, tiny_model_args):
    out = tmp_path / "out"
    out.mkdir()
    stale = {"step": 0, "eval/turn_1/reward_mean": 123.0, "eval/turn_1/expected_return": 0.0,
             "eval/turn_2/reward_mean": 0.0, "eval/turn_2/expected_return": 0.0}  # fmt: skip
    (out / "metrics.jsonl").write_text(json.dumps(stale) + "\n")
    example.main([*tiny_model_args, "--overwrite", "--no-save"])
    assert "123.000" not in capsys.readouterr().out


def test_wandb_flags_reach_wandb_init(example, fake_wandb, tiny_model_args):
    example.main(tiny_model_args + ["--no-save", "--wandb", "--wandb-project", "proj", "--wandb-entity", "team"])
    assert fake_wandb["init"]["project"] == "proj" and fake_wandb["init"]["entity"] == "team"
    assert fake_wandb["init"]["config"]["num_turns"] == 2
    assert fake_wandb["log"] and fake_wandb["finished"]


def test_short_run_with_the_actor_critic_trainer(example, tmp_path, capsys, tiny_model_args):
    example.main([*tiny_model_args, "--trainer", "iac", "--discount", "0.9"])
    assert "held-out evaluation" in capsys.readouterr().out
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "turn_2/reward_mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert all("critic0/value_loss" in r and "critic1/explained_variance" in r for r in train)
    saved = tmp_path / "out" / "models"
    assert (saved / "agent_0" / "value_head.safetensors").is_file()
