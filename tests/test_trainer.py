"""MAGRPOTrainer on tiny random models: wiring, heterogeneous agents, saving, bad input."""

import json
import math
import os

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import comlrl.algorithms.policy_terms as policy_terms
from comlrl.trainers.reinforce import MAGRPOTrainer

from .helpers import (
    DATA,
    MIXED,
    char_tokenizer,
    content_score,
    length_sum,
    make_trainer,
    small_config,
    snapshot,
    tiny_gpt2,
    tiny_llama,
    unchanged,
)


@pytest.mark.parametrize("joint_mode", ["aligned", "cross"])
def test_three_heterogeneous_agents_train_and_save(tmp_path, joint_mode):
    tok_a, tok_b = char_tokenizer(), char_tokenizer(MIXED)
    assert len(tok_a) != len(tok_b)
    agents = [tiny_llama(tok_a, 0), tiny_gpt2(tok_b, 1), tiny_llama(tok_a, 2)]
    before = snapshot(agents)
    trainer = make_trainer(
        tmp_path,
        agents=agents,
        tokenizer=[tok_a, tok_b, tok_a],
        reward_func=content_score,
        args=small_config(tmp_path, joint_mode=joint_mode, per_device_train_batch_size=3),
    )
    result = trainer.train()
    assert result.global_step == 1 and len(result.epoch_reward_means) == 1
    for b, agent in zip(before, agents):  # every agent took a step
        assert any(not torch.equal(x, p) for x, p in zip(b, agent.parameters()))

    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    logged = json.loads(lines[0])
    for key in [
        "step",
        "reward/mean",
        "reward/raw_mean",
        "agent2/loss",
        "agent1/grad_norm",
        "agent0/completion_length",
        "agent2/completion_length_max",
        "agent1/zero_std_group_frac",
        "agent0/learning_rate",
        "reward/content_score/mean",
        "time/step_s",
        "time/generated_tokens_per_s",
    ]:
        assert key in logged

    folders = trainer.save_model(str(tmp_path / "models"))
    assert [f.rsplit("/", 1)[1] for f in folders] == ["agent_0", "agent_1", "agent_2"]
    for folder, original in zip(folders, agents):
        model = AutoModelForCausalLM.from_pretrained(folder)
        tok = AutoTokenizer.from_pretrained(folder)
        assert type(model) is type(original) and len(tok) == original.config.vocab_size
        torch.testing.assert_close(model.state_dict(), original.state_dict())


def recording_reward(calls):
    def reward(a, b):
        calls.append((list(a), list(b)))
        return [0.0] * len(a)

    return reward


@pytest.mark.parametrize("joint_mode,num_joint", [("aligned", 3), ("cross", 9)])
def test_joint_actions_pair_the_right_completions(tmp_path, joint_mode, num_joint):
    calls = []
    trainer = make_trainer(
        tmp_path,
        reward_func=recording_reward(calls),
        args=small_config(tmp_path, joint_mode=joint_mode, num_generations=3),
    )
    rollout = trainer.rollout(trainer.train_prompts, [2, 0]).turns[0]
    first, second = calls[0]
    assert len(first) == len(second) == 2 * num_joint and rollout.rewards.shape == (2, num_joint, 2)
    texts0, texts1 = rollout.agents[0].texts, rollout.agents[1].texts
    for b in range(2):
        for j in range(num_joint):
            k0, k1 = (j, j) if joint_mode == "aligned" else divmod(j, 3)
            assert first[b * num_joint + j] == texts0[b * 3 + k0]
            assert second[b * num_joint + j] == texts1[b * 3 + k1]


def test_reward_with_prompts_first_gets_agent_zeros_prompts(tmp_path):
    seen = []

    def reward(prompts, a, b):
        seen.extend(prompts)
        return [1.0] * len(a)

    trainer = make_trainer(
        tmp_path,
        reward_func=reward,
        formatters=lambda row: "Q: " + row["prompt"],
        args=small_config(tmp_path, reward_call="batch"),  # "auto" also checks it once per joint action
    )
    trainer.rollout(trainer.train_prompts, [1, 2])
    assert seen == ["Q: a cat"] * 2 + ["Q: tell me, why?"] * 2  # as comlrl 1.4.3: the formatted prompt


def test_formatters_give_each_agent_its_prompt(tmp_path):
    trainer = make_trainer(tmp_path, formatters=[lambda r: "x" + r["prompt"], lambda r: "y" + r["prompt"]])
    assert trainer.train_prompts.agent_prompts(0, [1]) == ["xa cat"]
    assert trainer.train_prompts.agent_prompts(1, [1]) == ["ya cat"]


def test_same_seed_same_run(tmp_path):
    results = []
    for run in range(2):
        tok = char_tokenizer()
        trainer = make_trainer(
            tmp_path / str(run),
            agents=[tiny_llama(tok, 0), tiny_llama(tok, 1)],
            tokenizer=tok,
            args=small_config(tmp_path / str(run), num_train_epochs=2),
        )
        results.append(trainer.train().epoch_reward_means)
    assert results[0] == results[1]


def test_tokenizer_without_pad_token_pads_with_eos_and_says_so_once(tmp_path):
    tok = char_tokenizer(pad=False)
    agents = [tiny_llama(tok, 0), tiny_llama(tok, 1)]
    with pytest.warns(UserWarning, match="no pad token; padding with its EOS token '<eos>'") as record:
        trainer = make_trainer(tmp_path, agents=agents, tokenizer=tok)
    assert len([w for w in record if "pad token" in str(w.message)]) == 1
    assert tok.pad_token == "<eos>"
    trainer.train()


# ------------------------------------------------------------------------------------------
# bad input: a clear error naming the culprit, before any weight changes or file is written
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(agents=[]), ValueError, "agents is empty"),
        (dict(formatters=[str]), ValueError, "got 1 formatters for 2 agents"),
        (dict(train_dataset=[]), ValueError, "train_dataset is empty"),
        (
            dict(train_dataset=[{"prompt": "a"}, {"text": "b"}]),
            ValueError,
            "train_dataset row 1 has no 'prompt' column",
        ),
        (dict(formatters=lambda row: 3), TypeError, "agent 0 returned int for train_dataset row 0"),
        (
            dict(formatters=[str, lambda row: row["x"]]),
            RuntimeError,
            "of agent 1 raised KeyError: 'x' on train_dataset row 0",
        ),
        (dict(reward_func=lambda a, b, c, d: [0.0]), TypeError, "cannot be called with 2 completion lists"),
        (dict(reward_func=None), ValueError, "reward_func is required"),
        (dict(train_dataset=["just a string"]), TypeError, "train_dataset row 0 is a str; rows must be mappings"),
        (dict(formatters=[str, "not callable"]), TypeError, r"formatters\[1\] must be callable, got str"),
        (dict(args={"num_generations": 2}), TypeError, "args must be a MAGRPOConfig"),
    ],
)
def test_bad_trainer_arguments(tmp_path, kwargs, error, match):
    with pytest.raises(error, match=match):
        make_trainer(tmp_path, **kwargs)


def test_tokenizer_count_must_match_agents(tmp_path):
    tok = char_tokenizer()
    with pytest.raises(ValueError, match="got 3 tokenizers for 2 agents"):
        make_trainer(tmp_path, tokenizer=[tok] * 3, agents=[tiny_llama(tok), tiny_llama(tok)])


def test_the_same_model_twice_is_refused(tmp_path):
    tok = char_tokenizer()
    model = tiny_llama(tok)
    with pytest.raises(ValueError, match=r"agents\[1\] is the same object as agents\[0\]"):
        make_trainer(tmp_path, agents=[model, model], tokenizer=tok)


def test_no_agents_at_all():
    with pytest.raises(ValueError, match="no agents"):
        MAGRPOTrainer(reward_func=length_sum, train_dataset=DATA)


def raises(a, b):
    raise ZeroDivisionError("boom")


@pytest.mark.parametrize(
    "reward,error,match",
    [
        (
            raises,
            RuntimeError,
            r"reward_func raises raised ZeroDivisionError: boom \(called with 2 lists of sizes \[4, 4\]",
        ),
        (
            lambda a, b: [1.0, 2.0],
            ValueError,
            r"returned 2 values \(\[1.0, 2.0\]\) for joint actions 0-3 \(dataset rows \d, \d\); expected 4 values",
        ),
        (lambda a, b: [1.0, math.nan, 1.0, 1.0], ValueError, r"returned nan for joint action 1 \(dataset row \d\)"),
        (lambda a, b: [1.0, 1.0, 1.0, "high"], TypeError, r"returned 'high' \(str\) for joint action 3"),
    ],
)
def test_bad_reward_stops_before_any_update_or_output(tmp_path, reward, error, match):
    trainer = make_trainer(tmp_path, reward_func=reward)
    before = snapshot(trainer.agents)
    with pytest.raises(error, match=match):
        trainer.train()
    assert unchanged(before, trainer.agents)
    assert os.listdir(tmp_path / "run") == []  # claimed before step 1 (its lock is gone with the run), nothing written


def test_non_finite_loss_stops_without_touching_weights(tmp_path, monkeypatch):
    real = policy_terms.policy_gradient_loss

    def nan_loss(*args, **kwargs):
        out = real(*args, **kwargs)
        return out._replace(loss=out.loss * math.nan)

    monkeypatch.setattr(policy_terms, "policy_gradient_loss", nan_loss)
    trainer = make_trainer(tmp_path)
    before = snapshot(trainer.agents)
    with pytest.raises(FloatingPointError, match="agent 0 has a non-finite loss"):
        trainer.train()
    assert unchanged(before, trainer.agents)


def test_agent_model_loads_independent_copies_and_their_tokenizer(tmp_path):
    tok = char_tokenizer()
    tiny_llama(tok).save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    trainer = MAGRPOTrainer(
        agent_model=str(tmp_path / "tiny"), num_agents=3, reward_func=lambda a, b, c: [0.0] * len(a),
        train_dataset=DATA, args=small_config(tmp_path),
    )  # fmt: skip
    assert trainer.num_agents == 3 and len({id(a) for a in trainer.agents}) == 3
    assert (
        trainer.agents[0].model.embed_tokens.weight.data_ptr() != trainer.agents[1].model.embed_tokens.weight.data_ptr()
    )
    assert [len(t) for t in trainer.agents.tokenizers] == [len(tok)] * 3


def test_agents_and_another_agent_model_together_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"agent_model='somewhere' and agents\[0\] \(.*\) disagree: pass only one"):
        make_trainer(tmp_path, agent_model="somewhere")


def test_rollout_metrics_by_hand():
    from comlrl.metrics.rollout import rollout_metrics
    from comlrl.rollout import AgentRollout
    from comlrl.rollout.tree import RolloutTree, Turn
    from comlrl.utils.stats import finish

    # one agent, 2 rows x G = 2; completion masks give lengths [1, 3, 2, 2]; sample 1 truncated
    mask = torch.tensor([[1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 1, 0]], dtype=torch.bool)
    agent = AgentRollout(
        prompt_ids=torch.zeros(4, 1, dtype=torch.long), prompt_mask=torch.ones(4, 1, dtype=torch.long),
        completion_ids=torch.zeros(4, 3, dtype=torch.long), completion_mask=mask, texts=["a", "bcd", "ef", "gh"],
        truncated=torch.tensor([False, True, False, False]),
    )  # fmt: skip
    rewards = torch.tensor([[[1.0], [3.0]], [[2.0], [2.0]]])  # (B=2, J=2, N=1): row 1's group is constant
    turn = Turn(1, [0, 1], [["p", "q"]], [[["p"]], [["q"]]], [[[]], [[]]], [agent], rewards, rewards / 10,
                rewards.unsqueeze(0), children=torch.full((2, 2), -1))  # fmt: skip
    tree = RolloutTree([turn], torch.arange(2).unsqueeze(1), 2, ["score"], transition_calls=0)
    credits = rewards.permute(2, 0, 1)  # (N, B, G)
    metrics = finish(rollout_metrics(tree, [rewards], [credits], [[torch.tensor([-1.0, 1.0, 0.0, 0.0])]]))
    assert metrics["reward/mean"] == 2.0 and metrics["reward/raw_mean"] == pytest.approx(0.2)
    assert metrics["reward/score/mean"] == 2.0 and metrics["reward/score/std"] == pytest.approx(math.sqrt(2 / 3))
    assert metrics["agent0/zero_std_group_frac"] == 0.5 and metrics["agent0/truncated_frac"] == 0.25
    assert (metrics["agent0/completion_length_min"], metrics["agent0/completion_length_max"]) == (1.0, 3.0)
    assert metrics["agent0/completion_length"] == 2.0 and metrics["agent0/advantage_mean"] == 0.0
