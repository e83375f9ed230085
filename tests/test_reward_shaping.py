"""DAPO's overlong penalty as per-agent reward shaping: by hand, then through a MAGRPO run."""

import json

import pytest
import torch

from comlrl.algorithms.shaping import overlong_penalty, penalized_rewards
from comlrl.trainers.reinforce import MAGRPOConfig
from tests.helpers import make_trainer, small_config


def test_overlong_penalty_by_hand():
    # max_new_tokens 8, buffer 4: free up to 4 tokens, then (L - 4) / 4
    lengths = torch.tensor([3, 4, 5, 6, 8])
    torch.testing.assert_close(overlong_penalty(lengths, 8, 4), torch.tensor([0.0, 0.0, 0.25, 0.5, 1.0]).double())
    # a buffer of the whole length starts at 0 tokens
    torch.testing.assert_close(overlong_penalty(torch.tensor([0, 2]), 4, 4), torch.tensor([0.0, 0.5]).double())


def test_each_agent_pays_its_own_completions_penalty():
    # 1 node, G = 2, aligned joint actions (0, 0) and (1, 1); agent 0's penalties (0, 1), agent 1's (0.5, 0)
    rewards = torch.tensor([[[1.0, 1.0], [2.0, 2.0]]])
    shaped = penalized_rewards(
        rewards, [torch.tensor([0.0, 1.0]), torch.tensor([0.5, 0.0])], torch.tensor([[0, 0], [1, 1]]), 2, 0.2
    )
    torch.testing.assert_close(shaped, torch.tensor([[[1.0, 0.9], [1.8, 2.0]]]))


def test_a_run_with_completions_cut_at_max_new_tokens_pays_the_factor(tmp_path):
    """Every completion runs to max_new_tokens (EOS banned): each agent's penalty is the factor itself."""
    args = small_config(
        tmp_path, overlong_buffer=3, overlong_penalty_factor=0.5, generation_kwargs={"min_new_tokens": 6}
    )
    make_trainer(tmp_path, args=args).train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    penalties = [row["turn_1/overlong_penalty_mean"] for row in rows if "turn_1/overlong_penalty_mean" in row]
    assert penalties and all(value == pytest.approx(0.5) for value in penalties)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"overlong_buffer": 0}, "overlong_buffer must be"),
        ({"overlong_buffer": 9, "max_new_tokens": 8}, "overlong_buffer=9 is more than max_new_tokens=8"),
        ({"overlong_penalty_factor": 2.0}, "overlong_penalty_factor weighs the overlong penalty: set overlong_buffer"),
    ],
)
def test_bad_overlong_settings_are_named(overrides, message):
    with pytest.raises(ValueError, match=message):
        MAGRPOConfig(**overrides)
