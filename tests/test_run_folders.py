"""Where runs write: a config without ``output_dir`` gives every run a new folder of its own
under ``comlrl_output/`` (and points ``comlrl_output/latest`` at it); a folder the user named
keeps its protection. Scripts written for comlrl 1.4.3, which had no output folder, train
twice in a process and run twice in a folder; see also tests/test_migration_scripts.py."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from comlrl.checkpoint import run_folder
from comlrl.checkpoint.run_folder import LOCK_FILE, RunFolderLock, latest_run, new_run_folder
from comlrl.trainers.reinforce import MAREINFORCEConfig, MAREINFORCETrainer
from tests.helpers import DATA, char_tokenizer, length_sum, make_trainer, small_config, tiny_llama

REPO = Path(__file__).resolve().parents[1]
RUN_NAME = re.compile(r"magrpo-\d{8}-\d{6}(-\d+)?")


def unnamed(**overrides):
    """``small_config`` without an output folder."""
    config = small_config(Path("unused"), **overrides)
    config.output_dir = None
    return config


def steps(folder) -> list[int]:
    return [json.loads(line)["step"] for line in (Path(folder) / "metrics.jsonl").read_text().splitlines()]


def runs(root="comlrl_output") -> list[str]:
    return sorted(name for name in os.listdir(root) if name != "latest")


def test_each_run_without_output_dir_gets_a_new_folder_and_latest_points_at_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = unnamed()  # one config for every trainer, as a sweep does
    first = make_trainer(tmp_path, args=args).train()
    trainer = make_trainer(tmp_path, args=args)
    second = trainer.train()
    third = trainer.train()  # a second train() of one trainer is a run too
    folders = [first.output_dir, second.output_dir, third.output_dir]
    assert len(set(folders)) == 3 and all(RUN_NAME.fullmatch(os.path.basename(f)) for f in folders)
    assert runs() == sorted(os.path.basename(f) for f in folders)
    assert trainer.output_dir == os.path.relpath(third.output_dir) and args.output_dir is None
    assert (tmp_path / "comlrl_output" / "latest").resolve() == Path(third.output_dir)
    assert steps(first.output_dir) == steps(second.output_dir) == [1, 2] and steps(third.output_dir) == [3, 4]
    printed = capsys.readouterr().out
    assert all(f"MAGRPO: this run writes to {folder}" in printed for folder in folders)
    assert not any(LOCK_FILE in os.listdir(folder) for folder in folders)  # released and removed


def test_runs_of_one_second_get_suffixes_that_sort_as_numbers(tmp_path, monkeypatch):
    monkeypatch.setattr(run_folder.time, "strftime", lambda pattern: "20261201-184005")
    made = [os.path.basename(new_run_folder(str(tmp_path), "MAGRPO")) for _ in range(11)]
    assert made == ["magrpo-20261201-184005"] + [f"magrpo-20261201-184005-{n}" for n in range(2, 12)]
    (tmp_path / "magrpo-not-a-run").mkdir()
    (tmp_path / "marlhf-magrpo-20270101-000000").mkdir()  # another algorithm's run, newer
    assert latest_run(str(tmp_path), "MAGRPO") == str(tmp_path / "magrpo-20261201-184005-11")
    assert latest_run(str(tmp_path), "MARLHF-MAGRPO") == str(tmp_path / "marlhf-magrpo-20270101-000000")
    assert latest_run(str(tmp_path), "IAC") is None


def test_resume_without_output_dir_continues_the_newest_run_of_the_trainers_algorithm(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    stopped = make_trainer(tmp_path, args=unnamed(save_steps=1)).train()
    tok = char_tokenizer()
    other = MAREINFORCETrainer(  # a newer run of another algorithm is not the one to continue
        agents=[tiny_llama(tok, seed=i) for i in range(2)],
        tokenizer=tok,
        train_dataset=DATA,
        reward_func=length_sum,
        args=MAREINFORCEConfig(num_train_epochs=1, num_generations=2, max_new_tokens=6, save_steps=1),
    ).train()
    resumed = make_trainer(tmp_path, args=unnamed(num_train_epochs=2)).train(resume_from_checkpoint=True)
    assert resumed.output_dir == stopped.output_dir and resumed.global_step == 4
    assert steps(stopped.output_dir) == [1, 2, 3, 4] and steps(other.output_dir) == [1, 2]
    assert (tmp_path / "comlrl_output" / "latest").resolve() == Path(stopped.output_dir)


def test_resume_without_output_dir_or_an_earlier_run_says_what_to_write(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    reward = []
    trainer = make_trainer(tmp_path, args=unnamed(), reward_func=lambda *c: reward.append(1) or length_sum(*c))
    with pytest.raises(ValueError, match=r"comlrl_output holds no MAGRPO run \(magrpo-<time>\) to continue: set"):
        trainer.train(resume_from_checkpoint=True)
    assert reward == [] and not (tmp_path / "comlrl_output").exists()


def test_a_run_resumed_from_a_checkpoint_dir_goes_on_logging_in_its_own_folder(tmp_path, monkeypatch):
    """comlrl 1.4.3's ``train(checkpoint_dir=...)``: checkpoints there, the logs in the run's folder."""
    monkeypatch.chdir(tmp_path)
    stopped = make_trainer(tmp_path, args=unnamed()).train(checkpoint_dir="ckpt")
    assert sorted(os.listdir("ckpt")) == ["checkpoint-2"] and "checkpoint-2" not in os.listdir(stopped.output_dir)
    resumed = make_trainer(tmp_path, args=unnamed(num_train_epochs=2)).train(
        resume_from_checkpoint=True, checkpoint_dir="ckpt"
    )
    assert resumed.output_dir == stopped.output_dir and steps(stopped.output_dir) == [1, 2, 3, 4]
    assert runs() == [os.path.basename(stopped.output_dir)]


def test_a_named_folder_is_still_refused_and_offers_resuming_only_with_a_checkpoint(tmp_path):
    make_trainer(tmp_path).train()  # small_config names tmp_path/run; no checkpoint
    with pytest.raises(FileExistsError) as refused:
        make_trainer(tmp_path).train()
    message = str(refused.value)
    assert "holds an earlier run (metrics.jsonl, samples.jsonl)" in message
    assert "resume_from_checkpoint" not in message and "overwrite_output_dir=True" in message
    assert "leave output_dir unset" in message
    make_trainer(tmp_path, args=small_config(tmp_path, overwrite_output_dir=True, save_steps=2)).train()
    with pytest.raises(FileExistsError, match=r"continue it with train\(resume_from_checkpoint=True\), replace"):
        make_trainer(tmp_path).train()


def test_a_released_lock_leaves_no_file_and_the_next_lock_is_still_exclusive(tmp_path):
    folder = str(tmp_path / "run")
    RunFolderLock(folder).acquire().release()
    assert os.listdir(folder) == []
    held = RunFolderLock(folder).acquire()
    with pytest.raises(RuntimeError, match="is in use by another run"):
        RunFolderLock(folder).acquire()
    # Opened before the holder released it (and removed the file): that file is no lock.
    late = os.open(os.path.join(folder, LOCK_FILE), os.O_RDWR)
    held.release()
    again = RunFolderLock(folder).acquire()
    with pytest.raises(RuntimeError, match="is in use by another run"):
        RunFolderLock(folder).acquire()
    os.close(late)
    again.release()


WORKER = """
import json, os, sys
sys.path.insert(0, {repo!r})
from pathlib import Path
from tests.helpers import DATA, make_trainer, small_config
args = small_config(Path("unused"), per_device_train_batch_size=1)
args.output_dir = None
trainer = make_trainer(Path("unused"), args=args, train_dataset=DATA + DATA[:1])
result = trainer.train()
with open(f"rank{{os.environ['RANK']}}.json", "w") as f:
    json.dump([trainer.output_dir, result.output_dir], f)
"""


def test_under_torchrun_every_rank_uses_the_folder_rank_0_chose(tmp_path):
    (tmp_path / "worker.py").write_text(WORKER.format(repo=str(REPO)))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "worker.py"]
    finished = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr[-3000:]
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert rank0 == rank1 and len(runs(tmp_path / "comlrl_output")) == 1
    assert Path(rank0[1]) == (tmp_path / "comlrl_output" / "latest").resolve()


@pytest.mark.parametrize("algorithm", ["iac", "madpo", "marlhf", "madpo_iter", "marlhf_iter"])
def test_every_family_writes_a_run_without_output_dir_into_a_folder_of_its_own(tmp_path, monkeypatch, algorithm):
    """What each family writes beside its log (MARLHF's reward model, the rounds' replay
    shards and reward histograms) goes into the run's folder too."""
    from tests.helpers import build_trainer

    monkeypatch.chdir(tmp_path)
    trainer = build_trainer(algorithm, tmp_path / "unused", per_device_rows=2)
    trainer.args.output_dir = None  # the config the loop reads
    result = trainer.train()
    (name,) = runs()
    assert result.output_dir == str(tmp_path / "comlrl_output" / name) and trainer.output_dir is not None
    written = set(os.listdir(result.output_dir))
    assert {"metrics.jsonl", "checkpoint-2"} <= written
    if "marlhf" in algorithm:
        assert "reward_model" in written
    if algorithm.endswith("_iter"):
        assert "preference_replay" in written
    assert not (tmp_path / "unused").exists()
