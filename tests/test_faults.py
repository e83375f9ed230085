"""Faults a run meets (damaged checkpoints, two runs in one folder, a reused or unwritable
folder, a torn log, non-finite weights, a full disk, a kill -9 at any moment) and bad input
(vocabularies, positions, prompts, bounds): each ends in an error that names the culprit,
raised before anything is lost, or is recovered from exactly."""

from __future__ import annotations

import errno
import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import comlrl.checkpoint.files as checkpoint_files
from comlrl.checkpoint import complete_checkpoints
from comlrl.checkpoint.run_folder import RunFolderLock

from .helpers import (
    DATA,
    char_tokenizer,
    killable_trainer,
    length_sum,
    make_trainer,
    small_config,
    snapshot,
    tiny_gpt2,
    tiny_llama,
    unchanged,
    weights,
)

REPO = Path(__file__).resolve().parents[1]


def counting(score=length_sum):
    """``score`` that counts its calls: a run refused before its first step never samples."""

    def reward(a, b):
        reward.calls += 1
        return score(a, b)

    reward.calls = 0
    return reward


# ------------------------------------------------------------------------------ damaged checkpoints
@pytest.mark.parametrize("damaged", ["agent_0/model.safetensors", "optimizer.pt", "rng_state.pt", "trainer_state.json"])
def test_flipped_bytes_inside_a_checkpoint_file_are_named(tmp_path, damaged):
    make_trainer(tmp_path, args=small_config(tmp_path, save_steps=1)).train()
    path = tmp_path / "run" / "checkpoint-2" / damaged
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])  # same size, other bytes
    path.write_bytes(bytes(data))
    resumed = make_trainer(tmp_path, args=small_config(tmp_path, num_train_epochs=2))
    before = snapshot(resumed.agents)
    with pytest.raises(ValueError, match=rf"checkpoint-2 is damaged: {damaged} differs from what was written"):
        resumed.train(resume_from_checkpoint=True)
    assert unchanged(before, resumed.agents)


def test_a_damaged_value_head_is_named(tmp_path):
    from comlrl.trainers.actor_critic import IACConfig, IACTrainer

    tok = char_tokenizer()

    def iac():
        args = IACConfig(
            num_train_epochs=1, num_generations=1, max_new_tokens=4, save_steps=1, output_dir=str(tmp_path / "run")
        )
        agents = [tiny_llama(tok, seed=i) for i in range(2)]
        return IACTrainer(agents=agents, tokenizer=tok, train_dataset=DATA, reward_func=length_sum, args=args)

    iac().train()
    checkpoint = Path(complete_checkpoints(str(tmp_path / "run"))[-1])
    heads = sorted(checkpoint.rglob("value_head*"))
    assert heads, "an IAC checkpoint holds value heads"
    data = bytearray(heads[0].read_bytes())
    data[-8:] = bytes(b ^ 0xFF for b in data[-8:])
    heads[0].write_bytes(bytes(data))
    relative = heads[0].relative_to(checkpoint).as_posix()
    with pytest.raises(ValueError, match=rf"damaged: {relative} differs"):
        iac().train(resume_from_checkpoint=True)


def test_a_missing_checkpoint_file_is_named(tmp_path):
    make_trainer(tmp_path, args=small_config(tmp_path, save_steps=1)).train()
    os.remove(tmp_path / "run" / "checkpoint-2" / "rng_state.pt")
    with pytest.raises(ValueError, match=r"checkpoint-2 is damaged: rng_state.pt is missing"):
        make_trainer(tmp_path, args=small_config(tmp_path)).train(resume_from_checkpoint=True)


# ------------------------------------------------------------------------------ one run per folder
def test_a_second_run_in_a_locked_folder_is_refused(tmp_path):
    reward = counting()
    with RunFolderLock(str(tmp_path / "run")):
        with pytest.raises(
            RuntimeError, match=rf"output_dir {tmp_path / 'run'} is in use by another run \(pid {os.getpid()}"
        ):
            make_trainer(tmp_path, reward_func=reward).train()
    assert reward.calls == 0
    make_trainer(tmp_path).train()  # the lock is free again


def test_a_run_in_another_process_holds_the_folder(tmp_path):
    folder = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from comlrl.checkpoint.run_folder import RunFolderLock; "
            f"RunFolderLock({str(folder)!r}).acquire(); print('locked', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RuntimeError, match=rf"in use by another run \(pid {holder.pid} on host"):
            make_trainer(tmp_path).train()
    finally:
        holder.kill()
        holder.wait()
    # The holder died without releasing: the system dropped its lock, and the next run takes over.
    with pytest.warns(UserWarning, match=rf"a run \(pid {holder.pid} on host .*\) stopped without releasing it"):
        make_trainer(tmp_path).train()


def test_a_new_run_in_a_folder_holding_an_earlier_run_is_refused(tmp_path):
    make_trainer(tmp_path, args=small_config(tmp_path, save_steps=1)).train()
    log = (tmp_path / "run" / "metrics.jsonl").read_text()
    reward = counting()
    with pytest.raises(FileExistsError, match=r"holds an earlier run \(checkpoint-1, checkpoint-2, metrics.jsonl"):
        make_trainer(tmp_path, reward_func=reward).train()
    assert reward.calls == 0 and (tmp_path / "run" / "metrics.jsonl").read_text() == log
    assert len(complete_checkpoints(str(tmp_path / "run"))) == 2
    # Resuming it is what the folder is for; replacing it must be said.
    make_trainer(tmp_path, args=small_config(tmp_path, num_train_epochs=2)).train(resume_from_checkpoint=True)
    replaced = make_trainer(tmp_path, args=small_config(tmp_path, overwrite_output_dir=True))
    replaced.train()
    assert complete_checkpoints(str(tmp_path / "run")) == []  # the new run saves none
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]


@pytest.mark.parametrize("blocker", ["file in its place", "file as its parent"])
def test_an_output_dir_that_cannot_be_written_stops_before_step_one(tmp_path, blocker):
    (tmp_path / "blocker").write_text("")
    output_dir = tmp_path / "blocker" if blocker == "file in its place" else tmp_path / "blocker" / "run"
    reward = counting()
    trainer = make_trainer(tmp_path, reward_func=reward, args=small_config(tmp_path, output_dir=str(output_dir)))
    with pytest.raises(OSError, match=rf"output_dir {output_dir} (is a file|cannot be written)"):
        trainer.train()
    assert reward.calls == 0


# ------------------------------------------------------------------------------ the log
def test_a_torn_last_log_line_is_moved_aside_on_resume(tmp_path):
    make_trainer(tmp_path, args=small_config(tmp_path, save_steps=2)).train()
    log = tmp_path / "run" / "metrics.jsonl"
    with open(log, "a", encoding="utf-8") as f:
        f.write('{"step": 3, "reward/me')  # the crash came mid-write
    resumed = make_trainer(tmp_path, args=small_config(tmp_path, num_train_epochs=2))
    with pytest.warns(UserWarning, match=r"metrics.jsonl: 1 damaged line\(s\) .* moved to .*metrics.jsonl.damaged"):
        resumed.train(resume_from_checkpoint=True)
    steps = [json.loads(line)["step"] for line in log.read_text().splitlines()]  # every line parses
    assert steps == [1, 2, 3, 4]
    assert (tmp_path / "run" / "metrics.jsonl.damaged").read_text() == '{"step": 3, "reward/me\n'


# ------------------------------------------------------------------------------ non-finite weights
def test_weights_made_non_finite_by_a_step_stop_training_unsaved(tmp_path):
    trainer = make_trainer(tmp_path, args=small_config(tmp_path, save_steps=1))
    for group in trainer.learners.optimizers[1].param_groups:
        group["lr"] = math.inf  # past the config's bounds, as a broken schedule could do
    with pytest.raises(
        FloatingPointError, match=r"agent 1's weights are not finite after the optimizer step of step 1"
    ):
        trainer.train()
    assert complete_checkpoints(str(tmp_path / "run")) == []
    with pytest.raises(FloatingPointError, match=r"agent 1's weights are not finite: .*saved was not written"):
        trainer.save_model(str(tmp_path / "saved"))
    assert not (tmp_path / "saved").exists()


# ------------------------------------------------------------------------------ a full disk
def test_a_full_disk_during_a_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    real_save = torch.save
    saves = []

    def save(obj, path, *args, **kwargs):
        saves.append(path)
        if len(saves) == 3:  # the second checkpoint's optimizer.pt
            raise RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 64 vs 0")
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(checkpoint_files.torch, "save", save)
    with pytest.raises(
        OSError, match=r"checkpoint .*checkpoint-2 could not be written .* GiB free.*checkpoint-1, is kept"
    ):
        make_trainer(tmp_path, args=small_config(tmp_path, save_steps=1)).train()
    assert sorted(os.listdir(tmp_path / "run")) == ["checkpoint-1", "metrics.jsonl", "samples.jsonl"]


def test_enospc_names_the_disk(tmp_path, monkeypatch):
    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint_files.torch, "save", no_space)
    with pytest.raises(OSError, match=r"checkpoint-1 could not be written \(OSError: .*No space left on device\)"):
        make_trainer(tmp_path, args=small_config(tmp_path, save_steps=1)).train()
    assert not [name for name in os.listdir(tmp_path / "run") if name.endswith(".partial")]


# ------------------------------------------------------------------------------ bad input, before training
def test_one_tokenizer_for_agents_with_different_vocabularies(tmp_path):
    small, large = char_tokenizer(), char_tokenizer(alphabet="abcdefghijklmnopqrstuvwxyz .,:!?ABCDEFGHIJ")
    agents = [tiny_llama(large, seed=0), tiny_llama(small, seed=1)]
    with pytest.raises(ValueError, match=r"agent 1's tokenizer .*\(\d+ tokens\) has ids its model cannot embed"):
        make_trainer(tmp_path, agents=agents, tokenizer=large)


def test_a_prompt_past_learned_positions_names_the_row_and_agent(tmp_path):
    tok = char_tokenizer()
    data = [{"prompt": "short"}, {"prompt": "a much longer prompt, it goes on"}]
    agents = [tiny_llama(tok, seed=0), tiny_gpt2(tok, seed=1)]  # 256 positions each
    args = small_config(tmp_path, max_new_tokens=240)
    with pytest.raises(
        ValueError,
        match=r"agent 1's prompt for train_dataset row 1 \(the longest\): a prompt of 32 tokens plus "
        r"max_new_tokens=240 needs 272 positions; the model has 256 \(learned",
    ):
        make_trainer(tmp_path, agents=agents, tokenizer=tok, train_dataset=data, args=args)
    rotary = [tiny_llama(tok, seed=0), tiny_llama(tok, seed=1)]
    with pytest.warns(
        UserWarning, match=r"agent 0's prompt for train_dataset row 1 .* past the length it was trained on"
    ):
        make_trainer(tmp_path, agents=rotary, tokenizer=tok, train_dataset=data, args=args)


def test_a_later_turn_past_learned_positions_is_a_clear_error(tmp_path):
    tok = char_tokenizer()

    def grow(prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent):
        return ["x" * 300] * num_agents

    args = small_config(tmp_path, num_turns=2, max_new_tokens=4)
    trainer = make_trainer(
        tmp_path, agents=[tiny_gpt2(tok, seed=i) for i in range(2)], tokenizer=tok, external_transition=grow, args=args
    )
    with pytest.raises(ValueError, match=r"a prompt being sampled: a prompt of 30\d tokens .* the model has 256"):
        trainer.train()


@pytest.mark.parametrize(
    "prompts,match",
    [
        (["", "", ""], r"agent 0's prompt for train_dataset row 0 is empty after tokenization \(3 such row\(s\)"),
        (["fine", "", "ok"], r"agent 0's prompt for train_dataset row 1 is empty"),
        (
            ["fine", "ok", "bad \ud800 text"],
            r"agent 0's prompt for train_dataset row 2 \(the row's 'prompt' column\) cannot be tokenized: .*surrogate",
        ),
    ],
)
def test_prompts_a_model_cannot_take_name_the_row(tmp_path, prompts, match):
    with pytest.raises(ValueError, match=match):
        make_trainer(tmp_path, train_dataset=[{"prompt": p} for p in prompts])


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("seed", 2**70, r"seed must be below 2\*\*63"),
        ("seed", -1, r"seed must be an integer >= 0"),
        ("max_new_tokens", 10**9, r"max_new_tokens must be at most 1048576"),
        ("agent_learning_rate", 1e30, r"agent_learning_rate must be a finite number in \(0, 1\]"),
        ("agent_learning_rate", math.inf, r"agent_learning_rate must be a finite number"),
        ("agent_learning_rate", [1e-4, 1e30], r"agent_learning_rate\[1\] must be a finite number in \(0, 1\]"),
        ("beta", 1e30, r"beta must be a finite number in \[0, 1000\]"),
        ("entropy_coef", math.inf, r"entropy_coef must be a finite number"),
        ("reference_kl_coef", 1e30, r"reference_kl_coef must be a finite number in \[0, 1000\]"),
        ("weight_decay", 1e30, r"weight_decay must be a finite number"),
    ],
)
def test_out_of_bounds_values_are_refused(tmp_path, field, value, match):
    with pytest.raises(ValueError, match=match):
        small_config(tmp_path, **{field: value})


def test_actor_critic_bounds(tmp_path):
    from comlrl.trainers.actor_critic import IACConfig

    with pytest.raises(ValueError, match=r"critic_learning_rate must be a finite number in \(0, 1\]"):
        IACConfig(critic_learning_rate=1e30)
    with pytest.raises(ValueError, match=r"value_loss_coef must be a finite number in \(0, 1000\]"):
        IACConfig(value_loss_coef=1e30)


# ------------------------------------------------------------------------------ resuming with another config
def test_resuming_with_another_config_says_what_differs_and_which_side_wins(tmp_path, capsys):
    make_trainer(tmp_path, args=small_config(tmp_path, save_steps=2)).train()
    changed = small_config(tmp_path, num_train_epochs=2, agent_learning_rate=5e-4, max_new_tokens=5)
    resumed = make_trainer(tmp_path, args=changed)
    resumed.train(resume_from_checkpoint=True)
    out = capsys.readouterr().out
    assert "with agent_learning_rate=0.0005 (checkpoint: 0.001): the checkpoint's value stays" in out
    assert "with max_new_tokens=5 (checkpoint: 6): this run's value applies from here" in out
    assert "num_train_epochs=2 (checkpoint: 1)" in out
    assert "temperature" not in out  # unchanged fields are not listed


# ------------------------------------------------------------------------------ kill -9 at random moments
@pytest.mark.slow
def test_runs_killed_at_random_moments_resume_to_the_straight_result(tmp_path):
    straight = killable_trainer(str(tmp_path / "straight"))
    straight.train()
    expected = weights(straight)

    folder, saved = tmp_path / "killed", tmp_path / "killed.pt"
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "tests.fault_worker", str(folder), str(saved)]
    chance = random.Random(20261201)
    kills = 0
    for _attempt in range(12):
        worker = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert worker.stdout.readline().strip() == "ready", worker.stderr.read()[-2000:]
        if kills < 5:
            time.sleep(chance.uniform(0.05, 1.5))
            worker.kill()  # SIGKILL: no handler runs, the save in progress (if any) is cut short
            if worker.wait() == -9:
                kills += 1
                continue
        else:
            worker.wait(timeout=300)
        if worker.returncode == 0:
            break
        raise AssertionError(worker.stderr.read()[-3000:])
    assert kills >= 3 and saved.exists()
    for a, b in zip(torch.load(saved), expected):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    steps = [json.loads(line)["step"] for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 25))  # each step logged once, whatever was cut short


def test_a_tampered_manifest_is_a_clear_error(tmp_path):
    make_trainer(tmp_path, args=small_config(tmp_path, save_steps=1)).train()
    (tmp_path / "run" / "checkpoint-2" / "manifest.json").write_text('{"files": {"optimizer.pt": 7}}')
    with pytest.raises(ValueError, match=r"checkpoint-2: manifest.json cannot be read \(TypeError"):
        make_trainer(tmp_path, args=small_config(tmp_path)).train(resume_from_checkpoint=True)
