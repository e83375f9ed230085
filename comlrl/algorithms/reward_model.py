"""Fitting a reward model to preferences "chosen beats rejected": pure tensor functions.

The Bradley-Terry model (Bradley and Terry 1952; as a reward model for RLHF, Ouyang et al.
2022, https://arxiv.org/abs/2203.02155) says the chosen answer wins with probability
σ(s_w - s_l), s being the reward model's scores; fitting it minimises the negative
log-likelihood of the observed preferences:

    L = mean over pairs of -log σ(s_w - s_l)

Only score differences matter: adding a constant to every score changes nothing.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def bradley_terry_loss(chosen_scores: Tensor, rejected_scores: Tensor) -> Tensor:
    """``(P,), (P,) -> ()``: ``-mean log σ(s_w - s_l)`` over P pairs (log σ is computed
    stably, so a large margin gives 0, never NaN)."""
    return -F.logsigmoid(chosen_scores - rejected_scores).mean()


def pair_accuracy(chosen_scores: Tensor, rejected_scores: Tensor) -> Tensor:
    """``(P,), (P,) -> ()``: the share of pairs whose chosen answer scores STRICTLY higher
    (a tie is not a correct ranking)."""
    return (chosen_scores > rejected_scores).float().mean()
