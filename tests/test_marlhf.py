"""MARLHF on tiny random models: the Bradley-Terry loss by hand, the joint reward model (its
input text, pooling at the last real token whatever the padding side, no LM head, fitting,
saving), the config's checks, and the trainer end to end (MAGRPO and IAC): train on the
reward model's raw scores, evaluate on the task reward, save and resume without refitting."""

import math

import pytest
import torch

import comlrl
from comlrl.algorithms import bradley_terry_loss, pair_accuracy
from comlrl.models.reward_model import JointRewardModel, joint_reward_text, last_real_token
from comlrl.trainers import MARLHFConfig, MARLHFTrainer
from comlrl.trainers.reinforce import CentralizedMAGRPOConfig, MAREINFORCEConfig, MARLOOConfig
from comlrl.trainers.rlhf import reward_model as reward_fit

from .helpers import (
    DATA,
    MIXED,
    AfterTwo,
    assert_every_field_documented,
    char_tokenizer,
    content_score,
    load_example,
    log_lines,
    text_pair,
    tiny_gpt2,
    tiny_llama,
    unsplittable,
    weights,
)


def config(tmp_path, **overrides):
    values = dict(
        num_train_epochs=1,
        preference_num_candidates=4,
        preference_pairs_per_sample=2,
        num_generations=2,
        max_new_tokens=5,
        logging_steps=1,
        eval_interval=0,
        agent_learning_rate=1e-3,
        reward_learning_rate=1e-3,
        reward_eval_fraction=0.34,  # one of the three prompts
        output_dir=str(tmp_path / "run"),
    )
    values.update(overrides)
    return MARLHFConfig(**values)


def trainer(tmp_path, model_folder, reward=content_score, **kwargs):
    tok = char_tokenizer()
    kwargs.setdefault("args", config(tmp_path, reward_model_name=model_folder))
    agents = [tiny_llama(tok, seed=i) for i in range(2)]
    return MARLHFTrainer(
        agents=agents, tokenizer=tok, train_dataset=DATA, eval_dataset=DATA, reward_func=reward, **kwargs
    )


def reward_model(build=tiny_llama, seed=0):
    """A reward model on a tiny random transformer with a random (not zero) head."""
    tok = char_tokenizer()
    model = JointRewardModel(build(tok), tok)
    torch.manual_seed(seed)
    torch.nn.init.normal_(model.head.weight)
    return model.eval()


# ------------------------------------------------------------------------------ the loss
def test_bradley_terry_loss_and_accuracy_by_hand():
    chosen, rejected = torch.tensor([2.0, 0.0, -1.0]), torch.tensor([1.0, 0.0, 1.0])
    # -log σ(1) = 0.31326, -log σ(0) = log 2, -log σ(-2) = 2.12693
    expected = (0.313262 + math.log(2) + 2.126928) / 3
    assert bradley_terry_loss(chosen, rejected).item() == pytest.approx(expected, abs=1e-5)
    assert pair_accuracy(chosen, rejected).item() == pytest.approx(1 / 3)  # the tie is not a correct ranking
    big = torch.tensor([1000.0])
    assert bradley_terry_loss(big, -big).item() == 0.0 and math.isfinite(bradley_terry_loss(-big, big).item())


# ------------------------------------------------------------------------------ the reward model
def test_the_joint_text_is_1_4_3s():
    text = joint_reward_text(["write:", "review:"], ["a cat", "nice"])
    assert text == (
        "Joint multi-agent response\n\nAgent 1 prompt:\nwrite:\n\nAgent 1 response:\na cat\n\n"
        "Agent 2 prompt:\nreview:\n\nAgent 2 response:\nnice"
    )
    with pytest.raises(ValueError, match="one prompt per completion: got 1 and 2"):
        joint_reward_text(["x"], ["a", "b"])


def test_last_real_token_on_either_padding_side():
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1], [0, 1, 0, 0]])
    assert last_real_token(mask).tolist() == [3, 2, 3, 1]


@pytest.mark.parametrize("build", [tiny_llama, tiny_gpt2], ids=["llama", "gpt2"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_scores_pool_the_last_real_token_whatever_the_padding(build, side):
    model = reward_model(build)
    model.tokenizer.padding_side = side
    texts = ["a cat", "tell me, why? because.", "hi"]
    ids, mask = model.encode(texts)
    assert (mask[:, 0] == 0).any() if side == "left" else (mask[:, -1] == 0).any()  # padding is there
    with torch.no_grad():
        scores = model(ids, mask)
        for k, text in enumerate(texts):  # each text alone, no padding: its last token's hidden state
            alone = model.tokenizer(text, return_tensors="pt")["input_ids"]
            hidden = model.backbone(input_ids=alone).last_hidden_state[0, -1]
            torch.testing.assert_close(scores[k], model.head(hidden).squeeze(-1), atol=1e-5, rtol=1e-5)


def test_the_lm_head_is_never_run():
    tok = char_tokenizer()
    causal = tiny_llama(tok)

    def refuse(*args, **kwargs):
        raise AssertionError("the LM head ran")

    causal.lm_head.forward = refuse
    model = JointRewardModel(causal, tok)
    assert model.backbone is causal.model
    assert not any("lm_head" in name for name, _ in model.named_modules())
    assert model.scores(["a cat", "hi"]).shape == (2,)


def pair(row, chosen, rejected):
    return text_pair(row, "say:", chosen, rejected)


def test_fitting_ranks_a_separable_set():
    pairs = [pair(k, ["yes yes", "yes"], ["no no", "no"]) for k in range(4)]
    pairs += [pair(4 + k, ["a yes", "yes!"], ["a no", "no!"]) for k in range(4)]
    model = JointRewardModel(tiny_llama(char_tokenizer()), char_tokenizer())
    before = reward_fit.score_pairs(model, pairs, None)
    assert before == (pytest.approx(math.log(2)), 0.0)  # a fresh head scores every text 0
    fitted = reward_fit.fit_reward_model(model, pairs, 4, 4, 3e-2, 1.0, torch.Generator().manual_seed(0))
    after = reward_fit.score_pairs(model, pairs, None)
    assert after.loss < 0.5 * before.loss and after.accuracy == 1.0
    assert fitted.loss < before.loss  # the last epoch's batches, as they were fitted
    assert model.head.bias.item() == 0.0  # Bradley-Terry cannot tell a shared offset: it is not trained


@pytest.mark.parametrize("second", [True, False, 0.5, "tok"])
def test_1_4_3s_positional_freeze_backbone_is_refused_naming_the_new_signature(second):
    # 1.4.3: JointRewardModel(backbone, freeze_backbone=False); the tokenizer goes second now
    with pytest.raises(
        TypeError,
        match=r"JointRewardModel's second argument is the tokenizer, got .*JointRewardModel\(backbone, tokenizer, "
        r"freeze_backbone=False, max_length=None\).*write JointRewardModel\(backbone, tokenizer, freeze_backbone=",
    ):
        JointRewardModel(tiny_llama(char_tokenizer()), second)


def test_a_frozen_backbone_trains_the_head_only():
    model = JointRewardModel(tiny_llama(char_tokenizer()), char_tokenizer(), freeze_backbone=True)
    assert model.trainable_parameters() == [model.head.weight]  # not the bias, which Bradley-Terry cannot tell


def test_saved_and_loaded_it_scores_the_same(tmp_path):
    model = reward_model(tiny_gpt2)
    model.max_length = 40
    model.save(str(tmp_path / "rm"))
    loaded = JointRewardModel.load(str(tmp_path / "rm"))
    assert loaded.max_length == 40 and not loaded.freeze_backbone
    texts = [joint_reward_text(["p", "q"], ["a cat", "b"]), "hi"]
    torch.testing.assert_close(loaded.score_texts(texts), model.score_texts(texts))
    with pytest.raises(ValueError, match="holds no reward_model.json"):
        JointRewardModel.load(str(tmp_path))


# ------------------------------------------------------------------------------ config
def test_every_field_is_documented_and_the_defaults_are_1_4_3s_but_the_device():
    assert_every_field_documented(MARLHFConfig)
    args = MARLHFConfig()
    assert (args.rl_algorithm, args.num_generations, args.reward_model_name) == ("magrpo", 4, None)
    assert (args.reward_learning_rate, args.reward_num_train_epochs, args.reward_train_batch_size) == (1e-5, 1, 1)
    assert (args.reward_max_length, args.reward_freeze_backbone) == (None, False)
    assert args.reward_model_device is None  # 1.4.3: "cuda:0", which fails without a GPU
    assert MARLHFConfig(rl_algorithm="MAReforce").rl_algorithm == "mareinforce"  # 1.4.3's alias, any case
    loo = MARLHFConfig(rl_algorithm="marloo", advantage_mode="rloo").rl_config()
    assert type(loo) is MARLOOConfig and loo.advantage_mode == "rloo"
    raw = MARLHFConfig(rl_algorithm="mareinforce", advantage_normalization=True, train_batch_size=1).rl_config()
    assert type(raw) is MAREINFORCEConfig and raw.advantage_normalization and raw.train_batch_size == 1
    iac = MARLHFConfig(rl_algorithm="iac", num_generations=1, critic_type="q", ppo_epochs=3).rl_config()
    assert (iac.num_generations, iac.critic_type, iac.ppo_epochs, iac.critic_learning_rate) == (1, "q", 3, 5e-6)


@pytest.mark.parametrize(
    "values,match",
    [
        (dict(rl_algorithm="ppo"), r"rl_algorithm='ppo'; expected one of \['iac', 'maac', 'magrpo', 'mareinforce'"),
        (dict(num_generations=1), r"num_generations must be >= 2 with rl_algorithm='magrpo'.*got 1"),
        (dict(rl_algorithm="maac", num_generations=0), r"num_generations must be an integer >= 1, got 0"),
        (dict(advantage_mode="rloo"), r"advantage_mode='rloo', but rl_algorithm='magrpo' uses 'mean'"),
        (dict(rl_algorithm="iac", advantage_mode="mean"), r"rl_algorithm='iac' has a critic, not a group baseline"),
        (dict(critic_type="q"), r"critic_type='q' is a critic's setting, and rl_algorithm='magrpo' has no critic"),
        (dict(reward_learning_rate=0), r"reward_learning_rate must be"),
        (dict(reward_num_train_epochs=0), r"reward_num_train_epochs must be an integer >= 1, got 0"),
        (dict(reward_train_batch_size=0), r"reward_train_batch_size must be an integer >= 1, got 0"),
        (dict(reward_max_length=0), r"reward_max_length must be an integer >= 1 or None, got 0"),
        (dict(reward_eval_fraction=1.0), r"reward_eval_fraction must be in \[0, 1\), got 1.0"),
        (dict(reward_model_device="gpu:7"), r"reward_model_device must be None .*got 'gpu:7'"),
        (dict(reward_model_name=""), r"reward_model_name must be a folder or hub id"),
        (dict(dpo_beta=0.5), r"dpo_beta=0.5 has no effect in MARLHF \(MARLHF fits a reward model"),
        (dict(rl_algorithm="iac", critic_type="w", num_generations=1), r"critic_type='w'; expected one of"),
    ],
)
def test_bad_field_is_named_with_what_is_allowed(values, match):
    with pytest.raises(ValueError, match=match):
        MARLHFConfig(**values)


# ------------------------------------------------------------------------------ the trainer
def test_the_reward_model_needs_a_name_when_the_agents_are_objects(tmp_path):
    with pytest.raises(ValueError, match=r"reward_model_name is None and the agents were given as model objects"):
        trainer(tmp_path, None, args=config(tmp_path))


def test_critic_arguments_and_centralized_adapters_are_refused_where_they_mean_nothing(tmp_path, model_folder):
    with pytest.raises(ValueError, match=r"critic_model is given, but rl_algorithm='magrpo' has no critic"):
        trainer(tmp_path, model_folder, critic_model=model_folder)
    with pytest.raises(
        ValueError, match=r"adapter is given, but collaboration_mode='decentralized'.*set collaboration_mode"
    ):
        trainer(tmp_path, model_folder, centralized_comparator_adapter=object())
    with pytest.raises(ValueError, match=r"collaboration_mode='centralized' trains one model with centralized MAGRPO"):
        config(tmp_path, collaboration_mode="centralized", rl_algorithm="iac", num_generations=1)


def recording(reward, trainer_box):
    """``reward`` that records, per call, whether the reward model existed then."""
    calls = []

    def task_reward(*completions):
        values = reward(*completions)
        calls.append((trainer_box[0].reward_model is not None, values))
        return values

    task_reward.calls = calls
    return task_reward


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A MARLHF run with MAGRPO: its trainer, its folder and the task reward's calls."""
    tmp_path = tmp_path_factory.mktemp("marlhf")
    tok = char_tokenizer()
    tiny_llama(tok, 0).save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    box = []
    task = recording(content_score, box)
    args = config(tmp_path, reward_model_name=str(tmp_path / "model"), save_steps=1)
    box.append(trainer(tmp_path, None, reward=task, args=args, reward_processor=lambda r: 10 * r))
    box[0].train()
    return box[0], tmp_path, task.calls


def test_train_fits_the_reward_model_on_held_out_prompts_and_logs_it(trained):
    marlhf_trainer, tmp_path, _ = trained
    first = log_lines(tmp_path / "run", "metrics.jsonl")[0]
    assert first["step"] == 0 and first["preference/num_pairs"] == len(marlhf_trainer.pairs)
    assert first["reward_model/eval_pairs"] > 0  # the pairs of one prompt of three
    assert first["reward_model/train_pairs"] + first["reward_model/eval_pairs"] == len(marlhf_trainer.pairs)
    for key in ("reward_model/loss", "reward_model/accuracy", "reward_model/eval_loss", "reward_model/eval_accuracy"):
        assert math.isfinite(first[key])
    assert marlhf_trainer.reward_model.device == marlhf_trainer.agents.device(0)  # not cuda:0
    assert not any(p.requires_grad for p in marlhf_trainer.reward_model.parameters())  # frozen
    assert (tmp_path / "run" / "reward_model" / "reward_head.safetensors").exists()


def test_training_scores_with_the_reward_model_raw_and_evaluation_with_the_task_reward(trained):
    marlhf_trainer, tmp_path, calls = trained
    steps = [line for line in log_lines(tmp_path / "run", "metrics.jsonl") if "reward/mean" in line]
    assert len(steps) == marlhf_trainer.global_step == 2
    for step in steps:
        assert "reward/reward_model/mean" in step and "reward/task_reward/mean" not in step
        assert step["reward/mean"] == step["reward/raw_mean"]  # the processor is not applied to its scores
    after_fit = [values for had_model, values in calls if had_model]
    assert len(after_fit) == 1  # only the evaluation after the last step called the task reward
    evaluation = [line for line in log_lines(tmp_path / "run", "metrics.jsonl") if "eval/reward_mean" in line][-1]
    raw = sum(after_fit[0]) / len(after_fit[0])
    assert evaluation["eval/raw_reward_mean"] == pytest.approx(raw)
    assert evaluation["eval/reward_mean"] == pytest.approx(10 * raw)  # the task reward, processed


def test_a_second_train_is_refused_before_overwrite_output_dir_clears_the_reward_model(trained, monkeypatch):
    marlhf_trainer, tmp_path, _ = trained
    monkeypatch.setattr(marlhf_trainer.args, "overwrite_output_dir", True)
    logged = log_lines(tmp_path / "run", "metrics.jsonl")
    with pytest.raises(
        RuntimeError,
        match=r"MARLHFTrainer.train\(\) was already called on this trainer: its preference pairs and reward model came "
        r"from the policy as it was before that first call.*use MARLHFIterTrainer .*or build a new MARLHFTrainer",
    ):
        marlhf_trainer.train()  # 1.4.3 fitted a new reward model to new pairs of the trained policy
    assert (tmp_path / "run" / "reward_model").is_dir() and log_lines(tmp_path / "run", "metrics.jsonl") == logged


def test_save_model_writes_the_reward_model_beside_the_agents(trained, tmp_path):
    marlhf_trainer, _, _ = trained
    folders = marlhf_trainer.save_model(str(tmp_path / "saved"))
    assert [f.rsplit("/", 1)[-1] for f in folders] == ["agent_0", "agent_1", "reward_model"]
    loaded = JointRewardModel.load(str(tmp_path / "saved" / "reward_model"))
    texts = [joint_reward_text(["hello there:", "hello there:"], ["ab", "cd"])]
    torch.testing.assert_close(loaded.score_texts(texts), marlhf_trainer.reward_model.score_texts(texts))


def test_a_resumed_run_reads_its_reward_model_back_and_continues_exactly(trained, monkeypatch):
    straight, tmp_path, _ = trained

    def refuse(*args, **kwargs):
        raise AssertionError("a resumed run fitted the reward model again")

    monkeypatch.setattr(reward_fit, "fit_reward_model", refuse)
    monkeypatch.setattr(reward_fit, "sample_preference_pairs", refuse)
    args = config(tmp_path, reward_model_name=str(tmp_path / "model"), save_steps=1)
    resumed = trainer(tmp_path, None, args=args, reward_processor=lambda r: 10 * r)
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-1"))
    assert resumed.global_step == straight.global_step
    for a, b in zip(weights(straight), weights(resumed)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    torch.testing.assert_close(resumed.reward_model.head.weight, straight.reward_model.head.weight)


def test_iac_without_a_critic_has_separate_critics_from_the_agents_model_as_1_4_3(tmp_path, model_folder):
    # 1.4.3's MARLHFConfig.use_separate_critic defaulted to True: critics loaded from the agents' model
    args = config(tmp_path, reward_model_name=model_folder, rl_algorithm="iac", num_generations=1)
    assert args.use_separate_critic is True and args.rl_config().use_separate_critic is True
    iac = MARLHFTrainer(agent_model=model_folder, train_dataset=DATA, reward_func=content_score, args=args)
    assert [critic.agent for critic in iac.objective.critics] == [None, None]  # separate critic models
    with pytest.raises(
        ValueError,
        match=r"critic_model_name is None and the agents were given as model objects.*use_separate_critic=False",
    ):
        trainer(tmp_path, model_folder, args=args)  # no model name to load the critics from: said, with both ways out
    heads = config(
        tmp_path, reward_model_name=model_folder, rl_algorithm="iac", num_generations=1, use_separate_critic=False
    )
    iac = MARLHFTrainer(agent_model=model_folder, train_dataset=DATA, reward_func=content_score, args=heads)
    assert [critic.agent for critic in iac.objective.critics] == [0, 1]  # an explicit False: value heads
    assert MARLHFConfig(rl_algorithm="maac", num_generations=1).use_separate_critic is None  # iac's default only


def test_iac_trains_on_the_reward_model_with_its_critics(tmp_path, model_folder):
    args = config(
        tmp_path, reward_model_name=model_folder, rl_algorithm="iac", num_generations=1, use_separate_critic=False
    )
    iac = trainer(tmp_path, model_folder, args=args)
    before = weights(iac)
    iac.train()
    assert iac.global_step == 2 and [c.agent for c in iac.objective.critics] == [0, 1]  # value heads on the agents
    assert all(not torch.equal(a, b) for a, b in zip(before, weights(iac)))
    lines = log_lines(tmp_path / "run", "metrics.jsonl")
    assert "reward_model/accuracy" in lines[0]
    assert any("critic0/value_loss" in line and "reward/reward_model/mean" in line for line in lines)


def test_maac_loads_its_critic_from_the_agents_model_name(tmp_path, model_folder):
    args = config(tmp_path, rl_algorithm="maac", num_generations=1, reward_model_name=model_folder)
    with pytest.raises(ValueError, match=r"critic_model_name is None and the agents were given as model objects"):
        trainer(tmp_path, model_folder, args=args)
    tok = char_tokenizer(MIXED + "[]\n")  # MAAC's critic reads "[Agent 0] ..." and refuses unknown tokens
    tiny_llama(tok).save_pretrained(tmp_path / "mixed")
    tok.save_pretrained(tmp_path / "mixed")
    maac = MARLHFTrainer(agent_model=str(tmp_path / "mixed"), train_dataset=DATA, reward_func=content_score, args=args)
    assert maac.objective.critics[0].agent is None  # a separate critic model, loaded by name


def test_importable_from_1_4_3s_paths():
    from comlrl.trainers.preference.marlhf import JointRewardModel as from_module

    assert comlrl.MARLHFTrainer is MARLHFTrainer and comlrl.JointRewardModel is from_module


# ------------------------------------------------------------------------------ the example
def test_the_example_runs_on_a_tiny_model(tmp_path, capsys):
    example = load_example("marlhf-story-len-ratio.py")
    tok = char_tokenizer("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ :\n0123456789")
    tiny_llama(tok).save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    out = tmp_path / "out"
    flags = ["--model", str(tmp_path / "tiny"), "--output-dir", str(out), "--epochs", "1", "--num-candidates", "2",
             "--max-new-tokens", "4"]  # fmt: skip
    example.main(flags)
    summary = capsys.readouterr().out
    assert "reward model" in summary and "before" in summary and "after" in summary
    assert f"run folder {out}: metrics.jsonl; curves in metrics.png;" in summary and (out / "metrics.png").is_file()
    assert (out / "models" / "reward_model" / "reward_head.safetensors").exists()


# ------------------------------------------------------------------------------ centralized
def test_centralized_one_model_writes_every_role_and_its_reward_model_reads_the_joint_text(tmp_path, model_folder):
    roles_seen = []

    def role_reward(first, second):  # one list of texts per role, as with one model per role
        roles_seen.append((first, second))
        return content_score(first, second)

    args = config(tmp_path, reward_model_name=model_folder, collaboration_mode="centralized", rl_algorithm="marloo")
    tok = char_tokenizer()
    run = MARLHFTrainer(agents=[tiny_llama(tok)], tokenizer=tok, train_dataset=DATA, eval_dataset=DATA,
                        reward_func=role_reward, args=args, centralized_comparator_adapter=AfterTwo())  # fmt: skip
    # centralized MAGRPO's objective on one model, with marloo's baseline
    assert isinstance(run.objective.config, CentralizedMAGRPOConfig) and run.num_agents == 1
    assert run.objective.config.advantage_mode == "rloo" and run.num_roles == 2
    run.train()
    pair = run.pairs[0]
    joint_prompt = AfterTwo().build_prompt(DATA[pair.row], [DATA[pair.row]["prompt"]] * 2)
    assert pair.prompts == [joint_prompt] and len(pair.chosen_texts) == 1  # the one model's joint response
    text = reward_fit.pair_texts([pair])[0]
    assert f"Agent 1 prompt:\n{joint_prompt}" in text and "Agent 2" not in text  # one block, unsplit
    # The task reward saw roles: the adapter's split (the first two characters, then the rest; empty when unsplittable).
    responses = [text for pair in run.pairs for text in (pair.chosen_texts[0], pair.rejected_texts[0])]
    splits = {(t[:2], t[2:]) if not unsplittable(t) else ("", "") for t in responses}
    assert splits <= {pair for first, second in roles_seen for pair in zip(first, second)}
    lines = log_lines(tmp_path / "run", "metrics.jsonl")
    assert "centralized/parse_failure_frac" in lines[0] and "reward_model/accuracy" in lines[0]
    steps = [line for line in lines if "reward/reward_model/mean" in line]
    assert len(steps) == 2 and all("centralized/parse_failure_frac" in line for line in steps)
    assert "eval/reward_mean" in lines[-1]  # the task reward over the roles
    folders = run.save_model(str(tmp_path / "saved"))
    assert [f.rsplit("/", 1)[-1] for f in folders] == ["agent_0", "reward_model"]


def test_model_names_may_be_paths():
    from pathlib import Path

    args = MARLHFConfig(
        reward_model_name=Path("/models/rm"), critic_model_name=Path("/models/critic"), rl_algorithm="maac"
    )
    assert (args.reward_model_name, args.critic_model_name) == ("/models/rm", "/models/critic")
