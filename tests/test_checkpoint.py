"""Checkpoints: resuming continues the run exactly; cut-short, tampered or mismatched
checkpoints give clear errors or are skipped with a warning."""

import json
import os

import pytest
import torch

from comlrl.checkpoint import complete_checkpoints
from comlrl.trainers.reinforce import MAREINFORCETrainer

from .helpers import (
    DATA,
    char_tokenizer,
    interrupting_reward,
    length_sum,
    log_lines,
    make_trainer,
    small_config,
    tiny_gpt2,
    tiny_llama,
    weights,
)

STEPS = 4  # 2 epochs x 2 steps (3 rows, 2 per step)


def config(tmp_path, **overrides):
    values = dict(num_train_epochs=2, per_device_train_batch_size=2, lr_scheduler_type="linear", warmup_ratio=0.25)
    values.update(overrides)
    return small_config(tmp_path, **values)


@pytest.mark.parametrize("logging_steps", [1, 3])
def test_stop_and_resume_equals_one_straight_run(tmp_path, logging_steps):
    straight = make_trainer(tmp_path / "a", args=config(tmp_path / "a", logging_steps=logging_steps))
    straight_result = straight.train()

    first = make_trainer(
        tmp_path / "b", reward_func=interrupting_reward(2), args=config(tmp_path / "b", logging_steps=logging_steps)
    )
    stopped = first.train()
    assert stopped.interrupted and stopped.global_step == 2
    assert [os.path.basename(p) for p in complete_checkpoints(str(tmp_path / "b" / "run"))] == ["checkpoint-2"]
    second = make_trainer(tmp_path / "b", args=config(tmp_path / "b", logging_steps=logging_steps))
    resumed = second.train(resume_from_checkpoint=True)

    assert resumed.global_step == STEPS and not resumed.interrupted
    assert resumed.epoch_reward_means == straight_result.epoch_reward_means
    for a, b in zip(weights(straight), weights(second)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    for log in ("metrics.jsonl", "samples.jsonl"):
        assert log_lines(tmp_path / "b" / "run", log) == log_lines(tmp_path / "a" / "run", log)
    assert second.learners.schedulers[0].get_last_lr() == straight.learners.schedulers[0].get_last_lr()


def test_checkpoint_holds_hugging_face_folders_and_data_only(tmp_path):
    trainer = make_trainer(tmp_path, args=config(tmp_path, save_steps=1, save_total_limit=2))
    trainer.train()
    run = tmp_path / "run"
    assert sorted(os.listdir(run)) == ["checkpoint-3", "checkpoint-4", "metrics.jsonl", "samples.jsonl"]  # no lock left
    files = set(os.listdir(run / "checkpoint-4"))
    assert files == {"agent_0", "agent_1", "optimizer.pt", "rng_state.pt", "trainer_state.json", "manifest.json"}
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(os.listdir(run / "checkpoint-4" / "agent_0"))
    state = json.loads((run / "checkpoint-4" / "trainer_state.json").read_text())
    assert (state["global_step"], state["epoch"], state["step_in_epoch"]) == (4, 1, 2)


def test_a_save_cut_short_is_ignored_with_a_warning(tmp_path):
    trainer = make_trainer(tmp_path, args=config(tmp_path, num_train_epochs=1, save_steps=1))
    trainer.train()
    run = tmp_path / "run"
    os.remove(run / "checkpoint-2" / "trainer_state.json")  # as if the process died mid-save
    resumed = make_trainer(tmp_path, args=config(tmp_path, num_train_epochs=1, save_steps=1))
    with pytest.warns(UserWarning, match=r"ignoring .*checkpoint-2: it has no trainer_state.json"):
        result = resumed.train(resume_from_checkpoint=True)
    assert result.global_step == 2  # resumed from checkpoint-1 and took step 2 again


DAMAGEABLE = ["optimizer.pt", "rng_state.pt", "trainer_state.json", "agent_1/model.safetensors"]


@pytest.mark.parametrize("damage", DAMAGEABLE)
def test_truncated_files_are_named_by_the_manifest(tmp_path, damage):
    make_trainer(tmp_path, args=config(tmp_path, num_train_epochs=1, save_steps=2)).train()
    path = tmp_path / "run" / "checkpoint-2" / damage
    size = len(path.read_bytes())
    path.write_bytes(path.read_bytes()[: size // 2])
    with pytest.raises(ValueError, match=rf"checkpoint-2 is damaged: {damage} has {size // 2} bytes, {size} were"):
        make_trainer(tmp_path, args=config(tmp_path, num_train_epochs=1)).train(resume_from_checkpoint=True)


@pytest.mark.parametrize("damage", DAMAGEABLE)
def test_truncated_files_of_a_checkpoint_without_manifest_give_a_clear_error(tmp_path, damage):
    """A checkpoint written before manifests: its readers still name the file they cannot read."""
    make_trainer(tmp_path, args=config(tmp_path, num_train_epochs=1, save_steps=2)).train()
    os.remove(tmp_path / "run" / "checkpoint-2" / "manifest.json")
    path = tmp_path / "run" / "checkpoint-2" / damage
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    with pytest.warns(UserWarning, match="has no manifest.json: its files cannot be verified"):
        with pytest.raises(ValueError, match=rf"{damage} cannot be read"):
            make_trainer(tmp_path, args=config(tmp_path, num_train_epochs=1)).train(resume_from_checkpoint=True)


def test_a_pickled_object_is_refused(tmp_path):
    make_trainer(tmp_path, args=config(tmp_path, num_train_epochs=1, save_steps=2)).train()
    os.remove(tmp_path / "run" / "checkpoint-2" / "manifest.json")  # past the manifest, as a forger would go
    torch.save({"optimizers": [object()]}, tmp_path / "run" / "checkpoint-2" / "optimizer.pt")
    with pytest.warns(UserWarning, match="cannot be verified"):
        with pytest.raises(ValueError, match=r"optimizer.pt cannot be read \(UnpicklingError"):
            make_trainer(tmp_path, args=config(tmp_path, num_train_epochs=1)).train(resume_from_checkpoint=True)


def test_resuming_with_other_agents_names_what_differs(tmp_path):
    make_trainer(tmp_path, args=config(tmp_path, num_train_epochs=1, save_steps=2)).train()
    tok = char_tokenizer()
    three = make_trainer(tmp_path, agents=[tiny_llama(tok, i) for i in range(3)], tokenizer=tok, args=config(tmp_path))
    with pytest.raises(ValueError, match=r"checkpoint-2 holds 2 agents; this trainer has 3"):
        three.train(resume_from_checkpoint=True)
    other = make_trainer(tmp_path, agents=[tiny_llama(tok, 0), tiny_gpt2(tok, 1)], tokenizer=tok, args=config(tmp_path))
    with pytest.raises(
        ValueError, match=r"agent 1 was class='LlamaForCausalLM', this trainer's agent 1 has 'GPT2LMHeadModel'"
    ):
        other.train(resume_from_checkpoint=True)
    fewer_rows = make_trainer(tmp_path, train_dataset=DATA[:2], args=config(tmp_path))
    with pytest.raises(ValueError, match=r"taken with 3 training rows.*this trainer has 2,"):
        fewer_rows.train(resume_from_checkpoint=True)


def test_resuming_with_another_trainer_is_refused_and_an_unnamed_checkpoint_resumes(tmp_path):
    make_trainer(tmp_path, args=config(tmp_path, num_train_epochs=1, save_steps=2)).train()
    state_file = tmp_path / "run" / "checkpoint-2" / "trainer_state.json"
    assert json.loads(state_file.read_text())["trainer"] == "MAGRPO"
    tok = char_tokenizer()
    reinforce = MAREINFORCETrainer(
        agents=[tiny_llama(tok, seed=i) for i in range(2)],
        tokenizer=tok,
        train_dataset=DATA,
        reward_func=length_sum,
        args=config(tmp_path, num_train_epochs=1),
    )
    with pytest.raises(ValueError, match=r"checkpoint-2 was written by a MAGRPO run; this trainer trains MAREINFORCE"):
        reinforce.train(resume_from_checkpoint=True)
    state = json.loads(state_file.read_text())
    del state["trainer"]  # as a checkpoint written before the field existed
    state_file.write_text(json.dumps(state))
    manifest = tmp_path / "run" / "checkpoint-2" / "manifest.json"
    manifest.unlink()  # its SHA-256 of trainer_state.json no longer holds; an unverifiable checkpoint still resumes
    with pytest.warns(UserWarning, match=r"no manifest"):
        assert make_trainer(tmp_path, args=config(tmp_path, num_train_epochs=1)).train(resume_from_checkpoint=True)


def test_resume_without_a_checkpoint(tmp_path):
    with pytest.raises(ValueError, match=r"resume_from_checkpoint=True but .* holds no complete checkpoint-\* folder"):
        make_trainer(tmp_path, args=config(tmp_path)).train(resume_from_checkpoint=True)
    with pytest.raises(ValueError, match=r"elsewhere is not a complete checkpoint"):
        make_trainer(tmp_path, args=config(tmp_path)).train(resume_from_checkpoint=str(tmp_path / "elsewhere"))
