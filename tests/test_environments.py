"""Environments: the tree plays an Environment's episodes (states fork by value, episodes
end where the environment says, rewards per agent or shared), every return is checked and
named, the trainers take ``environment=`` in place of what it replaces, and a run with one
trains, evaluates and resumes exactly."""

import functools
import os
import signal

import pytest
import torch

from comlrl.algorithms.returns import tree_advantages
from comlrl.environments import Environment, Outcome, Start
from comlrl.environments.played import EnvironmentOnRows
from comlrl.metrics.rollout import rollout_metrics
from comlrl.rollout.chat import ChatRenderer
from comlrl.rollout.tree import build_tree
from comlrl.trainers.actor_critic import IACConfig, IACTrainer
from comlrl.trainers.dpo import MADPOConfig, MADPOTrainer
from comlrl.trainers.reinforce import MAGRPOTrainer
from tests.helpers import (
    assert_same_run,
    char_tokenizer,
    length_sum,
    log_lines,
    scripted_generate,
    small_config,
    tiny_llama,
    weights,
)

WORDS = [{"word": w} for w in ["cat", "sea", "moon", "tree"]]


class Relay(Environment):
    """Agent 0 is shown a word and agent 1 must echo what agent 0 said. Turn 1 pays 1 and
    goes on, unless agent 0 wrote a "z" (the episode ends there); turn 2 pays each agent its
    own score. The state is the word and the turns played, a tuple (a value)."""

    reward_name = "relay"

    def __init__(self):
        self.seen = []  # (turn, state) of every step, to check what each branch was given

    def reset(self, row):
        return Start([f"say {row['word']}:", "listen:"], state=(row["word"], 0))

    def step(self, state, actions, turn):
        self.seen.append((turn, state))
        word, played = state[:2]
        if turn == 1 and "z" not in actions[0]:
            return Outcome(
                1.0, observations=[f"again {word}:", f"heard {actions[0]}:"], state=(word, played + 1, actions[0])
            )
        return Outcome([float(len(actions[0])), float(len(set(actions[0]) & set(actions[1])))])


def relay_tree(environment, rows=(0, 1), num_turns=2):
    renderers = [ChatRenderer(char_tokenizer(), i) for i in range(2)]
    played = EnvironmentOnRows(environment, WORDS, renderers, dataset="train_dataset")
    return build_tree(
        played,
        list(rows),
        functools.partial(scripted_generate, letter_at=-2),
        torch.arange(2).unsqueeze(1).expand(2, 2),
        2,
        num_turns,
    )


def test_the_tree_plays_the_environments_episodes():
    environment = Relay()
    tree = relay_tree(environment)
    first, second = tree.turns
    assert first.prompts == [["say cat:", "say sea:"], ["listen:", "listen:"]]
    # Sample 1 of agent 0 ends in "z": that joint action ends its episode; sample 0's goes on.
    assert first.children.tolist() == [[0, -1], [1, -1]]
    assert first.rewards[:, 0].tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert second.rows == [0, 1] and second.prompts[1] == ["heard ta:", "heard aa:"]
    assert second.prompt_history[0] == [["say cat:", "again cat:"], ["listen:", "heard ta:"]]
    # Per-agent rewards at turn 2: agent 0 its length, agent 1 the letters it shares with agent 0.
    texts = [second.agents[i].texts for i in range(2)]
    assert second.rewards[0, 0].tolist() == [len(texts[0][0]), len(set(texts[0][0]) & set(texts[1][0]))]
    assert tree.reward_names == ["relay"] and tree.transition_calls == 4
    assert torch.equal(first.raw_rewards, first.rewards) and first.per_function_rewards.shape == (1, 2, 2, 2)


def test_episode_lengths_are_counted_in_turns():
    tree = relay_tree(Relay())
    estimate = tree_advantages([t.rewards for t in tree.turns], [t.children for t in tree.turns], tree.joint_indices,
                               2, 1.0, "mean", True)  # fmt: skip
    metrics = rollout_metrics(tree, estimate.returns, estimate.credits, estimate.advantages)
    # Per row: the "z" joint action ends at turn 1; the other goes on to a turn-2 node of 2 joint actions.
    assert metrics["rollout/episode_turns"].value() == pytest.approx((2 * 1 + 4 * 2) / 6)


def test_a_nodes_state_is_given_to_each_of_its_joint_actions_unchanged():
    environment = Relay()
    relay_tree(environment)
    turn1 = [state for turn, state in environment.seen if turn == 1]
    assert turn1 == [("cat", 0), ("cat", 0), ("sea", 0), ("sea", 0)]  # one node's state, stepped twice
    turn2 = [state for turn, state in environment.seen if turn == 2]
    assert turn2 == [("cat", 1, "ta"), ("cat", 1, "ta"), ("sea", 1, "aa"), ("sea", 1, "aa")]


class NoStart(Relay):
    def reset(self, row):
        return Start(None)


def test_an_episode_must_start_with_a_prompt_per_agent():
    expected = (
        r"NoStart\.reset returned Start\(observations=None, state=None\) for train_dataset row 0; expected a Start"
    )
    with pytest.raises(TypeError, match=expected):
        relay_tree(NoStart())


def test_the_last_turn_ends_every_episode():
    tree = relay_tree(Relay(), num_turns=1)
    assert len(tree.turns) == 1 and (tree.turns[0].children == -1).all() and tree.transition_calls == 0


class Broken(Relay):
    def __init__(self, what):
        super().__init__()
        self.what = what

    def step(self, state, actions, turn):
        outcomes = {
            "type": ("a reward",),
            "reward": Outcome(float("nan")),
            "rewards": Outcome([1.0, 2.0, 3.0]),
            "observations": Outcome(1.0, observations=["only one"]),
            "text": Outcome(1.0, observations=["fine", 7]),
        }
        if self.what == "raise":
            raise KeyError("no such word")
        return outcomes[self.what] if state[0] == "sea" else super().step(state, actions, turn)


@pytest.mark.parametrize(
    "what, error, match",
    [
        (
            "raise",
            RuntimeError,
            r"Broken\.step raised KeyError: 'no such word' on joint action 0 \(train_dataset row 0, turn 1\)",
        ),
        (
            "type",
            TypeError,
            r"Broken\.step returned tuple for joint action 2 \(train_dataset row 1, turn 1\); expected an Outcome",
        ),
        ("reward", ValueError, r"Broken\.step returned nan for joint action 2 \(train_dataset row 1, turn 1\)"),
        (
            "rewards",
            ValueError,
            r"returned 3 rewards for joint action 2 .* expected one number, or 2 \(one per agent\)",
        ),
        (
            "observations",
            ValueError,
            r"Broken\.step returned 1 prompts for joint action 2 .* expected 2 \(one per agent\)",
        ),
        ("text", TypeError, r"Broken\.step returned int for agent 1 for joint action 2 .*; expected a string"),
    ],
)
def test_what_an_environment_returns_is_checked_and_named(what, error, match):
    with pytest.raises(error, match=match):
        relay_tree(Broken(what))


def relay_trainer(tmp_path, environment=None, **overrides):
    tok = char_tokenizer()
    values = dict(num_turns=2, num_train_epochs=2, per_device_train_batch_size=2, save_steps=1)
    kwargs = dict(
        agents=[tiny_llama(tok, seed=i) for i in range(2)],
        tokenizer=tok,
        train_dataset=WORDS,
        eval_dataset=WORDS[:2],
        environment=Relay() if environment is None else environment,
        args=small_config(tmp_path, **{**values, **overrides}),
    )
    return MAGRPOTrainer(**kwargs)


def test_magrpo_trains_and_evaluates_in_an_environment(tmp_path):
    trainer = relay_trainer(tmp_path)
    before = [w.clone() for w in weights(trainer)]
    trainer.train()
    assert all(not torch.equal(a, b) for a, b in zip(before, weights(trainer)))
    lines = log_lines(tmp_path / "run", "metrics.jsonl")
    steps = [line for line in lines if "reward/mean" in line]  # the training steps' (evaluations' are eval/)
    assert len(steps) == 4 and all("reward/relay/mean" in line and "turn_2/reward_mean" in line for line in steps)
    assert [line["step"] for line in lines if "eval/reward_mean" in line] == [0, 4]
    metrics = trainer.evaluate()
    assert "eval/reward_mean" in metrics and "eval/turn_1/reward_mean" in metrics


class InterruptingRelay(Relay):
    """Sends this process SIGINT during its ``at_step``-th step call (that training step still finishes)."""

    def __init__(self, at_step):
        super().__init__()
        self.at_step = at_step

    def step(self, state, actions, turn):
        if len(self.seen) + 1 == self.at_step:
            os.kill(os.getpid(), signal.SIGINT)
        return super().step(state, actions, turn)


def test_a_run_in_an_environment_resumes_exactly(tmp_path):
    straight = relay_trainer(tmp_path / "straight")
    straight.train()
    cut = relay_trainer(tmp_path / "cut", environment=InterruptingRelay(at_step=3))
    cut.train()
    assert cut.global_step == 1
    resumed = relay_trainer(tmp_path / "cut")
    resumed.train(resume_from_checkpoint=True)
    assert_same_run(resumed, straight, tmp_path / "cut", tmp_path / "straight")


@pytest.mark.parametrize(
    "given, match",
    [
        (
            {"reward_func": length_sum},
            r"reward_func is given with environment=, which replaces it \(its step returns the reward\)",
        ),
        ({"formatters": lambda row: row["word"]}, r"formatters is given with environment=.*its reset writes"),
        ({"external_transition": lambda **kw: None}, r"external_transition is given with environment="),
        ({"early_termination_threshold": 0.5}, r"early_termination_threshold=0.5 is set with environment="),
    ],
)
def test_what_an_environment_replaces_is_refused(tmp_path, given, match):
    config = {k: v for k, v in given.items() if k == "early_termination_threshold"}
    inputs = {k: v for k, v in given.items() if k not in config}
    tok = char_tokenizer()
    with pytest.raises(ValueError, match=match):
        MAGRPOTrainer(
            agents=[tiny_llama(tok, seed=i) for i in range(2)],
            tokenizer=tok,
            train_dataset=WORDS,
            environment=Relay(),
            args=small_config(tmp_path, num_turns=2, **config),
            **inputs,
        )


def test_an_environment_must_be_one_and_only_some_trainers_take_it(tmp_path):
    tok = char_tokenizer()
    agents = [tiny_llama(tok, seed=i) for i in range(2)]
    with pytest.raises(
        TypeError, match="environment must be an instance of a subclass of comlrl.environments.Environment, got dict"
    ):
        MAGRPOTrainer(agents=agents, tokenizer=tok, train_dataset=WORDS, environment={}, args=small_config(tmp_path))
    with pytest.raises(
        TypeError, match=r"unexpected keyword argument 'environment' \(the MAGRPO family and the actor-critic"
    ):
        MADPOTrainer(
            agents=agents,
            tokenizer=tok,
            train_dataset=WORDS,
            environment=Relay(),
            args=MADPOConfig(output_dir=str(tmp_path)),
        )
    with pytest.raises(ValueError, match="reward_func is required \\(or an environment=\\)"):
        MAGRPOTrainer(agents=agents, tokenizer=tok, train_dataset=WORDS, args=small_config(tmp_path))


def test_an_actor_critic_trainer_trains_in_an_environment(tmp_path):
    tok = char_tokenizer()
    trainer = IACTrainer(
        agents=[tiny_llama(tok, seed=i) for i in range(2)],
        tokenizer=tok,
        train_dataset=WORDS,
        environment=Relay(),
        args=IACConfig(
            num_turns=2, num_generations=2, max_new_tokens=4, num_train_epochs=1, output_dir=str(tmp_path / "run")
        ),  # fmt: skip
    )
    before = [w.clone() for w in weights(trainer)]
    trainer.train()
    assert all(not torch.equal(a, b) for a, b in zip(before, weights(trainer)))  # the agents and the value heads
    assert "reward/relay/mean" in log_lines(tmp_path / "run", "metrics.jsonl")[-1]
