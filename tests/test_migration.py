"""Code written for comlrl 1.4.3 (its documented call shapes) runs here with the same meaning,
or stops with an error that says what to write: configs, trainer arguments, train/evaluate,
reference KL as reward shaping, minibatches, W&B keys, import paths."""

import importlib
import os
import warnings

import pytest
import torch

from comlrl.algorithms.shaping import penalized_rewards, sequence_kl
from comlrl.checkpoint.run_folder import earlier_run
from comlrl.compat.moved import MOVED_MODULES, MOVED_NAMES, MovedNameError
from comlrl.compat.paths import PATHS
from comlrl.engine.update import node_sequences, subtree_nodes
from comlrl.metrics.sinks import wandb_init_kwargs
from comlrl.models.forward import completion_logprobs
from comlrl.trainers import IACConfig, MAGRPOConfig, MAGRPOTrainer, MAReMaxTrainer, MARLOOConfig, MARLOOTrainer
from comlrl.trainers.reinforce.objective import shaped_rewards
from tests.helpers import (
    DATA,
    char_tokenizer,
    length_sum,
    log_lines,
    make_trainer,
    multi_turn_trainer,
    revise,
    small_config,
    tiny_llama,
)


# ------------------------------------------------------------------------------ config names
def test_old_field_names_move_to_ours_with_one_warning():
    with pytest.warns(FutureWarning, match="learning_rate is comlrl 1.4.3's name for agent_learning_rate"):
        config = MARLOOConfig(learning_rate=3e-4, rollout_buffer_size=3)
    assert config.agent_learning_rate == 3e-4 and config.per_device_train_batch_size == 3
    assert config.learning_rate is None and config.rollout_buffer_size is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second use of the same old name says nothing
        assert MARLOOConfig(learning_rate=1e-4).agent_learning_rate == 1e-4
    with pytest.warns(FutureWarning, match="actor_learning_rate"):
        assert IACConfig(actor_learning_rate=2e-4).agent_learning_rate == 2e-4


def test_old_and_new_names_set_differently_is_an_error():
    with pytest.raises(ValueError, match="learning_rate=0.001 .* and agent_learning_rate=0.0002 disagree: set only"):
        MAGRPOConfig(learning_rate=1e-3, agent_learning_rate=2e-4)


def test_a_misspelled_field_is_still_an_error():
    with pytest.raises(TypeError, match="learnig_rate"):
        MAGRPOConfig(learnig_rate=1e-3)


def test_parallel_training_mp_needs_agent_devices_and_references_may_live_elsewhere():
    with pytest.raises(ValueError, match="parallel_training='mp' needs agent_devices"):
        MAGRPOConfig(parallel_training="mp")
    assert MAGRPOConfig(parallel_training="null").parallel_training == "none"
    assert MAGRPOConfig(parallel_training="mp", agent_devices=["cpu", "cpu"]).agent_devices == ["cpu", "cpu"]
    # 1.4.3's meaning: the references on devices of their own (checked where the agents are placed)
    assert MAGRPOConfig(reference_devices="cuda:1").reference_devices == "cuda:1"
    assert IACConfig(reference_devices=["cpu", "cuda:1"]).reference_devices == ["cpu", "cuda:1"]
    with pytest.raises(ValueError, match="reference_devices must be None, 'auto', a device name or a list"):
        MAGRPOConfig(reference_devices=[1])


@pytest.mark.parametrize("spelling, mode", [("Align", "aligned"), ("ALIGNED", "aligned"), ("crossed", "cross")])
def test_the_originals_joint_mode_spellings(spelling, mode):
    assert MAGRPOConfig(joint_mode=spelling).joint_mode == mode


def test_advantage_mode_in_any_letter_case_as_the_original():
    assert MAGRPOConfig(advantage_mode="RLOO").advantage_mode == "rloo"


def test_the_configs_num_agents_must_match_the_agents(tmp_path):
    with pytest.raises(ValueError, match="agents holds 2 models but num_agents=3"):
        make_trainer(tmp_path, args=small_config(tmp_path, num_agents=3))
    assert make_trainer(tmp_path, args=small_config(tmp_path, num_agents=2)).num_agents == 2


def test_the_configs_num_agents_says_how_many_copies_to_load(tmp_path, model_folder):
    # comlrl 1.4.3's actor-critic trainers took the count from the config only
    trainer = MAGRPOTrainer(
        agent_model=model_folder, train_dataset=DATA, reward_func=length_sum, args=small_config(tmp_path, num_agents=3)
    )
    assert trainer.num_agents == 3
    with pytest.raises(ValueError, match="num_agents=2 but the config's num_agents=3"):
        MAGRPOTrainer(
            agent_model=model_folder,
            num_agents=2,
            train_dataset=DATA,
            reward_func=length_sum,
            args=small_config(tmp_path, num_agents=3),
        )


def test_a_transition_with_one_turn_is_refused_with_the_fix(tmp_path):
    with pytest.raises(ValueError, match="num_turns=1, so it would never be called.*set num_turns=2"):
        make_trainer(tmp_path, external_transition=revise)


def test_a_formatter_naming_external_prompts_gets_the_transitions_text(tmp_path):
    seen = []

    def formatter(row, external_prompts=None):
        seen.append(external_prompts)
        return "Q: " + (external_prompts if external_prompts is not None else row["prompt"])

    trainer = multi_turn_trainer(tmp_path, formatters=formatter)
    seen.clear()  # the first-turn prompts were formatted when the trainer was built, without it
    tree = trainer.rollout(trainer.train_prompts, [0])
    second = tree.turns[1]
    assert seen and all(text is not None for text in seen)
    assert all(prompt.startswith("Q: " + DATA[0]["prompt"] + " | others: ") for prompt in second.prompts[0])


# ------------------------------------------------------------------------------ variants
def test_a_variant_takes_a_magrpo_config_and_fixes_its_baseline(tmp_path):
    trainer = MARLOOTrainer(
        agents=[tiny_llama(char_tokenizer(), i) for i in range(2)],
        tokenizer=char_tokenizer(),
        train_dataset=DATA,
        reward_func=length_sum,
        args=small_config(tmp_path, agent_learning_rate=1e-4),
    )
    assert type(trainer.args) is MARLOOConfig and trainer.args.advantage_mode == "rloo"
    assert trainer.args.agent_learning_rate == 1e-4 and trainer.args.advantage_normalization is True
    with pytest.raises(
        ValueError, match="MAReMaxTrainer uses advantage_mode='max', but its MAGRPOConfig says advantage_mode='rloo'"
    ):
        MAReMaxTrainer(
            agents=[tiny_llama(char_tokenizer(), i) for i in range(2)],
            tokenizer=char_tokenizer(),
            train_dataset=DATA,
            reward_func=length_sum,
            args=small_config(tmp_path, advantage_mode="rloo"),
        )


# ------------------------------------------------------------------------------ minibatches
def test_subtree_nodes_follow_the_children_of_the_chosen_roots():
    # turn 1: 3 nodes x 2 joint actions; turn 2: nodes 0..3 (node 1's second branch ended)
    children = [torch.tensor([[0, 1], [2, -1], [3, 4]]), torch.full((5, 2), -1)]
    nodes = subtree_nodes(children, torch.tensor([2, 1]))
    assert [n.tolist() for n in nodes] == [[1, 2], [2, 3, 4]]
    assert node_sequences(torch.tensor([1, 3]), 2).tolist() == [2, 3, 6, 7]


def optimizer_steps(trainer) -> list[int]:
    return [int(opt.state[next(iter(opt.state))]["step"]) for opt in trainer.learners.optimizers]


def test_train_batch_size_splits_the_rollout_into_optimizer_steps(tmp_path):
    trainer = make_trainer(
        tmp_path,
        train_dataset=DATA + [{"prompt": "one more"}],
        args=small_config(
            tmp_path, num_train_epochs=2, per_device_train_batch_size=4, train_batch_size=2, lr_scheduler_type="linear"
        ),
    )
    metrics = trainer.training_step([0, 1, 2, 3])
    assert optimizer_steps(trainer) == [2, 2]  # 4 rows in minibatches of 2: two steps per agent
    assert "agent0/clip_fraction" in metrics  # the second minibatch's ratio is against the sampler
    # the linear schedule spans every optimizer step of the run, 2 epochs x 1 step x 2 minibatches:
    # after 2 of the 4 it is half way down
    assert trainer.learners.schedulers[0].get_last_lr()[0] == pytest.approx(5e-4)


def test_one_minibatch_is_one_optimizer_step(tmp_path):
    trainer = make_trainer(tmp_path, args=small_config(tmp_path, per_device_train_batch_size=2, train_batch_size=2))
    metrics = trainer.training_step([0, 1])
    assert optimizer_steps(trainer) == [1, 1] and "agent0/clip_fraction" not in metrics


def test_train_batch_size_above_the_rollout_is_refused():
    with pytest.raises(ValueError, match="train_batch_size=3 is more rows than a rollout holds"):
        MAGRPOConfig(per_device_train_batch_size=2, train_batch_size=3)


def test_minibatches_of_a_multi_turn_tree_hold_whole_subtrees(tmp_path):
    trainer = multi_turn_trainer(tmp_path, per_device_train_batch_size=2, train_batch_size=1)
    tree = trainer.rollout(trainer.train_prompts, [0, 1])
    batches = trainer.objective.update.minibatches(tree)
    assert len(batches) == 2
    for nodes in batches:
        (root,) = nodes[0].tolist()
        assert nodes[1].tolist() == sorted(c for c in tree.turns[0].children[root].tolist() if c >= 0)


# ------------------------------------------------------------------------------ reference KL as reward shaping
def test_sequence_kl_and_shaped_rewards_by_hand():
    logps = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, 0.0]])
    refs = torch.tensor([[-1.5, -2.0, -1.0], [-0.5, -1.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])

    def k3(d):
        return torch.exp(torch.tensor(d)) - d - 1

    kl = sequence_kl(logps, refs, mask)
    torch.testing.assert_close(kl, torch.stack([k3(-0.5) + k3(0.0), k3(0.0) + k3(-1.0)]))
    # 1 node, G=2, aligned joint actions (j, j) of 2 agents; agent 1's KLs are 0.1 and 0.3
    rewards = torch.tensor([[[1.0, 1.0], [2.0, 2.0]]])
    shaped = penalized_rewards(rewards, [kl, torch.tensor([0.1, 0.3])], torch.tensor([[0, 0], [1, 1]]), 2, 0.5)
    expected = torch.tensor([[[1 - 0.5 * kl[0], 1 - 0.05], [2 - 0.5 * kl[1], 2 - 0.15]]])
    torch.testing.assert_close(shaped, expected)


def test_reference_kl_lowers_each_agents_rewards_by_coef_times_its_k3_sum(tmp_path):
    coef = 0.25
    trainer = make_trainer(tmp_path, args=small_config(tmp_path, reference_kl_enabled=True, reference_kl_coef=coef))
    with torch.no_grad():  # move the references away from the agents, so the KL is not 0
        for reference in trainer.agents.references:
            for p in reference.parameters():
                p.add_(0.05 * torch.randn_like(p))
    tree = trainer.rollout(trainer.train_prompts, [0, 1])
    frozen = trainer.objective.update.frozen(tree)
    shaped, metrics = shaped_rewards(tree, frozen, trainer.args, trainer.args.max_new_tokens)
    turn = tree.turns[0]
    for i, agent in enumerate(turn.agents):
        by_hand = []
        for model in (trainer.agents[i], trainer.agents.references[i]):
            model.eval()
            with torch.no_grad():
                by_hand.append(
                    completion_logprobs(
                        model,
                        agent.prompt_ids,
                        agent.prompt_mask,
                        agent.completion_ids,
                        agent.completion_mask,
                        temperature=trainer.args.temperature,
                    )
                )
        kl = ((torch.exp(by_hand[1] - by_hand[0]) - (by_hand[1] - by_hand[0]) - 1) * agent.completion_mask).sum(-1)
        assert kl.min() > 0
        sample = tree.joint_indices[:, i]  # aligned: joint action j holds sample j at each node
        for m in range(turn.num_nodes):
            expected = turn.rewards[m, :, i] - coef * kl[m * 2 + sample]
            torch.testing.assert_close(shaped.turns[0].rewards[m, :, i], expected, atol=1e-5, rtol=1e-5)
    assert metrics["turn_1/reference_kl_mean"].value() > 0
    assert torch.equal(tree.turns[0].rewards, turn.rewards)  # the tree keeps the task rewards


def test_reference_kl_step_logs_the_original_keys(tmp_path):
    trainer = make_trainer(tmp_path, args=small_config(tmp_path, reference_kl_enabled=True))
    metrics = trainer.training_step([0, 1])
    # before any update the references are the agents: the KL is exactly 0
    assert metrics["turn_1/reference_kl_mean"] == 0.0 and metrics["turn_1/reference_kl_penalty_mean"] == 0.0
    assert "agent0/kl" not in metrics  # the loss-side KL (beta) stays off


# ------------------------------------------------------------------------------ trainer arguments
def test_agents_given_as_names_are_loaded(tmp_path, model_folder):
    trainer = MAGRPOTrainer(
        agents=[model_folder, model_folder], train_dataset=DATA, reward_func=length_sum, args=small_config(tmp_path)
    )
    assert trainer.agents[0] is not trainer.agents[1]
    assert trainer.agents[0].name_or_path == model_folder


def test_a_positional_call_in_the_originals_order_keeps_its_meaning(tmp_path, model_folder):
    # 1.4.3: MAGRPOTrainer(agent_model, agents, num_agents, tokenizer, model_config, train_dataset,
    # eval_dataset, reward_func, ...)
    trainer = MAGRPOTrainer(model_folder, None, 3, None, {"dtype": torch.float64}, DATA, None, length_sum)
    assert trainer.num_agents == 3 and next(trainer.agents[0].parameters()).dtype == torch.float64
    assert trainer.train_prompts.rows == DATA and trainer.reward.funcs == (length_sum,)


def test_agent_model_with_agents_of_that_model_is_accepted_and_another_refused(tmp_path, model_folder):
    trainer = MAGRPOTrainer(
        agent_model=model_folder,
        agents=[model_folder] * 2,
        train_dataset=DATA,
        reward_func=length_sum,
        args=small_config(tmp_path),
    )
    assert trainer.num_agents == 2
    with pytest.raises(ValueError, match=r"agent_model=.* and agents\[1\] \('elsewhere'\) disagree"):
        MAGRPOTrainer(
            agent_model=model_folder, agents=[model_folder, "elsewhere"], train_dataset=DATA, reward_func=length_sum
        )


def test_special_tokens_of_model_config_reach_every_tokenizer(tmp_path, model_folder):
    trainer = MAGRPOTrainer(
        agent_model=model_folder,
        model_config={"special_tokens": {"additional_special_tokens": ["z"]}},  # in the vocabulary already
        train_dataset=DATA,
        reward_func=length_sum,
        args=small_config(tmp_path),
    )
    assert all("z" in tok.all_special_tokens for tok in trainer.agents.tokenizers)
    assert all(agent.get_input_embeddings().weight.shape[0] == 35 for agent in trainer.agents)  # not resized
    grown = MAGRPOTrainer(
        agent_model=model_folder,
        model_config={"special_tokens": {"additional_special_tokens": ["<sep>"]}},  # one row too many
        train_dataset=DATA,
        reward_func=length_sum,
        args=small_config(tmp_path),
    )  # 1.4.3 failed at the first "<sep>"; models loaded by name are resized (tests/test_special_tokens.py)
    assert [agent.get_input_embeddings().weight.shape[0] for agent in grown.agents] == [36, 36]


def test_metrics_callback_gets_every_agent_sample_and_its_numbers_are_logged(tmp_path):
    seen = []

    def callback(samples):
        seen.append(samples)
        assert all(s.reward.shape == (1,) and isinstance(s.advantage.item(), float) for s in samples)
        return {"mean_chars": sum(len(s.completion) for s in samples) / len(samples)}

    trainer = make_trainer(tmp_path, metrics_callback=callback)
    metrics = trainer.training_step([0, 1])
    (samples,) = seen
    assert len(samples) == 2 * 2 * 2  # agents x rows x G
    assert {s.metadata["batch_item"]["prompt"] for s in samples} == {DATA[0]["prompt"], DATA[1]["prompt"]}
    assert metrics["mean_chars"] == pytest.approx(sum(len(s.completion) for s in samples) / 8)
    evaluated = make_trainer(tmp_path, eval_dataset=DATA, metrics_callback=callback).evaluate()
    per_row = seen[1:]  # one call per evaluated row: 2 agents x 1 sample
    assert len(per_row) == 3 and all(len(samples) == 2 for samples in per_row)
    assert evaluated["eval/mean_chars"] == pytest.approx(
        sum(sum(len(s.completion) for s in samples) / 2 for samples in per_row) / 3
    )
    bad = make_trainer(tmp_path, metrics_callback=lambda samples: {"x": "high"})
    with pytest.raises(TypeError, match="metrics_callback <lambda> returned 'high' for metric 'x'"):
        bad.training_step([0])


# ------------------------------------------------------------------------------ evaluate and train
def test_evaluate_takes_num_eval_samples_and_without_data_returns_nothing(tmp_path):
    rows_seen = []

    def logger(agent_completions_turns, rows):
        rows_seen.append(len(rows))
        return {}

    trainer = make_trainer(tmp_path, eval_dataset=DATA, eval_logger=logger)
    trainer.evaluate(num_eval_samples=2)
    trainer.evaluate()
    assert rows_seen == [2, 3]
    with pytest.warns(UserWarning, match="without an eval_dataset"):
        assert make_trainer(tmp_path).evaluate() == {}


def test_train_checkpoint_arguments_of_the_original(tmp_path):
    folder = tmp_path / "ckpts"
    args = small_config(tmp_path, num_train_epochs=3, per_device_train_batch_size=2)  # 2 steps per epoch
    make_trainer(tmp_path, args=args).train(checkpoint_dir=str(folder), checkpoint_total_limit=2)
    assert earlier_run(folder) == ["checkpoint-4", "checkpoint-6"]  # every epoch, newest 2 kept
    resumed = make_trainer(tmp_path, args=small_config(tmp_path, num_train_epochs=4, per_device_train_batch_size=2))
    result = resumed.train(resume_from_checkpoint=True, checkpoint_dir=str(folder), checkpoint_interval=3)
    assert result.global_step == 8 and "checkpoint-8" in os.listdir(folder)  # off the cadence: the end, as 1.4.3
    assert len(log_lines(tmp_path / "run", "metrics.jsonl")) > 0
    with pytest.raises(ValueError, match="checkpoint_interval=1 .* save_steps=1 both set a checkpoint cadence"):
        make_trainer(tmp_path, args=small_config(tmp_path, save_steps=1)).train(checkpoint_interval=1)


# ------------------------------------------------------------------------------ W&B and imports
def test_wandb_config_keys_of_the_original(tmp_path):
    kwargs = wandb_init_kwargs(
        {
            "project": "p",
            "run_name": "r",
            "tags": ["a"],
            "dir": str(tmp_path / "wb"),
            "config_sections": {"dataset": {"name": "d"}},
        },
        {"num_agents": 2},
    )
    assert kwargs == {
        "project": "p",
        "name": "r",
        "tags": ["a"],
        "dir": str(tmp_path / "wb"),
        "config": {"num_agents": 2, "dataset": {"name": "d"}},
    }
    assert (tmp_path / "wb").is_dir()
    with pytest.raises(ValueError, match="name='a' and run_name='b'"):
        wandb_init_kwargs({"name": "a", "run_name": "b"}, {})


@pytest.mark.parametrize(
    "module, names",
    [
        ("comlrl.trainers.reinforce.magrpo", ["MAGRPOConfig", "MAGRPOTrainer"]),
        ("comlrl.trainers.reinforce.marloo", ["MARLOOConfig", "MARLOOTrainer"]),
        ("comlrl.trainers.reinforce.mareinforce", ["MAREINFORCEConfig", "MAREINFORCETrainer"]),
        ("comlrl.trainers.reinforce.maremax", ["MAReMaxConfig", "MAReMaxTrainer"]),
        ("comlrl.trainers.actor_critic.iac", ["IACConfig", "IACTrainer"]),
        ("comlrl.trainers.actor_critic.maac", ["MAACConfig", "MAACTrainer"]),
        ("comlrl.utils", ["RewardProcessors"]),
        ("comlrl.trainers", ["MAGRPOTrainer", "MARLOOTrainer", "IACTrainer", "MAACConfig"]),
    ],
)
def test_the_originals_import_paths_resolve(module, names):
    imported = importlib.import_module(module)
    assert all(hasattr(imported, name) for name in names)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_every_143_path_holds_its_names_as_the_objects_that_live_elsewhere(path):
    module = importlib.import_module(path)
    assert sorted(module.__all__) == sorted(PATHS[path])
    for name, home in PATHS[path].items():
        assert getattr(module, name) is getattr(importlib.import_module(home), name)
        exec(f"from {path} import {name}", {})


# ------------------------------------------------------------------------------ a whole 1.4.3 script
def test_a_script_written_for_the_original_runs_with_its_meaning(tmp_path, model_folder, fake_wandb):
    """Config fields, trainer arguments, hooks and train/evaluate/save calls as comlrl 1.4.3's
    docs wrote them, together; each asserted for what it meant there."""
    rows = [{"prompt": "ab", "target": 2}, {"prompt": "cd", "target": 3}, {"prompt": "ef", "target": 1}]
    reward_rows = []

    def reward(completions1, completions2, batch_items=None):  # one joint action per call, as in 1.4.3
        reward_rows.append(batch_items)
        return [-abs(len(completions2[0]) - batch_items[0]["target"] * max(len(completions1[0]), 1))]

    def transition(prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent):
        return [f"{prompt} | {agent_completions[1 - i]}" for i in range(num_agents)]

    def eval_logger(agent_completions_turns, batch_items, prompts):
        return [{"chars": len(agent_completions_turns[0][k][0])} for k in range(len(batch_items))]

    def eval_aggregator(metrics, num_turns):
        return {"turn_1/chars": sum(m["chars"] for m in metrics) / len(metrics)}

    with pytest.warns(FutureWarning):
        config = MAGRPOConfig(
            num_agents=2,
            num_turns=2,
            learning_rate=1e-3,
            num_generations=2,
            max_new_tokens=4,
            rollout_buffer_size=2,
            train_batch_size=1,
            num_train_epochs=1,
            logging_steps=1,
            eval_interval=1,
            eval_num_samples=2,
            joint_mode="align",
            reference_kl_enabled=True,
            reference_kl_coef=0.05,
            parallel_training="mp",
            agent_devices=["cpu", "cpu"],
            output_dir=str(tmp_path / "run"),
        )
    trainer = MAGRPOTrainer(
        agent_model=model_folder,
        num_agents=2,
        model_config={"model_kwargs": {"dtype": torch.float32}},
        train_dataset=rows,
        eval_dataset=rows,
        reward_func=reward,
        formatters=[lambda row: row["prompt"], lambda row: "Expand: " + row["prompt"]],
        external_transition=transition,
        wandb_config={"project": "p", "run_name": "r", "config_sections": {"dataset": {"name": "toy"}}},
        eval_logger=eval_logger,
        eval_aggregator=eval_aggregator,
        args=config,
    )
    result = trainer.train(checkpoint_dir=str(tmp_path / "ckpt"))
    # the first call (the first evaluation's joint actions) returned one value: from then on, as in
    # 1.4.3, every call scored one joint action of one dataset row, and got that row
    probe, *calls = reward_rows
    assert len(probe) > 1 and all(len(items) == 1 and items[0] in rows for items in calls)
    assert {items[0]["prompt"] for items in calls} == {"ab", "cd", "ef"}
    # 3 rows, buffers of 2 rows in minibatches of 1: 2 + 1 optimizer steps per agent
    assert result.global_step == 2 and optimizer_steps(trainer) == [3, 3]
    assert fake_wandb["init"]["name"] == "r" and fake_wandb["init"]["config"]["dataset"] == {"name": "toy"}
    logged = {key for metrics, _ in fake_wandb["log"] for key in metrics}
    assert {"turn_1/reward_mean", "turn_2/expected_return", "turn_1/reference_kl_mean"} <= logged
    assert {"eval/turn_1/reward_mean", "eval/turn_1/expected_return", "eval/turn_1/chars"} <= logged
    assert earlier_run(tmp_path / "ckpt") == ["checkpoint-2"]  # after the (only) epoch
    assert set(trainer.evaluate(num_eval_samples=1)) >= {"eval/turn_2/reward_mean", "eval/turn_1/chars"}
    trainer.save_model(str(tmp_path / "out"))
    assert sorted(os.listdir(tmp_path / "out")) == ["agent_0", "agent_1"]


# ------------------------------------------------------------------------- 1.4.3's modules and names we lack
@pytest.mark.parametrize("module", sorted(MOVED_MODULES))
def test_importing_a_143_module_we_do_not_have_says_what_to_use(module):
    with pytest.raises(ModuleNotFoundError, match="it was comlrl 1.4.3's; ") as caught:
        importlib.import_module(module)
    missing = caught.value.name  # the module itself, or the 1.4.3 package that holds it
    assert module.startswith(missing) and MOVED_MODULES[missing] in str(caught.value)


@pytest.mark.parametrize("module, name", [(m, n) for m, names in sorted(MOVED_NAMES.items()) for n in sorted(names)])
def test_importing_a_143_name_we_do_not_have_says_what_to_use(module, name):
    with pytest.raises(ImportError, match=f"{module}.{name} was comlrl 1.4.3's; ") as caught:
        exec(f"from {module} import {name}", {})
    assert MOVED_NAMES[module][name] in str(caught.value)


@pytest.mark.parametrize("module, name", [(m, n) for m, names in sorted(MOVED_NAMES.items()) for n in sorted(names)])
def test_a_143_name_we_do_not_have_is_a_missing_attribute(module, name):
    """hasattr, getattr with a default, pydoc and IDEs rely on AttributeError."""
    package = importlib.import_module(module)
    assert not hasattr(package, name) and getattr(package, name, None) is None
    with pytest.raises(MovedNameError, match=f"{module}.{name} was comlrl 1.4.3's; ") as caught:
        getattr(package, name)
    assert isinstance(caught.value, AttributeError) and MOVED_NAMES[module][name] in str(caught.value)


def test_module_getattrs_raise_attribute_errors_for_unknown_names():
    """Every module ``__getattr__`` in the package: an unknown name is an AttributeError."""
    import pkgutil

    import comlrl

    found = []
    for info in pkgutil.walk_packages(comlrl.__path__, "comlrl."):
        if info.name.startswith(("comlrl.tasks", "comlrl.rollout.vllm")):  # optional extras' imports
            continue
        module = importlib.import_module(info.name)
        if "__getattr__" in vars(module):
            found.append(info.name)
            assert not hasattr(module, "no_such_name_here") and getattr(module, "no_such_name_here", 1) == 1
    for path in PATHS:  # 1.4.3's module paths, built by comlrl.compat.paths
        module = importlib.import_module(path)
        found.append(path)
        assert not hasattr(module, "no_such_name_here") and getattr(module, "no_such_name_here", 1) == 1
    assert len(found) >= 15  # the packages of MOVED_NAMES, comlrl.models' lazy import, 1.4.3's paths


def test_other_missing_names_are_plain_attribute_errors():
    import comlrl.models
    import comlrl.utils

    assert not hasattr(comlrl.utils, "no_such_helper") and not hasattr(comlrl.models, "NoSuchModel")
    with pytest.raises(ModuleNotFoundError, match=r"^No module named 'comlrl.utils.no_such_module'$"):
        importlib.import_module("comlrl.utils.no_such_module")
