"""The user's tutorial (the contract), run as written on the embedded model at a tiny size:
only ``model_name``, the number of prompts, ``num_train_epochs``, ``num_generations`` and
``max_new_tokens`` differ from the document."""

import pytest

pytestmark = pytest.mark.e2e


def test_tutorial_code_runs_and_saves_loadable_agents(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from comlrl.models import default_model_path

    # --- the tutorial, verbatim but for the sizes and the model name ---------------------
    import math
    from functools import partial

    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
    from comlrl.utils.reward_processor import RewardProcessors

    train_data = {
        "prompt": [
            "Describe a city in the clouds:",
            "Invent a new holiday and explain it:",
        ]
    }
    train_dataset = Dataset.from_dict(train_data)

    model_name = default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(model_name)
    agents = [AutoModelForCausalLM.from_pretrained(model_name) for _ in range(2)]

    def proper_length_ratio_reward(
        completions1, completions2, target_min=2.0, target_max=3.0
    ):
        rewards = []
        for c1, c2 in zip(completions1, completions2):
            len1, len2 = len(c1), len(c2)

            if len1 == 0:
                rewards.append(0.0)
                continue

            ratio = len2 / len1

            if target_min <= ratio <= target_max:
                reward = 1.0
            else:
                if ratio < target_min:
                    distance = target_min - ratio
                else:
                    distance = ratio - target_max

                reward = math.exp(-distance)

            rewards.append(float(reward))

        return rewards

    output_dir = "./magrpo_multi_reward_output"
    config = MAGRPOConfig(
        num_train_epochs=1,
        agent_learning_rate=5e-5,
        logging_steps=10,
        num_generations=2,
        num_turns=1,
        max_new_tokens=16,
    )

    configured_reward_func = partial(
        proper_length_ratio_reward, target_min=2, target_max=3
    )

    trainer = MAGRPOTrainer(
        agents=agents,
        reward_func=configured_reward_func,
        reward_processor=RewardProcessors.scale(factor=100.0),
        args=config,
        train_dataset=train_dataset,
        tokenizer=tokenizer,
    )

    trainer.train()
    trainer.save_model(f"{output_dir}/models")
    # --- end of the tutorial -------------------------------------------------------------

    for i in range(2):
        folder = tmp_path / "magrpo_multi_reward_output" / "models" / f"agent_{i}"
        reloaded = AutoModelForCausalLM.from_pretrained(folder)
        reloaded_tokenizer = AutoTokenizer.from_pretrained(folder)
        assert reloaded_tokenizer.eos_token == tokenizer.eos_token
        trained = agents[i].state_dict()
        for name, tensor in reloaded.state_dict().items():
            assert (tensor == trained[name]).all(), name
    # The config names no output_dir: the run got a folder of its own, which latest points at.
    (run,) = [p for p in (tmp_path / "comlrl_output").iterdir() if p.name != "latest"]
    assert run.name.startswith("magrpo-") and (run / "metrics.jsonl").exists()
    assert (tmp_path / "comlrl_output" / "latest").resolve() == run.resolve()
