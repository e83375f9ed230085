"""examples/story-len-ratio.py: its flags, a short run on a tiny model folder, where its runs
write (examples/_common.py, shared by every example), and the check of ``--model``."""

import json
import re
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from comlrl.models import folders
from comlrl.models.folders import check_model_available

from .helpers import TUTORIAL_FLAGS, char_tokenizer, help_text, load_example, tiny_llama

RUN_FLAGS = ["--overwrite", "--no-save", "--threads", "--generation-backend"]
"""The flags examples/_common.py gives every example beside the tutorial's."""
TWO_AGENTS_SAVED = "metrics.jsonl; curves in metrics.png; models in models/agent_0, models/agent_1"
"""The summary's list of what a run of two agents wrote into its folder."""


@pytest.fixture(scope="module")
def example():
    return load_example("story-len-ratio.py")


def test_help_lists_every_flag(example, capsys):
    text = help_text(example, capsys)
    for flag in [*TUTORIAL_FLAGS, *RUN_FLAGS]:
        assert flag in text
    assert "torch.set_num_threads" in text and "comlrl_output/<algorithm>-<time>" in text


def test_defaults_are_the_tutorials(example):
    args = example.parse_args([])
    assert (args.epochs, args.num_generations, args.max_new_tokens, args.wandb) == (3, 8, 128, False)
    assert (args.output_dir, args.overwrite, args.no_save, args.threads) == (None, False, False, None)
    assert example.run_config(args)["generation_backend"] == "hf"
    assert example.run_config(example.parse_args(["--generation-backend", "vllm"]))["generation_backend"] == "vllm"


def test_reward_by_hand(example):
    # ratios 2.5 (inside), 1 (1 below the range), 4 (1 above), empty first completion
    assert example.proper_length_ratio_reward(["ab", "ab", "ab", ""], ["abcde", "ab", "abcdefgh", "x"]) == [
        1.0, pytest.approx(0.36787944), pytest.approx(0.36787944), 0.0,
    ]  # fmt: skip


@pytest.fixture
def tiny_model(tmp_path):
    """``--model`` a tiny model folder, and the smallest sizes (no ``--output-dir``)."""
    tok = char_tokenizer("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ :")
    tiny_llama(tok).save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    return ["--model", str(tmp_path / "tiny"), "--epochs", "1", "--num-generations", "2", "--max-new-tokens", "4"]


@pytest.fixture
def tiny_model_args(tmp_path, tiny_model):
    return [*tiny_model, "--output-dir", str(tmp_path / "out")]


@pytest.fixture
def keep_threads():
    """Puts torch's thread count back after a test that sets it (it is process-wide)."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_short_run_on_a_tiny_model_saves_both_agents(example, tmp_path, capsys, monkeypatch, tiny_model_args,
                                                     keep_threads):  # fmt: skip
    monkeypatch.setitem(sys.modules, "wandb", None)  # any `import wandb` would now fail: W&B stays off
    out = tmp_path / "out"
    example.main([*tiny_model_args, "--threads", "1"])
    summary = capsys.readouterr().out
    assert "first epoch" in summary and "last epoch" in summary
    assert re.search(
        r"5 steps in \d+ s of training \(\d+ s in all\) with torch.get_num_threads\(\) = 1, peak memory \d+\.\d GiB\n",
        summary,
    )
    assert f"run folder {out}: {TWO_AGENTS_SAVED}" in summary
    assert (out / "metrics.png").stat().st_size > 0 and (out / "metrics.jsonl").exists()
    for i in range(2):
        AutoModelForCausalLM.from_pretrained(out / "models" / f"agent_{i}")


def test_wandb_flags_reach_wandb_init(example, fake_wandb, tiny_model_args):
    example.main(tiny_model_args + ["--no-save", "--wandb", "--wandb-project", "proj", "--wandb-entity", "team"])
    assert fake_wandb["init"]["project"] == "proj" and fake_wandb["init"]["entity"] == "team"
    assert fake_wandb["log"] and fake_wandb["finished"]


# ------------------------------------------------------------------------------ where runs write
def test_runs_without_output_dir_get_a_new_folder_each(example, tmp_path, monkeypatch, capsys, tiny_model):
    monkeypatch.setitem(sys.modules, "wandb", None)
    monkeypatch.chdir(tmp_path)
    example.main(tiny_model)
    example.main(tiny_model)
    runs = sorted(p for p in (tmp_path / "comlrl_output").iterdir() if p.name != "latest")
    assert [re.fullmatch(r"magrpo-\d{8}-\d{6}(-2)?", p.name) is not None for p in runs] == [True, True]
    for run in runs:  # each its own log, curves and models; nothing beside them
        assert len((run / "metrics.jsonl").read_text().splitlines()) == 5
        assert (run / "metrics.png").is_file()
        assert sorted(p.name for p in (run / "models").iterdir()) == ["agent_0", "agent_1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["comlrl_output", "tiny"]
    assert (tmp_path / "comlrl_output" / "latest").resolve() == runs[-1].resolve()
    summaries = capsys.readouterr().out
    assert all(f"run folder {run}:" in summaries for run in runs)


def test_no_save_writes_no_models(example, tmp_path, capsys, tiny_model_args):
    example.main([*tiny_model_args, "--no-save"])
    out = tmp_path / "out"
    assert "models not saved (--no-save)" in capsys.readouterr().out
    assert not (out / "models").exists() and (out / "metrics.jsonl").is_file()


def test_a_named_folder_holding_a_run_is_refused_without_overwrite(example, tmp_path, capsys, tiny_model_args):
    out = tmp_path / "out"
    example.main([*tiny_model_args, "--no-save"])
    first = (out / "metrics.jsonl").read_text()
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        example.main([*tiny_model_args, "--no-save"])
    assert stopped.value.code == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.endswith(f"--output-dir {out} holds an earlier run (metrics.jsonl): pass --overwrite "
                          "to replace it, name another folder, or leave --output-dir out for a new folder")  # fmt: skip
    assert (out / "metrics.jsonl").read_text() == first
    example.main([*tiny_model_args, "--overwrite"])
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3, 4, 5]  # the new run's log only
    assert (out / "models" / "agent_1" / "config.json").is_file()


def test_overwrite_needs_a_named_folder(example, capsys):
    with pytest.raises(SystemExit) as stopped:
        example.parse_args(["--overwrite"])
    assert stopped.value.code == 2 and "--overwrite replaces the run in --output-dir" in capsys.readouterr().err


# ------------------------------------------------------------------------------ a wrong --model
def test_a_missing_model_folder_is_one_line_naming_a_close_one(example, tmp_path, capsys, tiny_model):
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        example.parse_args(["--model", str(tmp_path / "tiyn")])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: ") and err.splitlines()[-1].endswith(
        f": error: --model {tmp_path / 'tiyn'}: no such folder (did you mean {tmp_path / 'tiny'}?); "
        "or leave --model out for the embedded SmolLM2-135M-Instruct"
    )


def test_a_model_folder_without_config_is_named(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"--model '.*empty' is a folder without config.json"):
        check_model_available(str(tmp_path / "empty"), "--model")
    with pytest.raises(ValueError, match=r"--model \./nowhere: no such folder$"):
        check_model_available("./nowhere", "--model")


def test_a_model_folder_is_given_as_is(tmp_path, tiny_model):
    assert check_model_available(str(tmp_path / "tiny"), "--model") == str(tmp_path / "tiny")


def test_a_hub_id_offline_and_not_cached_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(folders.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError) as error:
        check_model_available("nobody/no-such-model", "--model")
    assert str(error.value) == (
        "--model nobody/no-such-model: no such folder, not in the local Hugging Face cache, and HF_HUB_OFFLINE "
        "is set, so the hub was not asked; pass --model <a local model folder>, or load it once where the hub "
        "can be reached"
    )


def test_a_hub_id_with_the_hub_unreachable_says_so(tmp_path, monkeypatch):
    def unreachable(repo_id, timeout):
        raise ConnectionError("[Errno -2] Name or service\nnot known")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(folders.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(folders, "model_info", unreachable)
    with pytest.raises(ValueError, match=r"the hub did not answer \(ConnectionError: \[Errno -2\] Name or service not "
                                         r"known\); pass --model <a local model folder>"):  # fmt: skip
        check_model_available("nobody/no-such-model", "--model")
