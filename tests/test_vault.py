"""The vault tool task (comlrl.tasks.vault): its rows, each agent's own tool, the call format,
the reward by hand, and a MAGRPO run where agents that call their tools and copy the result
score, and those that guess do not."""

import re

import pytest
import torch

from comlrl.environments.tools import ToolRunner
from comlrl.tasks.vault import NAMES, VaultTask, answer
from comlrl.trainers.reinforce import MAGRPOTrainer
from tests.helpers import IGNORES_TOOLS, chat_tokenizer, load_example, log_lines, small_config, tiny_llama
from tests.test_tools import rollout_of


def test_the_splits_hold_different_people_with_four_digit_codes():
    task = VaultTask()
    train, held_out = task.dataset("train"), task.dataset("eval")
    assert len(train) == 64 and len(held_out) == 16 and len(set(NAMES)) == 80
    assert not {row["name"] for row in train} & {row["name"] for row in held_out}
    assert all(re.fullmatch(r"[1-9]\d[1-9]\d", row["code"]) for row in train + held_out)
    assert VaultTask(seed=0).dataset("train") == train and VaultTask(seed=1).dataset("train") != train
    with pytest.raises(ValueError, match="split must be 'train' or 'eval', got 'test'"):
        task.dataset("test")


def test_each_agent_reads_its_own_half_with_its_own_tool():
    task = VaultTask()
    start = task.reset({"name": "Bob", "code": "4173"})
    assert start.state == ("Bob", "41", "73")
    question = "What is Bob's secret code? Write lookup(Bob) to read it."
    assert start.observations[0] == [{"role": "user", "content": question}]
    (first,), (second,) = task.tools(0, start.state), task.tools(1, start.state)
    assert first.__name__ == second.__name__ == "lookup"
    assert first("Bob") == "Bob's code starts with 41" and second(" bob ") == "Bob's code ends with 73"
    assert first("Ann") == "No one named Ann has a vault here."
    results = ToolRunner(timeout=5).run([first], task.tool_calls(0, 'lookup("Bob") then lookup(Ann)'))
    assert results == [("Bob's code starts with 41", False), ("No one named Ann has a vault here.", False)]
    with pytest.raises(ValueError, match="row 'Eve' has code '12'; expected four digits"):
        task.reset({"name": "Eve", "code": "12"})


def test_calls_are_read_in_the_short_format_and_the_hermes_one():
    task = VaultTask()
    short = task.tool_calls(0, "Sure: lookup( 'Kim' ). Done")
    assert [(c.name, c.arguments) for c in short] == [("lookup", {"name": "Kim"})]
    hermes = task.tool_calls(1, '<tool_call>{"name": "lookup", "arguments": {"name": "Kim"}}</tool_call>')
    assert [(c.name, c.arguments) for c in hermes] == [("lookup", {"name": "Kim"})]
    assert task.tool_calls(0, "lookup is a function; lookup(Kim") == []


def test_the_joint_answer_scores_half_per_right_half_by_hand():
    task = VaultTask()
    state = ("Bob", "41", "73")
    assert task.step(state, ["It starts with 41.", "73"], 1).reward == 1.0
    assert task.step(state, ["41", "The code is 1234"], 1).reward == 0.5  # four digits are not a half
    assert task.step(state, ["73", "41"], 1).reward == 0.0  # each agent must give its own half
    assert task.step(state, ["Bob's code is 41 or 73", "ends with 73"], 1).reward == 1.0  # the first two digits
    assert answer("codes 123 and 7") is None and answer("x41y") == "41"


def test_without_tools_the_agents_are_only_asked():
    task = VaultTask(tools=False)
    start = task.reset({"name": "Bob", "code": "4173"})
    assert start.observations[1] == [{"role": "user", "content": "What is Bob's secret code?"}]
    assert task.tools(0, start.state) == ()


RESULT = re.compile(r"(?:starts|ends) with (\d\d)")


class CopyingBackend:
    """Each agent calls its tool on the even samples and guesses "10" on the odd ones; after a
    result it answers with the two digits the result gave."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def generate(self, agent, prompts, num_generations, sampling, generator=None):
        if all(isinstance(p, str) for p in prompts):
            names = [re.search(r"What is (\w+)'s", p).group(1) for p in prompts]
            texts = [f"lookup({name})" if k % 2 == 0 else "10" for name in names for k in range(num_generations)]
        else:
            read = [self.tokenizer.decode(p) for p in prompts]
            texts = ["It is " + RESULT.findall(text)[-1] + "." for text in read]
        return rollout_of(self.tokenizer, prompts, texts, num_generations)

    def uses_generators(self, sampling):
        return True

    def sync_weights(self, agent):
        pass


def test_magrpo_on_the_vault_scores_the_agents_that_call(tmp_path):
    tokenizer = chat_tokenizer(IGNORES_TOOLS)
    task = VaultTask()
    rows = [{"name": "Bob", "code": "4173"}, {"name": "Kim", "code": "2258"}]
    trainer = MAGRPOTrainer(
        agents=[tiny_llama(tokenizer, seed=i) for i in range(2)],
        tokenizer=tokenizer,
        train_dataset=rows,
        environment=task,
        args=small_config(tmp_path, per_device_train_batch_size=2, num_generations=2, joint_mode="cross"),
    )
    assert "Write lookup(name) to call it." in trainer.run.train_prompts.prompts[0][0]
    object.__setattr__(trainer.run, "rollout", trainer.run.rollout.with_backend(CopyingBackend(tokenizer)))
    before = [p.detach().clone() for p in trainer.agents[0].parameters()]
    trainer.train()
    line = log_lines(tmp_path / "run", "metrics.jsonl")[-1]
    for agent in (0, 1):
        assert line[f"agent{agent}/tool_call_frac"] == 0.5 and line[f"agent{agent}/tool_errors"] == 0
    # cross: each of agent 0's 2 samples meets both of agent 1's; a caller's half is right, a guess's wrong
    assert line["reward/vault/mean"] == pytest.approx(0.5)
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, trainer.agents[0].parameters()))


@pytest.mark.parametrize("flags", [[], ["--no-tools"]])
def test_the_example_runs_on_a_tiny_chat_model(flags, tmp_path, capsys):
    """examples/tool-vault.py end to end on a tiny model with a chat template: 16 steps, three
    held-out evaluations, the summary of its figures."""
    tokenizer = chat_tokenizer(IGNORES_TOOLS)
    tiny_llama(tokenizer).save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    example = load_example("tool-vault.py")
    example.main(
        [
            "--model",
            str(tmp_path / "tiny"),
            "--num-generations",
            "2",
            "--no-save",
            "--output-dir",
            str(tmp_path / "run"),
            *flags,
        ]
    )
    found = example.figures(tmp_path / "run" / "metrics.jsonl")
    assert found["steps"] == 16 and len(found["reward_curve"]) == 16
    assert 0 <= found["call_frac_first"] <= 1 and 0 <= found["eval_after"] <= 1
    out = capsys.readouterr().out
    assert "completions that called a tool" in out and "held-out reward (16 other people)" in out
    assert len([line for line in log_lines(tmp_path / "run", "metrics.jsonl") if "eval/reward_mean" in line]) == 3
