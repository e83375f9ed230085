"""Centralized MADPO on tiny random models: ONE model writes every role, its candidates are
split into roles for the reward (a response the adapter cannot split scores as empty roles,
and is counted), the pairs hold its joint tokens, the loss is single-agent DPO on the joint
response, eval_logger gets role texts, resuming continues exactly, and misuse is named."""

import pytest
import torch

from comlrl.trainers import MADPOConfig, MADPOTrainer
from comlrl.trainers.dpo.iterative import MADPOIterConfig, MADPOIterTrainer
from comlrl.trainers.dpo.pairs import PreferencePair

from .helpers import DATA, AfterTwo, char_tokenizer, content_score, log_lines, tiny_llama, unsplittable, weights


def config(tmp_path, **overrides):
    values = dict(
        collaboration_mode="centralized",
        num_train_epochs=2,
        preference_num_candidates=4,
        preference_pairs_per_sample=2,
        train_batch_size=2,
        max_new_tokens=5,
        logging_steps=1,
        eval_interval=0,
        agent_learning_rate=1e-3,
        output_dir=str(tmp_path / "run"),
    )
    values.update(overrides)
    return MADPOConfig(**values)


def centralized(tmp_path, reward=content_score, agents=None, **kwargs):
    tok = char_tokenizer()
    kwargs.setdefault("args", config(tmp_path))
    kwargs.setdefault("centralized_comparator_adapter", AfterTwo())
    return MADPOTrainer(
        agents=agents or [tiny_llama(tok)], tokenizer=tok, train_dataset=DATA, reward_func=reward, **kwargs
    )


def joint_logp(model, prompt_ids, completion_ids):
    """By hand: the summed log-prob of every completion token (the last included) after the
    prompt, from the raw logits (temperature 1, as 1.4.3's joint_sequence_log_prob), whatever
    the sampling temperature."""
    ids = torch.cat([prompt_ids, completion_ids]).unsqueeze(0)
    logits = model(ids).logits[0, len(prompt_ids) - 1 : -1]
    return torch.log_softmax(logits.float(), dim=-1).gather(1, completion_ids.unsqueeze(1)).sum()


def test_the_adapters_are_importable_from_1_4_3s_preference_paths():
    import comlrl.trainers.preference.centralized
    from comlrl.engine import centralized as where_they_live
    from comlrl.trainers import preference

    names = ("TaggedCentralizedComparatorAdapter", "CentralizedComparatorAdapter", "CentralizedComparatorParseError")
    for name in names:
        assert getattr(preference, name) is getattr(where_they_live, name) is getattr(preference.centralized, name)
        assert name in preference.__all__
    assert comlrl.trainers.preference.centralized.__all__ == sorted(names)


# ------------------------------------------------------------------------------ pairs
def test_the_reward_sees_roles_and_the_pairs_hold_the_one_models_joint_tokens(tmp_path):
    seen = []

    def reward(first, second):
        seen.extend(zip(first, second))
        return content_score(first, second)

    formatters = [lambda row: f"a {row['prompt']}", lambda row: f"b {row['prompt']}"]
    madpo = centralized(tmp_path, reward, formatters=formatters)
    assert (madpo.num_agents, madpo.num_roles, madpo.args.num_agents) == (1, 2, None)
    metrics = madpo.prepare(None)
    tok, split = madpo.agents.tokenizers[0], madpo.collaboration.split

    assert len(seen) == len(DATA) * 4  # every candidate, scored once as its roles' texts
    failures = sum(texts == ("", "") for texts in seen)  # a split response's first role is never empty
    assert 0 < failures < len(seen)  # both kinds were scored
    assert metrics["centralized/parse_failure_frac"] == failures / len(seen)
    assert metrics["preference/num_pairs"] == len(madpo.pairs) > 0
    for pair in madpo.pairs:
        row = DATA[pair.row]
        assert pair.prompts == [f"a {row['prompt']} : b {row['prompt']}"]  # the adapter's joint prompt
        assert tok.decode(pair.prompt_ids[0]) == pair.prompts[0] and len(pair.chosen_ids) == 1
        for ids, text, score in (
            (pair.chosen_ids[0], pair.chosen_texts[0], pair.chosen_reward),
            (pair.rejected_ids[0], pair.rejected_texts[0], pair.rejected_reward),
        ):
            assert tok.decode(ids, skip_special_tokens=True) == text  # the joint response, as sampled
            roles = split(text, row)
            assert tuple(roles) in seen and content_score([roles[0]], [roles[1]]) == [score]
            if unsplittable(text):
                assert roles == ["", ""] and score == content_score([""], [""])[0]


# ------------------------------------------------------------------------------ the loss
def test_the_loss_and_gradient_are_single_agent_dpo_on_the_joint_response(tmp_path):
    madpo = centralized(tmp_path, args=config(tmp_path, micro_batch_size=2))
    madpo.prepare(None)
    tok, model = madpo.agents.tokenizers[0], madpo.agents[0]
    prompt = madpo.collaboration.joint_prompt(DATA[0])
    prompt_ids = torch.tensor(tok(prompt).input_ids)

    def completion(text):
        return torch.tensor(tok(text).input_ids + [tok.eos_token_id])  # the EOS is the last token

    def pair(chosen, rejected):
        return PreferencePair(
            row=0,
            prompts=[prompt],
            prompt_ids=[prompt_ids],
            chosen_ids=[completion(chosen)],
            rejected_ids=[completion(rejected)],
            chosen_texts=[chosen],
            rejected_texts=[rejected],
            chosen_reward=1.0,
            rejected_reward=0.0,
        )

    madpo.objective.pairs = [pair("no, ok", "bad"), pair("zz", "ab, cd")]
    assert madpo.sampling.temperature != 1  # the loss's log-probs are temperature 1 all the same
    beta = madpo.args.dpo_beta
    margins = torch.stack(
        [
            joint_logp(model, p.prompt_ids[0], p.chosen_ids[0]) - joint_logp(model, p.prompt_ids[0], p.rejected_ids[0])
            for p in madpo.pairs
        ]
    )
    loss = -torch.nn.functional.logsigmoid(beta * margins).mean()
    expected = torch.autograd.grad(loss, list(model.parameters()))

    madpo.learners.zero_grad()  # the update's backward, one pair per forward (micro_batch_size=2)
    madpo.objective.agent_backward(0, madpo.objective.batch(madpo.pairs, 0), torch.zeros(2), None, 2)
    for parameter, want in zip(model.parameters(), expected):
        torch.testing.assert_close(parameter.grad, want, atol=1e-6, rtol=1e-4)
    metrics = madpo.step([0, 1]).metrics  # before its update
    assert metrics["dpo/loss"] == pytest.approx(loss.item(), abs=1e-5)
    assert metrics["dpo/margin"] == pytest.approx(margins.mean().item(), abs=1e-4)


# ------------------------------------------------------------------------------ the run
def test_training_logs_the_parse_failure_share_and_saves_the_one_model(tmp_path):
    madpo = centralized(tmp_path, args=config(tmp_path, num_train_epochs=1))
    madpo.train()
    first = log_lines(tmp_path / "run", "metrics.jsonl")[0]
    assert first["step"] == 0 and 0 < first["centralized/parse_failure_frac"] < 1
    assert first["preference/num_pairs"] == len(madpo.pairs)
    folders = madpo.save_model(str(tmp_path / "saved"))
    assert [folder.rsplit("/", 1)[-1] for folder in folders] == ["agent_0"]
    assert sorted(p.name for p in (tmp_path / "saved").iterdir()) == ["agent_0"]


def test_eval_logger_gets_role_texts_and_metrics_callback_one_sample_per_role(tmp_path):
    logged, sampled, joint = [], [], []

    def eval_logger(agent_completions_turns, batch_items):
        logged.append(agent_completions_turns)
        return {"first_role_chars": sum(len(turns[0]) for turns in agent_completions_turns[0])}

    def metrics_callback(samples):
        sampled.append(samples)
        return {"samples": len(samples)}

    rows = [dict(row) for row in DATA * 3]  # distinct rows: the callback gets each row's samples
    madpo = centralized(
        tmp_path,
        eval_dataset=rows,
        eval_logger=eval_logger,
        metrics_callback=metrics_callback,
        args=config(tmp_path, eval_num_samples=None),
    )
    role_hooks = madpo.eval_hooks

    def spy(completions, rows, prompts, num_turns):  # the one model's [agent][row][turn] responses
        joint.append(completions[0])
        return role_hooks(completions, rows, prompts, num_turns)

    object.__setattr__(madpo.run, "eval_hooks", spy)  # the run is frozen: the test swaps its hooks for a spy
    metrics = madpo.evaluate()
    split = [madpo.collaboration.split(turns[0], row) for turns, row in zip(joint[0], rows)]
    assert logged[0] == [[[texts[role]] for texts in split] for role in range(2)]  # [role][row][turn]
    assert metrics["eval/first_role_chars"] == sum(len(texts[0]) for texts in split)
    failures = sum(unsplittable(turns[0]) for turns in joint[0])
    assert 0 < failures < len(rows)
    assert metrics["eval/centralized/parse_failure_frac"] == pytest.approx(failures / len(rows))
    assert [[s.agent_idx for s in samples] for samples in sampled] == [[0, 1]] * len(rows)
    assert [[s.completion for s in samples] for samples in sampled] == split
    assert metrics["eval/samples"] == 2


def test_resume_continues_exactly(tmp_path):
    def run_config():
        return config(tmp_path, save_steps=2, lr_scheduler_type="linear", dpo_reference="initial")

    straight = centralized(tmp_path, eval_dataset=DATA, args=run_config())
    straight.train()
    logs = {name: log_lines(tmp_path / "run", name) for name in ("metrics.jsonl", "samples.jsonl")}
    assert straight.global_step >= 4
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoint-2").glob("agent_*")) == ["agent_0"]

    resumed = centralized(tmp_path, eval_dataset=DATA, args=run_config())  # a fresh model; the same folder
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))
    assert resumed.global_step == straight.global_step
    for a, b in zip(weights(straight), weights(resumed), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    for straight_pair, resumed_pair in zip(straight.pairs, resumed.pairs, strict=True):
        assert torch.equal(straight_pair.chosen_ids[0], resumed_pair.chosen_ids[0])
        assert straight_pair.reference_deltas == resumed_pair.reference_deltas
    for name, lines in logs.items():
        assert log_lines(tmp_path / "run", name) == lines
    assert resumed.args.num_agents is None and resumed.num_roles == 2


# ------------------------------------------------------------------------------ misuse
def test_an_adapter_without_centralized_mode_is_an_error_naming_collaboration_mode(tmp_path):
    with pytest.raises(ValueError, match=r"collaboration_mode='decentralized'.*set collaboration_mode='centralized'"):
        centralized(tmp_path, args=config(tmp_path, collaboration_mode="decentralized"))
    iterative = MADPOIterConfig(output_dir=str(tmp_path / "iter"))
    with pytest.raises(ValueError, match=r"collaboration_mode='decentralized'.*set collaboration_mode='centralized'"):
        MADPOIterTrainer(
            agents=[tiny_llama(char_tokenizer())],
            tokenizer=char_tokenizer(),
            train_dataset=DATA,
            reward_func=content_score,
            args=iterative,
            centralized_comparator_adapter=AfterTwo(),
        )


# ------------------------------------------------------------------------------ in rounds
def test_madpoiter_one_model_against_its_own_history_in_rounds(tmp_path):
    args = MADPOIterConfig(
        collaboration_mode="centralized",
        comparator_policy="history",
        num_iterations=2,
        preference_num_candidates=4,
        preference_pairs_per_sample=2,
        train_batch_size=2,
        max_new_tokens=5,
        logging_steps=1,
        eval_interval=0,
        agent_learning_rate=1e-3,
        output_dir=str(tmp_path / "run"),
    )
    assert args.comparator_generation_mode == "centralized"  # 1.4.3 forced it with centralized collaboration
    tok = char_tokenizer()
    seen = []

    def role_reward(first, second):
        seen.append((first, second))
        return content_score(first, second)

    madpo = MADPOIterTrainer(agents=[tiny_llama(tok)], tokenizer=tok, train_dataset=DATA, reward_func=role_reward,
                             args=args, centralized_comparator_adapter=AfterTwo())  # fmt: skip
    madpo.train()
    assert madpo.num_agents == 1 and madpo.rounds.round == 1
    for shard in madpo.rounds.shards:
        for pair in shard:
            assert pair.prompts == [" : ".join([DATA[pair.row]["prompt"]] * 2)] and len(pair.chosen_texts) == 1
    assert all(len(text) <= 2 for first, _ in seen for text in first)  # the reward saw roles: split answers
    starts = [line for line in log_lines(tmp_path / "run", "metrics.jsonl") if "iter/current_iteration" in line]
    assert len(starts) == 2
    # Each round calls the reward per batch of rows (2 rows, then 1): current candidates, then the comparator's.
    # An unsplittable answer reaches it as empty roles.
    for round_index, line in enumerate(starts):
        calls = [first for first, _ in seen[4 * round_index : 4 * round_index + 4]]
        for key, side in (
            ("centralized/parse_failure_frac", calls[0::2]),
            ("iter/comparator_parse_failure_frac", calls[1::2]),
        ):
            unsplit = sum(text == "" for batch in side for text in batch) / sum(len(batch) for batch in side)
            assert line[key] == pytest.approx(unsplit)


def test_two_models_in_centralized_mode_is_an_error_naming_what_to_pass(tmp_path):
    tok = char_tokenizer()
    with pytest.raises(
        ValueError,
        match=r"MADPOTrainer with collaboration_mode='centralized' trains ONE model that writes all 2 roles, but "
        r"agents holds 2 models: pass agents=\[model\].*set collaboration_mode='decentralized'",
    ):
        centralized(tmp_path, agents=[tiny_llama(tok, 0), tiny_llama(tok, 1)])


@pytest.mark.filterwarnings("ignore:agent 0's prompt")  # the tagged prompt is longer than the tiny model's context
def test_num_agents_counts_the_roles(tmp_path):
    seen = []

    def reward(a, b, c):
        seen.append((a, b, c))
        return [1.0] * len(a)

    madpo = centralized(tmp_path, reward, num_agents=3, centralized_comparator_adapter=None)  # the tagged default
    assert (madpo.num_agents, madpo.num_roles) == (1, 3)
    scored = madpo.reward([""], [["<agent_0>x</agent_0><agent_2>z</agent_2>"]], [0], {"turn": 1}, [DATA[0]])
    assert seen == [(["x"], [""], ["z"])] and scored.raw.tolist() == [[1.0]]
    assert "<agent_2>" in madpo.train_prompts.prompts[0][0]
    with pytest.raises(ValueError, match="num_agents=3 but the config's num_agents=2"):
        centralized(tmp_path, num_agents=3, args=config(tmp_path, num_agents=2))
