"""Console warnings read from each training step's metrics: a run can look healthy (finite
losses, a progress bar that moves) while it learns nothing."""

from __future__ import annotations

import re

from comlrl.metrics.rollout import ZERO_SPREAD_KEY

_ADVANTAGE_KEY = re.compile(r"agent\d+/advantage_(mean|std)")


class ZeroSpreadWatch:
    """Says once per run when ``patience`` training steps in a row had no group with any
    spread of returns (``reward/zero_std_group_frac`` at 1): every completion scored like the
    others of its group, so a group baseline (``mean``, ``rloo``, ``max``) makes every
    advantage 0 and the update moves nothing. Once, not every step: the metric stays in the
    log for whoever wants to follow it. A step without the metric (MADPO's steps train on
    stored pairs, sampling nothing) neither counts nor breaks the run of steps."""

    def __init__(self, patience: int = 3):
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise ValueError(f"patience must be an int >= 1 (steps), got {patience!r}")
        self.patience = patience
        self.streak = 0  # steps in a row, up to the last one seen, in which every group was flat
        self.warned = False

    def check(self, metrics: dict[str, float]) -> str | None:
        """Feed one training step's metrics; returns the warning to print the first time the
        streak reaches ``patience``, None otherwise."""
        if ZERO_SPREAD_KEY not in metrics:
            return None
        # Zero spread leaves nothing to learn only where the advantages are 0 too: a critic's
        # baseline (IAC, MAAC) or advantage_mode="raw" still gives r - V or r.
        # (Not exactly 0: a group mean of equal floats can differ from them in the last bit.)
        no_advantage = all(abs(value) < 1e-6 for key, value in metrics.items() if _ADVANTAGE_KEY.fullmatch(key))
        self.streak = self.streak + 1 if metrics[ZERO_SPREAD_KEY] == 1.0 and no_advantage else 0
        if self.warned or self.streak < self.patience:
            return None
        self.warned = True
        return (
            f"warning: in each of the last {self.streak} steps every group's rewards were all equal "
            f"({ZERO_SPREAD_KEY} = 1): no completion did better than the others of its group, so every "
            "group-relative advantage is 0 and the agents learn nothing. Check that reward_func can give "
            "different completions of one prompt different values, raise num_generations (more samples "
            "per group), and raise temperature (or top_k) if the samples of a group come out identical. "
            "Said once; follow the metric in metrics.jsonl."
        )
