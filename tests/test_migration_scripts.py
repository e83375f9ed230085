"""Scripts written as comlrl 1.4.3's users wrote them, run as they run them: each in a
process of its own, all in one working folder, each twice, several trainers per script, no
output folder named (1.4.3 had no such field). Every run must finish, write folders of its
own, and leave every other run's files as they were. The call shapes are 1.4.3's
documented ones (its tutorial, its REINFORCE variants, IAC then MAAC); only the models are
tiny ones."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import char_tokenizer, tiny_llama

REPO = Path(__file__).resolve().parents[1]

PREAMBLE = r"""
from datasets import Dataset
from tests.helpers import MIXED, char_tokenizer, tiny_llama, tiny_gpt2

tokenizer = char_tokenizer(MIXED + "[]|\n")  # MAAC's critic reads "[Agent 0] ..." joint inputs
train_dataset = Dataset.from_dict({"prompt": ["hello there:", "a cat", "tell me, why?", "go on"]})

def reward(completions1, completions2):
    return [float(len(b) - len(a)) for a, b in zip(completions1, completions2)]

def agents():
    return [tiny_llama(tokenizer, seed=i) for i in range(2)]

small = dict(num_train_epochs=1, num_generations=2, max_new_tokens=6, logging_steps=1)
"""

SCRIPTS = {
    "sweep.py": (
        PREAMBLE
        + """
from comlrl.trainers import (
    MAGRPOConfig, MAGRPOTrainer, MAREINFORCEConfig, MAREINFORCETrainer,
    MARLOOConfig, MARLOOTrainer, MAReMaxConfig, MAReMaxTrainer,
)

for trainer_class, config_class in [
    (MAGRPOTrainer, MAGRPOConfig),
    (MAREINFORCETrainer, MAREINFORCEConfig),
    (MARLOOTrainer, MARLOOConfig),
    (MAReMaxTrainer, MAReMaxConfig),
]:
    trainer = trainer_class(
        agents=agents(), tokenizer=tokenizer, reward_func=reward, train_dataset=train_dataset,
        args=config_class(**small),
    )
    trainer.train()
"""
    ),
    "iac_then_maac.py": (
        PREAMBLE
        + """
from comlrl.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer

iac = IACTrainer(
    agents=agents(), tokenizer=tokenizer, reward_func=reward, train_dataset=train_dataset,
    args=IACConfig(use_separate_critic=False, **small),
)
iac.train()
maac = MAACTrainer(
    agents=agents(), tokenizer=tokenizer, reward_func=reward, train_dataset=train_dataset,
    critics=[tiny_gpt2(tokenizer, seed=7)], critic_tokenizer=tokenizer, args=MAACConfig(**small),
)
maac.train()
"""
    ),
    "tutorial.py": (
        PREAMBLE
        + """
import math
import sys
from functools import partial

from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from comlrl.utils.reward_processor import RewardProcessors

model_name = sys.argv[1]
tokenizer = AutoTokenizer.from_pretrained(model_name)
agents = [AutoModelForCausalLM.from_pretrained(model_name) for _ in range(2)]

def proper_length_ratio_reward(completions1, completions2, target_min=2.0, target_max=3.0):
    rewards = []
    for c1, c2 in zip(completions1, completions2):
        if len(c1) == 0:
            rewards.append(0.0)
            continue
        ratio = len(c2) / len(c1)
        distance = 0.0 if target_min <= ratio <= target_max else min(abs(ratio - target_min), abs(ratio - target_max))
        rewards.append(float(math.exp(-distance)))
    return rewards

output_dir = "./magrpo_multi_reward_output"
config = MAGRPOConfig(agent_learning_rate=5e-5, num_turns=1, **small)
trainer = MAGRPOTrainer(
    agents=agents,
    reward_func=partial(proper_length_ratio_reward, target_min=2, target_max=3),
    reward_processor=RewardProcessors.scale(factor=100.0),
    args=config,
    train_dataset=train_dataset,
    tokenizer=tokenizer,
)
trainer.train()
trainer.save_model(f"{output_dir}/models")
"""
    ),
    # The original's README and older pages, as written there (1.4.3 itself refused these four
    # names): model= for agent_model=, the module paths comlrl.trainers.magrpo / .iac, and the
    # config fields termination_threshold and critic_model_name_or_path.
    "older_docs.py": (
        PREAMBLE
        + """
import sys

from transformers import AutoTokenizer

from comlrl.trainers.iac import IACConfig, IACTrainer
from comlrl.trainers.magrpo import MAGRPOConfig, MAGRPOTrainer

model_name = sys.argv[1]
tokenizer = AutoTokenizer.from_pretrained(model_name)
trainer = MAGRPOTrainer(
    model=model_name, tokenizer=tokenizer, reward_func=reward, train_dataset=train_dataset,
    args=MAGRPOConfig(termination_threshold=-0.2, **small),
)
trainer.train()
iac = IACTrainer(
    model=model_name, tokenizer=tokenizer, reward_func=reward, train_dataset=train_dataset,
    args=IACConfig(use_separate_critic=True, critic_model_name_or_path=model_name, **small),
)
iac.train()
"""
    ),
    # Settings 1.4.3 accepted and ignored: they run, with a warning, and mean what they meant.
    "ignored_settings.py": (
        PREAMBLE
        + """
from comlrl.trainers.actor_critic import IACConfig, IACTrainer

separate = IACTrainer(
    agents=agents(), tokenizer=tokenizer, reward_func=reward, train_dataset=train_dataset,
    critics=[tiny_gpt2(tokenizer, seed=c) for c in range(2)],
    args=IACConfig(value_head_hidden_dim=16, **small),
)
separate.train()
heads = IACTrainer(
    agents=agents(), tokenizer=tokenizer, reward_func=reward, train_dataset=train_dataset,
    args=IACConfig(use_separate_critic=False, critic_learning_rate=1e-3, **small),
)
heads.train()
"""
    ),
    # 1.4.3's exported helpers and trainer attributes, used as its source shows them.
    "names_and_attributes.py": (
        PREAMBLE
        + """
from comlrl.models.actor_critic import CausalLMWithValueHead
from comlrl.schedulers import DeviceScheduler
from comlrl.trainers.actor_critic import IACConfig, IACTrainer, RolloutSample
from comlrl.utils import build_formatters

agent_devices, _ = DeviceScheduler.assign_devices(2, "cpu", None, use_separate_critic=False)
old_values = []

def callback(samples):
    assert all(isinstance(sample, RolloutSample) for sample in samples)
    old_values.extend(float(sample.old_value) for sample in samples)
    return {"sample_count": float(len(samples))}

trainer = IACTrainer(
    agents=[CausalLMWithValueHead(model, value_head_hidden_dim=8) for model in agents()],
    tokenizer=tokenizer, reward_func=reward, train_dataset=train_dataset,
    formatters=build_formatters(None, 2), metrics_callback=callback,
    args=IACConfig(use_separate_critic=False, agent_devices=[str(d) for d in agent_devices], **small),
)
trainer.train()
assert old_values and all(value == value for value in old_values)  # numbers, not NaN
assert trainer.tokenizers == [tokenizer, tokenizer] and trainer.num_agents == 2
assert [len(optimizer.param_groups) > 0 for optimizer in trainer.agent_optimizers] == [True, True]
"""
    ),
}

EXPECTED_RUNS = {
    "sweep.py": ["magrpo", "mareinforce", "marloo", "maremax"],
    "iac_then_maac.py": ["iac", "maac"],
    "tutorial.py": ["magrpo"],
    "older_docs.py": ["magrpo", "iac"],
    "ignored_settings.py": ["iac", "iac"],
    "names_and_attributes.py": ["iac"],
}
"""Each script's trainers, in order: one run folder each per run of the script."""
RUN = re.compile(r"([a-z-]+?)-\d{8}-\d{6}(?:-\d+)?")


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("model") / "tiny"
    tok = char_tokenizer()
    tiny_llama(tok, 0).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def run_folders(workdir: Path) -> dict[str, str]:
    """Run folder name -> its metrics log's text."""
    root = workdir / "comlrl_output"
    return {p.name: (p / "metrics.jsonl").read_text() for p in sorted(root.iterdir()) if p.name != "latest"}


def test_143_scripts_run_twice_in_one_folder_each_run_in_folders_of_its_own(tmp_path, model_folder):
    workdir = tmp_path / "work"
    workdir.mkdir()
    for name, text in SCRIPTS.items():
        (tmp_path / name).write_text(text)
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    seen: dict[str, str] = {}
    for attempt in (1, 2):
        for name, algorithms in EXPECTED_RUNS.items():
            finished = subprocess.run(
                [sys.executable, str(tmp_path / name), model_folder],
                cwd=workdir,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert finished.returncode == 0, f"{name}, run {attempt}:\n{finished.stderr[-3000:]}"
            folders = run_folders(workdir)
            new = [folder for folder in folders if folder not in seen]
            assert sorted(RUN.fullmatch(folder).group(1) for folder in new) == sorted(algorithms), (name, attempt, new)
            for folder in new:
                logged = [json.loads(line)["step"] for line in folders[folder].splitlines()]
                assert logged and logged == list(range(1, len(logged) + 1)), folder  # one run's steps, once each
                assert f"this run writes to {workdir / 'comlrl_output' / folder}" in finished.stdout
            for folder, log in seen.items():
                assert folders[folder] == log, f"{name}, run {attempt}, changed the earlier run {folder}"
            seen = folders
    assert len(seen) == 2 * sum(len(algorithms) for algorithms in EXPECTED_RUNS.values())
    assert sorted(os.listdir(workdir / "magrpo_multi_reward_output" / "models")) == ["agent_0", "agent_1"]
