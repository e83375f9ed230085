"""When the sampler is not exactly the learner (bf16 decoding steps, which round apart from
the update's whole-sequence forward; an inference engine), the tokens were drawn from
pi_sampler while the update treats them as the learner's own: the two distributions differ
a little at every token. These measure the gap and correct for it with
truncated importance sampling, as large RL systems do for their inference engines
(https://fengyao.notion.site/off-policy-rl): each token's policy-gradient term is weighted by
min(pi_learner / pi_sampler, cap), where pi_learner is the policy as it was when sampling."""

from __future__ import annotations

import torch
from torch import Tensor


def sampler_logprob_gap(learner_logps: Tensor, sampler_logps: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """``(S, T)`` log-probs of the same tokens under the learner and the sampler, ``(S, T)``
    bool mask of completion tokens -> (sum of ``|learner - sampler|`` over them, their count)."""
    gap = (learner_logps.detach() - sampler_logps).abs() * mask
    return gap.sum(), mask.sum()


def truncated_importance_weights(learner_logps: Tensor, sampler_logps: Tensor, cap: float) -> Tensor:
    """``(S, T)`` per-token weights ``min(exp(learner - sampler), cap)``, without gradient:
    exactly 1 where the two agree."""
    return torch.exp(learner_logps.detach() - sampler_logps).clamp(max=cap)
