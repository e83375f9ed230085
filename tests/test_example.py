"""examples/story-len-ratio.py: its flags, and a short run on a tiny model folder."""

import re
import sys

import pytest
from transformers import AutoModelForCausalLM

from .helpers import TUTORIAL_FLAGS, char_tokenizer, help_text, load_example, tiny_llama


@pytest.fixture(scope="module")
def example():
    return load_example("story-len-ratio.py")


def test_help_lists_every_flag(example, capsys):
    text = help_text(example, capsys)
    for flag in TUTORIAL_FLAGS:
        assert flag in text


def test_defaults_are_the_tutorials(example):
    args = example.parse_args([])
    assert (args.epochs, args.num_generations, args.max_new_tokens, args.wandb) == (3, 8, 128, False)


def test_reward_by_hand(example):
    # ratios 2.5 (inside), 1 (1 below the range), 4 (1 above), empty first completion
    assert example.proper_length_ratio_reward(["ab", "ab", "ab", ""], ["abcde", "ab", "abcdefgh", "x"]) == [
        1.0, pytest.approx(0.36787944), pytest.approx(0.36787944), 0.0,
    ]  # fmt: skip


@pytest.fixture
def tiny_model_args(tmp_path):
    tok = char_tokenizer("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ :")
    tiny_llama(tok).save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    return ["--model", str(tmp_path / "tiny"), "--output-dir", str(tmp_path / "out"), "--epochs", "1",
            "--num-generations", "2", "--max-new-tokens", "4"]  # fmt: skip


def test_short_run_on_a_tiny_model_saves_both_agents(example, tmp_path, capsys, monkeypatch, tiny_model_args):
    monkeypatch.setitem(sys.modules, "wandb", None)  # any `import wandb` would now fail: W&B stays off
    out = tmp_path / "out"
    example.main(tiny_model_args)
    summary = capsys.readouterr().out
    assert "first epoch" in summary and "last epoch" in summary and str(out / "models") in summary
    assert re.search(r"steps in \d+ s, peak memory \d+\.\d GiB;", summary)
    assert f"curves in {out / 'metrics.png'}" in summary and (out / "metrics.png").stat().st_size > 0
    for i in range(2):
        AutoModelForCausalLM.from_pretrained(out / "models" / f"agent_{i}")
    assert (out / "metrics.jsonl").exists()


def test_wandb_flags_reach_wandb_init(example, fake_wandb, tiny_model_args):
    example.main(tiny_model_args + ["--wandb", "--wandb-project", "proj", "--wandb-entity", "team"])
    assert fake_wandb["init"]["project"] == "proj" and fake_wandb["init"]["entity"] == "team"
    assert fake_wandb["log"] and fake_wandb["finished"]
